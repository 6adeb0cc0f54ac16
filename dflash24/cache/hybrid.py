"""Per-sequence state of a hybrid (Gated DeltaNet + attention) target such as qwen35.

Attention layers keep keys/values in a `KVCache` (rows = positions); DeltaNet layers keep one fp32
recurrent state S [Hv, Dk, Dv] and the last K-1 raw qkv vectors for the causal conv. Buffers are
allocated once; forwards update them in place (copy_), so CUDA graphs can capture a step.
Unlike the KV cache, the recurrent state is position-free: `reset()` must be called before a new sequence.
"""
from __future__ import annotations

import torch

from .kv import KVCache


class HybridCache:
    def __init__(self, n_attn_layers: int, n_delta_layers: int, capacity: int, n_kv_heads: int, head_dim: int,
                 v_heads: int, k_dim: int, v_dim: int, conv_dim: int, conv_kernel: int,
                 dtype=torch.bfloat16, device=None):
        self.capacity = capacity
        self.kv = KVCache(n_attn_layers, capacity, n_kv_heads, head_dim, dtype, device)
        self.ssm = torch.zeros(n_delta_layers, v_heads, k_dim, v_dim, dtype=torch.float32, device=device)
        self.conv = torch.zeros(n_delta_layers, conv_kernel - 1, conv_dim, dtype=torch.float32, device=device)

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes + self.ssm.nbytes + self.conv.nbytes

    @staticmethod
    def state_nbytes(n_delta_layers: int, v_heads: int, k_dim: int, v_dim: int, conv_dim: int, conv_kernel: int) -> int:
        """Bytes of the recurrent part (for the memory planner): fp32 S + fp32 conv window per DeltaNet layer."""
        return 4 * n_delta_layers * (v_heads * k_dim * v_dim + (conv_kernel - 1) * conv_dim)

    def reset(self):
        """Start a new sequence: zero the recurrent states and conv windows (KV rows are overwritten by position)."""
        self.ssm.zero_()
        self.conv.zero_()

    def snapshot(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the recurrent part (tests, rollback experiments)."""
        return self.ssm.clone(), self.conv.clone()

    def restore(self, snap: tuple[torch.Tensor, torch.Tensor]):
        self.ssm.copy_(snap[0])
        self.conv.copy_(snap[1])
