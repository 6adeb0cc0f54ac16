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
    def _rope_kernel(x_ptr, pos_ptr, cos_ptr, sin_ptr, y_ptr, H, D, s_t, s_h, ROT: tl.constexpr,
                     NEOX: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False):
        pdl_enter(PDL)
        t = tl.program_id(0)
        h = tl.program_id(1)
        d = tl.arange(0, BLOCK_D)
        ok = d < D
        row = x_ptr + t.to(tl.int64) * s_t + h * s_h
        x = tl.load(row + d, mask=ok, other=0).to(tl.float32)
        HALF: tl.constexpr = ROT // 2
        if NEOX:
            first = d < HALF
            i = tl.where(first, d, d - HALF)                   # frequency index
            partner = tl.where(first, d + HALF, d - HALF)
        else:
            first = (d % 2) == 0
            i = d // 2
            partner = tl.where(first, d + 1, d - 1)
        rot = d < ROT
        i = tl.where(rot, i, 0)
        p = tl.load(row + tl.where(rot, partner, d), mask=ok & rot, other=0).to(tl.float32)
        pos = tl.load(pos_ptr + t).to(tl.int64)
        c = tl.load(cos_ptr + pos * HALF + i, mask=ok & rot, other=1.0)
        s = tl.load(sin_ptr + pos * HALF + i, mask=ok & rot, other=0.0)
        y = tl.where(first, x * c - p * s, x * c + p * s)
        y = tl.where(rot, y, x)
        tl.store(y_ptr + (t.to(tl.int64) * H + h) * D + d, y.to(y_ptr.dtype.element_ty), mask=ok)


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
                         BLOCK_D=triton.next_power_of_2(D), num_warps=1 if D <= 128 else 2, **launch_options(x.device))
    return y
