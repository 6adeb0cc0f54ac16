"""Static KV cache for the attention layers of one sequence.

Buffers are allocated once at the planned capacity; a step writes its keys/values at `step.slots`
(index_copy_, CUDA-graph safe) and attention reads rows 0..kv_rows-1.
"""
from __future__ import annotations

import torch


class KVCache:
    def __init__(self, n_layers: int, capacity: int, n_kv_heads: int, head_dim: int,
                 dtype=torch.bfloat16, device=None):
        self.capacity = capacity
        shape = (n_layers, capacity, n_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """k, v: [T, Hk, D] written at rows `slots` of layer `layer`."""
        self.k[layer].index_copy_(0, slots, k.to(self.k.dtype))
        self.v[layer].index_copy_(0, slots, v.to(self.v.dtype))

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer], self.v[layer]

    def commit(self, step, path: torch.Tensor, base: int):
        """Keep the accepted tokens of a speculative step: token path[j] of `step` (written at row
        step.slots[path[j]]) becomes row base + j. A chain (step.parents is None) wrote its tokens at
        base, base+1, ... already, and its accepted tokens are a prefix: nothing to move."""
        if step.parents is None:
            return
        src = step.slots[path]
        dst = torch.arange(base, base + path.shape[0], device=src.device)
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]
