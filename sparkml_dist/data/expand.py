"""`FeatureLayout.expand` in torch, on whatever device the rows are: compact rows ([rows,
compact_width]: a value, or a category's index) -> the dense [rows, dim] batch the model reads,
in one scatter.

On a GPU the loader ships compact rows (one float per source column, not a one-hot slot per category) and the batch is
made dense on the device, inside the step (and inside its CUDA graph, when the step is captured):
the host never builds the one-hot matrix, which at GPU step rates would cost more than the step.
"""

from __future__ import annotations

import torch

from sparkml_dist.data.layout import FeatureLayout


class DeviceExpander:
    """Compact rows -> dense rows on `device`. With no layout (a dense `features` column) the
    rows are dense already and pass through."""

    def __init__(self, layout: FeatureLayout | None, device: torch.device | str, dense_dim: int):
        self.layout = layout
        self.dim = layout.dim if layout is not None else dense_dim
        # floats per compact row (without a layout, the dense row itself)
        self.compact_width = layout.compact_width if layout is not None else dense_dim
        if layout is None:
            return
        slots = layout.compact_slots()
        self.offsets = torch.tensor([offset for offset, _ in slots], dtype=torch.int64, device=device)
        self.onehot = torch.tensor([onehot for _, onehot in slots], dtype=torch.bool, device=device)

    def __call__(self, compact: torch.Tensor) -> torch.Tensor:
        if self.layout is None:
            return compact
        # each compact float writes one slot: a value at its offset, or a 1 at offset + the index
        slots = self.offsets + torch.where(self.onehot, compact, 0.0).long()
        values = torch.where(self.onehot, 1.0, compact)
        dense = compact.new_zeros(compact.shape[0], self.dim)
        return dense.scatter_(1, slots, values)
