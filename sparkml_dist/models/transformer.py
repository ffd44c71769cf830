"""A tabular transformer: each source column of the feature vector is one token.

Written so that every parallel strategy can cut it: attention and MLP are plain Linear layers
(column/row-wise shardable, heads counted from the local width so a tensor-parallel shard
holds whole heads), the token table is an nn.Embedding (row-wise shardable), and the blocks
live in a ModuleDict so a pipeline stage keeps only its own blocks under the same names
(a sharded checkpoint written by one stage split loads into another).
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn


def token_layout(feature_names: list[str]) -> list[int]:
    """Token index of every slot: a one-hot block (`<col>__onehot_<value>`) is one token, every
    other slot (a scaled numeric, a category index) is its own token."""
    tokens: dict[str, int] = {}
    layout: list[int] = []
    for name in feature_names:
        key = name.split("__onehot_", 1)[0] if "__onehot_" in name else f"slot:{len(layout)}"
        layout.append(tokens.setdefault(key, len(tokens)))
    return layout


class Attention(nn.Module):
    def __init__(self, d_model: int, heads: int, dropout: float):
        super().__init__()
        self.head_dim = d_model // heads
        self.dropout = dropout
        self.q, self.k, self.v = (nn.Linear(d_model, d_model) for _ in range(3))
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: under tensor parallelism q/k/v hold only this rank's heads
        q, k, v = (proj(x).view(b, t, -1, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(d_model, hidden)
        self.fc2 = nn.Linear(hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, d_model: int, heads: int, mlp_hidden: int, dropout: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = Attention(d_model, heads, dropout)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = FeedForward(d_model, mlp_hidden)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.norm1(x)))
        return x + self.drop(self.mlp(self.norm2(x)))


class TokenEmbedding(nn.Module):
    """Slot values -> tokens: value x per-slot vector, summed per column, plus a per-token
    embedding; token 0 is the [CLS] token the head reads.

    A one-hot block's token is its slots' values times their vectors, summed: one [B, slots] @
    [slots, d] product. Spelled as a product per block (and one elementwise product over every
    one-slot token) it needs no [B, slots, d] intermediate, which for categories with thousands of
    values (nycflights13's flight and tail numbers: 7,492 slots in all; batch 256, d 32) is 245 MB
    a step."""

    # buffers (register_buffer): declared for the type checker, which reads attributes from __init__
    token_ids: torch.Tensor
    single_tokens: torch.Tensor
    single_slots: torch.Tensor
    block_tokens: torch.Tensor

    def __init__(self, layout: list[int], d_model: int):
        super().__init__()
        n_tokens = max(layout) + 1
        # unit scale, like the token table: at 0.02 a slot's value was a fiftieth of its token's
        # embedding and a regression target stayed at its mean for epochs
        self.values = nn.Parameter(torch.randn(len(layout), d_model))
        self.tokens = nn.Embedding(n_tokens + 1, d_model)
        self.register_buffer("token_ids", torch.arange(n_tokens + 1), persistent=False)
        slots_of: dict[int, list[int]] = {}
        for slot, token in enumerate(layout):
            slots_of.setdefault(token + 1, []).append(slot)
        singles = [(token, slots[0]) for token, slots in slots_of.items() if len(slots) == 1]
        # (token, first slot, end): the slots of a one-hot block are adjacent (one column's vector)
        self.blocks = [
            (token, slots[0], slots[-1] + 1) for token, slots in slots_of.items() if len(slots) > 1
        ]
        if any(end - start != len(slots_of[token]) for token, start, end in self.blocks):
            raise ValueError("a one-hot block's slots must be adjacent in the feature vector")
        self.register_buffer(
            "single_tokens", torch.tensor([t for t, _ in singles], dtype=torch.long), persistent=False
        )
        self.register_buffer(
            "single_slots", torch.tensor([s for _, s in singles], dtype=torch.long), persistent=False
        )
        self.register_buffer(
            "block_tokens", torch.tensor([t for t, _, _ in self.blocks], dtype=torch.long), persistent=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values = self.values
        summed = x.new_zeros(x.shape[0], self.token_ids.numel(), values.shape[-1])
        if self.single_slots.numel():
            one_slot = x.index_select(1, self.single_slots).unsqueeze(-1) * values.index_select(
                0, self.single_slots
            )
            summed = summed.index_copy(1, self.single_tokens, one_slot.to(summed.dtype))
        if self.blocks:
            per_block = torch.stack(
                [x[:, start:end] @ values[start:end] for _, start, end in self.blocks], dim=1
            )
            summed = summed.index_copy(1, self.block_tokens, per_block.to(summed.dtype))
        return summed + self.tokens(self.token_ids)


class Head(nn.Module):
    def __init__(self, d_model: int, outputs: int = 1):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        # no bias: the norm's shift already gives each output an intercept, and every parameter
        # keeps a dimension that a power-of-two mesh splits evenly (what DCP reshards)
        self.out = nn.Linear(d_model, outputs, bias=False)
        self.outputs = outputs

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out = self.out(self.norm(h[:, 0]))
        return out.squeeze(-1) if self.outputs == 1 else out


class TabularTransformer(nn.Module):
    def __init__(
        self,
        layout: list[int],
        d_model: int,
        heads: int,
        layers: int,
        mlp_hidden: int,
        dropout: float,
        outputs: int = 1,
    ):
        super().__init__()
        self.embed: TokenEmbedding | None = TokenEmbedding(layout, d_model)
        self.blocks = nn.ModuleDict(
            {str(i): Block(d_model, heads, mlp_hidden, dropout) for i in range(layers)}
        )
        self.head: Head | None = Head(d_model, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # a pipeline stage without the embedding receives hidden states, one without the head returns them
        h = self.embed(x) if self.embed is not None else x
        for block in self.blocks.values():
            h = block(h)
        return self.head(h) if self.head is not None else h

    def activation_floats_per_row(self) -> int:
        """The widest tensor a row becomes in the forward pass, in floats: its input, or its tokens
        times the widest of the model width, the MLP's hidden width and the attention scores (one
        per head and token pair). What scoring sizes its forward chunks by (`inference/predict.py::forward_rows`)."""
        block = cast("Block | None", next(iter(self.blocks.values()), None))  # the ModuleDict holds Blocks
        if self.embed is None or block is None:
            return 0  # a pipeline stage: not scored on its own
        tokens = int(self.embed.token_ids.numel())
        d_model = block.norm1.normalized_shape[0]
        heads = d_model // block.attn.head_dim
        slots = self.embed.values.shape[0]  # the input row: a wide one-hot block's slots can be the most
        return max(slots, tokens * max(d_model, block.mlp.fc1.out_features, heads * tokens))

    def keep_stage(self, stage: int, num_stages: int) -> TabularTransformer:
        """Drop what pipeline stage `stage` of `num_stages` does not run (in place; names unchanged)."""
        names = list(self.blocks.keys())
        lo, hi = len(names) * stage // num_stages, len(names) * (stage + 1) // num_stages
        for name in names[:lo] + names[hi:]:
            del self.blocks[name]
        if stage > 0:
            self.embed = None
        if stage < num_stages - 1:
            self.head = None
        return self
