"""Triton matmul on packed GGUF blocks: y[M, N] = x[M, K] @ W[N, K]^T, W dequantized in registers.

Layout of W: see `packed.py` (planar blocks: field f of word w of scale block b holds the code of
weight BS*b + WPB*f + w). The paths, chosen by M (rows of x):
- GEMV (M = 1, decode; `gemv`): memory bound. x is first rounded to int8 per 32 values (scale
  max|x| / 127, `quantize_x`; its bytes are packed in the order the weight words pair with). A one-warp
  program owns BLOCK_N (1-2) rows and streams G scale blocks per step as one [BLOCK_N, G, WPB] int32 tile
  (16-byte loads in a plain loop: the many small programs an SM holds hide the latency; a cp.async ring can be
  configured with stages > 1, slower for every type on an H200); each word's 8 codes become two words of 4
  byte codes with one or two integer ops and go through `dp4a` (4 multiply-adds in one instruction, exact in
  int32). The block scales are applied once per (row, block) in fp32:
  `sum w*x = S * dx * sum(code*q) + O * dx * sum(q)`.
  The int8 rounding of x costs about 1e-2 of max|y| against fp32 activations (tests state the bound);
  the integer part is exact, so the result equals `reference_matmul` on the rounded x to fp32 rounding.
- dot, small M (2..64, verification of a drafted block; `matmul`): the same tile, each field's
  weights `A*f + B` rounded to x.dtype and multiplied on tensor cores (tl.dot, M padded to 16/32/64),
  so every weight tile is read and decoded ONCE for all M rows. Split-K when N alone is short.
- Gluon, small M (2..32 a launch; up to 96 rows as several) for Q4_K, Q5_K, Q6_K on NVIDIA GPUs (the default there;
  `gluon_matmul.py`): the same bf16 weights and tensor-core dots as the dot path, with every layout written down, so
  each thread loads the weight words its MMA operand needs straight into registers; 0.55-0.75x the dot path's time on
  the 27B's shapes (H200).
- mmq, small M on int8 tensor cores (DFLASH24_SMALL_M_MATMUL=mmq; not the default: slower than the dot path on
  an H200, BENCHMARKS.md): x rounded to int8 per 32 values exactly as the GEMV rounds it, the weight codes read
  as bytes of the planar words, one int8 dot per 32-weight group (exact integer sums), the block scales in fp32.
  A verify row then equals the GEMV's row of the same token to fp32 summation order.
- large M (prefill, M > 64): W is dequantized a chunk of rows at a time into a small x.dtype scratch
  (same values as the dot path) and multiplied by cuBLAS (torch.matmul): the full weight is never
  materialised; the scratch stays in L2.
Split-K partials go to a (SPLIT, M, N) fp32 buffer summed by torch: deterministic, graph capturable.

Reference for every kernel: `reference_matmul` (dequantize with formats.dequantize + fp32 matmul).
"""
from __future__ import annotations

import contextlib
import os
import warnings
from typing import NamedTuple

import torch
from gguf import GGMLQuantizationType as QT

from . import gluon_matmul
from .formats import dequantize
from .packed import GEOMETRY, PackedWeight

from ..kernels import HAVE_TRITON, tl, triton  # noqa: F401 - without triton: the reference path
from ..kernels.pdl import launch_options, pdl_enter

# Under TRITON_INTERPRET=1 (CPU tests) bf16 tl.dot gives garbage in triton 3.9's interpreter.
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

# Kernel-side type codes (constexpr).
_CODE = {QT.Q8_0: 0, QT.Q4_0: 1, QT.Q5_0: 2, QT.Q4_K: 3, QT.Q5_K: 4, QT.Q6_K: 5}
SMALL_M = 64            # M above this: dequantize chunks + cuBLAS
# The one-token (decode) matmul: "gemv" (int8 activations, the fast default) or "dot" (the tl.dot path that
# verifies drafted blocks: a decode row then equals the same row of a verify step, so greedy AR and chain /
# tree output can be compared token for token on a GPU, at about 2.5x the decode matmul time).
# DFLASH24_BATCH_INVARIANT=1: every step of 1..SMALL_M tokens computes each token's row in the same order
# whatever the step's size (decode on the dot path, 64-row tiles, split-K partials summed in a fixed order;
# attention has its own half in kernels/attention.py), so greedy speculative output equals AR output on a GPU
# too, not only up to near-tie flips. Slower decode (the dot path, a 64-row tile for one row: 4.2x the default
# decode step on the 27B); one tile for any step of <= 64 tokens, which suits verify steps and the mode's
# 64-token prefill chunks.
BATCH_INVARIANT = os.environ.get("DFLASH24_BATCH_INVARIANT", "0") == "1"
DECODE_MATMUL = os.environ.get("DFLASH24_DECODE_MATMUL", "dot" if BATCH_INVARIANT else "gemv")
if DECODE_MATMUL not in ("gemv", "dot"):
    raise ValueError(f"DFLASH24_DECODE_MATMUL must be gemv or dot, got {DECODE_MATMUL!r}")
if BATCH_INVARIANT and DECODE_MATMUL != "dot":
    raise ValueError("DFLASH24_BATCH_INVARIANT=1 needs the dot decode matmul (DFLASH24_DECODE_MATMUL=dot)")
# The 2..SMALL_M-token matmul (verify steps): "dot" (bf16 tensor cores on weights decoded to x.dtype) or "mmq"
# (int8 tensor cores on the codes themselves, x rounded to int8 per 32 values as in the GEMV).
SMALL_M_MATMUL = os.environ.get("DFLASH24_SMALL_M_MATMUL", "dot")
if SMALL_M_MATMUL not in ("dot", "mmq"):
    raise ValueError(f"DFLASH24_SMALL_M_MATMUL must be dot or mmq, got {SMALL_M_MATMUL!r}")
if BATCH_INVARIANT and SMALL_M_MATMUL != "dot":
    raise ValueError("DFLASH24_BATCH_INVARIANT=1 needs the dot small-M matmul (DFLASH24_SMALL_M_MATMUL=dot)")


def reference_matmul(x: torch.Tensor, raw: torch.Tensor, qtype, k: int) -> torch.Tensor:
    """The PyTorch reference of every kernel here: (M, K) x raw GGUF rows (N, row_bytes) -> (M, N) fp32."""
    w = dequantize(raw, qtype, k)                                             # (N, K) fp32
    return x.float() @ w.to(x.device).T


if HAVE_TRITON:

    @triton.jit
    def _shift(v, s: tl.constexpr):
        """v >> s for s > 0, v << -s otherwise (callers mask the result)."""
        if s > 0:
            r = v >> s
        elif s < 0:
            r = v << (-s)
        else:
            r = v
        return r

    @triton.jit
    def _field(words, hi, F: tl.constexpr, QTYPE: tl.constexpr):
        """Field F of every word as fp32 1 + code / 2^B (B = bits of the code), exact."""
        if QTYPE == 0:      # Q8_0: byte F (int8); code = q + 128 via the xor of bit 22
            bits = (_shift(words, 8 * F - 15) & 0x7F8000) ^ 0x3FC00000
        elif QTYPE == 1 or QTYPE == 3:      # 4-bit codes -> mantissa bits 19..22
            bits = (_shift(words, 4 * F - 19) & 0x780000) | 0x3F800000
        elif QTYPE == 2 or QTYPE == 4:      # 5-bit: nibble -> 18..21, 5th bit (qh bit F) -> 22
            bits = (_shift(words, 4 * F - 18) & 0x3C0000) | (_shift(hi, F - 22) & 0x400000) | 0x3F800000
        else:                               # Q6_K 6-bit: nibble -> 17..20, high bits (see _load_raw) -> 21..22
            bits = (_shift(words, 4 * F - 17) & 0x1E0000) | (_shift(hi, 8 * (F // 2) + 4 * (F % 2) - 21) & 0x600000) | 0x3F800000
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def _load_below(ptr, blk, lim):
        """tl.load of ptr where its block index blk < lim, 0 elsewhere; lim None: every element, no mask (a whole
        step in range: no predicates, no zero-fill)."""
        if lim is None:
            v = tl.load(ptr)
        else:
            v = tl.load(ptr, mask=blk < lim, other=0)
        return v

    @triton.jit
    def _load_words(qs_ptr, qh_ptr, r, blk, wi, lim, s_qs, s_qh, QTYPE: tl.constexpr, WPB: tl.constexpr):
        """Words (and high bits) of rows r (BN,1,1) x blocks blk (1,G,1) x words wi (1,1,WPB); blocks >= lim read
        as 0 (lim None: no mask)."""
        words = _load_below(qs_ptr + r * s_qs + blk * WPB + wi, blk, lim)
        if QTYPE == 2 or QTYPE == 4:
            hi = _load_below(qh_ptr + r * s_qh + blk * WPB + wi, blk, lim).to(tl.int32)
        elif QTYPE == 5:    # one int32 per 16-block; >> 2w: word w's fields at 8(f//2) + 4(f%2) (packed._q6k_shift)
            hi = _load_below(qh_ptr + r * s_qh + blk, blk, lim) >> (2 * wi)
        else:
            hi = words
        return words, hi

    @triton.jit
    def _load_step_words(qs_ptr, qh_ptr, r, bb, b1, wi, s_qs, s_qh, QTYPE: tl.constexpr, WPB: tl.constexpr,
                         G: tl.constexpr):
        """_load_words of blocks bb .. bb + G - 1 (blocks >= b1 read as 0; b1 None: a whole step, no masks), each
        row's G * WPB consecutive words loaded as one (BN, G * WPB) run and reshaped to (BN, G, WPB): the compiler
        then sees a row's run as contiguous and spreads it over neighbouring threads (coalesced), where a (BN, G,
        WPB) load gives each thread one row's WPB words and a warp 32 rows, a sector each."""
        BN: tl.constexpr = r.shape[0]
        r2 = tl.reshape(r, (BN, 1))
        c = tl.arange(0, G * WPB)[None, :]
        words = tl.reshape(_load_below(qs_ptr + r2 * s_qs + bb * WPB + c, bb + c // WPB, b1), (BN, G, WPB))
        if QTYPE == 2 or QTYPE == 4:
            hi = tl.reshape(_load_below(qh_ptr + r2 * s_qh + bb * WPB + c, bb + c // WPB, b1).to(tl.int32),
                            (BN, G, WPB))
        elif QTYPE == 5:    # word w: >> 2 w (packed._q6k_shift); joined, so the two stay in the words' threads
            tl.static_assert(WPB == 2, "Q6_K: two words a 16-block")
            blk = bb + tl.arange(0, G)[None, :]
            h = _load_below(qh_ptr + r2 * s_qh + blk, blk, b1)
            hi = tl.join(h, h >> 2)
        else:
            hi = words
        return words, hi

    @triton.jit
    def _halves(ptr, h, blk, lim):
        """The f16 elements at element offsets h of ptr (a 4-byte aligned f16 array), read as the int32 words
        holding them: 4-byte loads, which the software pipeliner can turn into cp.async copies (2-byte loads
        stay synchronous inside the loop, each step waiting a full memory latency for its scales). Elements of
        blocks blk >= lim read as 0 (lim None: no mask)."""
        w = _load_below(ptr.to(tl.pointer_type(tl.int32)) + (h >> 1), blk, lim)
        return ((w >> ((h & 1) * 16).to(tl.int32)) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)

    @triton.jit
    def _bytes(ptr, r, b, lim, s, BN: tl.constexpr, G: tl.constexpr, SIGNED: tl.constexpr, WORDS: tl.constexpr):
        """(BN, G) bytes [r, b + j] of a byte array with row stride s as int32 values (SIGNED: int8, else uint8);
        blocks >= lim read as 0 (lim None: no mask). WORDS: read the int32 words holding them, each once (s a
        multiple of 4, b of G, lim of min(G, 4)), and spread their bytes by a reshape; else byte loads."""
        if WORDS:
            NW: tl.constexpr = (G + 3) // 4             # words per row: G / 4, or 1 holding all G < 4 bytes
            BPW: tl.constexpr = G // NW
            j = b + BPW * tl.arange(0, NW)[None, :]
            o = r * s + j
            w = _load_below(ptr.to(tl.pointer_type(tl.int32)) + (o >> 2), j, lim)
            if BPW == 4:    # s and b multiples of 4: every word starts at byte 0 of a row's run (constant shifts)
                sh = 8 * tl.arange(0, BPW)[None, None, :]
            else:
                sh = 8 * ((o & 3).to(tl.int32)[:, :, None] + tl.arange(0, BPW)[None, None, :])
            if SIGNED:
                v = (w[:, :, None] << (24 - sh)) >> 24
            else:
                v = (w[:, :, None] >> sh) & 0xFF
            v = tl.reshape(v, (BN, G))
        else:
            blk = b + tl.arange(0, G)[None, :]
            v = _load_below(ptr + r * s + blk, blk, lim).to(tl.int32)
        return v

    @triton.jit
    def _per_blocks(ptr, r, b, lim, s, R: tl.constexpr, BN: tl.constexpr, G: tl.constexpr, WORDS: tl.constexpr):
        """f16 tile of an array with one element per R blocks (row stride s) for blocks b .. b + G - 1; blocks >= lim
        read as 0. WORDS: each element read once as the int32 word holding it (_halves; b a multiple of min(G, R))
        and broadcast to its blocks, a (BN, 1) tile when one covers them all (the tiles it meets broadcast it);
        else (BN, G) f16 loads, one per block (a (BN, 1) load for the dot kernel's K types measured 1.06-1.12x
        slower at M = 16 on an H200, 2026-12-02)."""
        if WORDS:
            NE: tl.constexpr = (G + R - 1) // R         # elements per row: G / R, or 1 when G <= R
            RB: tl.constexpr = G // NE
            j = tl.arange(0, NE)[None, :]
            v = _halves(ptr, r * s + b // R + j, b + R * j, lim)
            if NE > 1 and RB > 1:
                v = tl.reshape(tl.broadcast_to(v[:, :, None], (BN, NE, RB)), (BN, G))
        else:
            blk = b + tl.arange(0, G)[None, :]
            v = _load_below(ptr + r * s + blk // R, blk, lim)
        return v

    @triton.jit
    def _load_scales(sc_ptr, mn_ptr, d_ptr, dm_ptr, r, b, lim, s_sc, s_d, QTYPE: tl.constexpr,
                     BN: tl.constexpr, G: tl.constexpr, WORDS: tl.constexpr):
        """The raw scale fields (d, dmin f16; sc, mn int32) of rows r (BN, 1) x scale blocks b .. b + G - 1, tiles
        that broadcast to (BN, G); blocks >= lim read as 0. Loaded as they are (1- / 2-byte fields), inside a loop
        these loads stay synchronous unless a thread's share of a tile is >= 4 contiguous bytes: the software
        pipeliner copies ahead (cp.async) only loads of >= 4 bytes. WORDS (bit 0: the f16 fields; bit 1: the byte
        fields) reads the int32 words holding them instead (b a multiple of G, of min(G, 4) and of the blocks per d;
        byte row strides multiples of 4), which the pipeliner copies ahead like the weight words, at the cost of the
        integer work that spreads them (which is faster depends on the type and kernel: `_SCALE_WORDS`)."""
        WD: tl.constexpr = (WORDS & 1) != 0
        WB: tl.constexpr = (WORDS & 2) != 0
        if QTYPE <= 2:      # one f16 scale per 32 weights
            d = _per_blocks(d_ptr, r, b, lim, s_d, 1, BN, G, WD)
            dmin = d
            sc = d
            mn = d
        elif QTYPE == 3 or QTYPE == 4:
            d = _per_blocks(d_ptr, r, b, lim, s_d, 8, BN, G, WD)
            dmin = _per_blocks(dm_ptr, r, b, lim, s_d, 8, BN, G, WD)
            sc = _bytes(sc_ptr, r, b, lim, s_sc, BN, G, False, WB)
            mn = _bytes(mn_ptr, r, b, lim, s_sc, BN, G, False, WB)
        else:               # Q6_K: int8 scale per 16 weights, f16 d per 256
            d = _per_blocks(d_ptr, r, b, lim, s_d, 16, BN, G, WD)
            sc = _bytes(sc_ptr, r, b, lim, s_sc, BN, G, True, WB)
            dmin = d
            mn = sc
        return d, dmin, sc, mn

    @triton.jit
    def _load_raw(qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, r, bb, b1, wi,
                  s_qs, s_qh, s_sc, s_d, QTYPE: tl.constexpr, WPB: tl.constexpr, G: tl.constexpr,
                  SCALE_WORDS: tl.constexpr, ROW_RUN: tl.constexpr):
        """Rows r (BN, 1, 1) x scale blocks bb .. bb + G - 1 (blocks >= b1 read as 0): _load_words, and the raw
        scale fields of each (row, block) as (BN, G) tiles."""
        if ROW_RUN:
            words, hi = _load_step_words(qs_ptr, qh_ptr, r, bb, b1, wi, s_qs, s_qh, QTYPE, WPB, G)
        else:
            blk = bb + tl.arange(0, G)[None, :, None]
            words, hi = _load_words(qs_ptr, qh_ptr, r, blk, wi, b1, s_qs, s_qh, QTYPE, WPB)
        d, dmin, sc, mn = _load_scales(sc_ptr, mn_ptr, d_ptr, dm_ptr, tl.reshape(r, (r.shape[0], 1)), bb, b1,
                                       s_sc, s_d, QTYPE, r.shape[0], G, SCALE_WORDS)
        return words, hi, d, dmin, sc, mn

    @triton.jit
    def _affine(d, dmin, sc, mn, QTYPE: tl.constexpr):
        """Each block's map from field values f = 1 + code / 2^B to weights: w = A * f + B."""
        d = d.to(tl.float32)
        if QTYPE == 0:
            a = d * 256.0
            b = d * -384.0
        elif QTYPE == 1:
            a = d * 16.0
            b = d * -24.0
        elif QTYPE == 2:
            a = d * 32.0
            b = d * -48.0
        elif QTYPE == 3 or QTYPE == 4:
            ds = d * sc.to(tl.float32)
            dm = dmin.to(tl.float32) * mn.to(tl.float32)
            if QTYPE == 3:
                a = ds * 16.0
            else:
                a = ds * 32.0
            b = -(a + dm)
        else:
            ds = d * sc.to(tl.float32)
            a = ds * 64.0
            b = ds * -96.0
        return a, b

    @triton.jit
    def _load_tile(qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, r, bb, b1, wi,
                   s_qs, s_qh, s_sc, s_d, QTYPE: tl.constexpr, WPB: tl.constexpr, G: tl.constexpr,
                   SCALE_WORDS: tl.constexpr, ROW_RUN: tl.constexpr):
        """_load_raw + _affine: words, high bits, and A, B (BN, G)."""
        words, hi, d, dmin, sc, mn = _load_raw(qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, r, bb, b1, wi,
                                               s_qs, s_qh, s_sc, s_d, QTYPE, WPB, G, SCALE_WORDS, ROW_RUN)
        a, b = _affine(d, dmin, sc, mn, QTYPE)
        return words, hi, a, b

    @triton.jit
    def _dp4a(a, b, c, SIGNED_A: tl.constexpr, INTERP: tl.constexpr):
        """c + sum over the 4 bytes i of a_i * b_i (b signed int8; a signed or unsigned), int32, exact."""
        if INTERP:      # the CPU interpreter runs no PTX: the same sum with shifts
            r = c
            for i in tl.static_range(4):
                if SIGNED_A:
                    ai = (a << (24 - 8 * i)) >> 24
                else:
                    ai = (a >> (8 * i)) & 0xFF
                r += ai * ((b << (24 - 8 * i)) >> 24)
        elif SIGNED_A:
            r = tl.inline_asm_elementwise("dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c],
                                          dtype=tl.int32, is_pure=True, pack=1)
        else:
            r = tl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c],
                                          dtype=tl.int32, is_pure=True, pack=1)
        return r

    @triton.jit
    def _quant_x_tile(v, blk, ok, xw_ptr, xw6_ptr, dx_ptr, xs_ptr, ORDERS: tl.constexpr):
        """The int8 activations of 32-value blocks held as v (NB, 32) fp32 (flat block index blk (NB,), stored where
        ok): codes q = round(v / dx), dx = max|v| / 127 per block, packed 4 per int32 in the order the weight words
        pair with, and xs = sum of the codes per 16 values (int32). Word order 0 (to xw_ptr; ORDERS 0 or 2): word j
        of a block holds positions j + 8i, i = 0..3, for Q8_0 / Q4 / Q5 planar words; order 1 (to xw6_ptr; ORDERS
        1 or 2): word j holds 16 ((j // 2) % 2) + 2 (j // 4) + j % 2 + 4i, for Q6_K's 16-blocks (words 0-3: the
        even fields' x of both 16-blocks' two weight words, 4-7 the odd fields': `_x_words`). IEEE division, so the
        codes equal reference_quantize_x's exactly (launch with enable_fp_fusion=False: no FMA contraction
        either)."""
        NB: tl.constexpr = v.shape[0]
        amax = tl.max(tl.abs(v), axis=1)
        inv = tl.where(amax > 0, tl.math.div_rn(tl.full(amax.shape, 127.0, tl.float32), amax), 0.0)
        q = tl.floor(v * inv[:, None] + 0.5).to(tl.int32)
        xs = tl.sum(tl.reshape(q, (NB, 2, 16)), axis=2)
        tl.store(xs_ptr + blk[:, None] * 2 + tl.arange(0, 2)[None, :], xs, mask=ok[:, None])
        tl.store(dx_ptr + blk, tl.math.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32)), mask=ok)
        b8 = q & 0xFF
        words = blk[:, None] * 8 + tl.arange(0, 8)[None, :]
        if ORDERS != 1:                                                    # (i, j): position 8i + j
            w = tl.sum(tl.reshape(b8, (NB, 4, 8)) << (8 * tl.arange(0, 4))[None, :, None], axis=1)
            tl.store(xw_ptr + words, w, mask=ok[:, None])                  # disjoint bytes: sum == or
        if ORDERS != 0:                                                    # (h, i, jj): position 16h + 4i + jj
            w = tl.sum(tl.reshape(b8, (NB, 2, 4, 4)) << (8 * tl.arange(0, 4))[None, None, :, None], axis=2)
            w = tl.permute(tl.reshape(w, (NB, 2, 2, 2)), (0, 2, 1, 3))     # word (h, jj) at 4 (jj // 2) + 2 h + jj % 2
            tl.store(xw6_ptr + words, tl.reshape(w, (NB, 8)), mask=ok[:, None])

    @triton.jit
    def _quant_x_kernel(x_ptr, xw_ptr, xw6_ptr, dx_ptr, xs_ptr, NB, ORDERS: tl.constexpr, R: tl.constexpr,
                        PDL: tl.constexpr = False):
        """x (K,) -> its int8 activations (_quant_x_tile), R 32-blocks a program."""
        pdl_enter(PDL)
        b = tl.program_id(0) * R + tl.arange(0, R)
        ok = b < NB
        v = tl.load(x_ptr + b[:, None] * 32 + tl.arange(0, 32)[None, :], mask=ok[:, None], other=0).to(tl.float32)
        _quant_x_tile(v, b, ok, xw_ptr, xw6_ptr, dx_ptr, xs_ptr, ORDERS)

    @triton.jit
    def _pair_store(v, i, ok, pa_ptr, pb_ptr, pg_ptr, pg16_ptr, DOT: tl.constexpr = True):
        """Values v at flat indices i (int32, < 2^31; mask ok) of a row-major (M, K) x, K % 256 == 0, stored into
        the two `pair_order` copies of x: pa for 32-weight scale blocks of 4 words (Q4_0, Q5_0, Q4_K, Q5_K), pb for
        Q6_K's 16-weight blocks of 2 words. Index e of a 256-value step: block j, field f = k + 4 ch, word w ->
        64 k + 2 WPB j + 2 w + ch (see pair_order). And into the Gluon kernel's two (`gluon_matmul.gluon_order`):
        pg for 32-blocks, e = 32 (2 q + j) + 16 h + 8 p1 + 4 p0 + c -> 128 j + 32 c + 16 p1 + 8 p0 + 2 q + h;
        pg16 for 16-blocks, e = 64 q + 32 j + 16 cb + 8 h + 4 p1 + 2 p0 + cw -> 128 j + 64 cb + 32 cw + 16 p1 +
        8 p0 + 2 q + h. Shifts and masks of 32-bit indices: the same places as the divisions, which on 64-bit
        signed indices cost the verify's norms several times their own time. DOT False: the Gluon orders only."""
        e = i & 255
        step = i - e
        if DOT:
            fa = (e >> 2) & 7                                              # field of a 32-weight block's word
            tl.store(pa_ptr + (step + ((fa & 3) << 6) + ((e >> 5) << 3) + ((e & 3) << 1) + (fa >> 2)), v, mask=ok)
            fb = (e >> 1) & 7                                              # field of a 16-weight block's word
            tl.store(pb_ptr + (step + ((fb & 3) << 6) + ((e >> 4) << 2) + ((e & 1) << 1) + (fb >> 2)), v, mask=ok)
        tl.store(pg_ptr + (step + (((e >> 5) & 1) << 7) + ((e & 3) << 5) + (((e >> 2) & 3) << 3)
                           + ((e >> 6) << 1) + ((e >> 4) & 1)), v, mask=ok)
        tl.store(pg16_ptr + (step + (((e >> 5) & 1) << 7) + (((e >> 4) & 1) << 6) + ((e & 1) << 5)
                             + (((e >> 1) & 3) << 3) + ((e >> 6) << 1) + ((e >> 3) & 1)), v, mask=ok)

    @triton.jit
    def _x_words(xw_ptr, blk, wi, lim, QTYPE: tl.constexpr):
        """The int8 activation words (of _quant_x_kernel) that pair with the weight words of blocks blk (1, G, 1)
        x words wi (1, 1, WPB): (lo, od), those of the even and the odd fields (Q8_0: its bytes, twice). Blocks >=
        lim read as 0 (lim None: no masks)."""
        if QTYPE == 0:
            xlo = _load_below(xw_ptr + blk * 8 + wi, blk, lim)
            xod = xlo
        elif QTYPE == 5:                 # Q6_K: 16-blocks, 4 x words each, 2 blocks' words interleaved (_quant_x_tile)
            xlo = _load_below(xw_ptr + (blk // 2) * 8 + (blk % 2) * 2 + wi, blk, lim)
            xod = _load_below(xw_ptr + (blk // 2) * 8 + (blk % 2) * 2 + 4 + wi, blk, lim)
        else:
            xlo = _load_below(xw_ptr + blk * 8 + wi, blk, lim)
            xod = _load_below(xw_ptr + blk * 8 + 4 + wi, blk, lim)
        return xlo, xod

    @triton.jit
    def _x_step_words(xw_ptr, bb, b1, QTYPE: tl.constexpr, WPB: tl.constexpr, G: tl.constexpr):
        """`_x_words` of blocks bb .. bb + G - 1 (b1 as in `_load_step_words`) as `_load_step_words` loads a row's
        weight words: one run over the step's G * WPB words e, reshaped to (1, G, WPB). Word e's x is at 8 (e // 4) +
        e % 4 of the step's x words (+ 4 for the odd fields; Q8_0: e), so a thread's 4 consecutive weight words meet
        4 consecutive x words: the tiles then share the weights' register layout, no shuffles (Q6_K: with x in word
        order 1's interleaved form, `_quant_x_tile`)."""
        e = tl.arange(0, G * WPB)[None, :]
        if QTYPE == 0:
            xlo = tl.reshape(_load_below(xw_ptr + bb * 8 + e, bb + e // WPB, b1), (1, G, WPB))
            xod = xlo
        else:
            tl.static_assert(WPB % 4 == 0 or (QTYPE == 5 and G % 2 == 0), "x runs of 4 words")
            pos = bb * (4 if QTYPE == 5 else 8) + (e // 4) * 8 + e % 4
            xlo = tl.reshape(_load_below(xw_ptr + pos, bb + e // WPB, b1), (1, G, WPB))
            xod = tl.reshape(_load_below(xw_ptr + pos + 4, bb + e // WPB, b1), (1, G, WPB))
        return xlo, xod

    @triton.jit
    def _int8_block_dot(words, hi, xlo, xod, QTYPE: tl.constexpr, INTERP: tl.constexpr):
        """Exact integer sum over each (row, scale block) of code * q_x: (BN, G) int32. Codes are the
        unsigned field values (Q8_0: the signed bytes), q_x the int8 activations of _quant_x_kernel (_x_words)."""
        if QTYPE == 0:
            s = _dp4a(words, xlo, 0, True, INTERP)
        else:
            lo = words & 0x0F0F0F0F                                        # even fields, one per byte
            od = (words >> 4) & 0x0F0F0F0F                                 # odd fields
            if QTYPE == 2 or QTYPE == 4:                                   # 5th bits to bit 4 of each byte
                lo = lo | (((hi & 0x55) * 0x410410) & 0x10101010)          # bits 0, 2, 4, 6 -> 4, 12, 20, 28
                od = od | (((hi & 0xAA) * 0x208208) & 0x10101010)          # bits 1, 3, 5, 7 -> the same
            if QTYPE == 5:                                                 # Q6_K: the two high bits
                lo = lo | ((hi & 0x03030303) << 4)
                od = od | (((hi >> 4) & 0x03030303) << 4)
            s = _dp4a(od, xod, _dp4a(lo, xlo, 0, False, INTERP), False, INTERP)
        return tl.sum(s, axis=2)

    @triton.jit
    def _int8_scale(isum, dx, xs, d, dmin, sc, mn, QTYPE: tl.constexpr):
        """W . x of each (row, scale block) from its exact integer sum, the block's x scale dx and integer
        code sum xs (per 32 values; Q6_K: per 16), and the weight block's scale fields (broadcastable
        tiles)."""
        d = d.to(tl.float32)
        if QTYPE == 0:
            part = (d * dx) * isum.to(tl.float32)
        elif QTYPE == 1:
            part = (d * dx) * (isum - 8 * xs).to(tl.float32)
        elif QTYPE == 2:
            part = (d * dx) * (isum - 16 * xs).to(tl.float32)
        elif QTYPE == 5:
            part = (d * sc.to(tl.float32) * dx) * (isum - 32 * xs).to(tl.float32)
        else:
            part = (d * sc.to(tl.float32) * dx) * isum.to(tl.float32) \
                - (dmin.to(tl.float32) * mn.to(tl.float32) * dx) * xs.to(tl.float32)
        return part

    @triton.jit
    def _x_scales(dx_ptr, xs_ptr, blk, lim, QTYPE: tl.constexpr):
        """GEMV: the x scales and code sums of the (1, G) blocks blk (1, G, 1); blocks >= lim read as 0 (lim None:
        no masks)."""
        blk = tl.reshape(blk, (1, blk.shape[1]))
        if QTYPE == 5:
            dx = _load_below(dx_ptr + blk // 2, blk, lim)
            xs = _load_below(xs_ptr + blk, blk, lim)
        else:
            dx = _load_below(dx_ptr + blk, blk, lim)
            xs = _load_below(xs_ptr + 2 * blk, blk, lim) + _load_below(xs_ptr + 2 * blk + 1, blk, lim)
        return dx, xs

    @triton.jit
    def _x_step_scales(dx_ptr, xs_ptr, bb, b1, QTYPE: tl.constexpr, G: tl.constexpr):
        """`_x_scales` of blocks bb .. bb + G - 1 (b1 as in `_load_step_words`), for the row-run loads: Q6_K's x
        scale of each 32 values joined to its two 16-blocks (a thread's pair of blocks), not gathered per block."""
        if QTYPE == 5:
            j = tl.arange(0, G // 2)[None, :]
            d32 = _load_below(dx_ptr + bb // 2 + j, bb + 2 * j, b1)
            dx = tl.reshape(tl.join(d32, d32), (1, G))
            blk = bb + tl.arange(0, G)[None, :]
            xs = _load_below(xs_ptr + blk, blk, b1)
        else:
            dx, xs = _x_scales(dx_ptr, xs_ptr, bb + tl.arange(0, G)[None, :, None], b1, QTYPE)
        return dx, xs

    @triton.jit
    def _gemv_rows_step(acc, r, bb, b1, wi, xlo, xod, dx, xs, qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr,
                        s_qs, s_qh, s_sc, s_d, QTYPE: tl.constexpr, WPB: tl.constexpr, G: tl.constexpr,
                        SCALE_WORDS: tl.constexpr, ROW_RUN: tl.constexpr, INTERP: tl.constexpr):
        """One GEMV step of rows r (BN, 1, 1) x blocks bb .. bb + G - 1 on the step's x tiles: acc (BN, G) += the
        blocks' W . x."""
        words, hi, d, dmin, sc, mn = _load_raw(qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, r, bb, b1, wi,
                                               s_qs, s_qh, s_sc, s_d, QTYPE, WPB, G, SCALE_WORDS, ROW_RUN)
        isum = _int8_block_dot(words, hi, xlo, xod, QTYPE, INTERP)
        return acc + _int8_scale(isum, dx, xs, d, dmin, sc, mn, QTYPE)

    @triton.jit
    def _prefetch_rows(qs_ptr, r, s_qs, first, last, LINES: tl.constexpr):
        """PTX prefetch.global.L2 of LINES 128-byte lines of each row r ((BN, 1) int64) of the word array from word
        `first` on (clamped to word `last`, so every address is valid). A PDL kernel issues it before its wait:
        the weights do not depend on the kernel before it, so they can stream toward L2 while that one drains.
        One line at a time (static loop): LINES need not be a power of two, as an arange's length must."""
        for i in tl.static_range(LINES):
            off = tl.minimum(first + 32 * i, last)
            tl.inline_asm_elementwise("prefetch.global.L2 [$1];", "=r,l", [qs_ptr + r * s_qs + off], dtype=tl.int32,
                                      is_pure=False, pack=1)

    @triton.jit
    def _row_pair_sums(pid_n, xw_ptr, dx_ptr, xs_ptr, qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, N, b0, b1,
                       s_qs, s_qh, s_sc, s_d, QTYPE: tl.constexpr, WPB: tl.constexpr, G: tl.constexpr,
                       STAGES: tl.constexpr, SCALE_WORDS: tl.constexpr, ROW_RUN: tl.constexpr, UNROLL: tl.constexpr,
                       INTERP: tl.constexpr, PREFETCH: tl.constexpr = 0, WHOLE: tl.constexpr = False):
        """(2,) fp32: rows 2 pid_n and 2 pid_n + 1 (clamped to N - 1) . x over blocks b0 .. b1 - 1, as two one-row
        tiles that share the step's x tiles, each in the layout of a one-row program (a (2, G) tile's scale loads
        take another layout, and converting them costs shuffles every step). PREFETCH (steps ahead, 0 none):
        `_prefetched_pair_sums`. WHOLE (b1 - b0 a multiple of G, b0 < b1): every step whole, its loads unmasked (no
        predicates, no zero-fills)."""
        gi = tl.arange(0, G)[None, :, None]
        wi = tl.arange(0, WPB)[None, None, :]
        acc0 = tl.zeros((1, G), dtype=tl.float32)
        acc1 = tl.zeros((1, G), dtype=tl.float32)
        r0 = tl.full((1, 1, 1), 0, tl.int64) + tl.minimum(pid_n * 2, N - 1)
        r1 = tl.full((1, 1, 1), 0, tl.int64) + tl.minimum(pid_n * 2 + 1, N - 1)
        if PREFETCH:
            acc0, acc1 = _prefetched_pair_sums(acc0, acc1, r0, r1, gi, wi, xw_ptr, dx_ptr, xs_ptr, qs_ptr, qh_ptr,
                                               sc_ptr, mn_ptr, d_ptr, dm_ptr, b0, b1, s_qs, s_qh, s_sc, s_d, QTYPE,
                                               WPB, G, SCALE_WORDS, ROW_RUN, INTERP, WHOLE, PREFETCH)
        elif WHOLE:
            for bb in tl.range(b0, b1, G, num_stages=STAGES, loop_unroll_factor=UNROLL):
                acc0, acc1 = _pair_step(acc0, acc1, r0, r1, bb, None, gi, wi, xw_ptr, dx_ptr, xs_ptr, qs_ptr, qh_ptr,
                                        sc_ptr, mn_ptr, d_ptr, dm_ptr, s_qs, s_qh, s_sc, s_d, QTYPE, WPB, G,
                                        SCALE_WORDS, ROW_RUN, INTERP)
        else:
            # tl.range with num_stages > 1: the word / scale tiles of the next steps are copied to shared memory
            # asynchronously (cp.async) while this step computes; 1 (shipped): plain loads.
            for bb in tl.range(b0, b1, G, num_stages=STAGES, loop_unroll_factor=UNROLL):
                acc0, acc1 = _pair_step(acc0, acc1, r0, r1, bb, b1, gi, wi, xw_ptr, dx_ptr, xs_ptr, qs_ptr, qh_ptr,
                                        sc_ptr, mn_ptr, d_ptr, dm_ptr, s_qs, s_qh, s_sc, s_d, QTYPE, WPB, G,
                                        SCALE_WORDS, ROW_RUN, INTERP)
        return tl.reshape(tl.join(tl.sum(acc0, axis=1), tl.sum(acc1, axis=1)), (2,))    # rows r0, r1

    @triton.jit
    def _step_x(xw_ptr, dx_ptr, xs_ptr, bb, b1, gi, wi, QTYPE: tl.constexpr, WPB: tl.constexpr, G: tl.constexpr,
                ROW_RUN: tl.constexpr):
        """A row-pair step's x tiles (words lo / od, scales, code sums) for blocks bb .. bb + G - 1 (b1 None: a
        whole step, unmasked): with row runs in the weight words' register layout (`_x_step_words`)."""
        if ROW_RUN:
            xlo, xod = _x_step_words(xw_ptr, bb, b1, QTYPE, WPB, G)
            dx, xs = _x_step_scales(dx_ptr, xs_ptr, bb, b1, QTYPE, G)
        else:
            xlo, xod = _x_words(xw_ptr, bb + gi, wi, b1, QTYPE)
            dx, xs = _x_scales(dx_ptr, xs_ptr, bb + gi, b1, QTYPE)
        return xlo, xod, dx, xs

    @triton.jit
    def _pair_step(acc0, acc1, r0, r1, bb, b1, gi, wi, xw_ptr, dx_ptr, xs_ptr, qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr,
                   dm_ptr, s_qs, s_qh, s_sc, s_d, QTYPE: tl.constexpr, WPB: tl.constexpr, G: tl.constexpr,
                   SCALE_WORDS: tl.constexpr, ROW_RUN: tl.constexpr, INTERP: tl.constexpr):
        """One step of `_row_pair_sums`'s plain loop: the step's x tiles (b1 None: a whole step, unmasked), then
        each row's `_gemv_rows_step`."""
        xlo, xod, dx, xs = _step_x(xw_ptr, dx_ptr, xs_ptr, bb, b1, gi, wi, QTYPE, WPB, G, ROW_RUN)
        acc0 = _gemv_rows_step(acc0, r0, bb, b1, wi, xlo, xod, dx, xs, qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr,
                               s_qs, s_qh, s_sc, s_d, QTYPE, WPB, G, SCALE_WORDS, ROW_RUN, INTERP)
        acc1 = _gemv_rows_step(acc1, r1, bb, b1, wi, xlo, xod, dx, xs, qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr,
                               s_qs, s_qh, s_sc, s_d, QTYPE, WPB, G, SCALE_WORDS, ROW_RUN, INTERP)
        return acc0, acc1

    @triton.jit
    def _step_tiles(r0, r1, bb, b1, gi, wi, xw_ptr, dx_ptr, xs_ptr, qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr,
                    s_qs, s_qh, s_sc, s_d, QTYPE: tl.constexpr, WPB: tl.constexpr, G: tl.constexpr,
                    SCALE_WORDS: tl.constexpr, ROW_RUN: tl.constexpr):
        """Everything one row-pair step reads (blocks bb .. bb + G - 1; blocks >= b1 read as 0, so a step past the
        end loads nothing; b1 None: a whole step in range, loaded without masks): x's words and scales, then each
        row's words and scale fields."""
        xlo, xod, dx, xs = _step_x(xw_ptr, dx_ptr, xs_ptr, bb, b1, gi, wi, QTYPE, WPB, G, ROW_RUN)
        w0 = _load_raw(qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, r0, bb, b1, wi, s_qs, s_qh, s_sc, s_d, QTYPE,
                       WPB, G, SCALE_WORDS, ROW_RUN)
        w1 = _load_raw(qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, r1, bb, b1, wi, s_qs, s_qh, s_sc, s_d, QTYPE,
                       WPB, G, SCALE_WORDS, ROW_RUN)
        return (xlo, xod, dx, xs), w0, w1

    @triton.jit
    def _pair_step_sums(acc0, acc1, xt, w0, w1, QTYPE: tl.constexpr, INTERP: tl.constexpr):
        """`_gemv_rows_step`'s sums on tiles already loaded (`_step_tiles`): acc0 / acc1 += each row's blocks' W . x."""
        xlo, xod, dx, xs = xt
        words, hi, d, dmin, sc, mn = w0
        acc0 += _int8_scale(_int8_block_dot(words, hi, xlo, xod, QTYPE, INTERP), dx, xs, d, dmin, sc, mn, QTYPE)
        words, hi, d, dmin, sc, mn = w1
        acc1 += _int8_scale(_int8_block_dot(words, hi, xlo, xod, QTYPE, INTERP), dx, xs, d, dmin, sc, mn, QTYPE)
        return acc0, acc1

    @triton.jit
    def _prefetched_pair_sums(acc0, acc1, r0, r1, gi, wi, xw_ptr, dx_ptr, xs_ptr, qs_ptr, qh_ptr, sc_ptr, mn_ptr,
                              d_ptr, dm_ptr, b0, b1, s_qs, s_qh, s_sc, s_d, QTYPE: tl.constexpr, WPB: tl.constexpr,
                              G: tl.constexpr, SCALE_WORDS: tl.constexpr, ROW_RUN: tl.constexpr,
                              INTERP: tl.constexpr, WHOLE: tl.constexpr = False, AHEAD: tl.constexpr = 1):
        """`_row_pair_sums`'s loop with the next step's tiles loaded into registers before this step's sums (a
        double buffer: the loop carries them), so a program always has a step of loads in flight. The same sums
        in the same order: the same bits. For GEMVs of few, long programs (ffn_down: K 17408, 2,560 programs, one
        partial wave), whose programs otherwise all load, then all compute, in step.
        WHOLE (b1 - b0 a multiple of G, b0 < b1): every step whole, so no load is masked (the step after the last
        is step b1 - G again, loaded and not used), and two steps an iteration, each buffer loaded while the other
        is summed, so the loop carries one buffer and copies no registers between them. AHEAD 2 (WHOLE only): the
        two steps after this one in flight (`_whole_pair_sums_ahead2`)."""
        tl.static_assert(AHEAD == 1 or (AHEAD == 2 and WHOLE), "two steps ahead: whole steps only")
        if AHEAD == 2:
            acc0, acc1 = _whole_pair_sums_ahead2(acc0, acc1, r0, r1, gi, wi, xw_ptr, dx_ptr, xs_ptr, qs_ptr, qh_ptr,
                                                 sc_ptr, mn_ptr, d_ptr, dm_ptr, b0, b1, s_qs, s_qh, s_sc, s_d, QTYPE,
                                                 WPB, G, SCALE_WORDS, ROW_RUN, INTERP)
        elif WHOLE:
            acc0, acc1 = _whole_pair_sums(acc0, acc1, r0, r1, gi, wi, xw_ptr, dx_ptr, xs_ptr, qs_ptr, qh_ptr, sc_ptr,
                                          mn_ptr, d_ptr, dm_ptr, b0, b1, s_qs, s_qh, s_sc, s_d, QTYPE, WPB, G,
                                          SCALE_WORDS, ROW_RUN, INTERP)
        else:
            xt, w0, w1 = _step_tiles(r0, r1, b0, b1, gi, wi, xw_ptr, dx_ptr, xs_ptr, qs_ptr, qh_ptr, sc_ptr, mn_ptr,
                                     d_ptr, dm_ptr, s_qs, s_qh, s_sc, s_d, QTYPE, WPB, G, SCALE_WORDS, ROW_RUN)
            for bb in range(b0, b1, G):
                nxt, n0, n1 = _step_tiles(r0, r1, bb + G, b1, gi, wi, xw_ptr, dx_ptr, xs_ptr, qs_ptr, qh_ptr,
                                          sc_ptr, mn_ptr, d_ptr, dm_ptr, s_qs, s_qh, s_sc, s_d, QTYPE, WPB, G,
                                          SCALE_WORDS, ROW_RUN)
                acc0, acc1 = _pair_step_sums(acc0, acc1, xt, w0, w1, QTYPE, INTERP)
                xt, w0, w1 = nxt, n0, n1
        return acc0, acc1

    @triton.jit
    def _whole_pair_sums(acc0, acc1, r0, r1, gi, wi, xw_ptr, dx_ptr, xs_ptr, qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr,
                         dm_ptr, b0, b1, s_qs, s_qh, s_sc, s_d, QTYPE: tl.constexpr, WPB: tl.constexpr,
                         G: tl.constexpr, SCALE_WORDS: tl.constexpr, ROW_RUN: tl.constexpr, INTERP: tl.constexpr):
        """`_prefetched_pair_sums` WHOLE: steps bb (in buffer A at the top of an iteration) and bb + G; B takes
        bb + G while A is summed, A takes bb + 2 G (clamped to the last step) while B is summed. An odd last step
        is in A after the loop."""
        last = b1 - G
        xa, a0, a1 = _step_tiles(r0, r1, b0, None, gi, wi, xw_ptr, dx_ptr, xs_ptr, qs_ptr, qh_ptr, sc_ptr, mn_ptr,
                                 d_ptr, dm_ptr, s_qs, s_qh, s_sc, s_d, QTYPE, WPB, G, SCALE_WORDS, ROW_RUN)
        for bb in range(b0, last, 2 * G):
            xb, c0, c1 = _step_tiles(r0, r1, bb + G, None, gi, wi, xw_ptr, dx_ptr, xs_ptr, qs_ptr, qh_ptr, sc_ptr,
                                     mn_ptr, d_ptr, dm_ptr, s_qs, s_qh, s_sc, s_d, QTYPE, WPB, G, SCALE_WORDS,
                                     ROW_RUN)
            acc0, acc1 = _pair_step_sums(acc0, acc1, xa, a0, a1, QTYPE, INTERP)
            xa, a0, a1 = _step_tiles(r0, r1, tl.minimum(bb + 2 * G, last), None, gi, wi, xw_ptr, dx_ptr, xs_ptr,
                                     qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, s_qs, s_qh, s_sc, s_d, QTYPE,
                                     WPB, G, SCALE_WORDS, ROW_RUN)
            acc0, acc1 = _pair_step_sums(acc0, acc1, xb, c0, c1, QTYPE, INTERP)
        if ((b1 - b0) // G) % 2 == 1:
            acc0, acc1 = _pair_step_sums(acc0, acc1, xa, a0, a1, QTYPE, INTERP)
        return acc0, acc1

    @triton.jit
    def _whole_pair_sums_ahead2(acc0, acc1, r0, r1, gi, wi, xw_ptr, dx_ptr, xs_ptr, qs_ptr, qh_ptr, sc_ptr, mn_ptr,
                                d_ptr, dm_ptr, b0, b1, s_qs, s_qh, s_sc, s_d, QTYPE: tl.constexpr,
                                WPB: tl.constexpr, G: tl.constexpr, SCALE_WORDS: tl.constexpr,
                                ROW_RUN: tl.constexpr, INTERP: tl.constexpr):
        """`_whole_pair_sums` with two steps in flight while one is summed: three buffers, three steps an
        iteration. At its top A holds step bb and B bb + G; C takes bb + 2 G while A is summed, A bb + 3 G while B
        is, B bb + 4 G while C is (steps past the last clamped to it: loaded, not used). The one or two steps left
        after the loop are in A (and B). The same sums in the same order as one step ahead: the same bits."""
        last = b1 - G
        xa, a0, a1 = _step_tiles(r0, r1, b0, None, gi, wi, xw_ptr, dx_ptr, xs_ptr, qs_ptr, qh_ptr, sc_ptr, mn_ptr,
                                 d_ptr, dm_ptr, s_qs, s_qh, s_sc, s_d, QTYPE, WPB, G, SCALE_WORDS, ROW_RUN)
        xb, e0, e1 = _step_tiles(r0, r1, tl.minimum(b0 + G, last), None, gi, wi, xw_ptr, dx_ptr, xs_ptr, qs_ptr,
                                 qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, s_qs, s_qh, s_sc, s_d, QTYPE, WPB, G,
                                 SCALE_WORDS, ROW_RUN)
        steps = (b1 - b0) // G
        for bb in range(b0, b0 + (steps // 3) * 3 * G, 3 * G):
            xc, c0, c1 = _step_tiles(r0, r1, tl.minimum(bb + 2 * G, last), None, gi, wi, xw_ptr, dx_ptr, xs_ptr,
                                     qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, s_qs, s_qh, s_sc, s_d, QTYPE,
                                     WPB, G, SCALE_WORDS, ROW_RUN)
            acc0, acc1 = _pair_step_sums(acc0, acc1, xa, a0, a1, QTYPE, INTERP)
            xa, a0, a1 = _step_tiles(r0, r1, tl.minimum(bb + 3 * G, last), None, gi, wi, xw_ptr, dx_ptr, xs_ptr,
                                     qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, s_qs, s_qh, s_sc, s_d, QTYPE,
                                     WPB, G, SCALE_WORDS, ROW_RUN)
            acc0, acc1 = _pair_step_sums(acc0, acc1, xb, e0, e1, QTYPE, INTERP)
            xb, e0, e1 = _step_tiles(r0, r1, tl.minimum(bb + 4 * G, last), None, gi, wi, xw_ptr, dx_ptr, xs_ptr,
                                     qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, s_qs, s_qh, s_sc, s_d, QTYPE,
                                     WPB, G, SCALE_WORDS, ROW_RUN)
            acc0, acc1 = _pair_step_sums(acc0, acc1, xc, c0, c1, QTYPE, INTERP)
        if steps % 3 >= 1:
            acc0, acc1 = _pair_step_sums(acc0, acc1, xa, a0, a1, QTYPE, INTERP)
        if steps % 3 == 2:
            acc0, acc1 = _pair_step_sums(acc0, acc1, xb, e0, e1, QTYPE, INTERP)
        return acc0, acc1

    @triton.jit
    def _two_rows(pid_n, N, K, BS: tl.constexpr):
        """A `_gemv_two_kernel` program's two rows (clamped to N - 1, int64, (2, 1)) and its weight's block count."""
        rows = tl.minimum(pid_n * 2 + tl.arange(0, 2), N - 1)
        return rows[:, None].to(tl.int64), K // BS

    @triton.jit
    def _gemv_two_rows(pid_n, xw_ptr, dx_ptr, xs_ptr, y_ptr, qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, N, K,
                       s_qs, s_qh, s_sc, s_d, QTYPE: tl.constexpr, BS: tl.constexpr, FPW: tl.constexpr,
                       G: tl.constexpr, SCALE_WORDS: tl.constexpr, ROW_RUN: tl.constexpr, INTERP: tl.constexpr,
                       PREFETCH: tl.constexpr, WHOLE: tl.constexpr):
        """One program of `_gemv_two_kernel` on one weight, after its wait: the unsplit row-pair GEMV's sums and
        store."""
        out = _row_pair_sums(pid_n, xw_ptr, dx_ptr, xs_ptr, qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, N, 0,
                             K // BS, s_qs, s_qh, s_sc, s_d, QTYPE, BS // FPW, G, 1, SCALE_WORDS, ROW_RUN, 1, INTERP,
                             PREFETCH, WHOLE)
        rows = pid_n * 2 + tl.arange(0, 2)
        tl.store(y_ptr + rows, out.to(y_ptr.dtype.element_ty), mask=rows < N)

    @triton.jit
    def _gemv_two_kernel(xa_ptr, xb_ptr, dx_ptr, xs_ptr, ya_ptr, yb_ptr, qa_ptr, ha_ptr, sa_ptr, ma_ptr, da_ptr,
                         dma_ptr, qb_ptr, hb_ptr, sb_ptr, mb_ptr, db_ptr, dmb_ptr,
                         NA, NB, K, a_qs, a_qh, a_sc, a_d, b_qs, b_qh, b_sc, b_d,
                         QA: tl.constexpr, BSA: tl.constexpr, FPWA: tl.constexpr, GA: tl.constexpr,
                         WORDSA: tl.constexpr, QB: tl.constexpr, BSB: tl.constexpr, FPWB: tl.constexpr,
                         GB: tl.constexpr, WORDSB: tl.constexpr, RUNA: tl.constexpr, RUNB: tl.constexpr,
                         INTERP: tl.constexpr, PREFETCH: tl.constexpr = 0, WHOLEA: tl.constexpr = False,
                         WHOLEB: tl.constexpr = False, PDL: tl.constexpr = False):
        """Two weights of one x (of different block types, so not stacked) in one launch (`gemv_two`): the first
        cdiv(NA, 2) programs are weight A's row-pair GEMV, the rest weight B's. One launch's ramp and tail instead of
        two. PREFETCH: both on `_prefetched_pair_sums`; WHOLEA / WHOLEB: `_row_pair_sums` WHOLE per weight."""
        pid = tl.program_id(0)
        pa = (NA + 1) // 2
        if PDL:         # the program's first step of weights (index math only: no load before the wait)
            if pid < pa:
                r, nblk = _two_rows(pid, NA, K, BSA)
                _prefetch_rows(qa_ptr, r, a_qs, 0, nblk * (BSA // FPWA) - 1, (GA * (BSA // FPWA) + 31) // 32)
            else:
                r, nblk = _two_rows(pid - pa, NB, K, BSB)
                _prefetch_rows(qb_ptr, r, b_qs, 0, nblk * (BSB // FPWB) - 1, (GB * (BSB // FPWB) + 31) // 32)
        pdl_enter(PDL)
        if pid < pa:
            _gemv_two_rows(pid, xa_ptr, dx_ptr, xs_ptr, ya_ptr, qa_ptr, ha_ptr, sa_ptr, ma_ptr, da_ptr, dma_ptr, NA, K,
                           a_qs, a_qh, a_sc, a_d, QA, BSA, FPWA, GA, WORDSA, RUNA, INTERP, PREFETCH, WHOLEA)
        else:
            _gemv_two_rows(pid - pa, xb_ptr, dx_ptr, xs_ptr, yb_ptr, qb_ptr, hb_ptr, sb_ptr, mb_ptr, db_ptr, dmb_ptr,
                           NB, K, b_qs, b_qh, b_sc, b_d, QB, BSB, FPWB, GB, WORDSB, RUNB, INTERP, PREFETCH, WHOLEB)

    @triton.jit
    def _gemv_int8_kernel(xw_ptr, dx_ptr, xs_ptr, y_ptr, b_ptr, qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr,
                          N, NBLK, s_qs, s_qh, s_sc, s_d, blocks_per_split,
                          QTYPE: tl.constexpr, BS: tl.constexpr, FPW: tl.constexpr,
                          BLOCK_N: tl.constexpr, G: tl.constexpr, STAGES: tl.constexpr, INTERP: tl.constexpr,
                          HAS_BIAS: tl.constexpr, SCALE_WORDS: tl.constexpr, ROW_RUN: tl.constexpr,
                          ROW_PAIR: tl.constexpr = False, UNROLL: tl.constexpr = 1, PREFETCH: tl.constexpr = 0,
                          WHOLE: tl.constexpr = False, PDL: tl.constexpr = False):
        """y[pid_k, n] = this program's blocks of W[n, :] . x with int8 activations (dp4a) [+ bias[n]],
        stored in y's dtype (fp32 partials when split, the layer's dtype otherwise). ROW_PAIR (BLOCK_N 2): the two
        rows as two one-row tiles that share the step's x tiles (`_row_pair_sums`, with its PREFETCH and WHOLE)."""
        WPB: tl.constexpr = BS // FPW
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        rows = tl.where(row_ok, rows, N - 1)          # clamped rows: loads need no row mask
        r = rows[:, None, None].to(tl.int64)          # int64 offsets: vocab-sized tables pass 2^31 bytes
        gi = tl.arange(0, G)[None, :, None]
        wi = tl.arange(0, WPB)[None, None, :]
        b0 = pid_k * blocks_per_split
        b1 = tl.minimum(b0 + blocks_per_split, NBLK)
        if PDL:         # the pipeline's first steps of weights (index math only above: no load before the wait)
            _prefetch_rows(qs_ptr, tl.reshape(r, (BLOCK_N, 1)), s_qs, b0 * WPB, b1 * WPB - 1,
                           (STAGES * G * WPB + 31) // 32)
        pdl_enter(PDL)
        # tl.range with num_stages > 1: the word / scale tiles of the next steps are copied to shared
        # memory asynchronously (cp.async) while this step computes; 1 (shipped): plain loads.
        if ROW_PAIR:    # BLOCK_N 2 as two one-row tiles sharing the step's x tiles (each in the one-row layout)
            out = _row_pair_sums(pid_n, xw_ptr, dx_ptr, xs_ptr, qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, N,
                                 b0, b1, s_qs, s_qh, s_sc, s_d, QTYPE, WPB, G, STAGES, SCALE_WORDS, ROW_RUN, UNROLL,
                                 INTERP, PREFETCH, WHOLE)
        else:           # _gemv_rows_step's work, in the order the shipped tiles were timed in (weights before x)
            acc = tl.zeros((BLOCK_N, G), dtype=tl.float32)
            for bb in tl.range(b0, b1, G, num_stages=STAGES, loop_unroll_factor=UNROLL):
                blk = bb + gi
                words, hi, d, dmin, sc, mn = _load_raw(qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, r, bb, b1, wi,
                                                       s_qs, s_qh, s_sc, s_d, QTYPE, WPB, G, SCALE_WORDS, ROW_RUN)
                xlo, xod = _x_words(xw_ptr, blk, wi, b1, QTYPE)
                isum = _int8_block_dot(words, hi, xlo, xod, QTYPE, INTERP)
                dx, xs = _x_scales(dx_ptr, xs_ptr, blk, b1, QTYPE)
                acc += _int8_scale(isum, dx, xs, d, dmin, sc, mn, QTYPE)
            out = tl.sum(acc, axis=1)
        if HAS_BIAS:
            out += tl.load(b_ptr + rows).to(tl.float32)
        tl.store(y_ptr + pid_k.to(tl.int64) * N + rows, out.to(y_ptr.dtype.element_ty), mask=row_ok)

    @triton.jit
    def _store_tile(acc, y_ptr, b_ptr, slot, offs_m, rows, m_ok, row_ok, M, N, HAS_BIAS: tl.constexpr):
        """A small-M program's (BLOCK_M, BLOCK_N) fp32 result into y[slot] (+ bias when unsplit), in y's dtype."""
        if HAS_BIAS:
            acc += tl.load(b_ptr + rows).to(tl.float32)[None, :]
        y = y_ptr + slot.to(tl.int64) * M * N + offs_m[:, None].to(tl.int64) * N + rows[None, :]
        tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & row_ok[None, :])

    @triton.jit
    def _pair_codes(words, hi, k: tl.constexpr, QTYPE: tl.constexpr, FIELD: tl.constexpr = False):
        """Fields k and k + 4 of every word as bf16 bits in the low / high 16 bits (see _field's layouts), in two
        parts for _bf16_pairs: t = (s & mask) | h. Integer form (FIELD False): the bits of 128 + q; s: the words
        shifted so the two nibbles sit at bits 0 and 16 (mask 0x000F000F); h: 0x43004300, with the fields' high
        bits at bits 4 (5) and 20 (21): Q6_K's two of each field (bits 4f, 4f + 1 of `hi`), Q5_0 / Q5_K's one (bit f
        of `hi`). Field form (FIELD; Q4_K's PAIRS_FIELD, 4-bit codes): the bits of 1 + q / 16, the nibbles 3 bits
        further up (mask 0x00780078), h = 0x3F803F80."""
        if FIELD:
            tl.static_assert(QTYPE == 1 or QTYPE == 3, "the field form is for 4-bit codes")
            s = _shift(words, 4 * k - 3)
            h = tl.full(s.shape, 0x3F803F80, tl.int32)
        else:
            s = _shift(words, 4 * k)
            if QTYPE == 5:
                h = (_shift(hi, 4 * k - 4) & 0x00300030) | 0x43004300
            elif QTYPE == 2 or QTYPE == 4:
                h = (_shift(hi, k - 4) & 0x10) | (_shift(hi, k - 16) & 0x100000) | 0x43004300
            else:
                h = tl.full(s.shape, 0x43004300, tl.int32)
        return s, h

    @triton.jit
    def _bf16_pair_scales(a, b, PAIRS: tl.constexpr):
        """A and B of each (row, block) (fp32, (BN, G, 1)) rounded to bf16, as _bf16_pairs takes them: for the PTX
        (PAIRS 1, 3) each as an int32 holding the bf16 twice (a bf16x2 operand), in the interpreter (PAIRS 2) as
        fp32 values, rounded to nearest as the GPU rounds. Once a step, for the step's four field pairs."""
        if PAIRS == 2 or PAIRS == 5:
            ap = _rne_bf16(a)
            bp = _rne_bf16(b)
        else:
            ab = a.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
            bb = b.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
            ap = ab | (ab << 16)
            bp = bb | (bb << 16)
        return ap, bp

    @triton.jit
    def _bf16_pairs(s, h, ap, bp, PAIRS: tl.constexpr):
        """Weights A * q + B in bf16, two per 32-bit op, from (s, h) of _pair_codes: t = (s & 0x000F000F) | h, int32
        words (BN, G, WPB) whose 16-bit halves are the bf16 bits of 128 + q (0x4300 | q, exact for q < 128); ap /
        bp the A / B of each (row, block) from _bf16_pair_scales, (BN, G, 1). Returns (BN, G, WPB, 2): [..., 0] from
        the low half, [..., 1] from the high half. PAIRS 1: PTX fma.rn.bf16x2 (sm_80+) twice: q = (128 + q) * 1 -
        128 (exact), then A * q + B rounded once; PAIRS 3: the same with t made by one lop3 in the asm; PAIRS 2: the
        same values in fp32 then one rounding (Triton's CPU interpreter runs no PTX; the product and the sum are
        exact in fp32, so the two agree).
        The field form (s, h from _pair_codes(FIELD=True); ap / bp the a / b of _affine in bf16): the halves of t are
        f = 1 + q / 16, and one fma.rn.bf16x2 makes a * f + b (PAIRS 4, after one lop3; PAIRS 5 the interpreter's
        fp32 arithmetic, rounded once). One bf16x2 op a pair fewer, at the cost of b rounded to bf16 where the
        integer form rounds a + b: b = -(a + dmin m) for Q4_K, at least a = 16 code steps in size, so a block's
        weights can move together by up to 2^-8 a (a sixteenth of a code step) more than there."""
        if PAIRS == 4:      # the mask 0x000F000F << 3 as lop3's immediate (ptxas does not fuse an and before it)
            ap = tl.broadcast_to(ap, s.shape)
            bp = tl.broadcast_to(bp, s.shape)
            lo, hi = tl.inline_asm_elementwise(
                "{ .reg .b32 t, r; lop3.b32 t, $2, 0x00780078, $3, 0xEA; fma.rn.bf16x2 r, t, $4, $5; "
                "mov.b32 {$0, $1}, r; }",
                "=h,=h,r,r,r,r", [s, h, ap, bp], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=1)
            w = tl.join(lo, hi)
        elif PAIRS == 5:
            t = (s & 0x00780078) | h
            lo = _rne_bf16((t << 16).to(tl.float32, bitcast=True) * ap + bp)
            hi = _rne_bf16((t & -65536).to(tl.float32, bitcast=True) * ap + bp)
            w = tl.join(lo, hi).to(tl.bfloat16)
        elif PAIRS == 1 or PAIRS == 3:
            ap = tl.broadcast_to(ap, s.shape)
            bp = tl.broadcast_to(bp, s.shape)
            # One asm per word (pack 1), two 16-bit results: an asm over neighbouring elements of a joined tensor
            # (pack 2) gets whichever two elements the layout puts in neighbouring registers, not a word's two
            # copies.
            if PAIRS == 3:  # (s & mask) | h as one lop3 (LUT 0xEA): Triton's and / or stay two (two immediates)
                lo, hi = tl.inline_asm_elementwise(
                    "{ .reg .b32 t, one, m128, q, r; lop3.b32 t, $2, 0x000F000F, $3, 0xEA; "
                    "mov.b32 one, 0x3F803F80; mov.b32 m128, 0xC300C300; "
                    "fma.rn.bf16x2 q, t, one, m128; fma.rn.bf16x2 r, q, $4, $5; mov.b32 {$0, $1}, r; }",
                    "=h,=h,r,r,r,r", [s, h, ap, bp], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=1)
            else:
                lo, hi = tl.inline_asm_elementwise(
                    "{ .reg .b32 one, m128, q, r; mov.b32 one, 0x3F803F80; mov.b32 m128, 0xC300C300; "
                    "fma.rn.bf16x2 q, $2, one, m128; fma.rn.bf16x2 r, q, $3, $4; mov.b32 {$0, $1}, r; }",
                    "=h,=h,r,r,r", [(s & 0x000F000F) | h, ap, bp], dtype=(tl.bfloat16, tl.bfloat16),
                    is_pure=True, pack=1)
            w = tl.join(lo, hi)
        else:
            t = (s & 0x000F000F) | h
            lo = _rne_bf16((t & 0x7F).to(tl.float32) * ap + bp)
            hi = _rne_bf16(((t >> 16) & 0x7F).to(tl.float32) * ap + bp)
            w = tl.join(lo, hi).to(tl.bfloat16)          # exact: the values are bf16 already
        return w

    @triton.jit
    def _rne_bf16(v):
        """fp32 v rounded to the nearest bf16 (ties to even), as fp32: what the GPU's conversions and bf16x2 fma
        do. Triton's CPU interpreter converts fp32 to bf16 by truncation, toward zero, which biases every sum."""
        u = v.to(tl.uint32, bitcast=True)
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
        return u.to(tl.float32, bitcast=True)

    @triton.jit
    def _dot_step(acc, w, xv, UPCAST: tl.constexpr, W_AS_A: tl.constexpr):
        """acc + the dot of a decoded weight tile w (BN, K) with x (BM, K), or x^T (K, BM) when W_AS_A."""
        if UPCAST:   # the CPU interpreter computes bf16 tl.dot wrongly: same rounded values in fp32
            xv = xv.to(tl.float32)
            w = w.to(tl.float32)
        if W_AS_A:
            acc = tl.dot(w, xv, acc)
        else:
            acc = tl.dot(xv, tl.trans(w), acc)
        return acc

    @triton.jit
    def _dot_kernel(x_ptr, y_ptr, b_ptr, qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr,
                    M, N, NBLK, s_xm, s_qs, s_qh, s_sc, s_d, blocks_per_split,
                    QTYPE: tl.constexpr, BS: tl.constexpr, FPW: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr, UPCAST: tl.constexpr,
                    HAS_BIAS: tl.constexpr, W_AS_A: tl.constexpr, SCALE_WORDS: tl.constexpr, ROW_RUN: tl.constexpr,
                    PAIRS: tl.constexpr = 0, XPERM: tl.constexpr = False, STREAM: tl.constexpr = False,
                    PDL: tl.constexpr = False):
        """y[slot, m, n] = partial x[m, :] . W[n, :] over this program's blocks (_dot_rows).
        Split of the work: grid (m tiles, row tiles, K splits), program (pid_n, pid_k) takes row tile pid_n, blocks
        pid_k * blocks_per_split on, into slot pid_k; or STREAM (`stream_split`): grid (m tiles, P), the row tiles'
        steps of G blocks laid end to end and cut into P near-equal runs, so every program has the same work
        whatever the number of row tiles; program p computes its run's piece of each row tile it touches (one or
        two when P >= row tiles) into slot p - (the first program of that tile)."""
        WPB: tl.constexpr = BS // FPW
        pid_n = tl.program_id(1)
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        m_ok = offs_m < M
        if STREAM:
            n_prog = tl.num_programs(1)
            spt = (NBLK + G - 1) // G                          # steps per row tile
            total = ((N + BLOCK_N - 1) // BLOCK_N) * spt
            s0 = (pid_n * total) // n_prog
            s1 = ((pid_n + 1) * total) // n_prog
            t0 = s0 // spt
            if PDL:
                b0, b1 = _stream_blocks(t0, s0, s1, spt, G, NBLK)
                rows, _ = _tile_rows(t0, N, BLOCK_N)
                _prefetch_rows(qs_ptr, rows[:, None].to(tl.int64), s_qs, b0 * WPB, b1 * WPB - 1,
                               (2 * G * WPB + 31) // 32)
            pdl_enter(PDL)
            for t in range(t0, (s1 - 1) // spt + 1):
                b0, b1 = _stream_blocks(t, s0, s1, spt, G, NBLK)
                rows, row_ok = _tile_rows(t, N, BLOCK_N)
                acc = _dot_rows(x_ptr, qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, rows, b0, b1, offs_m, m_ok,
                                s_xm, s_qs, s_qh, s_sc, s_d, QTYPE, BS, FPW, BLOCK_M, BLOCK_N, G, UPCAST, W_AS_A,
                                SCALE_WORDS, ROW_RUN, PAIRS, XPERM)
                slot = pid_n - ((t * spt + 1) * n_prog - 1) // total      # the first program of tile t
                _store_tile(acc, y_ptr, b_ptr, slot, offs_m, rows, m_ok, row_ok, M, N, HAS_BIAS)
        else:
            pid_k = tl.program_id(2)
            b0 = pid_k * blocks_per_split
            b1 = tl.minimum(b0 + blocks_per_split, NBLK)
            rows, row_ok = _tile_rows(pid_n, N, BLOCK_N)
            if PDL:         # the first two steps of weights (no load above this point: _prefetch_rows)
                _prefetch_rows(qs_ptr, rows[:, None].to(tl.int64), s_qs, b0 * WPB, b1 * WPB - 1,
                               (2 * G * WPB + 31) // 32)
            pdl_enter(PDL)
            acc = _dot_rows(x_ptr, qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, rows, b0, b1, offs_m, m_ok,
                            s_xm, s_qs, s_qh, s_sc, s_d, QTYPE, BS, FPW, BLOCK_M, BLOCK_N, G, UPCAST, W_AS_A,
                            SCALE_WORDS, ROW_RUN, PAIRS, XPERM)
            _store_tile(acc, y_ptr, b_ptr, pid_k, offs_m, rows, m_ok, row_ok, M, N, HAS_BIAS)

    @triton.jit
    def _stream_blocks(t, s0, s1, spt, G: tl.constexpr, NBLK):
        """Blocks [b0, b1) of row tile t that steps [s0, s1) of the end-to-end order (spt steps a tile) cover."""
        b0 = (tl.maximum(s0, t * spt) - t * spt) * G
        b1 = tl.minimum((tl.minimum(s1, t * spt + spt) - t * spt) * G, NBLK)
        return b0, b1

    @triton.jit
    def _tile_rows(t, N, BLOCK_N: tl.constexpr):
        """(rows, row_ok) of row tile t: the weight rows clamped to N - 1 (the loads need no row mask), and which of
        them are real (the store's mask)."""
        rows = t * BLOCK_N + tl.arange(0, BLOCK_N)
        return tl.minimum(rows, N - 1), rows < N

    @triton.jit
    def _dot_rows(x_ptr, qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, rows, b0, b1, offs_m, m_ok,
                  s_xm, s_qs, s_qh, s_sc, s_d,
                  QTYPE: tl.constexpr, BS: tl.constexpr, FPW: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr, UPCAST: tl.constexpr,
                  W_AS_A: tl.constexpr, SCALE_WORDS: tl.constexpr, ROW_RUN: tl.constexpr,
                  PAIRS: tl.constexpr, XPERM: tl.constexpr):
        """fp32 (BLOCK_M, BLOCK_N): x[offs_m, :] . W[n, :] for the weight rows n in `rows` (_tile_rows) over blocks
        [b0, b1), via tl.dot per field.
        PAIRS (4- to 6-bit codes, bf16 x; `_bf16_pairs`): fields f and f + 4 of a word decoded together, two
        weights per 32-bit op, one dot of K = 2 * G * WPB per pair instead of one per field.
        W_AS_A: y^T = W . x^T, the decoded weight tile as the dot's first operand and x^T (loaded transposed)
        second, so BLOCK_N is the MMA's M: on sm_90 a 16-token block then compiles to wgmma (M >= 64) instead of
        mma.sync; otherwise y = x . W^T. Same products and K order per output: the same values to fp32 rounding.
        XPERM (with PAIRS): x comes in `pair_order` (each 256-weight step's columns in the order the field pairs
        decode), so a pair's x tile is one contiguous run and neither operand is permuted in registers."""
        WPB: tl.constexpr = BS // FPW
        KF: tl.constexpr = G * WPB                     # K of one field's dot
        r = rows[:, None, None].to(tl.int64)
        wi = tl.arange(0, WPB)[None, None, :]
        c = tl.arange(0, KF)
        cb = c // WPB                                  # block of column c of a field's (BN, KF) tile
        cw = c % WPB
        c2 = tl.arange(0, 2 * KF)                      # PAIRS: column c2 of a field pair's (BN, 2 KF) tile is
        cb2 = c2 // (2 * WPB)                          # block cb2, field k + 4 * ch2, word cw2 (x runs of WPB)
        ch2 = (c2 // WPB) % 2
        cw2 = c2 % WPB
        xm = x_ptr + offs_m[:, None].to(tl.int64) * s_xm
        xm_t = x_ptr + offs_m[None, :].to(tl.int64) * s_xm
        DT: tl.constexpr = x_ptr.dtype.element_ty
        if W_AS_A:
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for bb in range(b0, b1, G):
            words, hi, a, b = _load_tile(qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, r, bb, b1, wi,
                                         s_qs, s_qh, s_sc, s_d, QTYPE, WPB, G, SCALE_WORDS, ROW_RUN)
            a3 = a[:, :, None]
            b3 = b[:, :, None]
            if PAIRS:
                kb = bb + cb2
            else:
                kb = bb + cb
            xmask = m_ok[:, None] & (kb < b1)[None, :]
            xmask_t = (kb < b1)[:, None] & m_ok[None, :]
            if PAIRS >= 4:  # the field form: w = a f + b as it is
                ap, bp = _bf16_pair_scales(a3, b3, PAIRS)
            elif PAIRS:     # field f = 1 + q / 2^bits (_field): w = a f + b = (a / 2^bits) q + (a + b)
                INV: tl.constexpr = 0.015625 if QTYPE == 5 else (0.03125 if QTYPE == 2 or QTYPE == 4 else 0.0625)
                ap, bp = _bf16_pair_scales(a3 * INV, a3 + b3, PAIRS)
            if PAIRS:
                for k in tl.static_range(4):
                    s, h = _pair_codes(words, hi, k, QTYPE, PAIRS >= 4)
                    # x is loaded in runs of a field's WPB words: (block, field of the pair, word). The pairs come
                    # as (block, word, field): the smaller tile is permuted to the other's K order (SASS of the
                    # loop on sm_90: x permuted 990 instructions, 152 registers; the weights permuted 1,239, 168).
                    # W_AS_A permutes the weights (1,191 against 1,368 and 255 registers).
                    w = _bf16_pairs(s, h, ap, bp, PAIRS)
                    col = kb * BS + (k + 4 * ch2) * WPB + cw2
                    if XPERM:   # x in pair_order: pair k of this step is columns 2 KF k .. 2 KF (k + 1) - 1
                        w = tl.reshape(w, (BLOCK_N, 2 * KF))
                        col = bb * BS + k * 2 * KF + c2
                        if W_AS_A:
                            xv = tl.load(xm_t + col[:, None], mask=xmask_t, other=0)
                        else:
                            xv = tl.load(xm + col[None, :], mask=xmask, other=0)
                    elif W_AS_A:
                        w = tl.reshape(tl.permute(w, (0, 1, 3, 2)), (BLOCK_N, 2 * KF))
                        xv = tl.load(xm_t + col[:, None], mask=xmask_t, other=0)
                    else:
                        w = tl.reshape(w, (BLOCK_N, 2 * KF))
                        xv = tl.load(xm + col[None, :], mask=xmask, other=0)
                        xv = tl.reshape(tl.permute(tl.reshape(xv, (BLOCK_M, G, 2, WPB)), (0, 1, 3, 2)),
                                        (BLOCK_M, 2 * KF))
                    acc = _dot_step(acc, w, xv, UPCAST, W_AS_A)
            else:
                for f in tl.static_range(FPW):
                    w = tl.reshape(_field(words, hi, f, QTYPE) * a3 + b3, (BLOCK_N, KF)).to(DT)
                    if W_AS_A:
                        xv = tl.load(xm_t + (kb * BS + f * WPB + cw)[:, None], mask=xmask_t, other=0)   # [KF, BM]
                    else:
                        xv = tl.load(xm + (kb * BS + f * WPB + cw)[None, :], mask=xmask, other=0)       # [BM, KF]
                    acc = _dot_step(acc, w, xv, UPCAST, W_AS_A)
        if W_AS_A:
            acc = tl.trans(acc)
        return acc

    @triton.jit
    def _mmq_pos(e, ORDER: tl.constexpr):
        """Weight position inside its 32-weight group of element e of the int8 code tiles of the mmq path
        (`_mmq_codes`: byte t of a group's planar words gives elements 2t, its low nibble, and 2t + 1, its
        high nibble; Q8_0: element t is byte t). ORDER 0: Q8_0, 1: 32-blocks of nibbles, 2: Q6_K."""
        if ORDER == 0:          # byte t = 4w + f of a 32-block: field f of word w = weight 8f + w
            pos = 8 * (e % 4) + e // 4
        elif ORDER == 1:        # byte t = 4w + i: fields 2i, 2i + 1 of word w = weights 8i + w, 8i + w + 4
            t = e // 2
            pos = 8 * (t % 4) + t // 4 + 4 * (e % 2)
        else:                   # Q6_K, two 16-blocks of 8 bytes: byte 4w + i = weights 4i + w, 4i + w + 2
            t = e // 2
            tt = t % 8
            pos = 16 * (t // 8) + 4 * (tt % 4) + tt // 4 + 2 * (e % 2)
        return pos

    @triton.jit
    def _quant_xm_kernel(x_ptr, xq_ptr, dx_ptr, xs_ptr, NG, s_xm, ORDER: tl.constexpr, R: tl.constexpr,
                         PDL: tl.constexpr = False):
        """Row m = program_id(1) of x (M, K) -> int8 codes per 32 values with the GEMV's rounding
        (_quant_x_kernel: the same codes and scales), stored (M, K) in the element order of the weight code
        tiles (_mmq_pos), the scales dx (M, K/32) and the code sums per 16 values in weight order xs (M, K/16)."""
        pdl_enter(PDL)
        m = tl.program_id(1).to(tl.int64)
        g = tl.program_id(0) * R + tl.arange(0, R)                         # 32-groups
        ok = g < NG
        c = tl.arange(0, 32)
        xrow = x_ptr + m * s_xm + g[:, None] * 32
        xn = tl.load(xrow + c[None, :], mask=ok[:, None], other=0).to(tl.float32)
        amax = tl.max(tl.abs(xn), axis=1)
        inv = tl.where(amax > 0, tl.math.div_rn(tl.full(amax.shape, 127.0, tl.float32), amax), 0.0)
        qn = tl.floor(xn * inv[:, None] + 0.5).to(tl.int32)
        xs = tl.sum(tl.reshape(qn, (R, 2, 16)), axis=2)
        tl.store(xs_ptr + m * 2 * NG + g[:, None] * 2 + tl.arange(0, 2)[None, :], xs, mask=ok[:, None])
        tl.store(dx_ptr + m * NG + g, tl.math.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32)), mask=ok)
        xp = tl.load(xrow + _mmq_pos(c, ORDER)[None, :], mask=ok[:, None], other=0).to(tl.float32)
        q = tl.floor(xp * inv[:, None] + 0.5).to(tl.int8)
        tl.store(xq_ptr + m * 32 * NG + g[:, None] * 32 + c[None, :], q, mask=ok[:, None])

    @triton.jit
    def _mmq_load_w(qs_ptr, qh_ptr, r, g, ok, s_qs, s_qh, QTYPE: tl.constexpr):
        """The raw bytes of 32-weight group g of rows r ((BN, 1) int64; ok (BN, 1)): the planar words as bytes
        (BN, 16) uint8 (Q8_0: (BN, 32) int8) and the high bits (Q5: the 4 qh bytes of the group's words per
        byte t, Q6_K: the int32 of t's 16-block; other types: the bytes again, unused). ok False: zeros."""
        if QTYPE == 0:
            t = tl.arange(0, 32)[None, :]
            b = tl.load(qs_ptr.to(tl.pointer_type(tl.int8)) + r * (4 * s_qs) + g * 32 + t, mask=ok, other=0)
            h = b
        else:
            t = tl.arange(0, 16)[None, :]
            b = tl.load(qs_ptr.to(tl.pointer_type(tl.uint8)) + r * (4 * s_qs) + g * 16 + t, mask=ok, other=0)
            if QTYPE == 2 or QTYPE == 4:       # bit f of word w's qh byte: field f
                h = tl.load(qh_ptr.to(tl.pointer_type(tl.uint8)) + r * s_qh + g * 4 + t // 4, mask=ok, other=0)
            elif QTYPE == 5:                   # one int32 of high bit pairs per 16-block (packed._q6k_shift)
                h = tl.load(qh_ptr + r * s_qh + 2 * g + t // 8, mask=ok, other=0)
            else:
                h = b
        return b, h

    @triton.jit
    def _mmq_codes(b, h, QTYPE: tl.constexpr):
        """_mmq_load_w's bytes -> the group's int8 codes (BN, 32) in _mmq_pos order: byte t gives elements 2t
        (its low nibble) and 2t + 1 (its high nibble), with their high bits; unsigned field values, Q8_0 the
        signed bytes."""
        if QTYPE == 0:
            codes = b
        else:
            t = tl.arange(0, 16)[None, :]
            lo = b & 15
            hi = b >> 4
            if QTYPE == 2 or QTYPE == 4:
                sh = (2 * (t % 4)).to(tl.uint8)
                lo = lo | (((h >> sh) & 1) << 4)
                hi = hi | (((h >> (sh + 1)) & 1) << 4)
            elif QTYPE == 5:
                sh = 8 * (t % 4) + 2 * ((t % 8) // 4)
                lo = lo | (((h >> sh) & 3) << 4).to(tl.uint8)
                hi = hi | (((h >> (sh + 4)) & 3) << 4).to(tl.uint8)
            codes = tl.reshape(tl.join(lo, hi), (lo.shape[0], 32)).to(tl.int8)
        return codes

    @triton.jit
    def _mmq_load_scales(sc_ptr, mn_ptr, d_ptr, dm_ptr, rn, g, ok, s_sc, s_d, QTYPE: tl.constexpr):
        """The raw scale fields of group g of rows rn ((BN,) int64): (d, dmin, sa, sb); Q8_0 / Q4_0 / Q5_0: d of
        the group (the others repeat it), K-quants: d, dmin of the 256 and sc, mn of the group, Q6_K: d and the
        two 16-blocks' int8 scales."""
        if QTYPE <= 2:
            d = tl.load(d_ptr + rn * s_d + g, mask=ok, other=0)
            dmin = d
            sa = d
            sb = d
        elif QTYPE == 5:
            d = tl.load(d_ptr + rn * s_d + g // 8, mask=ok, other=0)
            dmin = d
            sa = tl.load(sc_ptr + rn * s_sc + 2 * g, mask=ok, other=0)
            sb = tl.load(sc_ptr + rn * s_sc + 2 * g + 1, mask=ok, other=0)
        else:
            d = tl.load(d_ptr + rn * s_d + g // 8, mask=ok, other=0)
            dmin = tl.load(dm_ptr + rn * s_d + g // 8, mask=ok, other=0)
            sa = tl.load(sc_ptr + rn * s_sc + g, mask=ok, other=0)
            sb = tl.load(mn_ptr + rn * s_sc + g, mask=ok, other=0)
        return d, dmin, sa, sb

    @triton.jit
    def _mmq_accumulate(acc, xq, codes, dx, xs0, xs1, d, dmin, sa, sb, QTYPE: tl.constexpr):
        """acc (BM, BN) += one group's x[m] . W[n]: the exact integer sums code . q_x in an int8 dot (Q6_K: one
        per 16-block, the other half of x zeroed), then the scales in fp32 as the GEMV applies them
        (S * dx * isum + O * dx * xs). dx, xs0, xs1: (BM, 1); d, dmin, sa, sb: (BN,)."""
        d = d.to(tl.float32)
        if QTYPE == 5:
            first = (tl.arange(0, 32) < 16)[None, :]
            i0 = tl.dot(tl.where(first, xq, 0), tl.trans(codes), out_dtype=tl.int32)
            i1 = tl.dot(tl.where(first, 0, xq), tl.trans(codes), out_dtype=tl.int32)
            part = (d * sa.to(tl.float32))[None, :] * (i0 - 32 * xs0).to(tl.float32) \
                + (d * sb.to(tl.float32))[None, :] * (i1 - 32 * xs1).to(tl.float32)
            acc += dx * part
        else:
            isum = tl.dot(xq, tl.trans(codes), out_dtype=tl.int32)                          # (BM, BN)
            if QTYPE <= 2:
                if QTYPE == 0:
                    iv = isum
                elif QTYPE == 1:
                    iv = isum - 8 * (xs0 + xs1)
                else:
                    iv = isum - 16 * (xs0 + xs1)
                acc += (dx * d[None, :]) * iv.to(tl.float32)
            else:
                part = (d * sa.to(tl.float32))[None, :] * isum.to(tl.float32) \
                    - (dmin.to(tl.float32) * sb.to(tl.float32))[None, :] * (xs0 + xs1).to(tl.float32)
                acc += dx * part
        return acc

    @triton.jit
    def _mmq_kernel(xq_ptr, dx_ptr, xs_ptr, y_ptr, b_ptr, qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr,
                    M, N, NG, s_qs, s_qh, s_sc, s_d, groups_per_split,
                    QTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr,
                    PDL: tl.constexpr = False):
        """y[pid_k, m, n] = partial x[m, :] . W[n, :] over this program's 32-weight groups, on int8 tensor
        cores (_mmq_accumulate). x: the int8 codes, scales and sums of _quant_xm_kernel. Every load of group
        g + 1 (weights, x, scales) is issued before group g is computed, so its memory latency overlaps that
        work (Triton's pipeliner takes none of them: byte and per-row scale loads are too narrow for cp.async)."""
        pdl_enter(PDL)
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        pid_k = tl.program_id(2)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        m_ok = offs_m < M
        om = tl.where(m_ok, offs_m, M - 1).to(tl.int64)       # clamped rows: x loads need no row mask
        rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        rows = tl.where(row_ok, rows, N - 1)
        r = rows[:, None].to(tl.int64)
        rn = rows.to(tl.int64)
        xq_rows = xq_ptr + om[:, None] * (NG * 32) + tl.arange(0, 32)[None, :]
        g0 = pid_k * groups_per_split
        g1 = tl.minimum(g0 + groups_per_split, NG)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        # group g0 (a split holds at least one group), then per step: issue g + 1 (masked past g1), compute g
        b, h = _mmq_load_w(qs_ptr, qh_ptr, r, g0, r >= 0, s_qs, s_qh, QTYPE)
        xq = tl.load(xq_rows + g0 * 32)
        dx = tl.load(dx_ptr + om * NG + g0)[:, None]
        xs0 = tl.load(xs_ptr + om * (2 * NG) + 2 * g0)[:, None]
        xs1 = tl.load(xs_ptr + om * (2 * NG) + 2 * g0 + 1)[:, None]
        d, dmin, sa, sb = _mmq_load_scales(sc_ptr, mn_ptr, d_ptr, dm_ptr, rn, g0, rn >= 0, s_sc, s_d, QTYPE)
        for g in range(g0, g1):
            gn = g + 1
            okm = (om * 0 + gn) < g1               # as tensors: masks broadcast (the interpreter too)
            okn = (rn * 0 + gn) < g1
            b_n, h_n = _mmq_load_w(qs_ptr, qh_ptr, r, gn, okn[:, None], s_qs, s_qh, QTYPE)
            xq_n = tl.load(xq_rows + gn * 32, mask=okm[:, None], other=0)
            dx_n = tl.load(dx_ptr + om * NG + gn, mask=okm, other=0)[:, None]
            xs0_n = tl.load(xs_ptr + om * (2 * NG) + 2 * gn, mask=okm, other=0)[:, None]
            xs1_n = tl.load(xs_ptr + om * (2 * NG) + 2 * gn + 1, mask=okm, other=0)[:, None]
            d_n, dmin_n, sa_n, sb_n = _mmq_load_scales(sc_ptr, mn_ptr, d_ptr, dm_ptr, rn, gn, okn, s_sc, s_d, QTYPE)
            acc = _mmq_accumulate(acc, xq, _mmq_codes(b, h, QTYPE), dx, xs0, xs1, d, dmin, sa, sb, QTYPE)
            b, h, xq, dx, xs0, xs1 = b_n, h_n, xq_n, dx_n, xs0_n, xs1_n
            d, dmin, sa, sb = d_n, dmin_n, sa_n, sb_n
        _store_tile(acc, y_ptr, b_ptr, pid_k, offs_m, rows, m_ok, row_ok, M, N, HAS_BIAS)

    @triton.jit
    def _field_at(words, hi, f, QTYPE: tl.constexpr):
        """_field with a per-element field index f (a tensor): the same fp32 values 1 + code / 2^B, exact."""
        if QTYPE == 0:
            code = ((words >> (8 * f)) & 0xFF) ^ 0x80
            v = code.to(tl.float32) * (1.0 / 256.0)
        elif QTYPE == 1 or QTYPE == 3:
            v = ((words >> (4 * f)) & 0xF).to(tl.float32) * (1.0 / 16.0)
        elif QTYPE == 2 or QTYPE == 4:
            code = ((words >> (4 * f)) & 0xF) | (((hi >> f) & 1) << 4)
            v = code.to(tl.float32) * (1.0 / 32.0)
        else:
            code = ((words >> (4 * f)) & 0xF) | (((hi >> (8 * (f // 2) + 4 * (f % 2))) & 3) << 4)
            v = code.to(tl.float32) * (1.0 / 64.0)
        return 1.0 + v

    @triton.jit
    def _dequant_kernel(out_ptr, qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr,
                        row0, N, NBLK, s_out, s_qs, s_qh, s_sc, s_d,
                        QTYPE: tl.constexpr, BS: tl.constexpr, FPW: tl.constexpr,
                        BLOCK_N: tl.constexpr, G: tl.constexpr, PDL: tl.constexpr = False):
        """out[n - row0, k] = W[n, k] in out's dtype (the values the dot path multiplies). Each program
        writes BLOCK_N rows x G blocks in natural order (contiguous row segments): weight e of a block is
        field e // WPB of word e % WPB, so each word is read by the FPW elements it holds (from L1)."""
        pdl_enter(PDL)
        WPB: tl.constexpr = BS // FPW
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        rows = row0 + pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        rows = tl.where(row_ok, rows, N - 1)
        r = rows[:, None, None].to(tl.int64)
        gi = tl.arange(0, G)[None, :, None]
        e = tl.arange(0, BS)[None, None, :]
        blk = pid_k * G + gi
        bm = blk < NBLK
        words, hi = _load_words(qs_ptr, qh_ptr, r, blk, e % WPB, NBLK, s_qs, s_qh, QTYPE, WPB)
        d, dmin, sc, mn = _load_scales(sc_ptr, mn_ptr, d_ptr, dm_ptr, tl.reshape(r, (BLOCK_N, 1)), pid_k * G, NBLK,
                                       s_sc, s_d, QTYPE, BLOCK_N, G, 0)
        a, b = _affine(d, dmin, sc, mn, QTYPE)
        w = _field_at(words, hi, e // WPB, QTYPE) * a[:, :, None] + b[:, :, None]
        o = out_ptr + (r - row0) * s_out + blk * BS + e
        tl.store(o, w.to(out_ptr.dtype.element_ty), mask=bm & row_ok[:, None, None])


if HAVE_TRITON:

    @triton.jit
    def _sum_partials_kernel(y_ptr, b_ptr, out_ptr, MN, N, SPLIT, TILE_N, SPT, NPROG, HAS_BIAS: tl.constexpr,
                             BLOCK: tl.constexpr, STREAM: tl.constexpr = False, PDL: tl.constexpr = False):
        """out = sum over i = 0..SPLIT-1 in order of y[i] (+ bias[n]) in out's dtype. STREAM: only the slots the
        dot kernel's STREAM split wrote for n's row tile (TILE_N rows a tile, SPT steps a tile, NPROG programs)."""
        pdl_enter(PDL)
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < MN
        acc = tl.load(y_ptr + offs, mask=ok, other=0)
        if STREAM:      # programs first .. last of tile t (the inverse of s0(p) = p TOTAL // NPROG)
            TOTAL = ((N + TILE_N - 1) // TILE_N) * SPT
            t = (offs % N) // TILE_N
            first = ((t * SPT + 1) * NPROG - 1) // TOTAL
            n_slots = ((t * SPT + SPT) * NPROG - 1) // TOTAL - first + 1
            for i in range(1, SPLIT):
                acc += tl.load(y_ptr + i * MN + offs, mask=ok & (n_slots > i), other=0)
        else:
            for i in range(1, SPLIT):
                acc += tl.load(y_ptr + i * MN + offs, mask=ok, other=0)
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs % N, mask=ok, other=0).to(tl.float32)
        tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=ok)


def _num_sms(device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 8


_SM_CACHE: dict = {}


def _sms(device) -> int:
    key = (device.type, device.index)
    if key not in _SM_CACHE:
        _SM_CACHE[key] = _num_sms(device)
    return _SM_CACHE[key]


def _split(n_programs: int, nblk: int, step: int, sms: int, waves: int, min_steps: int) -> tuple[int, int]:
    """(split_k, blocks per split: a multiple of step) so that about `waves` programs per SM exist."""
    n_steps = -(-nblk // step)
    want = waves * sms
    split = 1
    if n_programs < want:
        split = max(1, min(-(-want // n_programs), n_steps // min_steps))
    per = -(-n_steps // split)
    split = -(-n_steps // per)                       # no empty splits
    return split, per * step


# Per type: (BLOCK_N, G, num_warps, stages) of the GEMV; G scale blocks of BS weights per step.
# One warp per program: x's (1, G, WPB) tiles then share the weight tile's register layout. Among pipelined loops
# (cp.async, benchmarks/tune_gemv.py on an H200, 2026-11-30), 4 rows x 16 blocks x 4 stages was best for the 4/5-bit
# types, 4 x 32 (Q6_K: 4 x 64 16-blocks) x 3 stages for Q8_0 and Q6_K. Faster still, and shipped for every type:
# stages 1 (a plain loop: no cp.async ring in shared memory, no barrier a step; latency hidden by the many one-warp
# programs an SM holds), 2026-12-02 (gpu_pending.sh part35 / part36 / a call after part37; us on 17408x5120 /
# 5120x17408 / 12288x5120 / 248320x5120, shipped tile -> the one below, every type with row runs):
#   Q4_K 4 x 16 x 4 stages -> 2 x 32: 23.65 / 28.18 / 16.57 / 243.3 -> 17.68 / 19.11 / 13.73 / 182.0 (69 / 63 / 62 /
#     95 % of copy bandwidth); Q6_K 4 x 64 x 3 stages -> 2 x 64: 28.37 / 27.28 / 22.71 / 326.4 -> 24.65 / 28.17 /
#     18.78 / 277.5; Q8_0 4 x 32 x 3 -> 2 x 32: 29.9 / 29.33 / 23.16 / 319.4 -> 25.83 / 25.3 / 18.86 / 301.8; Q5_K
#     4 x 16 x 4 -> 1 x 32: 31.38 / 40.55 / 22.99 / 303.0 -> 24.76 / 26.17 / 18.3 / 302.7; Q4_0 and Q5_0 4 x 16 x 4
#     -> 2 x 32 (the first three shapes): 22.41 / 19.04 / 16.37 -> 16.4 / 17.4 / 12.57 and 26.18 / 24.13 / 19.9 ->
#     21.23 / 22.98 / 16.56. The 27B decode step 8.526 -> 7.071 ms (Q4_K and Q6_K, which it is made of).
#   One warp with 2 stages was 3-10x slower (its ring of copies stalls on itself); 4 or 8 rows, 64 blocks a step, or
#   two warps a program slower than these. Q5_K 1 x 32 -> 2 x 32 with ROW_PAIR (below), 2026-12-02 15:50.
_GEMV_TILE = {QT.Q8_0: (2, 32, 1, 1), QT.Q4_0: (2, 32, 1, 1), QT.Q5_0: (2, 32, 1, 1), QT.Q4_K: (2, 32, 1, 1),
              QT.Q5_K: (2, 32, 1, 1), QT.Q6_K: (2, 64, 1, 1)}
_GEMV_WAVES = 4
# Per type: which block-scale fields the (GEMV, dot) kernels read as int32 words (`_load_scales` WORDS: bit 0 the
# f16 fields, bit 1 the byte fields; cp.async-pipelined); the GEMV's only on loops of >= _GEMV_WORDS_MIN_STEPS steps.
# Measured on an H200 (benchmarks/tune_scales.py, 2026-12-02; us, WORDS 0 -> the chosen one):
#   GEMV 5120x17408 (34 steps a program): Q4_K 30.24 -> 26.20 (2), Q5_K 38.82 -> 33.14 (2), Q6_K 29.08 -> 28.26 (1);
#   GEMV 17408x5120 (10 steps): Q4_K and Q5_K slower with any words (26.08 -> 29.71+, 31.55 -> 33.83+), Q6_K (5
#   steps of 64 blocks) 31.88 -> 30.62 (1);
#   dot M = 16, 17408x5120 / 5120x17408: Q5_K 84.64 / 85.08 -> 82.54 / 80.11 (1), Q6_K 111.36 / 111.54 -> 97.89 /
#   96.08 (1, with W_AS_A); Q4_K slower with any (67.24 / 71.92 -> 88.84+); Q4_0 / Q5_0 1.6-1.7x slower with
#   words (their f16 scales are already 4-byte copies).
#   Q4_K dot again after the word runs, PAIRS and x in pair order (2026-12-03, with PAIRS 3 at M = 16: the SASS loop
#   then has no synchronous load and no shared-memory layout conversion of d / dmin, 968 instructions and 152
#   registers against 1,061 and 167): the 27B verify of 16 tokens 15.80 -> 15.21 ms with both (part59).
_SCALE_WORDS = {QT.Q4_K: (2, 1), QT.Q5_K: (2, 1), QT.Q6_K: (1, 1)}
_GEMV_WORDS_MIN_STEPS = 24
# Each row's words of a step loaded as one run (`_load_step_words`, cfg row_run: coalesced; Nsight Compute on the dot
# kernel's (BN, G, WPB) load, 2026-12-02: 78 % of its global sectors excessive, 2.7 of 32 bytes a sector used). On in
# the dot kernel: 9-28 % faster for every K type and 27B shape at M = 16 on an H200 (tune_scales --row-run), a 27B
# verify of 16 tokens 22.59 -> 19.89 ms. The GEMV, per type: faster on 7 of the 9 K-type shapes, 11 % slower on Q5_K
# 5120x17408. On for Q4_K and Q6_K (the 27B's GEMV types): the 27B decode step 9.118 -> 8.723 ms in one call
# (gpu_pending.sh part27, 2026-12-02); Q5_K keeps the old load (its slower shape), as do the other types (untimed).
# With stages 1 (part36): on for every type (Q4_K 2 x 32: 17.68 / 19.11 / 13.73 / 182.0 us against 19.89 / 21.1 /
# 15.33 / 219.0 without; Q4_0 16.4 / 17.4 / 12.57 against 17.32 / 18.67 / 13.58).
_GEMV_ROW_RUN = {QT.Q8_0, QT.Q4_0, QT.Q5_0, QT.Q4_K, QT.Q5_K, QT.Q6_K}
# Types whose 2-row GEMV tile runs as two one-row tiles sharing x (cfg row_pair, the kernel's ROW_PAIR; SASS of the
# Q4_K loop 148 instructions a step against 178, no shuffles; Q6_K 252 against 322). On an H200 (gpu_pending.sh
# part38, 2026-12-02, one call): the 27B decode step 7.041 -> 6.513 ms with it for Q4_K and Q6_K (generate 142.2 ->
# 149.2 tok/s). Per type at the 27B shapes (tune_gemv.py, 2 rows x 32 blocks, row runs, without / with it; us):
# Q5_0 20.78 / 23.2 / 16.45 / 222.99 -> 19.27 / 20.11 / 14.7 / 198.49; Q5_K 25.34 / 28.51 / 19.2 / 286.94 -> 20.32 /
# 21.82 / 15.59 / 215.24 (0.71-0.85x the time of its 1-row tile before: its tile is 2 rows since); Q8_0 and Q4_0
# within 1 % either way, so off for them.
_GEMV_ROW_PAIR: set = {QT.Q4_K, QT.Q6_K, QT.Q5_0, QT.Q5_K}
# Per type: the GEMV loop unrolled this many steps (the kernel's UNROLL, tl.range's loop_unroll_factor), so that a
# program has the next step's loads in flight while it computes one (SASS of the Q4_K loop on sm_90 at 2: 22 of its
# 30 loads issued before the first dp4a; 64 registers against 56). On an H200 (2026-12-03, `gpu_pending.sh part56`),
# 2 for Q4_K / Q5_K / Q6_K left the 27B decode step as it was (5.998 ms against 5.993), so 1 (a plain loop) for every
# type; per shape untimed (`tune_gemv.py --configs` takes the factor).
_GEMV_UNROLL: dict = {}
# The row-pair GEMV with the next step's tiles loaded into registers before this step's sums (cfg prefetch,
# `_prefetched_pair_sums`), for weights of K >= _GEMV_PREFETCH_MIN_K: the 27B's ffn_down (K 17408) has 2,560 programs
# of 17 steps, about 19 an SM, all in one wave, and its GEMVs take 1.46x (Q4_K) and 1.76x (Q6_K) the time of a read of
# their bytes (`benchmarks/probe_gemv_chain.py`, 2026-12-05), where the K = 5120 shapes with 32 programs an SM take
# 1.12-1.29x: a step is 1-1.5 KB a program, so 19 programs an SM keep too few bytes in flight. Per type: the register
# cap (ptxas .maxnreg) under which ptxas issues the next step's loads ahead of this step's dp4a (sm_90, triton 3.6,
# `benchmarks/ttgir_counts.py --prefetch --k 17408 --maxnreg R` with the type's scale words: uncapped it holds 64
# registers and issues them after; Q4_K at 80 and Q5_K / Q6_K at 96 put every load first, no spills (Q6_K at 80 keeps
# some dp4a ahead; at G 128 it spills)); 96 registers still fit 21 one-warp programs an SM.
# On an H200 (2026-12-05, `gpu_pending.sh part118` + its follow-ups, BENCHMARKS.md): the 27B decode step 5.759 ->
# 5.713 ms (means of seven runs without and six with, interleaved; every run with below every run without);
# ffn_down alone Q6_K 23.68 -> 22.21 us, Q4_K 17.74 -> 17.78 (at 96 registers 17.46; the step the same at 80 and
# 96), Q5_K 21.53 -> 21.53 (uncapped 23.06). On every row-pair GEMV (_GEMV_PREFETCH_MIN_K 0) the step takes
# 6.18 ms. DFLASH24_GEMV_PREFETCH=0 turns it off.
GEMV_PREFETCH = os.environ.get("DFLASH24_GEMV_PREFETCH", "1") != "0"
# The row-pair GEMV on whole steps (cfg whole, the kernels' WHOLE) where every step of every K split is whole (K / BS
# and the split's blocks multiples of G: every GEMV of the 27B): no masked loads (no predicates, no zero-fills), and
# the prefetched loop two steps an iteration (`_whole_pair_sums`), so it copies no register buffer between steps.
# SASS of the loop, instructions a step on sm_90 (triton 3.6, `benchmarks/ttgir_counts.py --modes gemv_pair --pdl
# [--whole] [--prefetch --k 17408 --maxnreg R]`), before (masked loads, x tiles in their own layout) -> whole steps
# with x in the words' layout (`_x_step_words`: Q6_K's 12 shuffles and 22 selects a step gone): ffn_down (prefetched)
# Q4_K 182 -> 138, Q5_K 251 -> 191, Q6_K 263 -> 197; K = 5120 Q4_K 151 -> 127, Q5_K 217 -> 183, Q6_K 251 -> 172 (Q5_K
# with its odd fields' 5th bits spread by one multiply from the byte, not shifted first).
# DFLASH24_GEMV_WHOLE=0 turns whole steps off (x stays in the words' layout).
GEMV_WHOLE = os.environ.get("DFLASH24_GEMV_WHOLE", "1") != "0"
_GEMV_PREFETCH_REGS = {QT.Q4_K: 80, QT.Q5_K: 96, QT.Q6_K: 96}
_GEMV_PREFETCH_MIN_K = 8192
# Per type: how many steps ahead a prefetched GEMV on whole steps loads (cfg prefetch; 1 where unset). 2 keeps two
# steps in flight while one is summed (`_whole_pair_sums_ahead2`), for the ffn_down GEMVs' 19 programs an SM: by
# Little's law an H200 (4.2-4.8 TB/s) needs about 1.4x the bytes in flight an H100 needs at the same latency, and a
# step is 1.1-1.7 KB a program (ffn_down runs at 0.69-0.78 of the copy bandwidth on the H200, 0.80-0.88 on an H100).
# Timed on an H100 (2026-12-06, `gpu_pending.sh part131a`, us at 5120x17408, one ahead at 96 registers -> two ahead at
# 96): Q4_K 20.43 -> 20.55, Q5_K 25.64 -> 25.37, Q6_K 28.11 -> 36.78; on an H200 (2026-12-06): Q4_K 15.20 ->
# 15.84, Q6_K 20.84 -> 30.98. Off. SASS of the loop on sm_90
# (triton 3.9, `benchmarks/ttgir_counts.py --modes gemv_pair --pdl --whole --prefetch --k 17408 --ahead A --maxnreg
# 96`), one -> two steps ahead: loads in flight on average (each counted from its issue to its first use) Q4_K 13.7 ->
# 18.3 of 15 a step, Q6_K 11.3 -> 13.5 of 12, Q5_K 15.3 -> 17.5 of 17; instructions a step 129 -> 137, 175 -> 170, 193
# -> 187; no spills. 96 registers still fit 21 one-warp programs an SM (the 27B's ffn_down: 2,560 programs, one wave);
# at 128, 1.45 steps in flight for Q4_K but 16 programs an SM. (Against it: the Q4_K gate + up GEMV keeps about as
# many LDGs in flight an SM, 32 programs x 6.8, and reaches 0.91 of the ideal: BENCHMARKS.md, 2026-12-05 20:55.)
_GEMV_AHEAD: dict = {}
# Timed and not kept (BENCHMARKS.md, 2026-12-05 18:44, H100): also prefetching into L2 the steps 1-4 past the
# registers' (ffn_down 20.81 -> 21.04-22.73 us for Q4_K, the AR step +0.04-0.2 ms), and ffn_down split K 2 / 3
# (22.34 / 22.67 us with the sums' launch).


def _scale_words(p: PackedWeight, kernel: int) -> int:
    """`_SCALE_WORDS` of p's type for kernel 0 (GEMV) or 1 (dot); the byte fields stay byte loads when their rows
    are not 4-byte aligned (K-quant rows always are: K / 32 scales, K a multiple of 256)."""
    words = _SCALE_WORDS.get(p.qtype, (0, 0))[kernel]
    sc = p.arrays.get("sc")
    if sc is not None and (sc.stride(0) % 4 or sc.data_ptr() % 4):
        words &= 1
    return words


def _whole_steps(nblk: int, per: int, g: int) -> bool:
    """Whether every step of G blocks of every K split (per blocks each) of nblk blocks is whole."""
    return nblk % g == 0 and per % g == 0


def gemv_config(p: PackedWeight, device, unsplit: bool = False) -> dict:
    """Heuristic launch config of the M=1 path (shape based; no autotuning at load). unsplit: K never split (one
    program a row tile over all of K, as `gemv_two` runs both its weights)."""
    block_n, g, warps, stages = _GEMV_TILE[p.qtype]
    bs, _ = GEOMETRY[p.qtype]
    nblk = p.k // bs
    g = min(g, triton.next_power_of_2(nblk)) if HAVE_TRITON else g
    n_prog = -(-p.n // block_n)
    split, per = (1, nblk) if unsplit else _split(n_prog, nblk, g, _sms(device), waves=_GEMV_WAVES, min_steps=2)
    words = _scale_words(p, 0) if (p.qtype == QT.Q6_K or per // g >= _GEMV_WORDS_MIN_STEPS) else 0
    row_pair = block_n == 2 and p.qtype in _GEMV_ROW_PAIR
    regs = _GEMV_PREFETCH_REGS.get(p.qtype, 0)
    prefetches = GEMV_PREFETCH and regs > 0 and row_pair and stages == 1 and p.k >= _GEMV_PREFETCH_MIN_K
    whole = GEMV_WHOLE and row_pair and _whole_steps(nblk, per, g)
    ahead = (_GEMV_AHEAD.get(p.qtype, 1) if whole else 1) if prefetches else 0       # steps loaded ahead
    return dict(BLOCK_N=block_n, G=g, num_warps=warps, split=split, per=per, stages=stages, scale_words=words,
                row_run=p.qtype in _GEMV_ROW_RUN, row_pair=row_pair, unroll=_GEMV_UNROLL.get(p.qtype, 1),
                prefetch=ahead, whole=whole, maxnreg=regs if ahead else 0)


# Per type: (BLOCK_N, waves, W_AS_A) of the tl.dot path; 4 warps, 2 stages, 256 weights a step everywhere. With 2
# stages the loop waits for all its copies at its top and issues the next step's after its dots (TTGIR: async_wait num
# 0), so a warp never overlaps its own copies with its compute (Nsight Compute, `gpu_pending.sh part60`: 32 % of the
# stall samples at that barrier); 3 and 4 leave the next step in flight, and were still slower on an H200 (2026-12-03,
# `part66`, us at M = 16 / 23, stages 2 -> 3): Q4_K 17408x5120 37.99 -> 48.90 / 67.91 -> 77.94, 5120x17408 37.99 ->
# 56.45 / 64.13 -> 76.13, Q6_K 5120x17408 54.92 -> 65.73 / 73.17 -> 90.06 (4 slower still). Measured
# on an H200 at M = 16 over the 27B shapes (benchmarks/tune_dot.py, 2026-12-01): Q4_K 128 rows / 4 waves and Q6_K
# 64 / 8 take 0.954x and 0.962x the time of 64 / 4 (geometric mean); no other config of the sweep was better.
# Q5_K 64 / 8 (2026-12-02, 17408x5120 and 5120x17408): 0.943x at M = 16, 0.967x at M = 23.
# W_AS_A (the weight tile as the dot's first operand, wgmma on sm_90), timed 2026-12-01: Q6_K 0.932x the time at
# M = 16 and 0.977x at M = 23 (geometric means over 17408x5120 and 5120x17408); Q4_K 1.06x / 1.00x. On for Q6_K since
# its outputs were checked on the GPU (2026-12-02, `gpu_pending.sh part21`: the orientations agree for every type).
# Q5_K takes it with PAIRS (below): with both, 0.76-0.82x the time of neither at M = 16, 0.83-0.90x at M = 23.
# Waves (K split so that about waves x SMs programs run), per tile height: (BLOCK_M 16, BLOCK_M 32 and 64). Timed on
# an H200, 2026-12-02 17:40-18:30 (`gpu_pending.sh part44-46`, `part49`: tune_dot.py / tune_gemv.py at the shapes
# each type has in the 27B Q4_K_M file, M = 16 and 23; before: 4 for Q4_K, 8 for Q5_K / Q6_K):
#   Q4_K 2 / 2: 0.889x / 0.851x the time (geometric means; 17408x5120 45.8 -> 41.4 us, 5120x17408 50.1 -> 40.0,
#     6144x5120 20.9 -> 16.8 at M = 16). Fewer, longer programs: splits of 2-3 steps never fill the cp.async ring.
#   Q5_K 8 / 4: 10240x5120 at M = 23 60.5 -> 52.2 us (47.0 with x in pair order); at M = 16 4 and 8 within 0.3 %,
#     and 4 made 17408x5120 (not in that file) 60.5 -> 71.9 us.
#   Q6_K 8 / 2: 5120x17408 at M = 23 101.5 -> 82.7 / 72.3 us with x in pair order (waves 8 / 2); at M = 16 the two
#     within 1.3 % there, and 2 made 17408x5120 (not in that file) 57 -> 87 us.
_DOT_TILE = {QT.Q4_K: (128, (2, 2), False), QT.Q5_K: (64, (8, 4), True), QT.Q6_K: (64, (8, 2), True)}
# Types whose dot kernel decodes two weights per 32-bit op (PAIRS, `_bf16_pairs`; 4- to 6-bit codes, bf16 x). The
# loop's SASS on sm_90 for Q4_K: 990 instructions a step against 1,640, 152 registers against 255 (triton 3.6 +
# ptxas). Timed on an H200, against the per-field decode in the type's shipped orientation (benchmarks/tune_scales.py
# --pairs; us at M = 16, then M = 23):
#   Q4_K (gpu_pending.sh part30): 0.76x / 0.80x / 0.86x on 17408x5120 / 5120x17408 / 12288x5120 (0.84x / 0.87x /
#     0.84x at 23); the 27B verify of 16 tokens 19.50 -> 16.84 ms, of 23 tree nodes 31.36 -> 28.93 ms. With W_AS_A
#     slower (Q4_K's tile is not W_AS_A).
#   Q6_K with W_AS_A (part31): 71.35 -> 57.01 / 70.16 -> 59.39 / 789.5 -> 611.3 on 17408x5120 / 5120x17408 / the LM
#     head 248320x5120 (0.80x / 0.85x / 0.77x; at 23: 0.91x / 0.92x / 0.87x); the 27B verify of 16 tokens 16.85 ->
#     16.30 ms, the draft step (its LM head) 2.01 -> 1.85 ms, the tree verify 29.00 -> 28.57 ms (part32).
#   Q5_K with W_AS_A (part31): 77.57 -> 60.47 / 75.26 -> 61.48 / 62.71 -> 47.73 on 17408x5120 / 5120x17408 /
#     12288x5120 (at 23: 0.83x / 0.90x / 0.88x). Without W_AS_A PAIRS is slower for both at M = 23.
# Untimed, so off: Q4_0 and Q5_0 (the same code as Q4_K / Q5_K).
_DOT_PAIRS = {QT.Q4_K, QT.Q5_K, QT.Q6_K}
_DOT_DEFAULT = (64, (4, 4), False)
# Per type: the STREAM split (`stream_split`) instead of the K split, as programs per SM by tile height (BLOCK_M 16,
# 32), where the row tiles are fewer than those programs; 0: the K split. Why: the K split's grid rarely divides into
# the SMs. At Q4_K 17408x5120, M = 16 it is 136 row tiles x 2 = 272 programs for 132 SMs, so 8 SMs run three and the
# rest two (Nsight Compute, `part60`: the SMs active 66 % of the kernel's cycles); at M = 23 (198 registers: two
# programs an SM) the 8 left over run as a second wave. On an H200 (2026-12-03, `part64` / `part66`, us, K split ->
# STREAM at 2 an SM): at M = 23 Q4_K 17408x5120 68.14 / 67.91 -> 52.66 / 53.12, 5120x17408 63.85 / 64.13 -> 54.43 /
# 54.90, 12288x5120 51.03 / 51.06 -> 40.36 / 40.52; at M = 16 within 2 % but 12288x5120 (30.52 -> 27.66), yet the
# 27B verify of 16 tokens 14.74 -> 15.18 ms with it at both heights (`part65`: the K split's uneven tail is where the
# next kernel's programs start early under programmatic dependent launch), the tree verify of 23 nodes 25.79 ->
# 25.36. Q6_K (5120x17408, W_AS_A) 55.05 -> 56.09 / 72.51 -> 74.56: no. 3 or 4 an SM (with a register cap of 128 for
# 4 at M = 16): slower or within noise.
_DOT_STREAM: dict = {QT.Q4_K: (0, 2)}
# ... and only where a program gets at least this many steps: shorter runs that straddle two row tiles pay the cp.async
# ring's fill twice (Q4_K 6144x5120 / 5120x6144 at M = 23, 3.6 steps a program: 27.21 -> 30.38 / 28.12 -> 32.54 us).
_STREAM_MIN_STEPS = 6


def dot_config(p: PackedWeight, m: int, device) -> dict:
    """Launch config of the tl.dot path for m rows (m <= SMALL_M). K is split the same for every m of one tile
    height (BLOCK_M 16 / 32 / 64: the waves of _DOT_TILE); in the batch-invariant mode every m takes the 64-row tile,
    so each row's result does not depend on how many rows come with it."""
    bs, fpw = GEOMETRY[p.qtype]
    block_m = 64 if BATCH_INVARIANT else (16 if m <= 16 else (32 if m <= 32 else 64))
    block_n, waves_by_m, w_as_a = _DOT_TILE.get(p.qtype, _DOT_DEFAULT)
    waves = waves_by_m[0] if block_m == 16 else waves_by_m[1]
    warps, stages = 4, 2
    g = 256 // bs                                      # 256 weights per step: a field's dot has K = 32 (Q8_0: 64)
    nblk = p.k // bs
    n_prog = -(-p.n // block_n)
    split, per = _split(n_prog, nblk, g, _sms(device), waves=waves, min_steps=2)
    per_sm = _DOT_STREAM.get(p.qtype, (0, 0))[block_m != 16] if block_m <= 32 and not BATCH_INVARIANT else 0
    stream = 0
    programs, steps = per_sm * _sms(device), -(-nblk // g)
    if per_sm and n_prog < programs and n_prog * steps >= _STREAM_MIN_STEPS * programs:
        stream, split = stream_split(n_prog, steps, programs)
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, G=g, num_warps=warps, num_stages=stages,
                split=split, per=per, w_as_a=w_as_a and not BATCH_INVARIANT,
                scale_words=_scale_words(p, 1), row_run=True, pairs=p.qtype in _DOT_PAIRS, stream=stream)


# The int8 tensor-core path (mmq) of a small-M matmul: (BLOCK_N, num_warps, waves), the best of the sweep at M = 16
# and 23 on an H200 (benchmarks/tune_dot.py --kernel mmq, 2026-12-02) for Q6_K at both and Q4_K at 23; BLOCK_N is
# halved for 64-row tiles (the fp32 accumulator of 64 x 256 would not fit the registers of 4 warps).
_MMQ_TILE = (256, 4, 4)


def mmq_config(p: PackedWeight, m: int, device) -> dict:
    """Launch config of the int8 tensor-core path for m rows (K split the same for every m)."""
    block_n, warps, waves = _MMQ_TILE
    block_m = 16 if m <= 16 else (32 if m <= 32 else 64)
    block_n = min(block_n, 8192 // block_m)
    ng = p.k // 32
    n_prog = -(-p.n // block_n)
    split, per = _split(n_prog, ng, 1, _sms(device), waves=waves, min_steps=2)
    return dict(kernel="mmq", BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, split=split, per=per)


def quantize_xm(x: torch.Tensor, qtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (M, K) -> (xq int8 (M, K) in the mmq code-tile order of `qtype`, dx fp32 (M, K/32), xs int32 (M, K/16)):
    per row the codes and scales of `quantize_x` (the GEMV's int8 activations)."""
    m, k = x.shape
    if k % 32:
        raise ValueError(f"int8 activations need K % 32 == 0, got K={k}")
    ng = k // 32
    xq = torch.empty((m, k), device=x.device, dtype=torch.int8)
    dx = torch.empty((m, ng), device=x.device, dtype=torch.float32)
    xs = torch.empty((m, 2 * ng), device=x.device, dtype=torch.int32)
    qtype = QT(int(qtype))
    order = 0 if qtype == QT.Q8_0 else (2 if qtype == QT.Q6_K else 1)
    r = 16
    _quant_xm_kernel[(triton.cdiv(ng, r), m)](x, xq, dx, xs, ng, x.stride(0), ORDER=order, R=r, num_warps=1,
                                              enable_fp_fusion=False, **launch_options(x.device, _quant_xm_kernel))
    return xq, dx, xs


def _matmul_mmq(x: torch.Tensor, p: PackedWeight, cfg: dict | None, out_dtype, bias) -> torch.Tensor:
    m = x.shape[0]
    cfg = cfg or mmq_config(p, m, x.device)
    xq, dx, xs = quantize_xm(x, p.qtype)
    ptrs, strides = _args(p)
    split = cfg["split"]
    y, b_arg, fused_bias = _partials(split, m, p, x.device, out_dtype, bias)
    grid = (triton.cdiv(m, cfg["BLOCK_M"]), triton.cdiv(p.n, cfg["BLOCK_N"]), split)
    _mmq_kernel[grid](xq, dx, xs, y, b_arg, *ptrs, m, p.n, p.k // 32, *strides, cfg["per"],
                      QTYPE=_CODE[p.qtype], BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], HAS_BIAS=fused_bias,
                      num_warps=cfg["num_warps"], num_stages=1, **launch_options(xq.device, _mmq_kernel))
    return _finish(y, split, out_dtype, bias)


def _args(p: PackedWeight):
    a = p.arrays
    qs = a["qs"]
    dummy = qs
    qh = a.get("qh", dummy)
    sc = a.get("sc", dummy)
    mn = a.get("mn", dummy)
    d = a["d"]
    dm = a.get("dmin", d)
    return (qs, qh, sc, mn, d, dm), (qs.stride(0), qh.stride(0), sc.stride(0), d.stride(0))


def quantize_x(x: torch.Tensor, qtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (K,) -> (xw int32 (K/4,), dx fp32 (K/32,), xs int32 (K/16,)): int8 codes of x per 32 values,
    packed in the word order that pairs with `qtype`'s planar weight words (see _quant_x_tile)."""
    k = x.numel()
    if k % 32:
        raise ValueError(f"int8 activations need K % 32 == 0, got K={k}")
    nb = k // 32
    xw = torch.empty(k // 4, device=x.device, dtype=torch.int32)
    dx = torch.empty(nb, device=x.device, dtype=torch.float32)
    xs = torch.empty(k // 16, device=x.device, dtype=torch.int32)
    r = 16
    six = QT(int(qtype)) == QT.Q6_K
    _quant_x_kernel[(triton.cdiv(nb, r),)](x, xw, xw, dx, xs, nb, ORDERS=1 if six else 0, R=r, num_warps=1,
                                           enable_fp_fusion=False, **launch_options(x.device, _quant_x_kernel))
    return xw, dx, xs


class Int8Rows(NamedTuple):
    """A row of activations already rounded to int8 for the decode GEMV by the kernel that produced the row (the
    norms and silu_mul of kernels/norm.py, `_quant_x_tile`), in both word orders: the GEMVs that read the row
    then launch no quantization of their own (313 launches in a 27B decode step; see kernels/norm.py for what
    that is worth). Carried on the row's tensor as its `int8_rows` attribute (`INT8_ATTR`); QuantLinear passes it
    on to `gemv`."""
    words: torch.Tensor        # (K/4,) int32, word order 0 (Q8_0, Q4_0, Q5_0, Q4_K, Q5_K)
    words6: torch.Tensor       # (K/4,) int32, word order 1 (Q6_K)
    dx: torch.Tensor           # (K/32,) fp32
    xs: torch.Tensor           # (K/16,) int32

    @staticmethod
    def empty(k: int, device) -> "Int8Rows":
        """Uninitialized rows for k values (k % 32 == 0), in one allocation."""
        buf = torch.empty(k // 2 + k // 32 + k // 16, device=device, dtype=torch.int32)
        words, words6, dx, xs = buf.split([k // 4, k // 4, k // 32, k // 16])
        return Int8Rows(words, words6, dx.view(torch.float32), xs)

    @property
    def k(self) -> int:
        return self.words.numel() * 4

    def for_type(self, qtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(xw, dx, xs) as `quantize_x(x, qtype)` returns them."""
        return (self.words6 if QT(int(qtype)) == QT.Q6_K else self.words), self.dx, self.xs


INT8_ATTR = "int8_rows"


class PairRows(NamedTuple):
    """A verify step's activations (M, K) already in the small-M kernels' K orders, written by the kernel that
    produced them (the norms and silu_mul of kernels/norm.py, `_pair_store`) in up to four layouts: the dot kernel
    then reads each field pair's x as one contiguous run (XPERM) instead of permuting it in registers, and the Gluon
    kernel its x tiles in its own orders. The dot kernel's two (a, b) are None where no verify matmul can reach it
    (`dot_pairs_needed`). Carried on the output tensor as its `pair_rows` attribute (`PAIRS_ATTR`); QuantLinear
    passes it on to `matmul`."""
    a: torch.Tensor | None     # (M K,) bf16, pair_order for 32-weight blocks of 4 words: Q4_0, Q5_0, Q4_K, Q5_K
    b: torch.Tensor | None     # (M K,) bf16, pair_order for 16-weight blocks of 2 words: Q6_K
    g: torch.Tensor            # (M K,) bf16, gluon_matmul.gluon_order for 32-weight blocks: Q4_K, Q5_K
    g16: torch.Tensor          # (M K,) bf16, gluon_matmul.gluon_order for 16-weight blocks: Q6_K

    @staticmethod
    def empty(numel: int, device, dot: bool = True) -> "PairRows":
        """Uninitialized copies of numel values (numel % 256 == 0), in one allocation; dot False: the Gluon
        kernel's two only."""
        buf = torch.empty((4 if dot else 2, numel), device=device, dtype=torch.bfloat16)
        return PairRows(buf[0], buf[1], buf[-2], buf[-1]) if dot else PairRows(None, None, buf[0], buf[1])

    @staticmethod
    def of(x: torch.Tensor) -> "PairRows":
        """The four copies of bf16 rows x (M, K), K % 256 == 0, made with PyTorch ops: what the norms write for the
        same values (benchmarks time the matmuls on them, as a verify step runs them)."""
        orders = (pair_order(x, QT.Q4_K), pair_order(x, QT.Q6_K), gluon_matmul.gluon_order(x, QT.Q4_K),
                  gluon_matmul.gluon_order(x, QT.Q6_K))
        rows = PairRows.empty(x.numel(), x.device)
        for dst, src in zip(rows, orders):
            dst.copy_(src.reshape(-1))
        return rows

    def for_type(self, qtype, k: int) -> torch.Tensor | None:
        """The copy `qtype`'s dot kernel reads, as (M, k) rows (k % 256 == 0); None where it was not written."""
        rows = self.b if GEOMETRY[QT(int(qtype))][0] == 16 else self.a
        return rows.view(-1, k) if rows is not None else None

    def gluon(self, qtype, k: int) -> torch.Tensor:
        """The copy `qtype`'s Gluon kernel reads, as (M, k) rows (k % 256 == 0)."""
        return (self.g16 if GEOMETRY[QT(int(qtype))][0] == 16 else self.g).view(-1, k)


PAIRS_ATTR = "pair_rows"


def reference_quantize_x(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch reference of the int8 activations, natural order: (q int8-valued int32 (K,), dx (K/32,))."""
    xb = x.float().reshape(-1, 32)
    amax = xb.abs().amax(1)
    # tensor / tensor: IEEE division, as the kernels' div_rn (a python scalar over a tensor is computed as
    # 127 * (1 / amax), one ulp off at times, which flips codes at exact .5 ties)
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    q = torch.floor(xb * inv[:, None] + 0.5).to(torch.int32)
    return q.reshape(-1), amax / 127.0


def _partials(split: int, m: int, p: PackedWeight, device, out_dtype, bias):
    """A kernel's output (split, M, N): out_dtype when unsplit (the store adds the bias and casts), fp32
    partials otherwise. Returns (y, the kernel's bias argument, whether the kernel adds the bias)."""
    y = torch.empty((split, m, p.n), device=device, dtype=out_dtype if split == 1 else torch.float32)
    fused = bias is not None and split == 1
    return y, bias if fused else y, fused


# Values a program of the split-K sum kernel (_finish). On an H100 (2026-12-06, `ab_steps.py`, one process, the 27B,
# ms): 1024 -> 512 made the 16-token verify 10.26-10.29 -> 10.13-10.16 and the 23-node tree verify 12.70-12.71 ->
# 12.47-12.52 (a 16 x 5120 output: 160 programs instead of 80 on 132 SMs; 23 rows: 230 instead of 115); 256 the same
# as 512, 2048 slower. Unrolling its loop over the partials (every load issued before the first add) changed nothing.
SUM_BLOCK = 512


def _finish(y: torch.Tensor, split: int, out_dtype, bias, stream: tuple | None = None,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """Split-K partials (split, M, N) fp32 -> (M, N) [+ bias] in out_dtype (unsplit: the kernel did it): one
    kernel summing the partials in split order (a fixed order per element, whatever M is), adding the bias
    and casting. stream: (rows a tile, steps a tile, programs) of a STREAM split (`stream_split`), whose row tiles
    have a varying number of slots; None: a plain split. out: a contiguous (M, N) tensor of out_dtype to write."""
    if split == 1:
        return y[0]
    m, n = y.shape[1], y.shape[2]
    if out is None:
        out = torch.empty((m, n), device=y.device, dtype=out_dtype)
    block = SUM_BLOCK
    _sum_partials_kernel[(triton.cdiv(m * n, block),)](y, bias if bias is not None else y, out, m * n, n, split,
                                                       *(stream or (1, 1, 1)), HAS_BIAS=bias is not None,
                                                       BLOCK=block, STREAM=stream is not None, num_warps=4,
                                                       **launch_options(y.device, _sum_partials_kernel))
    return out


def stream_split(n_tiles: int, steps_per_tile: int, programs: int) -> tuple[int, int]:
    """(programs, slots) of the dot kernel's STREAM split: the n_tiles x steps_per_tile steps end to end, cut into
    `programs` runs of near-equal length (program p: steps p T // P .. (p + 1) T // P - 1), at least 2 steps each;
    slots: the most programs any row tile's steps meet (the partials' first axis)."""
    total = n_tiles * steps_per_tile
    programs = max(1, min(programs, total // 2))
    # a tile's programs are p(first step) .. p(last step), p(s) = ((s + 1) P - 1) // T: at most ceil((spt - 1) P / T) + 1
    slots = min(programs, -(-(steps_per_tile - 1) * programs // total) + 1)
    return programs, slots


def gemv(x: torch.Tensor, p: PackedWeight, cfg: dict | None = None, out_dtype: torch.dtype = torch.float32,
         bias: torch.Tensor | None = None, int8: Int8Rows | None = None) -> torch.Tensor:
    """x (K,) or (1, K) -> (1, N) [+ bias (N,) fp32] in out_dtype, with int8 activations (module docstring): x's
    own `int8` rows when given (made with x by the kernel that produced it), else `quantize_x` first."""
    if not HAVE_TRITON:
        raise RuntimeError("triton is not installed")
    x = x.reshape(-1)
    if x.numel() != p.k:
        raise ValueError(f"gemv: x has {x.numel()} values, weight has K={p.k}")
    if int8 is not None and int8.k != p.k:
        raise ValueError(f"gemv: the int8 rows have {int8.k} values, weight has K={p.k}")
    xw, dx, xs = int8.for_type(p.qtype) if int8 is not None else quantize_x(x.contiguous(), p.qtype)
    cfg = cfg or gemv_config(p, x.device)
    if cfg.get("row_pair", False) and cfg["BLOCK_N"] != 2:
        raise ValueError(f"gemv: row_pair needs BLOCK_N 2, got {cfg['BLOCK_N']}")
    prefetch = int(cfg.get("prefetch", 0))
    if prefetch and not (cfg.get("row_pair", False) and cfg["stages"] == 1):
        raise ValueError("gemv: prefetch needs the row-pair GEMV on a plain loop (row_pair, stages 1)")
    if cfg.get("whole", False) and not _whole_steps(p.k // GEOMETRY[p.qtype][0], cfg["per"], cfg["G"]):
        raise ValueError(f"gemv: whole steps (cfg whole) need K / BS and the split's blocks ({cfg['per']}) to be "
                         f"multiples of G={cfg['G']}")
    if prefetch not in (0, 1, 2) or (prefetch == 2 and not cfg.get("whole", False)):
        raise ValueError(f"gemv: prefetch is 0, 1 or 2 steps ahead, 2 on whole steps only (cfg whole), got "
                         f"{prefetch} (whole {cfg.get('whole', False)})")
    ptrs, strides = _args(p)
    bs, fpw = GEOMETRY[p.qtype]
    split = cfg["split"]
    y, b_arg, fused_bias = _partials(split, 1, p, x.device, out_dtype, bias)
    grid = (triton.cdiv(p.n, cfg["BLOCK_N"]), split)
    _gemv_int8_kernel[grid](xw, dx, xs, y, b_arg, *ptrs, p.n, p.k // bs, *strides, cfg["per"],
                            QTYPE=_CODE[p.qtype], BS=bs, FPW=fpw, BLOCK_N=cfg["BLOCK_N"], G=cfg["G"],
                            STAGES=cfg["stages"], INTERP=_INTERPRET, HAS_BIAS=fused_bias,
                            SCALE_WORDS=cfg.get("scale_words", 0), ROW_RUN=cfg.get("row_run", False),
                            ROW_PAIR=cfg.get("row_pair", False), UNROLL=cfg.get("unroll", 1),
                            PREFETCH=prefetch, WHOLE=cfg.get("whole", False),
                            num_warps=cfg["num_warps"], **_maxnreg(cfg), **launch_options(xw.device, _gemv_int8_kernel))
    return _finish(y, split, out_dtype, bias)


# Two weights of one x whose block types differ (FusedLinear's parts: the 27B's DeltaNet qkv Q5_K with its z / beta /
# alpha Q4_K) as one GEMV launch (`gemv_two`): one ramp and one tail instead of two, the same bits. On an H200
# (synthetic 27B Q4_K_M, 24 GiB emulated, 2026-12-05, `gpu_pending.sh part115` and a call after it): the AR decode
# step 5.907-5.918 -> 5.753-5.762 ms (48 launches fewer). DFLASH24_GEMV_TWO=0 turns it off.
GEMV_TWO = os.environ.get("DFLASH24_GEMV_TWO", "1") != "0"


def _two_configs(pa: PackedWeight, pb: PackedWeight, device) -> tuple[dict, dict] | None:
    """The two weights' GEMV configs where `gemv_two` takes them (the same K, both on the row-pair GEMV, a plain
    loop, both with or both without prefetch), else None. Both run unsplit: a weight that alone would split K
    (too few rows to fill the GPU: the 27B attention's Q6_K v, 1,024 rows) fills it in its partner's launch,
    without the partial sums' launch. On an H100 (2026-12-05, `gpu_pending.sh part127`, one process, interleaved
    with the pair as two GEMV launches and the split one's sums, as before): the 27B AR step 7.054-7.059 ->
    7.032-7.038 ms (its 8 attention layers with a Q6_K v)."""
    if pa.k != pb.k:
        return None
    cfgs = gemv_config(pa, device, unsplit=True), gemv_config(pb, device, unsplit=True)
    if any(not c["row_pair"] or c["stages"] != 1 or c["num_warps"] != 1 for c in cfgs):
        return None
    if cfgs[0]["prefetch"] != cfgs[1]["prefetch"]:
        return None
    return cfgs


def gemv_two_ok(pa: PackedWeight, pb: PackedWeight, device) -> bool:
    """Whether `gemv_two` takes the two weights (`_two_configs`)."""
    return _two_configs(pa, pb, device) is not None


def gemv_two(x: torch.Tensor, pa: PackedWeight, pb: PackedWeight, out_dtype: torch.dtype = torch.float32,
             int8: Int8Rows | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x W_a^T, x W_b^T), each (1, N) in out_dtype, from one launch: what `gemv` gives for each with K unsplit
    (the same program's work a row pair, so the same bits as `gemv(x, p, gemv_config(p, device, unsplit=True))`).
    Needs `gemv_two_ok`."""
    if not HAVE_TRITON:
        raise RuntimeError("triton is not installed")
    x = x.reshape(-1)
    cfgs = _two_configs(pa, pb, x.device) if x.numel() == pa.k else None
    if cfgs is None:
        raise ValueError(f"gemv_two: needs two weights of K={x.numel()} on the unsplit row-pair GEMV, got "
                         f"{pa.qtype.name} {pa.n}x{pa.k} and {pb.qtype.name} {pb.n}x{pb.k}")
    if int8 is not None and int8.k != pa.k:
        raise ValueError(f"gemv_two: the int8 rows have {int8.k} values, the weights K={pa.k}")
    if int8 is None:
        w4, dx, xs = quantize_x(x.contiguous(), QT.Q4_K)
        int8 = Int8Rows(w4, quantize_x(x.contiguous(), QT.Q6_K)[0], dx, xs)
    xa, dx, xs = int8.for_type(pa.qtype)
    xb = int8.for_type(pb.qtype)[0]
    ca, cb = cfgs
    ya = torch.empty((1, pa.n), device=x.device, dtype=out_dtype)
    yb = torch.empty((1, pb.n), device=x.device, dtype=out_dtype)
    (pta, sta), (ptb, stb) = _args(pa), _args(pb)
    (bsa, fpwa), (bsb, fpwb) = GEOMETRY[pa.qtype], GEOMETRY[pb.qtype]
    grid = (-(-pa.n // 2) + -(-pb.n // 2),)
    _gemv_two_kernel[grid](xa, xb, dx, xs, ya, yb, *pta, *ptb, pa.n, pb.n, pa.k, *sta, *stb,
                           QA=_CODE[pa.qtype], BSA=bsa, FPWA=fpwa, GA=ca["G"], WORDSA=ca["scale_words"],
                           QB=_CODE[pb.qtype], BSB=bsb, FPWB=fpwb, GB=cb["G"], WORDSB=cb["scale_words"],
                           RUNA=ca["row_run"], RUNB=cb["row_run"], INTERP=_INTERPRET, PREFETCH=ca["prefetch"],
                           WHOLEA=ca["whole"], WHOLEB=cb["whole"],
                           num_warps=1, **_maxnreg(dict(maxnreg=max(ca["maxnreg"], cb["maxnreg"]))),
                           **launch_options(x.device, _gemv_two_kernel))
    return ya, yb


STEP_WEIGHTS = 256        # weights of K per step of the dot kernel, every type (G scale blocks of BS)
# x in pair order (the norms' PairRows, XPERM): the types whose dot kernel reads it, and from how many tokens a step
# the norms write it (models.layers.feeds). On an H200 (synthetic 27B Q4_K_M, 24 GiB emulated; ms of the 23-node tree
# verify / the 16-token verify), 2026-12-02 18:10, `gpu_pending.sh part47 / part48`: without 26.46 / 15.94; from 2
# tokens, every type 25.97 / 17.67; from 17 tokens 26.06 / 16.01. The 16-token step's loss was the norms' pair stores
# (part50: its norms 0.53 -> 1.85 ms, 64-bit index divisions); with 32-bit shifts (2026-12-03 00:50, part51): from 2
# tokens 24.86 / 15.79, from 17 tokens 24.88 / 16.08.
XPERM_TYPES = {QT.Q4_0, QT.Q5_0, QT.Q4_K, QT.Q5_K, QT.Q6_K}
PAIRS_FROM_TOKENS = 2


def pair_order(x: torch.Tensor, qtype) -> torch.Tensor:
    """x (M, K) with each 256-column step's columns in the order the dot kernel's PAIRS decode meets them
    (XPERM): pair k (fields k and k + 4 of every word), then scale block, word, field of the pair. K % 256 == 0."""
    bs, fpw = GEOMETRY[qtype]
    m, k = x.shape
    if k % STEP_WEIGHTS or fpw != 8:
        raise ValueError(f"pair_order: needs 8 fields a word and K % {STEP_WEIGHTS} == 0, got {qtype.name}, K={k}")
    g, wpb = STEP_WEIGHTS // bs, bs // fpw
    # natural column of (step, block j, field k + 4 ch, word w): j BS + (k + 4 ch) WPB + w -> (k, j, w, ch)
    return x.reshape(m, k // STEP_WEIGHTS, g, 2, 4, wpb).permute(0, 1, 4, 2, 5, 3).reshape(m, k)


def _maxnreg(cfg: dict) -> dict:
    """The launch's register cap (ptxas .maxnreg) where cfg sets one (benchmarks/tune_dot.py's maxnreg axis; no
    shipped config sets one); the CPU interpreter takes none. Q4_K's M = 16 loop (sm_90, triton 3.6) at 128 registers
    has 961 SASS instructions a step and no spills against 968 at 152 (four programs of 4 warps an SM against three),
    yet on an H200 (2026-12-03, `gpu_pending.sh part64`) 128 at M = 16 and 168 at M = 23 were slower or within noise
    with either split; the one gain, 168 with the K split at M = 23 (17408x5120 68.14 -> 56.35 us), is less than the
    STREAM split's (52.66)."""
    return {"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") and not _INTERPRET else {}


def _matmul_dot(x: torch.Tensor, p: PackedWeight, cfg: dict | None, out_dtype, bias,
                x_pairs: torch.Tensor | None = None) -> torch.Tensor:
    """x_pairs: x already in pair_order, read instead of x (XPERM) where the kernel can take it (PAIRS, whole
    256-weight steps), else ignored."""
    m = x.shape[0]
    cfg = cfg or dot_config(p, m, x.device)
    pairs = _pairs(cfg, p, x)
    bs, fpw = GEOMETRY[p.qtype]
    xperm = x_pairs is not None and pairs != 0 and p.k % STEP_WEIGHTS == 0 and cfg["G"] * bs == STEP_WEIGHTS
    if xperm:
        if x_pairs.shape != x.shape:
            raise ValueError(f"matmul: x in pair order has shape {tuple(x_pairs.shape)}, x {tuple(x.shape)}")
        x = x_pairs
    ptrs, strides = _args(p)
    split = cfg["split"]
    y, b_arg, fused_bias = _partials(split, m, p, x.device, out_dtype, bias)
    programs = cfg.get("stream", 0)
    if programs:
        grid = (triton.cdiv(m, cfg["BLOCK_M"]), programs, 1)
        stream = (cfg["BLOCK_N"], triton.cdiv(p.k // bs, cfg["G"]), programs)
    else:
        grid = (triton.cdiv(m, cfg["BLOCK_M"]), triton.cdiv(p.n, cfg["BLOCK_N"]), split)
        stream = None
    _dot_kernel[grid](x, y, b_arg, *ptrs, m, p.n, p.k // bs, x.stride(0), *strides, cfg["per"],
                      QTYPE=_CODE[p.qtype], BS=bs, FPW=fpw, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
                      G=cfg["G"], UPCAST=_INTERPRET and x.dtype != torch.float32, HAS_BIAS=fused_bias,
                      W_AS_A=cfg.get("w_as_a", False), SCALE_WORDS=cfg.get("scale_words", 0),
                      ROW_RUN=cfg.get("row_run", False), PAIRS=pairs, XPERM=xperm, STREAM=programs > 0,
                      num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **_maxnreg(cfg),
                      **launch_options(x.device, _dot_kernel))
    return _finish(y, split, out_dtype, bias, stream)


# PAIRS 3 instead of 1 on a GPU from this BLOCK_M on: the decode's mask and or as one lop3 inside its asm. Same
# values; SASS of the Q4_K loop on sm_90 (triton 3.6 + ptxas): 863 instructions a step against 990, but 166 registers
# against 152. On an H200 (gpu_pending.sh part34, 2026-12-02), Q4_K at M = 23 (BLOCK_M 32): 0.97x the time on each
# of 17408x5120, 5120x17408, 12288x5120, the 27B tree verify (23 nodes) 28.93 -> 28.36 ms; at M = 16 1.02x, 1.07x,
# 0.98x and the 27B verify of 16 tokens 16.84 / 16.85 ms: so from BLOCK_M 32 on then. Since the x in pair order and the
# fewer K splits, SASS of the M = 16 loop 926 instructions with it against 1,061, at 168 / 167 registers. With Q4_K's
# d / dmin as words (_SCALE_WORDS), on an H200 (2026-12-03 11:30, `gpu_pending.sh part59`, one call): the 27B verify of
# 16 tokens 15.80 -> 15.21 ms, of 23 tree nodes 25.11 -> 25.00 ms: from 16 on.
_PAIRS_LOP3_FROM = 16


# Q4_K's PAIRS decode in the field form (`_bf16_pairs` PAIRS 4 / 5): one lop3 and one bf16x2 fma a weight
# pair, against one lop3 and two (SASS of the Q4_K M = 16 loop on sm_90: 846 instructions a step against 968, 168
# registers against 156). The price is b = -(a + dmin m) rounded to bf16 whole, a block-wide offset of up to 2^-8 a:
# a sixteenth of a Q4_K code step (test on the CPU: max error 5.3e-3 of max |y| against the integer form's
# 2.8e-3). Q4_0 would move by a tenth of a step, Q6_K by over a third (b = -1.5 a): never for those. On an H200
# (2026-12-03, `gpu_pending.sh part71` / `part72`): Q4_K 17408x5120 37.78 -> 35.46 us at M = 16, 53.50 -> 50.97 at 23;
# the 27B verify of 16 tokens 14.84 -> 14.25 ms, of 23 tree nodes 22.39 -> 20.36 ms. Off: it moves the verify's
# logits 13 % (real 0.5B) to 18 % (27B synth) further from the decode's, and on the 27B synth the greedy flips at
# near-ties went from 29 to 51 in six runs (2026-12-04, `benchmarks/diag_verify_numerics.py`, `part73`).
PAIRS_FIELD = os.environ.get("DFLASH24_PAIRS_FIELD", "0") == "1"

_PAIRED_TYPES = (QT.Q4_0, QT.Q5_0, QT.Q4_K, QT.Q5_K, QT.Q6_K)       # codes < 128: 128 + q is exact in bf16


def _pairs(cfg: dict, p: PackedWeight, x: torch.Tensor) -> int:
    """The dot kernel's PAIRS for cfg["pairs"]: 4- to 6-bit codes (not Q8_0's bytes) and bf16 activations only (the
    decoded pairs are bf16); 1 (or 3 from BLOCK_M _PAIRS_LOP3_FROM on) on a GPU, 2 in the CPU interpreter."""
    if not cfg.get("pairs", False) or p.qtype not in _PAIRED_TYPES or x.dtype != torch.bfloat16:
        return 0
    if PAIRS_FIELD and p.qtype == QT.Q4_K:
        return 5 if _INTERPRET else 4
    return 2 if _INTERPRET else (3 if cfg["BLOCK_M"] >= _PAIRS_LOP3_FROM else 1)


def dequant_config(p: PackedWeight) -> dict:
    """Tile of the dequantize kernel: BLOCK_N rows x G scale blocks per program."""
    bs, _ = GEOMETRY[p.qtype]
    # the best tiles of benchmarks/tune_dequant.py on an H200 (BENCHMARKS.md), as fractions of copy bandwidth
    if p.qtype == QT.Q6_K:
        return dict(BLOCK_N=4, G=256 // bs, num_warps=4)             # 59-62 %
    if p.qtype == QT.Q8_0:
        return dict(BLOCK_N=4, G=256 // bs, num_warps=2)             # 82-85 %
    return dict(BLOCK_N=4, G=max(1, 512 // bs), num_warps=2)     # Q4_K 78-81 % (other types: not swept)


def dequant_rows(p: PackedWeight, row0: int, row1: int, out: torch.Tensor, cfg: dict | None = None) -> torch.Tensor:
    """out[: row1 - row0] = W[row0:row1] in out.dtype (out: (>= rows, K), unit stride in K)."""
    ptrs, strides = _args(p)
    bs, fpw = GEOMETRY[p.qtype]
    nblk = p.k // bs
    cfg = cfg or dequant_config(p)
    grid = (triton.cdiv(row1 - row0, cfg["BLOCK_N"]), triton.cdiv(nblk, cfg["G"]))
    _dequant_kernel[grid](out, *ptrs, row0, row1, nblk, out.stride(0), *strides,
                          QTYPE=_CODE[p.qtype], BS=bs, FPW=fpw, BLOCK_N=cfg["BLOCK_N"], G=cfg["G"],
                          num_warps=cfg["num_warps"], **launch_options(out.device, _dequant_kernel))
    return out


SCRATCH_BYTES = 24 << 20          # bf16 weight chunk of the large-M path (stays in the 50 MiB L2)
# A prompt chunk shorter than the prefill chunk the memory plan was made for leaves the activation memory planned for
# its missing rows unused; the large-M path takes it as a larger scratch (up to the whole weight), so the weight is
# dequantized in fewer pieces. Short prompts are bound by the host launching kernels, two a piece: on an H100
# (2026-12-06, `benchmarks/bench_prefill.py`, the 27B, median wall ms at 128 / 256 / 512 / 1024 tokens) 24 MiB pieces
# 207-211 / 232 / 236-272 / 229, 96 MiB 138 / 140 / 139 / 136, 384 MiB 116 / 116 / 118-120 / 121; the GPU's kernel
# time the same or lower with larger pieces (53-55 / 58-65 / 75-85 / 117-125 ms; 4,096 tokens 402-409 either way).
# SCRATCH_PLAN: (rows of the plan's prefill chunk, activation bytes the plan holds for each), set around a prefill by
# `scratch_plan`; (0, 0) outside one: SCRATCH_BYTES pieces only.
SCRATCH_PLAN = (0, 0)


@contextlib.contextmanager
def scratch_plan(rows: int, row_bytes: int):
    """Within this block the large-M path may use (rows - M) * row_bytes bytes of scratch for a matmul of M rows
    (see SCRATCH_PLAN); rows: the prefill chunk the memory plan was made for, row_bytes: the activation bytes the
    plan reserves for each of its rows at any point of a layer (`plan.prefill_row_bytes`)."""
    global SCRATCH_PLAN
    before, SCRATCH_PLAN = SCRATCH_PLAN, (rows, row_bytes)
    try:
        yield
    finally:
        SCRATCH_PLAN = before


def scratch_bytes(m: int) -> int:
    """Bytes of bf16 weight the large-M path dequantizes at a time for a matmul of m rows."""
    rows, row_bytes = SCRATCH_PLAN
    return max(SCRATCH_BYTES, (rows - m) * row_bytes)


def _matmul_large(x: torch.Tensor, p: PackedWeight) -> torch.Tensor:
    """(M, K) -> (M, N) in x.dtype: dequantize a chunk of rows into scratch, cuBLAS, next chunk."""
    m = x.shape[0]
    chunk = max(256, scratch_bytes(m) // (x.element_size() * p.k) // 256 * 256)
    chunk = min(chunk, p.n)
    w = torch.empty((chunk, p.k), device=x.device, dtype=x.dtype)
    y = torch.empty((m, p.n), device=x.device, dtype=x.dtype)
    for n0 in range(0, p.n, chunk):
        n1 = min(p.n, n0 + chunk)
        dequant_rows(p, n0, n1, w)
        torch.matmul(x, w[: n1 - n0].T, out=y[:, n0:n1])
    return y


# Verify matmuls (2..GLUON_MAX_ROWS rows of bf16 x; Q4_K, Q5_K, Q6_K, and Q8_0 / Q4_0 / Q5_0 with K % 256 == 0) on the
# Gluon kernel (`gluon_matmul`: weights from
# global memory straight into mma.sync operands) where it runs: triton with Gluon, an NVIDIA GPU of compute
# capability 8+. DFLASH24_GLUON=0: the tl.dot kernel. On an H200 (2026-12-04, `gpu_pending.sh part82` / `part83` /
# `part86`, us, dot kernel -> Gluon at its best tile): M = 16 Q4_K 34816x5120 66.32 -> 49.46, 5120x17408 38.06 ->
# 28.80, Q5_K 10240x5120 36.86 -> 22.04, Q6_K 5120x17408 54.61 -> 35.10, 248320x5120 539.15 -> 348.85; M = 23 Q4_K
# 116.32 -> 67.94, 55.78 -> 36.04, Q5_K 47.48 -> 28.65, Q6_K 72.44 -> 40.60. The same bf16 weights, x and fp32
# accumulation: the two differ by the order of sums. The 27B's 16-token verify 14.7 -> 10.9 ms, its 23-node tree
# verify 21.9 -> 15.5 ms (BENCHMARKS.md).
GLUON = os.environ.get("DFLASH24_GLUON", "1") != "0"
GLUON_TYPES = set(gluon_matmul.TYPES)
# Up to this many rows of x take the Gluon kernel, in `gluon_launches` launches (near-equal chunks, each reading the
# weights again): on an H200 (2026-12-04, `gpu_pending.sh part97`, the synthetic 27B) the tree verify of 33 nodes took
# 33.5 ms on the tl.dot kernel (BLOCK_M 64) and 65 nodes 53.0 ms on dequantized chunks + cuBLAS, against 13.9 ms for
# 23 nodes on one Gluon launch a matmul. Above: the tl.dot kernel to SMALL_M rows, cuBLAS beyond.
GLUON_MAX_ROWS = 96
# From this many rows up, one launch of 64-row tiles (gluon_matmul.MAX_ROWS) instead of two of up to 32: on an H200
# (2026-12-05, `part108` trimmed; us, two launches -> one) Q4_K 34816x5120 at 33 rows 110.9 -> 115.2, 48 130.6 ->
# 114.6, 64 135.8 -> 110.0; Q4_K 5120x17408 60.7 -> 63.5, 67.2 -> 64.8, 68.4 -> 66.4; Q6_K 5120x17408 76.6 -> 77.0,
# 82.9 -> 78.1, 82.0 -> 76.2. The 27B tree verify (bench_tree_budget.py): budget 32 (33 rows) 23.83 -> 24.11 ms,
# 40 27.33 -> 25.37, 48 28.77 -> 26.81, 63 30.51 -> 28.55.
GLUON_ROWS64_FROM = 40


# The dot kernel's pair orders (PairRows.a / .b) in the verify steps' norms and silu_mul: None, where
# `dot_pairs_needed` says (only where a verify matmul may run the dot kernel); True / False force them (benchmarks).
DOT_PAIRS: bool | None = None


def dot_pairs_needed(device) -> bool:
    """Whether the norms should also write x in the dot kernel's pair orders for a verify step on `device`: not
    where the Gluon kernel takes every verify matmul the dot kernel would read them for (each type of XPERM_TYPES, up
    to SMALL_M rows). A weight the Gluon kernel declines (K not whole 256-weight steps, arrays it cannot view) goes
    to the dot kernel, which then permutes x in registers itself."""
    if DOT_PAIRS is not None:
        return DOT_PAIRS
    return not (_gluon_on(torch.device(device)) and SMALL_M_MATMUL != "mmq" and XPERM_TYPES <= GLUON_TYPES
                and GLUON_MAX_ROWS >= SMALL_M)


def _gluon_on(device: torch.device) -> bool:
    """Whether verify matmuls on `device` may run the Gluon kernel at all (switched on, not the batch-invariant
    mode, a GPU it runs on); `_gluon` then asks per weight and x."""
    return GLUON and not BATCH_INVARIANT and gluon_matmul.available(device)


def _gluon(p: PackedWeight, x: torch.Tensor) -> bool:
    return (_gluon_on(x.device) and p.qtype in GLUON_TYPES and 2 <= x.shape[0] <= GLUON_MAX_ROWS
            and x.dtype == torch.bfloat16 and gluon_matmul.supports(p))


def gluon_launches(m: int, wg64: bool = False) -> int:
    """How many Gluon launches take m rows (2..GLUON_MAX_ROWS): launches of up to 32 rows below GLUON_ROWS64_FROM
    rows, of up to gluon_matmul.MAX_ROWS from there; wg64 (the weight's 64-row tiles on the warpgroup MMA, whose MMA
    count does not grow with the rows): of up to MAX_ROWS from 33 rows."""
    per_launch = gluon_matmul.MAX_ROWS if m >= GLUON_ROWS64_FROM or wg64 else min(32, gluon_matmul.MAX_ROWS)
    return -(-m // per_launch)


def _gluon_rows(x: torch.Tensor, p: PackedWeight, out_dtype, bias, x_order: torch.Tensor | None) -> torch.Tensor:
    """The Gluon matmul of x's rows in `gluon_launches` launches: more than one as near-equal chunks (33 -> 16 + 17),
    each written into its rows of one output. x_order: x in gluon_order (else made per launch)."""
    m = x.shape[0]
    n = gluon_launches(m, (p.qtype, 64) in gluon_matmul.WG_TILES and gluon_matmul.hopper(x.device))
    if n == 1:
        return gluon_matmul.matmul(x, p, out_dtype=out_dtype, bias=bias, x_order=x_order)
    out = torch.empty((m, p.n), device=x.device, dtype=out_dtype)
    for i in range(n):
        r0, r1 = i * m // n, (i + 1) * m // n
        gluon_matmul.matmul(x[r0:r1], p, out_dtype=out_dtype, bias=bias,
                            x_order=x_order[r0:r1] if x_order is not None else None, out=out[r0:r1])
    return out


def _gluon_compile_errors() -> tuple:
    """What a triton whose Gluon API this kernel does not fit raises before anything runs: a compile error (the
    kernel's body, ptxas) or a missing / changed name on the host side."""
    errs: list = [AttributeError, TypeError, ImportError]
    try:
        from triton.compiler.errors import CompilationError
        errs.append(CompilationError)
        from triton.runtime.errors import PTXASError
        errs.append(PTXASError)
    except ImportError:
        pass
    return tuple(errs)


def _wg_failed(err: Exception) -> bool:
    """Whether err is the warpgroup-MMA form of the Gluon kernel (gluon_matmul WG) failing before it ran: a compile
    error, a TMA descriptor the driver or Triton refused (AssertionError / RuntimeError naming a tensor map or
    descriptor). Then warn once and take that form off (gluon_matmul.WG_TILES emptied): the mma.sync tiles go on."""
    if not gluon_matmul.WG_TILES:
        return False
    if not isinstance(err, _gluon_compile_errors()) and not any(
            w in str(err) for w in ("tensor map", "descriptor", "aligned", "strides")):
        return False
    gluon_matmul.WG_TILES = set()
    warnings.warn(f"the warpgroup-MMA form of the Gluon matmul failed with triton {triton.__version__} "
                  f"({type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}); "
                  "verify steps use its mma.sync tiles", RuntimeWarning)
    return True


def _gluon_off(err: Exception) -> None:
    """The Gluon kernel did not compile on this triton: warn once and use the tl.dot kernel from now on."""
    global GLUON
    GLUON = False
    warnings.warn(f"the Gluon small-M matmul does not compile with triton {triton.__version__} "
                  f"({type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}); "
                  "verify steps use the tl.dot kernel (DFLASH24_GLUON=0 skips the attempt)", RuntimeWarning)


def matmul(x: torch.Tensor, p: PackedWeight, cfg: dict | None = None, out_dtype: torch.dtype | None = None,
           bias: torch.Tensor | None = None, pairs: PairRows | None = None) -> torch.Tensor:
    """x (M, K) -> (M, N) [+ bias (N,) fp32]: Gluon launches where `_gluon` allows (up to GLUON_MAX_ROWS rows; not
    in mmq mode), else the small-M path for M <= SMALL_M (tl.dot, or mmq as SMALL_M_MATMUL says), dequantized
    chunks + cuBLAS above. Result in out_dtype (default: fp32 up to SMALL_M rows or with a cfg, x.dtype above). A
    cfg forces a small-M path: mmq when it says kernel="mmq" (mmq_config), else dot."""
    if not HAVE_TRITON:
        raise RuntimeError("triton is not installed")
    if x.dim() != 2 or x.shape[1] != p.k:
        raise ValueError(f"matmul: x must be (M, {p.k}), got {tuple(x.shape)}")
    if x.stride(1) != 1:
        x = x.contiguous()
    out_dtype = out_dtype or (x.dtype if cfg is None and x.shape[0] > SMALL_M else torch.float32)
    kernel = cfg["kernel"] if cfg and "kernel" in cfg else SMALL_M_MATMUL
    if pairs is not None and pairs.g.numel() != x.numel():
        raise ValueError(f"matmul: the pair-order rows have {pairs.g.numel()} values, x has {x.numel()}")
    if cfg is None and kernel != "mmq" and _gluon(p, x):
        try:
            return _gluon_rows(x, p, out_dtype, bias, pairs.gluon(p.qtype, p.k) if pairs is not None else None)
        except (*_gluon_compile_errors(), AssertionError, RuntimeError) as e:
            if _wg_failed(e):           # the warpgroup MMA is off now: again, on the mma.sync tiles
                return matmul(x, p, cfg, out_dtype, bias, pairs)
            if not isinstance(e, _gluon_compile_errors()):
                raise
            _gluon_off(e)
    if cfg is None and x.shape[0] > SMALL_M:
        y = _matmul_large(x, p)
        if bias is not None:
            y = y + bias
        return y.to(out_dtype)
    if kernel == "mmq":
        return _matmul_mmq(x, p, cfg, out_dtype, bias)
    x_pairs = pairs.for_type(p.qtype, p.k) if pairs is not None and p.qtype in XPERM_TYPES else None
    return _matmul_dot(x, p, cfg, out_dtype, bias, x_pairs=x_pairs)


def quant_matmul(x: torch.Tensor, p: PackedWeight, bias: torch.Tensor | None = None,
                 out_dtype: torch.dtype | None = None, int8: Int8Rows | None = None,
                 pairs: PairRows | None = None) -> torch.Tensor:
    """x (M, K) -> (M, N) [+ bias (N,) fp32] in out_dtype (default x.dtype); the path is chosen by M (GEMV for
    M = 1 unless DECODE_MATMUL is "dot", else `matmul`'s paths). Bias and the cast happen in the kernel's store
    unless K was split. `int8`: x's int8 rows, for the GEMV (see Int8Rows); `pairs`: x in pair order, for the
    small-M kernels (see PairRows)."""
    out_dtype = out_dtype or x.dtype
    if x.shape[0] == 1 and DECODE_MATMUL == "gemv":
        return gemv(x, p, out_dtype=out_dtype, bias=bias, int8=int8)
    return matmul(x, p, out_dtype=out_dtype, bias=bias, pairs=pairs)
