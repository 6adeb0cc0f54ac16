"""RMSNorm as one Triton kernel (CUDA): y = x * rsqrt(mean(x^2) + eps) * weight [* silu(gate)], fp32 inside;
optionally with the residual add in front (s = x + r in x's dtype, stored, then normalized); and silu(g) * u,
the SwiGLU product, as one kernel.

The PyTorch reference is `models.layers.rms_norm`'s own code path (used on CPU, under autograd, and for
layouts this kernel does not take); in eager PyTorch the same norm is 6-8 kernels (cast, square, mean,
add, rsqrt, two multiplies, cast back), which the decode step pays about 200 times per token on the 27B
shape. Rows are independent, so a row's result does not depend on how many rows come with it.

With `int8=True` (a one-token decode step) the norms and silu_mul also round their output to the decode GEMV's
int8 activations (`quant.kernels._quant_x_tile`, on the output tile still in registers: the codes `quantize_x` would
make of the stored output, exactly) and hang them on the output tensor as `int8_rows`: the GEMVs that read it need
no quantization kernel of their own. With `pairs=True` (a verify step of 2..64 tokens: models.layers.feeds) they
also store their output in the small-M kernels' K orders (the dot kernel's two `pair_order` layouts and the Gluon
kernel's two; `quant.kernels._pair_store`; the dot kernel's only where a verify matmul may run it), hung on it as
`pair_rows`: the small-M matmuls that read it then load their x tiles as contiguous runs.
"""
from __future__ import annotations

import os

import torch

from . import HAVE_TRITON, tl, triton  # noqa: F401 - without triton: the reference in models/layers.py
from .pdl import launch_options, pdl_enter
from ..quant.kernels import (INT8_ATTR, PAIRS_ATTR, Int8Rows, PairRows, _pair_store, _quant_x_tile,
                             dot_pairs_needed)

# DFLASH24_NORM_INT8=0: the norms never make int8 activations (each GEMV then rounds its x itself, one more launch).
# Measured on an H200 (synthetic 27B Q4_K_M, 24 GiB emulated, 2026-12-02): without programmatic dependent launch, as
# on the 24 GB cards this engine is for (sm_86 / sm_89 have none), the decode step 7.179 -> 6.933 ms (138.7 -> 143.7
# tok/s); with it (sm_90, kernels/pdl.py), where the small launches already overlap, 6.472 / 6.477 ms: the same.
INT8 = os.environ.get("DFLASH24_NORM_INT8", "1") != "0"
# DFLASH24_NORM_PAIRS=0: the norms never write the pair-order copies (each small-M matmul then permutes x in registers).
PAIRS = os.environ.get("DFLASH24_NORM_PAIRS", "1") != "0"
# Every launch without FMA contraction: the int8 codes then equal quantize_x's exactly, and the output is the same
# bits with and without them.
_NO_FMA = {"enable_fp_fusion": False}

# Columns a program writes of a one-token (decode) row (_tile; 0: one program a row). Each program still reads the
# whole row for its mean square, so the output is the same bits either way. On an H200 (2026-12-03 00:55,
# `gpu_pending.sh part52`): a residual add + norm + int8 activations of a 5120 row alone 3.93 us with one program,
# 2.20 / 2.18 / 2.14 / 2.02 us with COLS 128 / 256 / 512 / 1024; the synthetic 27B Q4_K_M decode step (24 GiB
# emulated) 6.419 ms with 0, 6.164 with 256, 6.160 with 512.
# 1024 since 2026-12-06 (H100, `ab_steps.py`, one process: the 27B AR step 6.840-6.845 ms with 512, 6.831-6.837
# with 1024, 6.929-6.930 with 2048).
COLS = int(os.environ.get("DFLASH24_NORM_COLS", "1024"))
# Columns a program of a verify step's rows (2..COLS_ROWS). Whole rows a program put 16 programs on 16 SMs for a
# 16-token verify, each writing its row five times (the output and its four pair orders; 6.75 us a norm on the
# synthetic 27B, 1.19 of its 10.69 ms of kernels: `profile_steps.py`, 2026-12-04). Each program reads its rows whole
# for their mean square, so fewer, wider programs read less: on an H100 (2026-12-06, `ab_steps.py`, one process, ms)
# the 16-token verify 10.15-10.16 with 512 columns, 10.07-10.10 with 1024, 9.98 with 2048; the 23-node tree verify
# 12.47-12.49, 12.46-12.47, 12.45.
VERIFY_COLS = int(os.environ.get("DFLASH24_NORM_VERIFY_COLS", "2048"))
# Up to this many rows a norm's rows are split into columns (COLS / VERIFY_COLS); longer inputs (prefill) keep whole
# rows a program. 1: a decode row only; 0: never.
COLS_ROWS = int(os.environ.get("DFLASH24_NORM_COLS_ROWS", "64"))

MAX_DIM = 16384          # one row per tile: wider rows take the reference path
# Columns a program of silu_mul (a multiple of 32: whole int8 blocks); 256 and 512 timed within 0.01 ms of it in the
# 27B steps (H100, 2026-12-06, `ab_steps.py` silu256 / silu512).
SILU_BLOCK = 1024
# Rows a norm program at most (short rows: the gated norm's heads of 128 values). 4 since 2026-12-06 (H100,
# `ab_steps.py`, one process, ms, 16 -> 4): the 27B AR step 6.833-6.836 -> 6.797-6.799 (a decode step's 48 heads in
# 12 programs instead of 3), the 16-token verify 10.01-10.03 -> 9.91-9.92, the 23-node tree verify 12.53-12.54 ->
# 12.44-12.45; 1 row a program: 6.798 / 9.93 / 12.42-12.47.
ROWS = 4

if HAVE_TRITON:

    @triton.jit
    def _norm_input(x_ptr, r_ptr, r64, cols, m, stride_x, stride_r, HAS_RES: tl.constexpr, DT: tl.constexpr):
        """The values the norm reads at rows r64 (BR, 1) and columns cols (1, BC), fp32: x, or x + r rounded to DT
        (x's dtype, as the eager add)."""
        x = tl.load(x_ptr + r64 * stride_x + cols, mask=m, other=0)
        if HAS_RES:
            x = (x.to(tl.float32) + tl.load(r_ptr + r64 * stride_r + cols, mask=m, other=0).to(tl.float32)).to(DT)
        return x.to(tl.float32)

    @triton.jit
    def _rms_norm_kernel(x_ptr, w_ptr, g_ptr, y_ptr, r_ptr, s_ptr, R, D, stride_x, stride_g, stride_r, eps,
                         xw_ptr, xw6_ptr, dx_ptr, xs_ptr, pa_ptr, pb_ptr, pg_ptr, pg16_ptr, GH, stride_gh,
                         HAS_W: tl.constexpr, HAS_GATE: tl.constexpr, HAS_RES: tl.constexpr,
                         BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, INT8: tl.constexpr = False,
                         PAIRS: tl.constexpr = False, COLS: tl.constexpr = 0, DOT_PAIRS: tl.constexpr = True,
                         PDL: tl.constexpr = False):
        """BLOCK_R whole rows a program. COLS > 0: the program reads its rows whole for their mean square (the same
        sum, in the same order) but writes only columns program_id(1) COLS .. + COLS - 1: a one-token decode row
        spread over several SMs instead of one. The gate's row r is at (r // GH) stride_g + (r % GH) stride_gh: GH rows
        (heads) a token, so a gate whose tokens are rows of a wider matrix needs no copy (GH 1: plain rows)."""
        pdl_enter(PDL)
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        c = tl.arange(0, BLOCK_D)
        m = (r < R)[:, None] & (c < D)[None, :]
        r64 = r[:, None].to(tl.int64)
        x = _norm_input(x_ptr, r_ptr, r64, c[None, :], m, stride_x, stride_r, HAS_RES, s_ptr.dtype.element_ty)
        ms = tl.sum(x * x, axis=1) / D
        if COLS == 0:
            co = c
            mo = m
        else:           # this program's columns, read again (cache hits) and rounded as above
            co = tl.program_id(1) * COLS + tl.arange(0, COLS)
            mo = (r < R)[:, None] & (co < D)[None, :]
            x = _norm_input(x_ptr, r_ptr, r64, co[None, :], mo, stride_x, stride_r, HAS_RES, s_ptr.dtype.element_ty)
        if HAS_RES:     # s = x + r rounded to x's dtype (as the eager add), stored; the norm reads s
            tl.store(s_ptr + r64 * D + co[None, :], x.to(s_ptr.dtype.element_ty), mask=mo)
        y = x * (1.0 / tl.sqrt_rn(ms + eps))[:, None]
        if HAS_W:
            y = y * tl.load(w_ptr + co, mask=co < D, other=0).to(tl.float32)[None, :]
        if HAS_GATE:
            g = tl.load(g_ptr + (r64 // GH) * stride_g + (r64 % GH) * stride_gh + co[None, :], mask=mo,
                        other=0).to(tl.float32)
            y = y * (g / (1.0 + tl.exp(-g)))
        y = y.to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + r64 * D + co[None, :], y, mask=mo)
        if PAIRS:        # the same values in both pair orders (the rows are contiguous: flat index r D + c < 2^31)
            _pair_store(y, r[:, None] * D + co[None, :], mo, pa_ptr, pb_ptr, pg_ptr, pg16_ptr, DOT_PAIRS)
        if INT8:         # the stored values as int8 activations, from registers (D % 32 == 0: whole blocks a row)
            W: tl.constexpr = BLOCK_D if COLS == 0 else COLS
            RB: tl.constexpr = W // 32                                     # blocks a tile row
            t = tl.arange(0, BLOCK_R * RB)
            rr = tl.program_id(0) * BLOCK_R + t // RB
            cb = tl.program_id(1) * RB + t % RB
            _quant_x_tile(tl.reshape(y.to(tl.float32), (BLOCK_R * RB, 32)), rr * (D // 32) + cb,
                          (rr < R) & (cb < D // 32), xw_ptr, xw6_ptr, dx_ptr, xs_ptr, 2)


def _int8_rows(y: torch.Tensor, int8: bool) -> Int8Rows | None:
    """Buffers for y's int8 activations when asked for and y's rows are whole 32-value blocks, else None."""
    return Int8Rows.empty(y.numel(), y.device) if int8 and y.shape[-1] % 32 == 0 else None


def _pair_rows(y: torch.Tensor, pairs: bool) -> PairRows | None:
    """Buffers for y in pair order when asked for, y is bf16 (the dot kernel's pairs are bf16) and its values are
    whole 256-value steps (fewer than 2^31: the kernels index them in 32 bits), else None. The dot kernel's two
    orders only where a verify matmul may run it (`kernels.dot_pairs_needed`)."""
    ok = pairs and PAIRS and y.dtype == torch.bfloat16 and y.numel() % 256 == 0 and y.numel() < 2**31
    return PairRows.empty(y.numel(), y.device, dot=dot_pairs_needed(y.device)) if ok else None


def _row_args(rows: Int8Rows | None, pairs: PairRows | None, y: torch.Tensor) -> tuple:
    """The kernels' int8 and pair-order pointer arguments (y itself where there are none: never touched)."""
    return (*(tuple(rows) if rows is not None else (y, y, y, y)),
            *(tuple(t if t is not None else y for t in pairs) if pairs is not None else (y, y, y, y)))


def _pair_kw(pairs: PairRows | None) -> dict:
    """The kernels' PAIRS / DOT_PAIRS constants for these pair rows."""
    return dict(PAIRS=pairs is not None, DOT_PAIRS=pairs is not None and pairs.a is not None)


def _hang(y: torch.Tensor, rows: Int8Rows | None, pairs: PairRows | None = None) -> torch.Tensor:
    if rows is not None:
        setattr(y, INT8_ATTR, rows)
    if pairs is not None:
        setattr(y, PAIRS_ATTR, pairs)
    return y


def _rows(t: torch.Tensor, d: int) -> torch.Tensor | None:
    """t as (rows, d) with unit stride along d: a view where one exists, else a contiguous copy; None when t's last
    dim is strided."""
    if t.stride(-1) != 1:
        return None
    r = t.reshape(-1, d) if t.dim() != 2 else t
    return r if r.stride(-1) == 1 and (r.shape[0] <= 1 or r.stride(0) >= d) else None


def _gate_rows(gate: torch.Tensor, d: int) -> tuple[torch.Tensor | None, int, int]:
    """(g, GH, stride_gh) of the norm kernel for a gate: a [T, heads, d] gate whose tokens are rows of a wider matrix
    (a verify step's DeltaNet z) read where it lies, row r at (r // heads) g.stride(0) + (r % heads) d; any other
    gate as _rows gives it (GH 1)."""
    if gate.dim() == 3 and gate.stride(2) == 1 and gate.stride(1) == d and gate.shape[0] > 1 \
            and gate.stride(0) != gate.shape[1] * d:
        return gate, gate.shape[1], d
    return _rows(gate, d), 1, 0


def supports(x: torch.Tensor, gate: torch.Tensor | None = None) -> bool:
    return (HAVE_TRITON and x.shape[-1] <= MAX_DIM and x.numel() > 0
            and (gate is None or gate.shape == x.shape))


def _tile(rows: int, d: int) -> tuple[tuple[int, int], dict]:
    """Grid and launch constants of _rms_norm_kernel: whole rows of d, up to ROWS rows (4096 values) a program; a
    decode row wider than 2 COLS written COLS columns a program, 2..COLS_ROWS rows (a verify step's) wider than
    2 VERIFY_COLS VERIFY_COLS a program (0: never)."""
    block_d = triton.next_power_of_2(d)
    block_r = max(1, min(ROWS, 4096 // block_d))
    cols = 0 if rows > COLS_ROWS else COLS if rows == 1 else VERIFY_COLS
    cols = cols if cols and d > 2 * cols else 0
    return ((triton.cdiv(rows, block_r), triton.cdiv(d, cols) if cols else 1),
            dict(BLOCK_R=block_r, BLOCK_D=block_d, COLS=cols, num_warps=4 if block_d * block_r <= 4096 else 8))


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, gate: torch.Tensor | None = None,
             out_dtype: torch.dtype | None = None, int8: bool = False, pairs: bool = False) -> torch.Tensor | None:
    """The fused norm of x's last dim (see module doc); returns None when the layout does not fit (the
    caller then runs the reference). int8: also the output's int8 activations, as its `int8_rows`; pairs: also
    the output in pair order, as its `pair_rows`."""
    d = x.shape[-1]
    xr = _rows(x, d)
    gr, gh, s_gh = _gate_rows(gate, d) if gate is not None else (None, 1, 0)
    if xr is None or (gate is not None and gr is None):
        return None
    if weight is not None and (weight.numel() != d or not weight.is_contiguous() or weight.device != x.device):
        return None
    y = torch.empty(x.shape, device=x.device, dtype=out_dtype or x.dtype)
    rows = xr.shape[0]
    w = weight if weight is not None else xr
    g = gr if gr is not None else xr
    grid, tile = _tile(rows, d)
    q, pr = _int8_rows(y, int8), _pair_rows(y, pairs)
    _rms_norm_kernel[grid](xr, w, g, y, xr, y, rows, d, xr.stride(0), g.stride(0), 0, eps, *_row_args(q, pr, y),
                           gh, s_gh, HAS_W=weight is not None, HAS_GATE=gate is not None, HAS_RES=False,
                           INT8=q is not None, **_pair_kw(pr), **tile, **_NO_FMA,
                           **launch_options(xr.device, _rms_norm_kernel))
    return _hang(y, q, pr)


def add_rms_norm(x: torch.Tensor, res: torch.Tensor, weight: torch.Tensor, eps: float, int8: bool = False,
                 pairs: bool = False) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(s, rms_norm(s) * weight) with s = x + res in x's dtype, in one kernel; None when a layout does not fit.
    s is what `x + res` gives in eager PyTorch (fp32 sum rounded once), so the result does not depend on it.
    int8 / pairs: also the norm's int8 activations / its pair-order copies, as in rms_norm."""
    d = x.shape[-1]
    xr, rr = _rows(x, d), _rows(res, d)
    if (xr is None or rr is None or res.shape != x.shape or res.dtype != x.dtype or weight.numel() != d
            or not weight.is_contiguous() or weight.device != x.device):
        return None
    s = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    y = torch.empty_like(s)
    rows = xr.shape[0]
    grid, tile = _tile(rows, d)
    q, pr = _int8_rows(y, int8), _pair_rows(y, pairs)
    _rms_norm_kernel[grid](xr, weight, xr, y, rr, s, rows, d, xr.stride(0), 0, rr.stride(0), eps,
                           *_row_args(q, pr, y), 1, 0, HAS_W=True, HAS_GATE=False, HAS_RES=True, INT8=q is not None,
                           **_pair_kw(pr), **tile, **_NO_FMA, **launch_options(xr.device, _rms_norm_kernel))
    return s, _hang(y, q, pr)


if HAVE_TRITON:

    @triton.jit
    def _silu_mul_kernel(g_ptr, u_ptr, y_ptr, N, s_g, s_gh, s_u, xw_ptr, xw6_ptr, dx_ptr, xs_ptr, pa_ptr, pb_ptr,
                         pg_ptr, pg16_ptr,
                         BLOCK: tl.constexpr, SIGMOID: tl.constexpr, INT8: tl.constexpr = False,
                         PAIRS: tl.constexpr = False, G_HEAD: tl.constexpr = 0, DOT_PAIRS: tl.constexpr = True,
                         PDL: tl.constexpr = False):
        """Row t, column block: y = silu(g) * u (SIGMOID: sigmoid(g) * u), each product rounded to y's dtype
        as eager PyTorch does (the activation rounded first, then the product); INT8: then its int8 activations
        (N a multiple of 32). G_HEAD > 0: g's row is heads of G_HEAD values, s_gh apart (column c of the row at
        (c // G_HEAD) s_gh + c % G_HEAD)."""
        pdl_enter(PDL)
        t = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = c < N
        gc = c if G_HEAD == 0 else (c // G_HEAD) * s_gh + c % G_HEAD
        g = tl.load(g_ptr + t * s_g + gc, mask=m, other=0).to(tl.float32)
        if SIGMOID:
            s = 1.0 / (1.0 + tl.exp(-g))
        else:
            s = g / (1.0 + tl.exp(-g))
        s = s.to(y_ptr.dtype.element_ty).to(tl.float32)
        u = tl.load(u_ptr + t * s_u + c, mask=m, other=0).to(tl.float32)
        y = (s * u).to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + t * N + c, y, mask=m)
        if PAIRS:
            _pair_store(y, tl.program_id(0) * N + c, m, pa_ptr, pb_ptr, pg_ptr, pg16_ptr, DOT_PAIRS)   # index < 2^31
        if INT8:         # the stored values as int8 activations, from registers (N % 32 == 0)
            b = tl.arange(0, BLOCK // 32)
            c0 = tl.program_id(1) * BLOCK
            _quant_x_tile(tl.reshape(y.to(tl.float32), (BLOCK // 32, 32)), (t * N + c0) // 32 + b,
                          c0 + 32 * b < N, xw_ptr, xw6_ptr, dx_ptr, xs_ptr, 2)


def silu_mul(g: torch.Tensor, u: torch.Tensor, sigmoid: bool = False, int8: bool = False, pairs: bool = False
             ) -> torch.Tensor | None:
    """silu(g) * u (sigmoid: sigmoid(g) * u) for 2-D g, u of one shape and dtype (rows may be strided:
    column slices of the fused gate/up projection) in one kernel; None when the layout does not fit. g may also
    be (T, H, Dh) with unit stride along Dh for a (T, H * Dh) u: per-head slices of a projection (the attention
    output gate, each head's half of its [q | gate] columns), read in place.
    int8 / pairs: also the product's int8 activations / its pair-order copies, as in rms_norm."""
    if u.dim() != 2 or u.stride(1) != 1 or g.dtype != u.dtype or g.stride(-1) != 1:
        return None
    if g.dim() == 3 and g.shape[0] == u.shape[0] and g.shape[1] * g.shape[2] == u.shape[1]:
        head, s_gh = g.shape[2], g.stride(1)                          # row t's heads s_gh apart
        if g.shape[1] == 1 or s_gh == head:
            head = 0                                                   # the heads are one run of columns
    elif g.dim() == 2 and g.shape == u.shape:
        head, s_gh = 0, 0
    else:
        return None
    T, N = u.shape
    y = torch.empty(T, N, device=g.device, dtype=g.dtype)
    block = min(SILU_BLOCK, triton.next_power_of_2(N))
    q, pr = _int8_rows(y, int8), _pair_rows(y, pairs)
    _silu_mul_kernel[(T, triton.cdiv(N, block))](g, u, y, N, g.stride(0), s_gh, u.stride(0), *_row_args(q, pr, y),
                                                 BLOCK=block, SIGMOID=sigmoid, INT8=q is not None,
                                                 **_pair_kw(pr), G_HEAD=head, num_warps=4, **_NO_FMA,
                                                 **launch_options(g.device, _silu_mul_kernel))
    return _hang(y, q, pr)
