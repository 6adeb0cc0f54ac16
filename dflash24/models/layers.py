"""Building blocks shared by every architecture: norms, rotary embedding, attention over the KV cache, MLP.

All functions take data explicitly (no global context). Shapes: T = tokens of this step, H = query heads,
Hk = KV heads, D = head dim, S = cache rows visible to this step.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..cache.kvquant import PackedKV
from ..quant import kernels as _quant_kernels
from ..spec.ddtree import tree_mask

try:  # one-kernel RMSNorm on CUDA (DFLASH24_TRITON_NORM=0 disables it)
    from ..kernels import norm as _fused_norm
    if not _fused_norm.HAVE_TRITON or os.environ.get("DFLASH24_TRITON_NORM", "1") == "0":
        _fused_norm = None
except ImportError:  # pragma: no cover
    _fused_norm = None

try:  # fused Triton attention on CUDA; absent (or disabled with DFLASH24_TRITON_ATTENTION=0): SDPA below
    from ..kernels import attention as _fused_attn
    if not _fused_attn.HAVE_TRITON or os.environ.get("DFLASH24_TRITON_ATTENTION", "1") == "0":
        _fused_attn = None
except ImportError:  # pragma: no cover
    _fused_attn = None


try:  # one-kernel rotary embedding on CUDA (the same switch as the norm: DFLASH24_TRITON_NORM=0 disables it)
    from ..kernels import rope as _fused_rope
    if not _fused_rope.HAVE_TRITON or os.environ.get("DFLASH24_TRITON_NORM", "1") == "0":
        _fused_rope = None
except ImportError:  # pragma: no cover
    _fused_rope = None


def _use_fused_rope(x: torch.Tensor) -> bool:
    """The Triton rotary kernel runs on CUDA tensors outside autograd (tests patch this)."""
    return _fused_rope is not None and x.is_cuda and not (torch.is_grad_enabled() and x.requires_grad)


def _use_fused_act(g: torch.Tensor, u: torch.Tensor) -> bool:
    """silu_mul's Triton kernel (kernels/norm.py) runs on CUDA tensors outside autograd (tests patch this)."""
    return (_fused_norm is not None and g.is_cuda and g.numel() > 0
            and not (torch.is_grad_enabled() and (g.requires_grad or u.requires_grad)))


def _use_fused_norm(x: torch.Tensor, weight: torch.Tensor | None, gate: torch.Tensor | None) -> bool:
    """The Triton norm runs on CUDA tensors outside autograd (tests patch this to run it on the CPU)."""
    return (_fused_norm is not None and x.is_cuda and _fused_norm.supports(x, gate)
            and not (torch.is_grad_enabled() and (x.requires_grad or (weight is not None and weight.requires_grad))))


def _int8(want: bool) -> bool:
    """Whether a fused norm / silu_mul whose output feeds the decode GEMVs (want: a one-token step) also rounds it
    to their int8 activations (kernels/norm.py; off with DFLASH24_NORM_INT8=0 or the dot decode matmul)."""
    return want and _fused_norm is not None and _fused_norm.INT8 and _quant_kernels.DECODE_MATMUL == "gemv"


def _pairs(want: bool) -> bool:
    """Whether a fused norm / silu_mul whose output feeds the small-M matmuls (want: a verify step of
    kernels.PAIRS_FROM_TOKENS..SMALL_M tokens) also writes it in their pair order (kernels/norm.py; off with
    DFLASH24_NORM_PAIRS=0, the mmq small-M matmul, or the batch-invariant mode)."""
    return (want and _fused_norm is not None and _fused_norm.PAIRS and _quant_kernels.SMALL_M_MATMUL == "dot"
            and not _quant_kernels.BATCH_INVARIANT)


def feeds(tokens: int) -> dict:
    """The `int8` / `pairs` arguments of a norm or silu_mul whose output feeds quantized matmuls of `tokens` rows:
    int8 for the decode GEMV (one token), pairs for the dot kernel (kernels.PAIRS_FROM_TOKENS..SMALL_M tokens);
    neither for the steps between or for prefill chunks above SMALL_M."""
    return dict(int8=tokens == 1, pairs=_quant_kernels.PAIRS_FROM_TOKENS <= tokens <= _quant_kernels.SMALL_M)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, gate: torch.Tensor | None = None,
             out_dtype: torch.dtype | None = None, int8: bool = False, pairs: bool = False) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * weight, computed in fp32 (GGUF norms already hold the final weight);
    with `gate`, times silu(gate) (the gated norm of DeltaNet outputs). Result in out_dtype (default: x's
    dtype, or the promoted dtype of x and gate). On CUDA without autograd, one Triton kernel
    (kernels/norm.py); the code below is its reference. int8: the result feeds the decode GEMVs (a one-token
    step): the kernel also makes their int8 activations (`_int8`); pairs: it feeds a verify step's small-M
    matmuls: the kernel also writes it in their pair order (`_pairs`). `feeds(tokens)` gives both."""
    if _use_fused_norm(x, weight, gate):
        dt = out_dtype or (x.dtype if gate is None else torch.promote_types(x.dtype, gate.dtype))
        y = _fused_norm.rms_norm(x, weight, eps, gate, dt, int8=_int8(int8), pairs=_pairs(pairs))
        if y is not None:
            return y
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    y = y.to(x.dtype)
    if gate is not None:
        y = y * F.silu(gate.to(torch.promote_types(y.dtype, gate.dtype)))    # a bf16 gate of an fp32 x: fp32
    return y if out_dtype is None else y.to(out_dtype)


def add_rms_norm(x: torch.Tensor, res: torch.Tensor | None, weight: torch.Tensor, eps: float, int8: bool = False,
                 pairs: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + res, rms_norm(x + res, weight)): the residual add and the next norm, one kernel on CUDA; res None
    (the first layer: nothing to add yet): (x, rms_norm(x, weight)). int8 and pairs as in rms_norm."""
    if res is None:
        return x, rms_norm(x, weight, eps, int8=int8, pairs=pairs)
    if _use_fused_norm(x, weight, None) and not (torch.is_grad_enabled() and res.requires_grad):
        out = _fused_norm.add_rms_norm(x, res, weight, eps, int8=_int8(int8), pairs=_pairs(pairs))
        if out is not None:
            return out
    s = x + res
    return s, rms_norm(s, weight, eps, int8=int8, pairs=pairs)


def flat(y: torch.Tensor, rows: int) -> torch.Tensor:
    """y as (rows, -1), keeping the int8 activations and pair-order copies a fused kernel made with it (they are
    flat already)."""
    v = y.reshape(rows, -1)
    for attr in (_quant_kernels.INT8_ATTR, _quant_kernels.PAIRS_ATTR):
        if hasattr(y, attr):
            setattr(v, attr, getattr(y, attr))
    return v


class Rotary(torch.nn.Module):
    """Rotary position embedding on the first `rot_dim` dims of each head.

    neox=True rotates halves (x[:d/2], x[d/2:]) -- qwen2/qwen3/qwen35 in llama.cpp's NEOX mode;
    neox=False rotates adjacent pairs -- llama GGUFs, whose converter permuted Q/K rows for this mode.
    """

    def __init__(self, rot_dim: int, theta: float, max_positions: int, neox: bool, device=None,
                 freq_factors: torch.Tensor | None = None):
        super().__init__()
        self.rot_dim, self.neox = rot_dim, neox
        inv_freq = 1.0 / (theta ** (torch.arange(0, rot_dim, 2, dtype=torch.float64, device=device) / rot_dim))
        if freq_factors is not None:                    # llama-3 style long-context scaling (GGUF rope_freqs)
            inv_freq = inv_freq / freq_factors.to(device=device, dtype=torch.float64)
        t = torch.arange(max_positions, dtype=torch.float64, device=device)
        freqs = torch.outer(t, inv_freq)                                   # [P, rot/2]
        self.register_buffer("cos", freqs.cos().float(), persistent=False)
        self.register_buffer("sin", freqs.sin().float(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: [T, heads, D]; positions: [T] int64. On CUDA without autograd one Triton kernel
        (kernels/rope.py); the code below is its reference."""
        if _use_fused_rope(x):
            y = _fused_rope.rope(x, positions, self.cos, self.sin, self.rot_dim, self.neox)
            if y is not None:
                return y
        cos = self.cos[positions].unsqueeze(1)                             # [T, 1, rot/2]
        sin = self.sin[positions].unsqueeze(1)
        rot, rest = x[..., : self.rot_dim].float(), x[..., self.rot_dim:]
        if self.neox:
            a, b = rot.chunk(2, dim=-1)
        else:
            a, b = rot[..., 0::2], rot[..., 1::2]
        ra, rb = a * cos - b * sin, b * cos + a * sin
        if self.neox:
            out = torch.cat([ra, rb], dim=-1)
        else:
            out = torch.stack([ra, rb], dim=-1).flatten(-2)
        return torch.cat([out.to(x.dtype), rest], dim=-1)


# DFLASH24_FUSED_QK=0: an attention layer's q / k norms, rotary embedding and cache write run as separate kernels.
FUSED_QK = os.environ.get("DFLASH24_FUSED_QK", "1") != "0"


def qk_norm_rope_write(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_norm: torch.Tensor | None,
                       k_norm: torch.Tensor | None, eps: float, rope: Rotary, positions: torch.Tensor,
                       slots: torch.Tensor, cache, layer: int) -> torch.Tensor:
    """q [T, H, D], k / v [T, Hk, D] -> the rotated q; k rotated and v written to `cache` (a KVCache) at `slots`.
    q_norm / k_norm: per-head RMSNorm weights applied first (qwen3, qwen35), or None. On CUDA with a dense cache
    one Triton kernel (kernels/rope.py); the code below is its reference."""
    if FUSED_QK and _use_fused_rope(q):
        rows = cache.dense_layer(layer)
        if rows is not None:
            qo = _fused_rope.qk_norm_rope_write(q, k, v, q_norm, k_norm, eps, positions, slots, rope.cos, rope.sin,
                                                rope.rot_dim, rope.neox, *rows)
            if qo is not None:
                return qo
    if q_norm is not None:
        q, k = rms_norm(q, q_norm, eps), rms_norm(k, k_norm, eps)
    q, k = rope(q, positions), rope(k, positions)
    cache.write(layer, slots, k, v)
    return q


@dataclass
class Step:
    """Where the tokens of one forward go.

    positions: [T] rope positions. slots: [T] cache rows the step writes (== positions for a plain
    sequence; differ for tree verification). mask: optional [T, S] bool over cache rows 0..S-1
    (True = visible); None means causal by slot: row s is visible to token t iff s <= slots[t].
    kv_rows: S, the number of cache rows attention reads (a Python int: it picks the compiled shape).
    speculative: the tokens are a guess under verification: recurrent layers must leave their committed
    state untouched and record what `cache.commit(path)` needs to advance it along the accepted tokens.
    parents: tree verification: [T] index of each token's parent within the step (-1 = the committed
    state); None = a chain (token t follows token t-1).
    tree: tree verification visibility in compact form, (base [1] int64, ancestors [T, T] bool): rows
    < base are visible to every token, row base + j to token t iff ancestors[t, j]; nothing beyond.
    Used instead of `mask` (the dense form is built from it only where needed: the SDPA path).
    window: > 0: sliding-window attention (--attn-window): token t also sees only cache rows > positions[t] -
    window (committed rows are positions; tree nodes must be shallower than the window).
    region: > 0: the cache holds independent sequences in blocks of `region` rows (batched generation,
    train/batchgen.py): token t sees only rows slots[t] // region * region .. slots[t], and attention reads
    just that block for each token instead of all kv_rows.
    ring: > 0 (with a window): the layer's cache is a ring of `ring` rows holding position p at row p % ring
    (a sliding layer keeps only its last positions); kv_rows still counts positions.
    """
    positions: torch.Tensor
    slots: torch.Tensor
    kv_rows: int
    mask: torch.Tensor | None = None
    speculative: bool = False
    parents: torch.Tensor | None = None
    tree: tuple[torch.Tensor, torch.Tensor] | None = None
    window: int = 0
    region: int = 0
    ring: int = 0

    @staticmethod
    def sequential(start: int, n: int, kv_rows: int | None = None, device=None) -> "Step":
        pos = torch.arange(start, start + n, device=device)
        return Step(pos, pos, kv_rows if kv_rows is not None else start + n)

    def fused(self) -> bool:
        """Whether cache_attention runs the Triton kernel for this step (CUDA, no arbitrary mask): it reads
        the visibility from slots / tree itself, and no dense mask is built."""
        return (_fused_attn is not None and self.slots.is_cuda and not self.region
                and (self.mask is None or self.tree is not None))

    def visibility(self) -> torch.Tensor | None:
        """[T, S] bool: which cache rows each token of the step attends to; None when the step is `fused` or
        a `region` step (cache_attention builds what it needs)."""
        return None if self.fused() or self.region else self.dense_visibility()

    def dense_visibility(self) -> torch.Tensor:
        """[T, S] bool, always built (the SDPA path); S = ring for a ring step, else kv_rows."""
        if self.ring:
            return self._ring_visibility()
        if self.mask is not None:
            vis = self.mask
        elif self.tree is not None:
            base, anc = self.tree
            vis = tree_mask(anc, base, self.kv_rows)
        else:
            rows = torch.arange(self.kv_rows, device=self.slots.device)
            vis = rows.unsqueeze(0) <= self.slots.unsqueeze(1)
            if self.region:
                vis = vis & (rows.unsqueeze(0) >= (self.slots // self.region * self.region).unsqueeze(1))
        if self.window:
            rows = torch.arange(vis.shape[1], device=vis.device)
            vis = vis & (rows.unsqueeze(0) > self.positions.unsqueeze(1) - self.window)
        return vis

    def ring_positions(self) -> torch.Tensor:
        """[ring] int64: the position each row of a ring step's cache holds, the latest one <= the step's last
        position (negative: never written). A row may hold a later position than that (another step's scratch
        rows); the window puts every such row's computed position out of sight (the ring is sized for it)."""
        top = self.positions.max()
        r = torch.arange(self.ring, device=self.positions.device)
        return top - torch.remainder(top - r, self.ring)

    def _ring_visibility(self) -> torch.Tensor:
        if self.mask is not None or self.tree is not None or self.region or not self.window:
            raise ValueError("a ring step is sequential, with a window, no mask and no region")
        pos = self.ring_positions().unsqueeze(0)                               # [1, ring]
        return ((pos >= 0) & (pos < self.kv_rows) & (pos <= self.slots.unsqueeze(1))
                & (pos > self.positions.unsqueeze(1) - self.window))


def cache_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, step: Step,
                    scale: float, visible: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of this step's queries over the first `step.kv_rows` cache rows.

    q: [T, H, D]; k_cache / v_cache: [capacity, Hk, D] (the new keys were already written at step.slots).
    Returns [T, H, D]. GQA: query head h reads KV head h // (H // Hk).
    On CUDA, a step without an arbitrary mask (sequential, or tree in `step.tree` form) runs the Triton
    kernel (kernels/attention.py), which ignores `visible`; otherwise SDPA with the dense mask.
    K / V may each be a quantized `PackedKV` (cache/kvquant.py): the kernel decodes its tiles; the SDPA
    path dequantizes the visible rows to fp32 first (the exact reference).
    """
    if step.fused() and _fused_attn.supports(q, k_cache, v_cache):
        win = dict(positions=step.positions, window=step.window, ring=step.ring) if step.window else {}
        if step.tree is not None:
            return _fused_attn.attention(q, k_cache, v_cache, scale, step.kv_rows,
                                         base=step.tree[0], ancestors=step.tree[1], **win)
        return _fused_attn.attention(q, k_cache, v_cache, scale, step.kv_rows, slots=step.slots, **win)
    if step.region and visible is None and not step.window and torch.is_tensor(k_cache) and torch.is_tensor(v_cache):
        return _region_attention(q, k_cache, v_cache, scale, step)
    S = step.ring or step.kv_rows
    k = (k_cache.dequantize(S) if isinstance(k_cache, PackedKV) else k_cache[:S]).transpose(0, 1)   # [Hk, S, D]
    v = (v_cache.dequantize(S) if isinstance(v_cache, PackedKV) else v_cache[:S]).transpose(0, 1)
    if k.dtype != v.dtype:                                                 # mixed K/V types: a common dtype
        dt = torch.promote_types(k.dtype, v.dtype)
        k, v = k.to(dt), v.to(dt)
    mask = visible if visible is not None else step.dense_visibility()    # [T, S]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0).to(k.dtype),                        # [1, H, T, D]
        k.unsqueeze(0), v.unsqueeze(0), attn_mask=mask, scale=scale,
        enable_gqa=q.shape[1] != k.shape[0])
    return out.squeeze(0).transpose(0, 1).to(q.dtype)                      # [T, H, D]


def _region_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float,
                      step: Step) -> torch.Tensor:
    """cache_attention of a `region` step: each token attends over its own block of `region` rows only (one
    batched SDPA over the gathered blocks: the work of B sequences, not of B tokens over all B blocks)."""
    R, (_, H, D), Hk = step.region, q.shape, k_cache.shape[1]
    block = step.slots // R                                                 # [T] each token's block
    k = k_cache[: step.kv_rows].view(-1, R, Hk, D)[block].transpose(1, 2)    # [T, Hk, R, D]
    v = v_cache[: step.kv_rows].view(-1, R, Hk, D)[block].transpose(1, 2)
    if H != Hk:                                # explicit GQA repeat: every SDPA kernel takes it, and it is small
        k, v = k.repeat_interleave(H // Hk, dim=1), v.repeat_interleave(H // Hk, dim=1)
    vis = torch.arange(R, device=q.device)[None, :] <= (step.slots - block * R)[:, None]    # [T, R]
    out = F.scaled_dot_product_attention(q.unsqueeze(2).to(k.dtype), k, v, attn_mask=vis[:, None, None, :],
                                         scale=scale)                      # [T, H, 1, D]
    return out.squeeze(2).to(q.dtype)


def silu_mul(g: torch.Tensor, u: torch.Tensor, sigmoid: bool = False, int8: bool = False, pairs: bool = False
             ) -> torch.Tensor:
    """silu(g) * u (sigmoid: sigmoid(g) * u, an output gate): one Triton kernel where the fused norm runs
    (CUDA, no autograd), else two PyTorch ops. g: u's shape, or (T, H, Dh) for a (T, H * Dh) u (per-head slices
    of a projection, which the kernel reads in place). int8 and pairs as in rms_norm."""
    if _use_fused_act(g, u):
        y = _fused_norm.silu_mul(g, u, sigmoid, int8=_int8(int8), pairs=_pairs(pairs))
        if y is not None:
            return y
    g = g.reshape(u.shape)
    return (torch.sigmoid(g) if sigmoid else F.silu(g)) * u


def swiglu(x: torch.Tensor, gate_up, down) -> torch.Tensor:
    """down(silu(gate(x)) * up(x)); gate_up: a FusedLinear of (gate, up)."""
    g, u = gate_up(x)
    return down(silu_mul(g, u, **feeds(x.shape[0])))
