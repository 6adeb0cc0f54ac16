"""Where the small-M tl.dot path's time goes: the shipped kernel's loop with one stage left out, timed on a GPU.

    python benchmarks/probe_dot.py [--types Q4_K,Q6_K] [--m 16]

The stages are found by difference (time of the loop without the
stage). Modes of `_probe_kernel` (same tiles, launch config and split-K as `kernels.dot_config`):
  full      loads + decode + 8 per-field dots (the shipped loop, re-stated; checked equal to it)
  no_dot    loads + decode, each decoded field summed into the accumulator (no layout change, no MMA)
  no_decode loads + one cast per field + the 8 dots (decode work left out)
  loads     the word / scale tiles only (summed so they are not dead code)
  joined    loads + decode + ONE dot per step of K = 8 * KF (fields interleaved by tl.join), x columns permuted
  packed    4-bit types: decode with packed bf16x2 ops (inline PTX: per word 3 shifts, 4 lop3 that OR each
            pair of nibbles into the mantissas of bf16 128 + c, 4 fma that subtract 128, 4 fma by the block's
            scale and offset rounded to bf16): about 2 instructions per weight where the fp32 decode takes ~4
  x_once    x of a whole step loaded as one (BM, 256) tile and split into the 8 fields' operands (tl.split),
            the scale fields loaded beside the word tile instead of through _load_tile
  prefetch  x_once with x and the scale fields of the NEXT step loaded into registers during this one
  x_first   the 8 fields' x operands loaded first in the step, as 8 separate loads issued together (the shipped
            loop loads each just before its dot, behind the previous dot's layout-conversion barriers)
  x_ahead   the same 8 loads for the NEXT step, issued after this step's tile loads and before its dots
  all_ahead x_ahead, and the scale fields of the next step loaded with it (as in prefetch)
  lean      the shipped step with no index vector rebuilt inside the loop: x pointers and masks are loop-invariant
            tiles plus a scalar (22 -> 4 layout conversions per step in triton 3.9's TTGIR, but the same PTX:
            those conversions lower to register moves; benchmarks/ttgir_counts.py)
  lean3     lean, and the scale fields loaded as (BN, G, 1) tiles through the word tile's own row / block
            indices instead of 2-D tiles (fewer barriers, but the word tile then lands in a blocked layout and
            every decoded field takes a shared-memory round trip to the MMA)
  hoist     the word tile and each block's A, B as (BN, KF) 2-D tiles once per step, each field decoded
            elementwise from them, to see whether Triton then moves the words (not 8 bf16 tiles) to the MMA
            layout: it does not (triton 3.9, sm_90: the same PTX as lean; ttgir_counts.py). In the shipped
            kernel's W_AS_A orientation the word tile is loaded in a layout that decodes straight into the
            wgmma's register operand (no shared memory for the weights): not timed yet (gpu_pending part16)
  trange    the shipped step in `tl.range(..., num_stages=S)` (the GEMV's loop form) instead of `range` with the
            launch's num_stages; loads_trange: the loads mode's step so (S: --stages, each timed)
`--per-sweep`: also time the shipped kernel and x_ahead at every split of K (blocks per program), to see what the
grid's last partial wave costs.
Output: one JSON line per (type, shape) with us per mode, the ratio to the M = 1 GEMV of the same weight, and
per mode the compiled kernel's registers, spills, cp.async copies and synchronous loads (counted in its TTGIR).
`--once`: run the GEMV, the shipped dot kernel and each mode once on the first shape, no timing, for a profiler:
    ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \
        python benchmarks/probe_dot.py --types Q4_K --once
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf import GGMLQuantizationType as QT  # noqa: E402

from bench_gemv import packed_copies, time_graph  # noqa: E402
from dflash24.quant import kernels as K  # noqa: E402
from dflash24.quant.packed import GEOMETRY  # noqa: E402

SHAPES = [(17408, 5120), (5120, 17408), (12288, 5120)]
MODES = {"full": 0, "no_dot": 1, "no_decode": 2, "loads": 3, "joined": 4, "packed": 5, "x_once": 6,
         "prefetch": 7, "x_first": 8, "x_ahead": 9, "all_ahead": 10, "trange": 11, "loads_trange": 12,
         "lean": 13, "lean3": 14, "hoist": 15}


@triton.jit
def _split8(x5):
    """(..., 2, 2, 2) with field f = 4 i0 + 2 i1 + i2 -> the 8 fields, in order."""
    e, o = tl.split(x5)
    e0, e1 = tl.split(e)
    o0, o1 = tl.split(o)
    f0, f4 = tl.split(e0)
    f2, f6 = tl.split(e1)
    f1, f5 = tl.split(o0)
    f3, f7 = tl.split(o1)
    return f0, f1, f2, f3, f4, f5, f6, f7


@triton.jit
def _x_step(xm, m_ok, bb, b1, c5, BS: tl.constexpr, WPB: tl.constexpr):
    """x of one step as (BM, KF, 2, 2, 2): column c of field f = 4 i0 + 2 i1 + i2 at (m, c, i0, i1, i2)."""
    cb = c5 // WPB
    kb = bb + cb
    f = 4 * tl.arange(0, 2)[None, None, :, None, None] + 2 * tl.arange(0, 2)[None, None, None, :, None] \
        + tl.arange(0, 2)[None, None, None, None, :]
    return tl.load(xm[:, :, None, None, None] + kb * BS + f * WPB + c5 % WPB,
                   mask=m_ok[:, None, None, None, None] & (kb < b1), other=0)


@triton.jit
def _x_fields(xm, m_ok, bb, b1, cb, cw, BS: tl.constexpr, WPB: tl.constexpr):
    """The 8 fields' x operands (BM, KF) of the step at block bb, as 8 separate loads issued together."""
    kb = bb + cb
    msk = m_ok[:, None] & (kb < b1)[None, :]
    p = xm + (kb * BS + cw)[None, :]
    return (tl.load(p, mask=msk, other=0), tl.load(p + WPB, mask=msk, other=0),
            tl.load(p + 2 * WPB, mask=msk, other=0), tl.load(p + 3 * WPB, mask=msk, other=0),
            tl.load(p + 4 * WPB, mask=msk, other=0), tl.load(p + 5 * WPB, mask=msk, other=0),
            tl.load(p + 6 * WPB, mask=msk, other=0), tl.load(p + 7 * WPB, mask=msk, other=0))


@triton.jit
def _decode4_packed(words, a, b):
    """4-bit fields of int32 words as bf16 c * a + b (a, b bf16, broadcast): a tuple of the 8 fields."""
    return tl.inline_asm_elementwise(
        """{
        .reg .b32 t1, t2, t3, p0, p1, p2, p3, ab, bb, m, mg, one, neg;
        mov.b32 ab, {$9, $9};
        mov.b32 bb, {$10, $10};
        mov.b32 m, 0x000F000F;
        mov.b32 mg, 0x43004300;
        mov.b32 one, 0x3F803F80;
        mov.b32 neg, 0xC300C300;
        shr.b32 t1, $8, 4;
        shr.b32 t2, $8, 8;
        shr.b32 t3, $8, 12;
        lop3.b32 p0, $8, m, mg, 0xEA;
        lop3.b32 p1, t1, m, mg, 0xEA;
        lop3.b32 p2, t2, m, mg, 0xEA;
        lop3.b32 p3, t3, m, mg, 0xEA;
        fma.rn.bf16x2 p0, p0, one, neg;
        fma.rn.bf16x2 p1, p1, one, neg;
        fma.rn.bf16x2 p2, p2, one, neg;
        fma.rn.bf16x2 p3, p3, one, neg;
        fma.rn.bf16x2 p0, p0, ab, bb;
        fma.rn.bf16x2 p1, p1, ab, bb;
        fma.rn.bf16x2 p2, p2, ab, bb;
        fma.rn.bf16x2 p3, p3, ab, bb;
        mov.b32 {$0, $4}, p0;
        mov.b32 {$1, $5}, p1;
        mov.b32 {$2, $6}, p2;
        mov.b32 {$3, $7}, p3;
        }""",
        "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h", [words, a, b], dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)


@triton.jit
def _join8(f0, f1, f2, f3, f4, f5, f6, f7):
    """(..., ) x 8 -> (..., 2, 2, 2): index (a, b, c) holds field a + 2 b + 4 c."""
    return tl.join(tl.join(tl.join(f0, f1), tl.join(f2, f3)), tl.join(tl.join(f4, f5), tl.join(f6, f7)))


@triton.jit
def _load_tile3(qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, r, blk, wi, bm, s_qs, s_qh, s_sc, s_d,
                QTYPE: tl.constexpr, WPB: tl.constexpr):
    """kernels._load_tile with the scale fields loaded as (BN, G, 1) tiles through the same row / block index
    tensors as the word tile (no reshape to 2-D, so no layout conversion between them): words, hi, A, B."""
    words, hi = K._load_words(qs_ptr, qh_ptr, r, blk, wi, bm, s_qs, s_qh, QTYPE, WPB)
    d, dmin, sc, mn = K._load_scales(sc_ptr, mn_ptr, d_ptr, dm_ptr, r, blk, bm, s_sc, s_d, QTYPE)
    a, b = K._affine(d, dmin, sc, mn, QTYPE)
    return words, hi, a, b


@triton.jit
def _step(acc, bb, b1, r, gi, wi, cb, cw, xm, m_ok, qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr,
          s_qs, s_qh, s_sc, s_d, QTYPE: tl.constexpr, BS: tl.constexpr, FPW: tl.constexpr, WPB: tl.constexpr,
          BLOCK_N: tl.constexpr, KF: tl.constexpr, LOADS_ONLY: tl.constexpr):
    """One step of the shipped loop (LOADS_ONLY: the loads mode's step), for the tl.range modes."""
    blk = bb + gi
    bm = blk < b1
    words, hi, a, b = K._load_tile(qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, r, blk, wi, bm,
                                   s_qs, s_qh, s_sc, s_d, QTYPE, BS, WPB)
    if LOADS_ONLY:
        acc += (tl.sum(tl.sum(words + hi, axis=2), axis=1).to(tl.float32) + tl.sum(a + b, axis=1))[None, :]
    else:
        a3 = a[:, :, None]
        b3 = b[:, :, None]
        kb = bb + cb
        xmask = m_ok[:, None] & (kb < b1)[None, :]
        for f in tl.static_range(FPW):
            w = tl.reshape(K._field(words, hi, f, QTYPE) * a3 + b3, (BLOCK_N, KF)).to(xm.dtype.element_ty)
            xv = tl.load(xm + (kb * BS + f * WPB + cw)[None, :], mask=xmask, other=0)
            acc = tl.dot(xv, tl.trans(w), acc)
    return acc


@triton.jit
def _probe_kernel(x_ptr, y_ptr, qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr,
                  M, N, NBLK, s_xm, s_qs, s_qh, s_sc, s_d, blocks_per_split,
                  QTYPE: tl.constexpr, BS: tl.constexpr, FPW: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr, MODE: tl.constexpr,
                  STAGES: tl.constexpr):
    WPB: tl.constexpr = BS // FPW
    KF: tl.constexpr = G * WPB
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < M
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    rows = tl.where(row_ok, rows, N - 1)
    r = rows[:, None, None].to(tl.int64)
    gi = tl.arange(0, G)[None, :, None]
    wi = tl.arange(0, WPB)[None, None, :]
    c = tl.arange(0, KF)
    cb = c // WPB
    cw = c % WPB
    # joined mode: column j of the (BN, 8 KF) tile is (block g, word w, a, b, c) -> field a + 2b + 4c
    j = tl.arange(0, 8 * KF)
    jf = (j // 4) % 2 + 2 * ((j // 2) % 2) + 4 * (j % 2)
    jw = (j // 8) % WPB
    jb = j // (8 * WPB)
    xm = x_ptr + offs_m[:, None].to(tl.int64) * s_xm
    b0 = pid_k * blocks_per_split
    b1 = tl.minimum(b0 + blocks_per_split, NBLK)
    DT: tl.constexpr = x_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    c5 = tl.arange(0, KF)[None, :, None, None, None]
    r2 = tl.reshape(r, (BLOCK_N, 1))
    g2 = tl.reshape(gi, (1, G))
    if MODE == 7:       # x and the scale fields one step ahead, in registers
        x_next = _x_step(xm, m_ok, b0, b1, c5, BS, WPB)
        s_next = K._load_scales(sc_ptr, mn_ptr, d_ptr, dm_ptr, r2, b0 + g2, b0 + g2 < b1, s_sc, s_d, QTYPE)
    if MODE == 9 or MODE == 10:       # the 8 x operands (all_ahead: and the scale fields) one step ahead
        xs_next = _x_fields(xm, m_ok, b0, b1, cb, cw, BS, WPB)
    if MODE == 10:
        s_next = K._load_scales(sc_ptr, mn_ptr, d_ptr, dm_ptr, r2, b0 + g2, b0 + g2 < b1, s_sc, s_d, QTYPE)
    LEAN_SCALES: tl.constexpr = MODE == 14
    if MODE == 13 or MODE == 14:      # lean: no index vector is rebuilt in the loop (x pointers and masks are
        # loop-invariant tiles plus a scalar); lean3 also loads the scale fields in the word tile's (BN, G, 1) shape
        xoff = xm + (cb * BS + cw)[None, :]
        cb2 = cb[None, :]
        gi1 = tl.reshape(gi, (1, G, 1))
        wi1 = tl.reshape(wi, (1, 1, WPB))
        for bb in range(b0, b1, G):
            bm = gi1 < b1 - bb
            if LEAN_SCALES:
                words, hi, a3, b3 = _load_tile3(qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, r, bb + gi1, wi1, bm,
                                                s_qs, s_qh, s_sc, s_d, QTYPE, WPB)
            else:
                words, hi, a, b = K._load_tile(qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, r, bb + gi, wi,
                                               bb + gi < b1, s_qs, s_qh, s_sc, s_d, QTYPE, BS, WPB)
                a3 = a[:, :, None]
                b3 = b[:, :, None]
            xmask = m_ok[:, None] & (cb2 < b1 - bb)
            for f in tl.static_range(FPW):
                w = tl.reshape(K._field(words, hi, f, QTYPE) * a3 + b3, (BLOCK_N, KF)).to(DT)
                xv = tl.load(xoff + (bb * BS + f * WPB), mask=xmask, other=0)
                acc = tl.dot(xv, tl.trans(w), acc)
    if MODE == 15:      # hoist: the word tile and A, B as (BN, KF) 2-D tiles once per step, every field's decode
        # elementwise on them (no reshape between a field's decode and its dot)
        xoff = xm + (cb * BS + cw)[None, :]
        cb2 = cb[None, :]
        for bb in range(b0, b1, G):
            words, hi, a, b = K._load_tile(qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, r, bb + gi, wi,
                                           bb + gi < b1, s_qs, s_qh, s_sc, s_d, QTYPE, BS, WPB)
            w2 = tl.reshape(words, (BLOCK_N, KF))
            h2 = tl.reshape(hi, (BLOCK_N, KF))
            a2 = tl.reshape(tl.broadcast_to(a[:, :, None], (BLOCK_N, G, WPB)), (BLOCK_N, KF))
            b2 = tl.reshape(tl.broadcast_to(b[:, :, None], (BLOCK_N, G, WPB)), (BLOCK_N, KF))
            xmask = m_ok[:, None] & (cb2 < b1 - bb)
            for f in tl.static_range(FPW):
                w = (K._field(w2, h2, f, QTYPE) * a2 + b2).to(DT)
                xv = tl.load(xoff + (bb * BS + f * WPB), mask=xmask, other=0)
                acc = tl.dot(xv, tl.trans(w), acc)
    if MODE == 11 or MODE == 12:      # the loop as tl.range with explicit stages (the GEMV's form)
        for bb in tl.range(b0, b1, G, num_stages=STAGES):
            acc = _step(acc, bb, b1, r, gi, wi, cb, cw, xm, m_ok, qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr,
                        s_qs, s_qh, s_sc, s_d, QTYPE, BS, FPW, WPB, BLOCK_N, KF, MODE == 12)
    if MODE < 11:       # the other modes (a loop the tl.range / lean modes do not compile)
        for bb in range(b0, b1, G):
            if MODE >= 8:
                if MODE == 8:
                    xs = _x_fields(xm, m_ok, bb, b1, cb, cw, BS, WPB)
                else:
                    xs = xs_next
                blk = bb + gi
                bm = blk < b1
                if MODE == 10:
                    d, dmin, sc, mn = s_next
                    words, hi = K._load_words(qs_ptr, qh_ptr, r, blk, wi, bm, s_qs, s_qh, QTYPE, WPB)
                    s_next = K._load_scales(sc_ptr, mn_ptr, d_ptr, dm_ptr, r2, bb + G + g2, bb + G + g2 < b1,
                                            s_sc, s_d, QTYPE)
                    a, b = K._affine(d, dmin, sc, mn, QTYPE)
                else:
                    words, hi, a, b = K._load_tile(qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, r, blk, wi, bm,
                                                   s_qs, s_qh, s_sc, s_d, QTYPE, BS, WPB)
                if MODE >= 9:
                    xs_next = _x_fields(xm, m_ok, bb + G, b1, cb, cw, BS, WPB)
                a3 = a[:, :, None]
                b3 = b[:, :, None]
                for f in tl.static_range(8):
                    w = tl.reshape(K._field(words, hi, f, QTYPE) * a3 + b3, (BLOCK_N, KF)).to(DT)
                    acc = tl.dot(xs[f], tl.trans(w), acc)
            elif MODE >= 6:
                if MODE == 7:
                    x5 = x_next
                    d, dmin, sc, mn = s_next
                    x_next = _x_step(xm, m_ok, bb + G, b1, c5, BS, WPB)
                    s_next = K._load_scales(sc_ptr, mn_ptr, d_ptr, dm_ptr, r2, bb + G + g2, bb + G + g2 < b1,
                                            s_sc, s_d, QTYPE)
                else:
                    x5 = _x_step(xm, m_ok, bb, b1, c5, BS, WPB)
                    d, dmin, sc, mn = K._load_scales(sc_ptr, mn_ptr, d_ptr, dm_ptr, r2, bb + g2, bb + g2 < b1,
                                                     s_sc, s_d, QTYPE)
                xs = _split8(x5)
                blk = bb + gi
                bm = blk < b1
                words, hi = K._load_words(qs_ptr, qh_ptr, r, blk, wi, bm, s_qs, s_qh, QTYPE, WPB)
                a, b = K._affine(d, dmin, sc, mn, QTYPE)
                a3 = a[:, :, None]
                b3 = b[:, :, None]
                for f in tl.static_range(8):
                    w = tl.reshape(K._field(words, hi, f, QTYPE) * a3 + b3, (BLOCK_N, KF)).to(DT)
                    acc = tl.dot(xs[f], tl.trans(w), acc)
            else:
                blk = bb + gi
                bm = blk < b1
                words, hi, a, b = K._load_tile(qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, r, blk, wi, bm,
                                               s_qs, s_qh, s_sc, s_d, QTYPE, BS, WPB)
                a3 = a[:, :, None]
                b3 = b[:, :, None]
                kb = bb + cb
                xmask = m_ok[:, None] & (kb < b1)[None, :]
                if MODE == 5:       # c * A + B, A = a / 16 and B = a + b (fields f = 1 + c / 16: w = a f + b)
                    fs = _decode4_packed(words, (a3 * 0.0625).to(tl.bfloat16), (a3 + b3).to(tl.bfloat16))
                    for f in tl.static_range(8):
                        xv = tl.load(xm + (kb * BS + f * WPB + cw)[None, :], mask=xmask, other=0)
                        acc = tl.dot(xv, tl.trans(tl.reshape(fs[f], (BLOCK_N, KF))), acc)
                elif MODE == 3:
                    acc += (tl.sum(tl.sum(words + hi, axis=2), axis=1).to(tl.float32) + tl.sum(a + b, axis=1))[None, :]
                elif MODE == 4:
                    w = _join8(K._field(words, hi, 0, QTYPE) * a3 + b3, K._field(words, hi, 1, QTYPE) * a3 + b3,
                               K._field(words, hi, 2, QTYPE) * a3 + b3, K._field(words, hi, 3, QTYPE) * a3 + b3,
                               K._field(words, hi, 4, QTYPE) * a3 + b3, K._field(words, hi, 5, QTYPE) * a3 + b3,
                               K._field(words, hi, 6, QTYPE) * a3 + b3, K._field(words, hi, 7, QTYPE) * a3 + b3)
                    w = tl.reshape(w, (BLOCK_N, 8 * KF)).to(DT)
                    kj = bb + jb
                    xv = tl.load(xm + (kj * BS + jf * WPB + jw)[None, :], mask=m_ok[:, None] & (kj < b1)[None, :],
                                 other=0)
                    acc = tl.dot(xv, tl.trans(w), acc)
                else:
                    for f in tl.static_range(FPW):
                        if MODE == 2:
                            w = tl.reshape(words + f, (BLOCK_N, KF)).to(DT)
                        else:
                            w = tl.reshape(K._field(words, hi, f, QTYPE) * a3 + b3, (BLOCK_N, KF)).to(DT)
                        if MODE == 1:
                            acc += tl.sum(w.to(tl.float32), axis=1)[None, :]
                        else:
                            xv = tl.load(xm + (kb * BS + f * WPB + cw)[None, :], mask=xmask, other=0)
                            acc = tl.dot(xv, tl.trans(w), acc)
    y = y_ptr + (pid_k * M + offs_m[:, None]).to(tl.int64) * N + rows[None, :]
    tl.store(y, acc, mask=m_ok[:, None] & row_ok[None, :])


LAST: dict = {}       # the compiled kernel of the last probe() launch


def asm_counts(kernel) -> list:
    """[registers, spilled, async (cp.async) copies, synchronous tt.load ops] of a compiled kernel (TTGIR)."""
    ttgir = kernel.asm.get("ttgir", "")
    return [getattr(kernel, "n_regs", None), getattr(kernel, "n_spills", None),
            ttgir.count("async_copy_global_to_local"), ttgir.count("tt.load ")]


def probe(x: torch.Tensor, p, cfg: dict, mode: int, stages: int | None = None) -> torch.Tensor:
    m = x.shape[0]
    ptrs, strides = K._args(p)
    bs, fpw = GEOMETRY[p.qtype]
    y = torch.empty((cfg["split"], m, p.n), device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(m, cfg["BLOCK_M"]), triton.cdiv(p.n, cfg["BLOCK_N"]), cfg["split"])
    LAST["kernel"] = _probe_kernel[grid](x, y, *ptrs, m, p.n, p.k // bs, x.stride(0), *strides, cfg["per"],
                        QTYPE=K._CODE[p.qtype], BS=bs, FPW=fpw, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
                        G=cfg["G"], MODE=mode, STAGES=stages or cfg["num_stages"], num_warps=cfg["num_warps"],
                        num_stages=cfg["num_stages"])
    return y.sum(0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="Q4_K,Q6_K,Q4_0")
    ap.add_argument("--m", type=int, default=16)
    ap.add_argument("--min-ms", type=float, default=3.0)
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES))
    ap.add_argument("--once", action="store_true", help="one launch of each kernel (for ncu), no timing")
    ap.add_argument("--per-sweep", action="store_true", help="shipped and x_ahead at every split of K")
    ap.add_argument("--stages", default="2,3,4", help="num_stages of the tl.range modes (each timed)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    if args.once:
        q = QT[args.types.split(",")[0]]
        p = packed_copies(q, *SHAPES[0])[0]
        x = torch.randn(args.m, SHAPES[0][1], device=dev, dtype=torch.bfloat16)
        cfg = K.dot_config(p, args.m, dev)
        for _ in range(2):                        # the first round compiles
            K.gemv(x[:1].contiguous(), p)
            K._matmul_dot(x, p, cfg, torch.float32, None)
            for mname, mode in MODES.items():
                if mname != "packed" or q in (QT.Q4_K, QT.Q4_0):
                    probe(x, p, cfg, mode)
            torch.cuda.synchronize()
        return 0
    for name in args.types.split(","):
        q = QT[name]
        for n, k in SHAPES:
            copies = packed_copies(q, n, k)
            x = torch.randn(args.m, k, device=dev, dtype=torch.bfloat16)
            cfg = K.dot_config(copies[0], args.m, dev)
            ref = K._matmul_dot(x, copies[0], cfg, torch.float32, None)
            row = {"type": name, "N": n, "K": k, "M": args.m, "cfg": {kk: cfg[kk] for kk in ("BLOCK_N", "G", "split")}}
            checked = ("full", "joined", "x_once", "prefetch", "x_first", "x_ahead", "all_ahead", "trange", "lean",
                       "lean3") + (("packed",) if q in (QT.Q4_K, QT.Q4_0) else ())
            for mname in checked:
                if mname not in args.modes.split(","):
                    continue
                y = probe(x, copies[0], cfg, MODES[mname])
                row[f"{mname}_max_rel_err"] = float((y - ref).abs().max() / ref.abs().max())
            x1 = x[:1].contiguous()
            t_gemv = time_graph([lambda p=p: K.gemv(x1, p) for p in copies], min_ms=args.min_ms, repeats=3)
            t_ship = time_graph([lambda p=p: K._matmul_dot(x, p, cfg, torch.float32, None) for p in copies],
                                min_ms=args.min_ms, repeats=3)
            row["gemv_us"] = round(t_gemv * 1e6, 2)
            row["shipped_us"] = round(t_ship * 1e6, 2)
            for mname, mode in MODES.items():
                if mname not in args.modes.split(",") or (mname == "packed" and q not in (QT.Q4_K, QT.Q4_0)):
                    continue
                for st in ([int(v) for v in args.stages.split(",")] if mode >= 11 else [None]):
                    key = mname if st is None else f"{mname}{st}"
                    try:
                        t = time_graph([lambda p=p: probe(x, p, cfg, mode, st) for p in copies], min_ms=args.min_ms,
                                       repeats=3)
                        row[f"{key}_us"] = round(t * 1e6, 2)
                        row[f"{key}_over_gemv"] = round(t / t_gemv, 2)
                        probe(x, copies[0], cfg, mode, st)
                        row[f"{key}_regs_spills_async_sync"] = asm_counts(LAST["kernel"])
                    except Exception as e:  # noqa: BLE001 - a variant the compiler cannot take
                        row[f"{key}_error"] = str(e)[:160]
            if args.per_sweep:
                bs, _ = GEOMETRY[q]
                n_steps = -(-(k // bs) // cfg["G"])
                row["per_sweep"] = {}
                for steps in sorted({-(-n_steps // s) for s in range(1, n_steps + 1)}):
                    c2 = dict(cfg, per=steps * cfg["G"], split=-(-n_steps // steps))
                    n_prog = c2["split"] * -(-n // cfg["BLOCK_N"])
                    t1 = time_graph([lambda p=p: K._matmul_dot(x, p, c2, torch.float32, None) for p in copies],
                                    min_ms=args.min_ms, repeats=3)
                    t2 = time_graph([lambda p=p: probe(x, p, c2, MODES["x_ahead"]) for p in copies],
                                    min_ms=args.min_ms, repeats=3)
                    row["per_sweep"][steps] = [n_prog, round(t1 * 1e6, 1), round(t2 * 1e6, 1)]
            print(json.dumps(row), flush=True)
            del copies
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
