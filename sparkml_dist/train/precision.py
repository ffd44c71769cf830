"""Mixed precision for the rank loop (`train.precision`) and TF32 for fp32 matmuls on CUDA
(`train.tf32`).

bf16 and fp16 run the forward pass under `torch.autocast` (parameters, gradients and the
optimizer stay fp32); the loss is taken in fp32. fp16 also scales the loss so small gradients do
not flush to zero (`torch.amp.GradScaler`), and skips a step whose gradients overflowed. bf16
needs no scaler: it has fp32's exponent range.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Precision:
    name: str  # fp32 | bf16 | fp16
    device_type: str  # cpu | cuda
    # in a captured CUDA graph autocast must not cache casts across the capture (PyTorch's advice)
    cache_casts: bool = True
    scaler: torch.amp.GradScaler | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.name not in ("fp32", *DTYPES):
            raise ValueError(f"train.precision={self.name}: use fp32, bf16 or fp16")
        if self.name == "fp16" and self.device_type != "cuda":
            raise ValueError(
                "train.precision=fp16 runs on a GPU only (its gradient scaler is CUDA's); on CPU "
                "use train.precision=bf16"
            )
        if self.name == "fp16" and self.scaler is None:
            self.scaler = torch.amp.GradScaler(self.device_type)

    @property
    def dtype(self) -> torch.dtype | None:
        return DTYPES.get(self.name)

    def autocast(self) -> AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype, cache_enabled=self.cache_casts)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """fp16: gradients back to their true size (before clipping, or Horovod's step)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)  # skipped when the unscaled gradients hold an inf or NaN
        self.scaler.update()


@contextlib.contextmanager
def matmul_precision(device: torch.device, tf32: bool) -> Iterator[None]:
    """fp32 matmuls on TF32 tensor cores (on CUDA, with `tf32`) for the block; restored after,
    so a Spark worker that trains and later scores keeps scoring in full fp32."""
    if device.type != "cuda":
        yield
        return
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)
