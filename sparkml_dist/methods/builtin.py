"""The built-in training methods, imported (and so registered) on the first `train.strategy`
lookup. Each module is one method family: its config class, validators and `run`."""

from sparkml_dist.methods import data_parallel, federated, model_parallel, parameter_server  # noqa: F401
