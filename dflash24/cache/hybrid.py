"""Per-sequence state of a hybrid (Gated DeltaNet + attention) target such as qwen35.

Attention layers keep keys/values in a `KVCache` (rows = positions); DeltaNet layers keep one fp32
recurrent state S [Hv, Dk, Dv] and the last K-1 raw qkv vectors for the causal conv. Buffers are
allocated once; forwards update them in place (copy_), so CUDA graphs can capture a step.
Unlike the KV cache, the recurrent state is position-free: `reset()` must be called before a new sequence.

Speculative verification (Step.speculative): DeltaNet layers leave `ssm` and `conv` untouched and `record`
each token's recurrence inputs (k, v, g, beta, fp32) and raw pre-conv qkv vector into scratch rows
0..T-1 (T <= max_spec_tokens); `commit(step, path, base)` then replays the accepted tokens from the
committed state (kernels.deltanet.replay) and rebuilds the conv window from the accepted raw vectors.
No per-token states are kept. Tree steps that run the recurrent kernel on CUDA (`tree_states_needed`: more
than SPEC_CHUNK_MAX_T nodes, or SPEC_CHUNK off) also need `node_states` [max_tree_nodes, Hv, Dk, Dv], a scratch
that kernel fills with each node's state during the forward (shared by all layers).
"""
from __future__ import annotations

import torch

from ..kernels.deltanet import replay, tree_states_needed
from .kv import KVCache


class HybridCache:
    def __init__(self, n_attn_layers: int, n_delta_layers: int, capacity: int, n_kv_heads: int, head_dim: int,
                 v_heads: int, k_dim: int, v_dim: int, conv_dim: int, conv_kernel: int,
                 dtype=torch.bfloat16, device=None, max_spec_tokens: int = 64, max_tree_nodes: int = 0):
        self.capacity = capacity
        self.kv = KVCache(n_attn_layers, capacity, n_kv_heads, head_dim, dtype, device)
        self.ssm = torch.zeros(n_delta_layers, v_heads, k_dim, v_dim, dtype=torch.float32, device=device)
        self.conv = torch.zeros(n_delta_layers, conv_kernel - 1, conv_dim, dtype=torch.float32, device=device)
        k_heads, rem = divmod(conv_dim - v_heads * v_dim, 2 * k_dim)      # conv channels = [q | k | v]
        if rem or k_heads <= 0:
            raise ValueError(f"conv_dim {conv_dim} is not 2 * k_heads * {k_dim} + {v_heads} * {v_dim}")
        if max_spec_tokens < 0 or max_tree_nodes < 0:
            raise ValueError("max_spec_tokens and max_tree_nodes must be >= 0")
        self.max_spec_tokens, self.max_tree_nodes = max_spec_tokens, max_tree_nodes
        L, M, f32 = n_delta_layers, max_spec_tokens, dict(dtype=torch.float32, device=device)
        self.spec_raw = torch.zeros(L, M, conv_dim, **f32)                 # pre-conv qkv of each step token
        self.spec_k = torch.zeros(L, M, k_heads, k_dim, **f32)             # recurrence inputs (after conv,
        self.spec_v = torch.zeros(L, M, v_heads, v_dim, **f32)             # l2norm, gates)
        self.spec_g = torch.zeros(L, M, v_heads, **f32)
        self.spec_beta = torch.zeros(L, M, v_heads, **f32)
        self.node_states = (torch.zeros(max_tree_nodes, v_heads, k_dim, v_dim, **f32)
                            if tree_states_needed(max_tree_nodes) else None)

    @property
    def nbytes(self) -> int:
        scratch = sum(t.nbytes for t in (self.spec_raw, self.spec_k, self.spec_v, self.spec_g, self.spec_beta))
        if self.node_states is not None:
            scratch += self.node_states.nbytes
        return self.kv.nbytes + self.ssm.nbytes + self.conv.nbytes + scratch

    @staticmethod
    def spec_nbytes(n_delta_layers: int, k_heads: int, k_dim: int, v_heads: int, v_dim: int, conv_dim: int,
                    max_spec_tokens: int, max_tree_nodes: int = 0) -> int:
        """Bytes of the speculative scratch (memory planner): per DeltaNet layer and token fp32 raw qkv,
        k, v, g, beta; plus the tree node states (shared by all layers) where `tree_states_needed`."""
        per_token = conv_dim + k_heads * k_dim + v_heads * v_dim + 2 * v_heads
        nodes = max_tree_nodes if tree_states_needed(max_tree_nodes) else 0
        return 4 * (n_delta_layers * max_spec_tokens * per_token + nodes * v_heads * k_dim * v_dim)

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

    # ----- speculative verification -----
    def check_spec_step(self, T: int, tree: bool):
        """Raise unless a speculative step of T tokens fits the scratch (Python ints only)."""
        if T > self.max_spec_tokens:
            raise ValueError(f"speculative step of {T} tokens exceeds max_spec_tokens={self.max_spec_tokens}")
        if (tree and self.ssm.is_cuda and tree_states_needed(T)
                and (self.node_states is None or T > self.node_states.shape[0])):
            raise ValueError(f"tree step of {T} nodes runs the recurrent kernel, which needs "
                             f"new_cache(max_tree_nodes >= {T}); this cache has {self.max_tree_nodes}"
                             f"{'' if self.node_states is not None else ' and no node states'}")

    def raw_rows(self, layer: int, T: int) -> torch.Tensor:
        """Where DeltaNet layer `layer` keeps a speculative step's raw (pre-conv) rows: fp32 [T, conv_dim]."""
        return self.spec_raw[layer, :T]

    def record(self, layer: int, raw: torch.Tensor, written: bool = False) -> tuple[torch.Tensor, ...]:
        """Keep DeltaNet layer `layer`'s per-token inputs of a speculative step at rows 0..T-1: raw
        [T, conv_dim] is copied here (unless `written`: the conv kernel already wrote it to `raw_rows`); returns the
        buffers (k [T, Hk, Dk], v [T, Hv, Dv], g, beta [T, Hv]) that the recurrence fills as it reads them
        (`gated_delta_rule(..., record=)`)."""
        T = raw.shape[0]
        if not written:
            self.spec_raw[layer, :T].copy_(raw)
        return (self.spec_k[layer, :T], self.spec_v[layer, :T], self.spec_g[layer, :T], self.spec_beta[layer, :T])

    def commit(self, step, path: torch.Tensor, base: int, n: torch.Tensor | None = None):
        """Accept tokens `path` of the speculative `step` just run (see the module docstring).

        path: [n] int64 step indices of the accepted tokens in order (chain: arange(n); tree: root-to-node,
        path[0] has parent -1). Fixed-shape form: path padded to any length P <= T with valid indices and
        n a 0-dim int64 device tensor (the number of real entries): no host sync, the same kernels for
        every n (CUDA-graph capturable for chains; a tree's KV move uses the Python `base` and, with a
        padded path, also fills rows base+n .. base+P-1 with copies: they lie beyond the committed length).
        Advances `ssm` along the accepted tokens, sets `conv` to the last K-1 raw vectors of
        [conv ; accepted tokens], and moves the KV rows (`KVCache.commit`).
        """
        T = step.slots.shape[0]
        P = path.shape[0]
        if P == 0 or P > T:
            raise ValueError(f"path of {P} tokens for a {T}-token step")
        path = path.to(device=self.ssm.device, dtype=torch.long)
        if n is None:
            if not path.is_cuda:
                self._check_path(step, path)
            count = P
        else:
            count = n.to(device=self.ssm.device, dtype=torch.long).reshape(())
        replay(self.spec_k, self.spec_v, self.spec_g, self.spec_beta, self.ssm, path, count)
        W = self.conv.shape[1]
        if W:
            full = torch.cat([self.conv, self.spec_raw.index_select(1, path)], dim=1)   # [L, W + P, C]
            if n is None:
                self.conv.copy_(full[:, P:P + W])
            else:
                rows = count + torch.arange(W, device=full.device)           # [W]: the last W of W + count
                self.conv.copy_(full.index_select(1, rows))
        self.kv.commit(step, path, base)

    @staticmethod
    def _check_path(step, path: torch.Tensor):
        """Host-side check of an exact path (CPU tensors only; a GPU check would sync)."""
        idx = path.tolist()
        if step.parents is None:
            if idx != list(range(len(idx))):
                raise ValueError(f"a chain commits a prefix arange(n), got path {idx}")
            return
        par = step.parents.tolist()
        prev = -1
        for j in idx:
            if not 0 <= j < len(par) or par[j] != prev:
                raise ValueError(f"path {idx} is not a root-to-node path of the tree (parents {par})")
            prev = j
