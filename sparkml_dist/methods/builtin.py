"""The built-in training methods, imported (and so registered) on the first `train.strategy`
lookup. Each module is one method family: its config class, validators and `run`."""

from sparkml_dist.methods import data_parallel, model_parallel  # noqa: F401
from sparkml_dist.methods.async_ps import method as async_ps  # noqa: F401
from sparkml_dist.methods.federated import method as federated  # noqa: F401
