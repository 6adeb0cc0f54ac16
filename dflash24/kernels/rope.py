"""Rotary position embedding as one Triton kernel (CUDA): the reference is `models.layers.Rotary.forward`'s own
code path, which in eager PyTorch is about a dozen kernels per call (index the cos / sin rows, cast, split,
four multiplies, add, subtract, two concatenations, cast back) -- twice per attention layer per step.

One program per (token, head): the head's first rot_dim values are rotated in fp32 with the cos / sin of the
token's position (NeoX: halves; otherwise adjacent pairs), the rest copied; the result in x's dtype. Each
element reads its rotation partner directly (a second load of the same row, from L1).
"""
from __future__ import annotations

import torch

from . import HAVE_TRITON, tl, triton  # noqa: F401 - without triton: the reference in models/layers.py
from .pdl import launch_options, pdl_enter

if HAVE_TRITON:

    @triton.jit
    def _norm_rope_row(src, w_ptr, dst, pos, cos_ptr, sin_ptr, D, eps, ROT: tl.constexpr, NEOX: tl.constexpr,
                       BLOCK_D: tl.constexpr, NORM: tl.constexpr):
        """dst[:D] = rope(rms_norm(src[:D]) * w) at position pos (NORM False: rope(src[:D])), both results rounded
        to dst's dtype."""
        DT = dst.dtype.element_ty
        d = tl.arange(0, BLOCK_D)
        ok = d < D
        y = tl.load(src + d, mask=ok, other=0).to(tl.float32)
        if NORM:
            rstd = 1.0 / tl.sqrt_rn(tl.sum(y * y, axis=0) / D + eps)
            y = (y * rstd * tl.load(w_ptr + d, mask=ok, other=0).to(tl.float32)).to(DT).to(tl.float32)
        HALF: tl.constexpr = ROT // 2
        if NEOX:
            first = d < HALF
            i = tl.where(first, d, d - HALF)
            partner = tl.where(first, d + HALF, d - HALF)
        else:
            first = (d % 2) == 0
            i = d // 2
            partner = tl.where(first, d + 1, d - 1)
        rot = d < ROT
        i = tl.where(rot, i, 0)
        partner = tl.where(rot, partner, d)
        p = tl.load(src + partner, mask=ok & rot, other=0).to(tl.float32)
        if NORM:
            p = (p * rstd * tl.load(w_ptr + partner, mask=ok & rot, other=0).to(tl.float32)).to(DT).to(tl.float32)
        c = tl.load(cos_ptr + pos * HALF + i, mask=ok & rot, other=1.0)
        s = tl.load(sin_ptr + pos * HALF + i, mask=ok & rot, other=0.0)
        out = tl.where(first, y * c - p * s, y * c + p * s)
        tl.store(dst + d, tl.where(rot, out, y).to(DT), mask=ok)

    @triton.jit
    def _rope_kernel(x_ptr, pos_ptr, cos_ptr, sin_ptr, y_ptr, H, D, s_t, s_h, ROT: tl.constexpr,
                     NEOX: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False):
        pdl_enter(PDL)
        t = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        pos = tl.load(pos_ptr + t).to(tl.int64)
        _norm_rope_row(x_ptr + t * s_t + h * s_h, x_ptr, y_ptr + (t * H + h) * D, pos, cos_ptr, sin_ptr, D, 0.0, ROT,
                       NEOX, BLOCK_D, False)


def rope(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot_dim: int,
         neox: bool) -> torch.Tensor | None:
    """x [T, heads, D] (unit stride along D; token and head strides free) rotated at `positions` [T] with the
    fp32 tables cos / sin [P, rot_dim / 2]; a new contiguous tensor in x's dtype. None when the layout does
    not fit (the caller runs the reference)."""
    if (not HAVE_TRITON or x.dim() != 3 or x.stride(2) != 1 or rot_dim % 2 or rot_dim > x.shape[2]
            or not (cos.is_contiguous() and sin.is_contiguous()) or cos.shape[1] * 2 != rot_dim
            or positions.dim() != 1 or positions.shape[0] != x.shape[0]):
        return None
    T, H, D = x.shape
    y = torch.empty((T, H, D), device=x.device, dtype=x.dtype)
    if T == 0:
        return y
    _rope_kernel[(T, H)](x, positions, cos, sin, y, H, D, x.stride(0), x.stride(1), ROT=rot_dim, NEOX=neox,
                         BLOCK_D=triton.next_power_of_2(D), num_warps=1 if D <= 128 else 2,
                         **launch_options(x.device, _rope_kernel))
    return y


# ---------------------------------------------------------------------------------------------------
# An attention layer's per-head q / k norms (qwen3, qwen35; none for qwen2 / llama), rotary embedding and KV-cache
# write in one kernel. Apart, they are six launches a layer (two RMSNorms, two rotary kernels, two index_copy_
# writes): 96 of a 27B decode step's ~900.
# Program (t, j): j < H normalizes and rotates query head j of token t into q_out; j >= H does key head j - H and
# writes it, with value head j - H copied, to cache row slots[t]. The values are the separate kernels' to fp32
# rounding: each norm result is rounded to the output dtype before it is rotated, as the rotary kernel reads it.
# ---------------------------------------------------------------------------------------------------
if HAVE_TRITON:

    @triton.jit
    def _qk_norm_rope_kernel(q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, pos_ptr, slot_ptr, cos_ptr, sin_ptr,
                             qo_ptr, kc_ptr, vc_ptr, H, D, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_c, eps,
                             ROT: tl.constexpr, NEOX: tl.constexpr, BLOCK_D: tl.constexpr, NORM: tl.constexpr,
                             PDL: tl.constexpr = False):
        pdl_enter(PDL)
        t = tl.program_id(0).to(tl.int64)
        j = tl.program_id(1)
        pos = tl.load(pos_ptr + t).to(tl.int64)
        if j < H:
            _norm_rope_row(q_ptr + t * s_qt + j * s_qh, qw_ptr, qo_ptr + (t * H + j) * D, pos, cos_ptr, sin_ptr,
                           D, eps, ROT, NEOX, BLOCK_D, NORM)
        else:
            h = j - H
            row = tl.load(slot_ptr + t).to(tl.int64) * s_c + h * D
            _norm_rope_row(k_ptr + t * s_kt + h * s_kh, kw_ptr, kc_ptr + row, pos, cos_ptr, sin_ptr, D, eps, ROT,
                           NEOX, BLOCK_D, NORM)
            d = tl.arange(0, BLOCK_D)
            v = tl.load(v_ptr + t * s_vt + h * s_vh + d, mask=d < D, other=0)
            tl.store(vc_ptr + row + d, v.to(vc_ptr.dtype.element_ty), mask=d < D)


def qk_norm_rope_write(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor | None,
                       k_weight: torch.Tensor | None, eps: float, positions: torch.Tensor, slots: torch.Tensor,
                       cos: torch.Tensor, sin: torch.Tensor, rot_dim: int, neox: bool, k_rows: torch.Tensor,
                       v_rows: torch.Tensor) -> torch.Tensor | None:
    """q [T, H, D], k / v [T, Hk, D] (unit stride along D; token and head strides free): returns rope(rms_norm(q) *
    q_weight) as a new contiguous [T, H, D] tensor, and writes rope(rms_norm(k) * k_weight) and v to rows `slots`
    of k_rows / v_rows ([capacity, Hk, D], rows contiguous), in one kernel; without the weights (None), no norms.
    None when the layout does not fit (the caller then runs the norms, the rotary kernel and the cache write
    apart)."""
    if not HAVE_TRITON or q.dim() != 3 or k.dim() != 3 or v.shape != k.shape:
        return None
    T, H, D = q.shape
    hk = k.shape[1]
    norm = q_weight is not None
    if norm and (k_weight is None or not (q_weight.is_contiguous() and k_weight.is_contiguous())
                 or q_weight.numel() != D or k_weight.numel() != D):
        return None
    if (k.shape[0] != T or k.shape[2] != D or any(t.stride(2) != 1 for t in (q, k, v))
            or rot_dim % 2 or rot_dim > D or cos.shape[1] * 2 != rot_dim
            or not (cos.is_contiguous() and sin.is_contiguous())
            or k.dtype != q.dtype or v.dtype != q.dtype or k_rows.dtype != q.dtype or v_rows.dtype != q.dtype
            or tuple(k_rows.shape[1:]) != (hk, D) or v_rows.shape != k_rows.shape
            or k_rows.stride(2) != 1 or k_rows.stride(1) != D or v_rows.stride() != k_rows.stride()
            or positions.shape != (T,) or slots.shape != (T,)):
        return None
    qo = torch.empty((T, H, D), device=q.device, dtype=q.dtype)
    if T == 0:
        return qo
    qw, kw = (q_weight, k_weight) if norm else (q, q)               # not read without norms
    _qk_norm_rope_kernel[(T, H + hk)](q, k, v, qw, kw, positions, slots, cos, sin, qo, k_rows, v_rows, H, D,
                                      q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                                      k_rows.stride(0), eps, ROT=rot_dim, NEOX=neox,
                                      BLOCK_D=triton.next_power_of_2(D), NORM=norm, num_warps=1 if D <= 128 else 2,
                                      **launch_options(q.device, _qk_norm_rope_kernel))
    return qo
