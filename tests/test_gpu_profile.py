"""GPU placement logic, tested on CPU: each rank uses the GPU Spark assigned to its task."""


import pytest

from sparkml_dist.launch.backends import gpu_index
from sparkml_dist.launch.context import RankContext


def ctx(rank, local_rank, local_size, gpus=()):
    return RankContext(rank, 2, local_rank, local_size, 0, 1, "h", "h", 1, tuple(gpus))


def test_gpu_index_prefers_the_task_resource_then_the_local_rank():
    assert gpu_index(ctx(0, 0, 2, ["1"]), 2) == 1
    assert gpu_index(ctx(1, 1, 2), 2) == 1
    with pytest.raises(RuntimeError, match="Spark assigned GPU 3 but torch sees 2"):
        gpu_index(ctx(0, 0, 1, ["3"]), 2)
    with pytest.raises(RuntimeError, match="3 ranks on h but only 2 GPU"):
        gpu_index(ctx(2, 2, 3), 2)
