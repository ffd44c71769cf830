"""`train.cuda_graph`: the data-parallel step captured in CUDA graphs and replayed.

A tabular model's step on a GPU is launch-bound: about 2 ms of kernel launches whatever the
batch, for a few microseconds of arithmetic each (docs/gpu.md). Captured once and replayed, the
whole step is one launch.

What is captured, with static buffers the step's batch is copied into:
- one rank: the whole step (expansion of the compact rows, forward, loss, backward, AdamW's fused
  capturable step) in one graph;
- several ranks: two graphs with one allreduce of the flat gradient buffer between them, issued
  eagerly (not captured: a lost peer then surfaces as an ordinary collective error, and NCCL's
  capture rules do not apply). DDP is not used: the gradients are views of one flat buffer that
  the first graph zeroes and backward fills, exactly what DDP averages, in one call.

Shapes must not change between replays, so a short last batch is padded to the batch size with
rows of weight 0 (the loss is the weighted mean, so padding changes neither the loss nor a
gradient). The first `WARMUP_STEPS` steps run eagerly on a side stream (PyTorch's advice before a
capture: they initialise cuBLAS, autograd and the optimizer's state); they are real steps on real
batches. Dropout draws from the default CUDA generator, which the capture registers, so the loop's
per-step seed still decides each replay's masks.

With `auto`, a step that cannot be captured (a custom model that reads a value on the host, say)
is logged and trained eagerly from then on; with `on` it is an error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from sparkml_dist.errors import ConfigError
from sparkml_dist.observe.steps import CommClock
from sparkml_dist.train.precision import Precision

log = logging.getLogger(__name__)

WARMUP_STEPS = 3


class CaptureFailed(ConfigError):
    """`train.cuda_graph=on` and the step could not be captured (a relaunch would fail the same way)."""


class GraphedStep:
    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        world_size: int,
        batch_size: int,
        input_width: int,
        precision: Precision,
        expand: Callable[[torch.Tensor], torch.Tensor],
        required: bool,
        clock: CommClock | None = None,
    ):
        self.model = model
        self.optimizer = optimizer
        self.world_size = world_size
        self.precision = precision
        self.expand = expand
        self.required = required
        self.clock = clock
        device = next(model.parameters()).device
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.flat = bind_flat_gradients(self.params)
        self.static_x = torch.zeros(batch_size, input_width, device=device)
        self.static_y = torch.zeros(batch_size, 2, device=device)
        self.static_loss: torch.Tensor | None = None
        self.side = torch.cuda.Stream(device)
        self.warmups_left = WARMUP_STEPS
        self.eager = False  # capture failed under `auto`: every step runs eagerly
        self.forward_backward: torch.cuda.CUDAGraph | None = None
        self.update: torch.cuda.CUDAGraph | None = None  # several ranks: the optimizer's graph

    @property
    def captured(self) -> bool:
        return self.forward_backward is not None

    def train_step(self, x: torch.Tensor, y: torch.Tensor, loss_fn: nn.Module) -> torch.Tensor:
        """Forward and backward of one batch (one rank: the optimizer step too, in the same graph)."""
        self._stage(x, y)
        if self.eager or self.warmups_left > 0:
            return self._eager_forward_backward(loss_fn)
        if not self.captured:
            self._capture(loss_fn)
            if self.eager:  # `auto` and the capture failed: this step eagerly too
                return self._eager_forward_backward(loss_fn)
        assert self.forward_backward is not None and self.static_loss is not None  # set by _capture
        self.forward_backward.replay()
        return self.static_loss

    def optimizer_step(self, timed: bool = False) -> None:
        """`timed`: a step the breakdown times, so the allreduce waits for the device around it."""
        if self.eager or self.warmups_left > 0:
            self._eager_update(timed)
            return
        if self.update is None:  # one rank: the update was part of the step's graph
            return
        self._allreduce(timed)
        self.update.replay()

    # ---- the step's parts -------------------------------------------------------------------
    def _stage(self, x: torch.Tensor, y: torch.Tensor) -> None:
        rows = len(x)
        self.static_x[:rows].copy_(x, non_blocking=True)
        self.static_y[:rows].copy_(y, non_blocking=True)
        if rows < len(self.static_y):
            self.static_y[rows:, 1].zero_()  # padding: weight 0

    def _forward_backward(self, loss_fn: nn.Module) -> torch.Tensor:
        self.flat.zero_()
        with self.precision.autocast():
            outputs = self.model(self.expand(self.static_x))
        loss = loss_fn(outputs.float(), self.static_y)
        loss.backward()
        return loss.detach()

    def _allreduce(self, timed: bool) -> None:
        import torch.distributed as dist

        if self.clock is not None and timed:
            torch.cuda.synchronize()
            with self.clock.blocking():
                dist.all_reduce(self.flat)
                torch.cuda.synchronize()
        else:
            dist.all_reduce(self.flat)

    def _eager_forward_backward(self, loss_fn: nn.Module) -> torch.Tensor:
        if self.eager:
            return self._forward_backward(loss_fn)
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            loss = self._forward_backward(loss_fn)
        torch.cuda.current_stream().wait_stream(self.side)
        return loss

    def _eager_update(self, timed: bool) -> None:
        if self.world_size > 1:
            self._allreduce(timed)
            self.flat.div_(self.world_size)
        self.optimizer.step()
        if not self.eager:
            self.warmups_left -= 1

    def _capture(self, loss_fn: nn.Module) -> None:
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: the feed's thread keeps copying the next batches during the capture
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self.static_loss = self._forward_backward(loss_fn)
                if self.world_size == 1:
                    self.optimizer.step()
        except Exception as exc:
            self._capture_failed(exc)
            return
        self.forward_backward = graph
        if self.world_size > 1:
            self.update = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.update, capture_error_mode="thread_local"):
                self.flat.div_(self.world_size)
                self.optimizer.step()
        log.info(
            "train.cuda_graph: the step is captured (%s)",
            "one graph" if self.world_size == 1 else "forward+backward, allreduce, optimizer",
        )

    def _capture_failed(self, exc: Exception) -> None:
        torch.cuda.synchronize()
        bind_flat_gradients(self.params, self.flat)  # the capture may have left other tensors as .grad
        if self.required:
            raise CaptureFailed(
                f"train.cuda_graph=on: the training step could not be captured in a CUDA graph "
                f"({type(exc).__name__}: {exc}); set train.cuda_graph=auto (train without a graph "
                f"when capture fails) or off"
            ) from exc
        log.warning(
            "train.cuda_graph=auto: the training step could not be captured (%s: %s); training continues "
            "without a graph",
            type(exc).__name__,
            exc,
        )
        self.eager = True


def bind_flat_gradients(params: list[nn.Parameter], flat: torch.Tensor | None = None) -> torch.Tensor:
    """Every parameter's .grad a view of one flat buffer (made here unless given): what backward
    accumulates into, what one allreduce averages and what the optimizer reads."""
    if flat is None:
        flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
    offset = 0
    for p in params:
        p.grad = flat[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    return flat
