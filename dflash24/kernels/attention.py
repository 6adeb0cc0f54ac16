"""Attention of one step's queries over the KV cache: Triton kernel (GQA-packed flash attention with
split-KV) and the plain PyTorch reference.

Shapes: q [T, H, D]; k_cache / v_cache [capacity, Hk, D] (the step's own keys/values already written at
their rows); query head h reads KV head h // (H // Hk). Output [T, H, D] in q's dtype.

Visibility, read from device tensors only (no host sync; CUDA-graph capturable for a fixed T):
  sequential  key row s is visible to query t iff s <= slots[t]          (slots [T] int64)
  tree        rows < base are visible to every query; row base + j is visible to query t iff
              ancestors[t, j] (j < N = T); nothing beyond base + N      (base [1] int64, ancestors [N, N] bool)
Every program derives its last row from these tensors (max slot of its queries + 1, or base + N), so
the work follows the real context, not the bucketed `kv_rows`; rows >= kv_rows are never read either.

Kernel layout (one kernel for decode, verification and prefill):
  a program owns (a block of BLOCK_M packed rows, one KV head, one KV split). Packed row r of KV head kh
  is query token t = r // G, query head kh * G + r % G (G = H // Hk), so a K/V tile is loaded once and
  used by all G query heads of its group and by all T tokens in the block (T * G <= BLOCK_M for
  verification-sized steps: K/V rows are read once per KV head).
  - decode / verify: the visible rows are cut into `n_splits` contiguous ranges, one per program
    (flash-decoding); each writes unnormalised partials (acc, running max m, sum l) and `_reduce_kernel`
    merges them. n_splits is picked on the host from kv_rows and the program count.
  - prefill: many row blocks already fill the GPU: n_splits = 1 and the program writes the output.
  Online softmax in base 2 (scale * log2(e) folded into the scores), fp32 statistics and accumulator.

Quantized KV (q8_0, q4_0, tq3; cache/kvquant.py): K and V may each be a `PackedKV` (uint8 rows of
row_bytes per KV head). `_load_kv_tile` decodes a [BLOCK_N, D] tile in registers from the rows' 32-bit
words (a constexpr format code per side selects the decoder; a q4_0 tile comes in `_to_q4_0_order`'s
order); the rest of the kernel only sees dense tiles, computed in the query's dtype. tq3 tiles stay in the
rotated domain: q is rotated before the kernel when K is tq3 (QK^T is unchanged, R is orthogonal), and the
output (fp32 until then) rotated back after it when V is tq3 (the output is linear in V), by one `_rotate_kernel`
launch each. A prompt chunk (sequential, more than PREFILL_MIN_T tokens, no window) instead has `_dequant_kernel`
decode its visible rows into a dense scratch SEGMENT_ROWS at a time and runs the dense kernel over each segment,
going on from the partials of the one before (RESUME).
"""
from __future__ import annotations

import os

import torch

from ..cache.kvquant import FORMAT_CODE, TQ3_CENTROIDS, TQ3_GROUP, PackedKV, rotation_signs
from ..quant import kernels as quant_kernels

from . import HAVE_TRITON, tl, triton  # noqa: F401 - without triton: the SDPA path in models/layers.py
from .pdl import launch_options, pdl_enter

# Under TRITON_INTERPRET=1 (CPU tests) bf16 tl.dot gives wrong results in triton 3.9's interpreter:
# the kernel then upcasts its tiles to fp32 before every dot.
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

HEAD_DIMS = (64, 128, 256)
MAX_SPLITS = 64               # partials per (token, head); the reduction handles them in one tile
# a split should cover at least this many of the kv_rows the step passes (the engine's power-of-two bucket, of which
# the step's context fills half or more): 64 -> 16 splits of a 1024-row bucket. H200, 24 / 4 heads of 256, bf16
# (benchmarks/bench_attention.py --short --splits; 2026-12-04), us per call at 4 / 16 splits after a 512-token
# prompt: decode 8.65 / 5.59, chain verify 16 16.74 / 13.31, tree verify 23 29.27 / 19.49 (256 gave 4).
MIN_SPLIT_ROWS = 64
INVARIANT_MIN_SPLIT_ROWS = 256    # the batch-invariant mode's smallest split (its split size is fixed by capacity)
# DFLASH24_BATCH_INVARIANT=1 (the flag lives in quant/kernels.py, with the matmul half of the mode): steps of
# up to SMALL_M tokens use the decode tiles and splits of a fixed number of cache rows, so a token's output does
# not depend on the other tokens of its step (sequential steps without a window; in a tree verify, ancestors sit
# at other rows than in AR, and a window moves the split edges with the block's first visible row: both can
# change the sums' order)
_LOG2E = 1.4426950408889634
if HAVE_TRITON:      # tq3 centroid magnitudes, ascending (kvquant.TQ3_CENTROIDS[4:])
    C0, C1, C2, C3 = (tl.constexpr(c) for c in TQ3_CENTROIDS[4:])


# ---------------------------------------------------------------------------------------------------
# PyTorch reference
# ---------------------------------------------------------------------------------------------------
def dense_visibility(T: int, kv_rows: int, slots: torch.Tensor | None = None, base: torch.Tensor | None = None,
                     ancestors: torch.Tensor | None = None, device=None) -> torch.Tensor:
    """[T, kv_rows] bool mask of the visibility rule (sequential: slots; tree: base + ancestors [T, T])."""
    dev = device if device is not None else (slots.device if slots is not None else base.device)
    rows = torch.arange(kv_rows, device=dev)
    if ancestors is None:
        return rows.unsqueeze(0) <= slots.view(T, 1)
    rel = rows - base.view(1)                                        # [S] row offset inside the tree
    in_tree = (rel >= 0) & (rel < T)
    tree_vis = ancestors[:, rel.clamp(0, T - 1)] & in_tree.unsqueeze(0)
    return (rows < base.view(1)).unsqueeze(0) | tree_vis


def attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float, kv_rows: int,
                  slots: torch.Tensor | None = None, base: torch.Tensor | None = None,
                  ancestors: torch.Tensor | None = None) -> torch.Tensor:
    """The definition, in fp32: builds the dense mask and does softmax(q k^T * scale) v per query head.
    q [T, H, D]; k_cache/v_cache [>= kv_rows, Hk, D]. Returns [T, H, D] in q's dtype. K/V are taken as
    stored; q is rounded to the cache dtype first (as the kernel and the SDPA path do)."""
    T, H, D = q.shape
    Hk = k_cache.shape[1]
    if isinstance(k_cache, PackedKV):                                 # quantized: the dequantized values
        k_cache = k_cache.dequantize(kv_rows)
        q = q.float()
    if isinstance(v_cache, PackedKV):
        v_cache = v_cache.dequantize(kv_rows)
    if (slots is None) == (ancestors is None):
        raise ValueError("give exactly one of slots (sequential) or base + ancestors (tree)")
    mask = dense_visibility(T, kv_rows, slots, base, ancestors, q.device)          # [T, S]
    k = k_cache[:kv_rows].float().repeat_interleave(H // Hk, dim=1)               # [S, H, D]
    v = v_cache[:kv_rows].float().repeat_interleave(H // Hk, dim=1)
    qf = q.to(k_cache.dtype).float()
    s = torch.einsum("thd,shd->hts", qf, k) * scale                                # [H, T, S]
    s = s.masked_fill(~mask.unsqueeze(0), float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)                                   # a row seeing nothing -> 0
    return torch.einsum("hts,shd->thd", p, v).to(q.dtype)


# ---------------------------------------------------------------------------------------------------
# Triton kernels
# ---------------------------------------------------------------------------------------------------
if HAVE_TRITON:

    @triton.jit
    def _load_kv_tile(ptr, rows, kh, stride_s, stride_h, offs_d, row_ok, FMT: tl.constexpr,
                      BLOCK_N: tl.constexpr, D: tl.constexpr, VEC: tl.constexpr):
        """[BLOCK_N, D] tile of cache rows `rows` of KV head kh (zero where not row_ok). FMT 0: dense (the
        cache dtype, columns offs_d); 1 q8_0, 2 q4_0, 3 tq3 (rotated domain): decoded to fp32 from the rows'
        32-bit words (`ptr` an int32 view of the uint8 rows, strides in units of VEC words; layouts in
        cache/kvquant.py: a row's fp16 scales, then its blocks' payloads), a word's values side by side, so a
        load brings 4 (q8_0), 8 (q4_0) or 16 (tq3) values. q8_0 and tq3 tiles come out in the head dim's
        order; a q4_0 tile in `_to_q4_0_order`'s (the kernel puts q / its output in that order for a q4_0
        K / V side)."""
        # One return at the end: the branches are resolved at compile time (FMT is constexpr) and give
        # different dtypes (dense: the cache dtype; quantized: fp32), which triton refuses across returns.
        if FMT == 0:
            tile = tl.load(ptr + rows[:, None] * stride_s + kh * stride_h + offs_d[None, :],
                           mask=row_ok[:, None], other=0.0)
        else:
            m = row_ok[:, None]
            # VEC words a unit: the compiler then knows a row starts VEC-word (16-byte) aligned, and loads a
            # thread's consecutive words as one vector
            row = ptr + (rows[:, None] * stride_s + kh * stride_h) * VEC                # [BN, 1] word pointers
            NB: tl.constexpr = D // 32                                                 # blocks (scales) a row
            s = _block_scales(row, m, BLOCK_N, NB)                                    # [BN, NB] fp32
            # Integers become floats without a conversion instruction (a slow one): a field of a value's bits put
            # in the mantissa of 2^23 (bits 0x4B000000; the field below bit 23) makes 2^23 + (the field as an
            # unsigned integer), exact; one subtraction leaves the value times the field's place (2^4, 2^8, 2^12),
            # taken out of the scale (exact: a power of 2). A word's upper half is shifted down first.
            if FMT == 1:        # D / 4 words of 4 int8 values (two's complement), after the scales
                c = tl.arange(0, D // 4)
                # each byte's top bit flipped (0x80808080 as an int32): a byte b (two's complement) reads b + 128
                w = tl.load(row + (NB // 2 + c)[None, :], mask=m, other=0) ^ -2139062144
                up = (w >> 16) | 0x4B000000
                w = w | 0x4B000000
                s0 = _per_word(s, BLOCK_N, NB, 8)
                s8 = s0 * (1.0 / 256)
                v0 = (_field(w, 0xFF) - (8388608.0 + 128.0)) * s0
                v1 = (_field(w, 0xFF00) - (8388608.0 + 32768.0)) * s8
                v2 = (_field(up, 0xFF) - (8388608.0 + 128.0)) * s0
                v3 = (_field(up, 0xFF00) - (8388608.0 + 32768.0)) * s8
                tile = tl.reshape(tl.join(tl.join(v0, v2), tl.join(v1, v3)), (BLOCK_N, D))
            elif FMT == 2:      # D / 8 words after the scales, 4 a block; a word's byte k holds values 4j + k and
                c = tl.arange(0, D // 8)    # 4j + k + 16 (j = word % 4) in its low / high nibble
                w = tl.load(row + (NB // 2 + c)[None, :], mask=m, other=0)
                up = (w >> 16) | 0x4B000000
                w = w | 0x4B000000
                s0 = _per_word(s, BLOCK_N, NB, 4)
                s4 = s0 * (1.0 / 16)
                s8 = s0 * (1.0 / 256)
                s12 = s0 * (1.0 / 4096)
                v0 = (_field(w, 0xF) - (8388608.0 + 8.0)) * s0
                v1 = (_field(w, 0xF0) - (8388608.0 + 128.0)) * s4
                v2 = (_field(w, 0xF00) - (8388608.0 + 2048.0)) * s8
                v3 = (_field(w, 0xF000) - (8388608.0 + 32768.0)) * s12
                v4 = (_field(up, 0xF) - (8388608.0 + 8.0)) * s0
                v5 = (_field(up, 0xF0) - (8388608.0 + 128.0)) * s4
                v6 = (_field(up, 0xF00) - (8388608.0 + 2048.0)) * s8
                v7 = (_field(up, 0xF000) - (8388608.0 + 32768.0)) * s12
                tile = tl.reshape(_join8(v0, v1, v2, v3, v4, v5, v6, v7), (BLOCK_N, D))
            else:               # D / 16 words of 2-bit codes (16 values each), then D / 32 words of the codes'
                c = tl.arange(0, D // 16)   # high (sign) bits (32 values each); c: a run of 16 values
                lo = tl.load(row + (NB // 2 + c)[None, :], mask=m, other=0)
                hi = tl.load(row + (NB // 2 + D // 16 + c // 2)[None, :], mask=m, other=0)
                hi = (hi >> (16 * (c % 2))[None, :]) & 0xFFFF
                d = _per_word(s, BLOCK_N, NB, 2)
                nd = -d
                k = _tq3_magnitudes(lo, hi)           # values 8 ... 15 of the run from the words shifted down
                k8 = k >> 16
                h8 = hi >> 8
                tile = tl.reshape(tl.join(
                    _join8(_tq3_value(k, hi, 0, d, nd), _tq3_value(k, hi, 2, d, nd), _tq3_value(k, hi, 4, d, nd),
                           _tq3_value(k, hi, 6, d, nd), _tq3_value(k8, h8, 0, d, nd), _tq3_value(k8, h8, 2, d, nd),
                           _tq3_value(k8, h8, 4, d, nd), _tq3_value(k8, h8, 6, d, nd)),
                    _join8(_tq3_value(k, hi, 1, d, nd), _tq3_value(k, hi, 3, d, nd), _tq3_value(k, hi, 5, d, nd),
                           _tq3_value(k, hi, 7, d, nd), _tq3_value(k8, h8, 1, d, nd), _tq3_value(k8, h8, 3, d, nd),
                           _tq3_value(k8, h8, 5, d, nd), _tq3_value(k8, h8, 7, d, nd))), (BLOCK_N, D))
        return tile

    @triton.jit
    def _join8(a0, a1, a2, a3, a4, a5, a6, a7):
        """[..., 8]: a0 ... a7 in this order along a new last axis (a join puts its second operand right after
        its first along the axis it adds, which varies fastest)."""
        return tl.join(tl.join(tl.join(a0, a4), tl.join(a2, a6)), tl.join(tl.join(a1, a5), tl.join(a3, a7)))

    @triton.jit
    def _block_scales(row, m, BLOCK_N: tl.constexpr, NB: tl.constexpr):
        """[BLOCK_N, NB] fp32: each row's NB fp16 block scales (its first NB / 2 words, two scales a word)."""
        w = tl.load(row + tl.arange(0, NB // 2)[None, :], mask=m, other=0)
        lo = w.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        hi = (w >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        return tl.reshape(tl.join(lo, hi), (BLOCK_N, NB))

    @triton.jit
    def _per_word(s, BLOCK_N: tl.constexpr, NB: tl.constexpr, R: tl.constexpr):
        """[BLOCK_N, NB * R]: each block's scale of `s` [BLOCK_N, NB] repeated for its R words."""
        return tl.reshape(tl.broadcast_to(s[:, :, None], (BLOCK_N, NB, R)), (BLOCK_N, NB * R))

    @triton.jit
    def _field(w, mask: tl.constexpr):
        """2^23 + (w & mask) as fp32, exact (mask below bit 23), from a word with 2^23's bits (0x4B000000) OR'ed in
        (once a word: each field then takes one AND)."""
        return (w & (mask + 0x4B000000)).to(tl.float32, bitcast=True)

    @triton.jit
    def _tq3_value(k, hi, i: tl.constexpr, d, nd):
        """Value i (< 8) of a run of tq3 codes: level C_k of the magnitude k (bits 2i, 2i + 1 of `k`), times the
        scale `d` for a positive code (bit i of `hi` set), `nd` = -d for a negative one."""
        k0 = (k & (1 << (2 * i))) != 0
        k1 = (k & (2 << (2 * i))) != 0
        mag = tl.where(k1, tl.where(k0, C3, C2), tl.where(k0, C1, C0))
        return mag * tl.where((hi & (1 << i)) != 0, d, nd)

    @triton.jit
    def _tq3_magnitudes(lo, hi):
        """The 16 magnitude indices of a run's codes, 2 bits each: a code's low bits, mirrored (3 - bits) where its
        sign bit (of `hi`) is clear: each clear bit i of hi spread to bits 2i, 2i + 1 and XOR'ed in."""
        n = ~hi & 0xFFFF
        n = (n | (n << 8)) & 0x00FF00FF
        n = (n | (n << 4)) & 0x0F0F0F0F
        n = (n | (n << 2)) & 0x33333333
        n = (n | (n << 1)) & 0x55555555
        return lo ^ (n | (n << 1))

    @triton.jit
    def _to_q4_0_order(x, BM: tl.constexpr, D: tl.constexpr):
        """x [BM, D] in the head dim's order -> in a decoded q4_0 tile's: column 8j + 2k + h of a 32-value block holds
        its value 16h + 4j + k (word j's nibbles in bit order, as `_load_kv_tile` joins them): each block's [2, 4, 4]
        (h, j, k) values as (j, k, h)."""
        return tl.reshape(tl.permute(tl.reshape(x, (BM, D // 32, 2, 4, 4)), (0, 1, 3, 4, 2)), (BM, D))

    @triton.jit
    def _from_q4_0_order(x, BM: tl.constexpr, D: tl.constexpr):
        """The inverse of `_to_q4_0_order`."""
        return tl.reshape(tl.permute(tl.reshape(x, (BM, D // 32, 4, 4, 2)), (0, 1, 4, 2, 3)), (BM, D))

    @triton.jit
    def _dequant_kernel(SRC, DST, row0, n_rows, stride_s, stride_h, stride_ds, stride_dh,
                        FMT: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, VEC: tl.constexpr):
        """Cache rows row0 .. row0 + n_rows - 1 of KV head program_id(1), decoded by `_load_kv_tile`, into DST
        [n_rows, Hk, D] (DST's dtype; q4_0 values back in the head dim's order, tq3 kept in the rotated domain)."""
        rel = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        kh = tl.program_id(1)
        ok = rel < n_rows
        offs_d = tl.arange(0, D)
        tile = _load_kv_tile(SRC, row0 + rel, kh, stride_s, stride_h, offs_d, ok, FMT, BLOCK_N, D, VEC)
        if FMT == 2:    # rearranged in registers, not stored through permuted addresses (as `_attn_kernel`'s output)
            tile = _from_q4_0_order(tile, BLOCK_N, D)
        tl.store(DST + rel[:, None] * stride_ds + kh * stride_dh + offs_d[None, :], tile.to(DST.dtype.element_ty),
                 mask=ok[:, None])

    # n_splits grows with the KV bucket during a generation: not specialized (Triton would compile another
    # variant once it became divisible by 16, a 2-12 s stall in the middle of a long answer)
    @triton.jit(do_not_specialize=["n_splits", "split_tiles"])
    def _attn_kernel(Q, K, V, O, PO, PM, PL, SLOTS, BASE, ANC, POS,
                     stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh,
                     stride_ot, stride_oh, stride_at,
                     T, H, kv_rows, n_splits, split_tiles, qk_scale, window, ring,
                     G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     TREE: tl.constexpr, SPLIT: tl.constexpr, UPCAST: tl.constexpr, IEEE_K: tl.constexpr,
                     IEEE_V: tl.constexpr, KFMT: tl.constexpr, VFMT: tl.constexpr, WINDOW: tl.constexpr,
                     KVEC: tl.constexpr = 1, VVEC: tl.constexpr = 1, RESUME: tl.constexpr = False,
                     RING: tl.constexpr = False, PDL: tl.constexpr = False):
        pdl_enter(PDL)
        mb = tl.program_id(0)                      # block of packed (token, query head) rows
        kh = tl.program_id(1)                      # KV head
        sp = tl.program_id(2)                      # KV split
        r = mb * BLOCK_M + tl.arange(0, BLOCK_M)   # [BM] packed rows
        t = r // G                                 # query token
        h = kh * G + r % G                         # query head
        row_ok = t < T
        offs_d = tl.arange(0, D)
        # a q4_0 side's tiles come in `_to_q4_0_order`'s order: q is put in its K tiles' order (QK^T is the same
        # sum), and the output, in its V tiles' order, put back before it is stored. Both rearranged in registers:
        # loading / storing them through permuted addresses kept [BLOCK_M, D] 64-bit pointers live beside the
        # accumulator (sm_90: 744 bytes a thread spilled, 128-272 this way; a 4K chain step 94.5 -> 27.6 us, H100)
        q = tl.load(Q + t[:, None] * stride_qt + h[:, None] * stride_qh + offs_d[None, :],
                    mask=row_ok[:, None], other=0.0)
        if KFMT == 2:
            q = _to_q4_0_order(q, BLOCK_M, D)
        if KFMT == 0:
            q = q.to(K.dtype.element_ty)           # as the SDPA path: queries in the cache dtype
        if UPCAST:
            q = q.to(tl.float32)

        # last visible row + 1 of this block's queries, from device data only
        if TREE:
            base = tl.load(BASE)
            hi = base + T
        else:
            slot = tl.load(SLOTS + t, mask=row_ok, other=-1)              # [BM] int64
            hi = tl.max(slot, axis=0) + 1
        hi = tl.minimum(hi, kv_rows).to(tl.int32)                           # rows < 2^31
        start0 = 0
        if WINDOW:      # sliding window: query t sees positions > pos_t - window (cache rows = positions)
            pos = tl.load(POS + t, mask=row_ok, other=0)
            lo_t = tl.maximum(pos - window + 1, 0).to(tl.int32)             # [BM]
            lo_min = tl.min(tl.where(row_ok, lo_t, hi), axis=0)             # no row below it is loaded
            start0 = lo_min // BLOCK_N * BLOCK_N
        n_tiles = tl.cdiv(hi - start0, BLOCK_N)
        per = tl.cdiv(n_tiles, n_splits)
        if split_tiles > 0:                        # batch-invariant: splits of a fixed size, whatever hi is
            per = split_tiles
        lo_s = start0 + sp * per * BLOCK_N
        hi_s = tl.minimum(lo_s + per * BLOCK_N, hi)

        if RESUME:     # a later segment of a long context: go on from the partials the segment before stored
            idx = (sp * T + t) * H + h                                     # [BM]
            m_i = tl.load(PM + idx, mask=row_ok, other=-1.0e30)
            l_i = tl.load(PL + idx, mask=row_ok, other=0.0)
            acc = tl.load(PO + idx[:, None] * D + offs_d[None, :], mask=row_ok[:, None], other=0.0)
            if VFMT == 2:
                acc = _to_q4_0_order(acc, BLOCK_M, D)
        else:
            m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)    # finite: fully masked rows stay NaN-free
            l_i = tl.zeros([BLOCK_M], tl.float32)
            acc = tl.zeros([BLOCK_M, D], tl.float32)
        for start in range(lo_s, hi_s, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)                          # [BN] cache rows
            col_ok = cols < hi_s
            if WINDOW:
                col_ok = col_ok & (cols >= lo_min)
            if RING:    # a sliding layer's ring of `ring` >= BLOCK_N rows: position p at row p % ring (cols are
                rows = start % ring + tl.arange(0, BLOCK_N)     # positions); one scalar modulo a tile, one wrap
                rows = tl.where(rows >= ring, rows - ring, rows)
            else:
                rows = cols
            k = _load_kv_tile(K, rows, kh, stride_ks, stride_kh, offs_d, col_ok, KFMT, BLOCK_N, D, KVEC)
            if KFMT != 0:
                k = k.to(q.dtype)                  # decoded tiles: computed in the query's dtype
            if UPCAST:
                k = k.to(tl.float32)
            if IEEE_K:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = s * qk_scale                                              # [BM, BN], log2 domain
            if TREE:
                rel = cols - base
                in_tree = (rel >= 0) & col_ok
                anc = tl.load(ANC + t[:, None] * stride_at + rel[None, :],
                              mask=row_ok[:, None] & in_tree[None, :], other=0)
                vis = ((cols < base)[None, :] | (anc != 0)) & col_ok[None, :]
            else:
                vis = cols[None, :] <= slot[:, None]
            if WINDOW:
                vis = vis & (cols[None, :] >= lo_t[:, None])
            s = tl.where(vis, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.math.exp2(m_i - m_new)
            p = tl.math.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = _load_kv_tile(V, rows, kh, stride_vs, stride_vh, offs_d, col_ok, VFMT, BLOCK_N, D, VVEC)
            if VFMT != 0:
                v = v.to(Q.dtype.element_ty)
            if UPCAST:
                v = v.to(tl.float32)
                pv = p
            else:
                pv = p.to(v.dtype)
            if IEEE_V:
                acc = acc * alpha[:, None] + tl.dot(pv, v, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(pv, v)
            m_i = m_new

        if VFMT == 2:
            acc = _from_q4_0_order(acc, BLOCK_M, D)
        if SPLIT:      # partials [n_splits, T, H, (D)]: unnormalised acc, max (log2 domain), sum
            idx = (sp * T + t) * H + h                                     # [BM]
            tl.store(PO + idx[:, None] * D + offs_d[None, :], acc, mask=row_ok[:, None])
            tl.store(PM + idx, m_i, mask=row_ok)
            tl.store(PL + idx, l_i, mask=row_ok)
        else:
            o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
            tl.store(O + t[:, None] * stride_ot + h[:, None] * stride_oh + offs_d[None, :],
                     o.to(O.dtype.element_ty), mask=row_ok[:, None])

    @triton.jit(do_not_specialize=["TH", "n_splits"])
    def _reduce_kernel(PO, PM, PL, O, TH, H, n_splits, stride_ot, stride_oh,
                       D: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False):
        """Merge the split partials of one (token, head) and a D-slice: O = sum_s w_s acc_s / sum_s w_s l_s."""
        pdl_enter(PDL)
        i = tl.program_id(0)                        # t * H + h
        db = tl.program_id(1)
        sp = tl.arange(0, BLOCK_S)
        ok = sp < n_splits
        m = tl.load(PM + sp * TH + i, mask=ok, other=-1.0e30)              # [BS]
        l = tl.load(PL + sp * TH + i, mask=ok, other=0.0)
        m_max = tl.max(m, axis=0)
        w = tl.where(ok, tl.math.exp2(m - m_max), 0.0)
        denom = tl.sum(w * l, axis=0)
        offs_d = db * BLOCK_D + tl.arange(0, BLOCK_D)
        po = tl.load(PO + (sp[:, None] * TH + i) * D + offs_d[None, :], mask=ok[:, None], other=0.0)
        o = tl.sum(po * w[:, None], axis=0) / tl.where(denom > 0, denom, 1.0)
        t = i // H
        h = i % H
        tl.store(O + t * stride_ot + h * stride_oh + offs_d, o.to(O.dtype.element_ty))

    @triton.jit(do_not_specialize=["n_groups"])
    def _rotate_kernel(X, S, Y, n_groups, INVERSE: tl.constexpr, BLOCK_G: tl.constexpr, PDL: tl.constexpr = False):
        """tq3's rotation R = D2 H D1 (S: [2, 128] signs, D1's then D2's) of the 128-value groups of contiguous X
        into Y, in fp32, written in Y's dtype: y = R x, or with INVERSE y = R^T x = D1 H D2 x. H is Sylvester's,
        H[i, j] = (-1)^popcount(i & j) / sqrt(128): a fast Walsh-Hadamard transform, seven butterflies (one per
        bit of the index; (a, b) -> (a + b, a - b)) in registers, no 128 x 128 matrix. A program rotates every
        num_programs-th tile of BLOCK_G groups."""
        pdl_enter(PDL)
        c = tl.arange(0, 128)
        first = tl.load(S + (128 if INVERSE else 0) + c)
        last = tl.load(S + (0 if INVERSE else 128) + c) * 0.08838834764831845       # 1 / sqrt(128)
        j = tl.arange(0, 2)[:, None]
        k = tl.arange(0, 2)[None, :]
        butterfly = tl.where((j & k) == 1, -1.0, 1.0)                                # [[1, 1], [1, -1]]
        for g0 in range(tl.program_id(0) * BLOCK_G, n_groups, tl.num_programs(0) * BLOCK_G):
            g = g0 + tl.arange(0, BLOCK_G)
            ok = g < n_groups
            x = tl.load(X + g[:, None] * 128 + c[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
            x = x * first[None, :]
            for bit in tl.static_range(7):      # index = hi * 2^(bit+1) + j * 2^bit + lo: x[..., j] -> sum_j
                x5 = tl.reshape(x, [BLOCK_G, 64 >> bit, 2, 1, 1 << bit])
                x = tl.reshape(tl.sum(x5 * butterfly[None, None, :, :, None], axis=2), [BLOCK_G, 128])
            tl.store(Y + g[:, None] * 128 + c[None, :], (x * last[None, :]).to(Y.dtype.element_ty),
                     mask=ok[:, None])


# ---------------------------------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------------------------------
_LIMITS: dict = {}


def _limits(device: torch.device) -> tuple[int, int]:
    """(SM count, opt-in shared memory per block) of a CUDA device; (4, 0) elsewhere (the interpreter)."""
    if device.type != "cuda":
        return 4, 0
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _LIMITS:
        p = torch.cuda.get_device_properties(key)
        _LIMITS[key] = (p.multi_processor_count, getattr(p, "shared_memory_per_block_optin", 0))
    return _LIMITS[key]


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


# Prefill chunks (more tokens than a verify step) of the 27B's head dim 256 take 128-row tiles on 8 warps. H100, 24 /
# 4 heads, a 4,096-token chunk at the end of 8K / 32K rows (benchmarks/bench_prefill_attention.py, 2026-12-06),
# TFLOP/s with the 64 x 32 tiles on 4 warps -> 128 x BLOCK_N on 8: q8_0 56.8 -> 86.4 (BLOCK_N 32) / 101.3 (64),
# q4_0 95.2 -> 122.6 / 148.2, tq3 53.8 -> 86.4 / 73.7; bf16 358 -> 435 (64, two stages; 32 is slower than 64 x 32
# on 4 warps). BLOCK_N 64 takes 96-112 KiB of shared memory quantized and 192 KiB dense (ptxas, sm_86 / sm_90):
# only where the device offers it, not on sm_86 / sm_89's 99 KiB.
PREFILL_MIN_T = 64
PREFILL_SPLIT_ROWS = 1024         # T x n_splits of such a chunk (pick_splits)
BIG_TILE_SHARED = 192 * 1024      # opt-in shared memory per block for BLOCK_N 64 (sm_90: 227 KiB; sm_80: 163)


# Steps over a quantized cache of head dim 256 (K and V of one type): (BLOCK_N, num_stages) where they differ from the
# dense tiles. H100, 24 / 4 heads, bench_attention.py --sweep at 32K / 131K rows (2026-12-07, the 32-bit word loads),
# us shipped -> these: q4_0 decode 59.4 -> 53.2 / 203.0 -> 176.2, verify 16 169.4 -> 156.2 / 425.7 -> 371.6; q8_0
# verify 16 at 131K 361.2 -> 334.3, tree 23 1,217.7 -> 851.5 (q8_0's decode and q4_0's tree: the dense tiles within 2 %;
# tq3 not swept with these loads). Only where a block may take BIG_TILE_SHARED: q4_0's decode tiles need 112 KiB and
# q8_0's tree tiles 106 KiB, more than sm_86 / sm_89's 99 KiB.
STEP_TILES = {(FORMAT_CODE["q4_0"], "decode"): (128, 2), (FORMAT_CODE["q4_0"], "verify"): (64, 3),
              (FORMAT_CODE["q8_0"], "verify"): (32, 3), (FORMAT_CODE["q8_0"], "tree"): (64, 2)}

# A chain verify step over a long q8_0 / tq3 cache: its 65-128 packed query rows (16 tokens x 6 heads = 96 on the 27B)
# in one 128-row tile on 8 warps, which decodes each cache row once instead of once per 64-row tile. H100
# (2026-12-07, `part187` and the call after it: bench_attention --only verify_chain --sweep, us): q8_0 at 131K rows
# 335.2 -> 288.1, 32K 93.7 -> 91.8, 4K 23.3 -> 30.5; tq3 131K 679.4 -> 511.1, 32K 203.1 -> 162.2, 4K 53.4 -> 56.4.
# Hence from LONG_STEP_ROWS cache rows on only; q4_0 was slower at every length (32K 154.5 -> 215.3), and a tree's 138
# rows (two 128-row tiles against three of 64) were in none of the three best configs of any type.
LONG_STEP_ROWS = 32768
LONG_STEP_TILES = {FORMAT_CODE["q8_0"]: dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=1),
                   FORMAT_CODE["tq3"]: dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=1)}


def pick_config(T: int, G: int, D: int, wide: bool = False, formats: tuple = (0, 0), shared: int = 0,
                tree: bool = False, kv_rows: int = 0) -> dict:
    """Tile sizes by head dim and packed rows (T * G): BLOCK_M covers all rows of a verify step when it
    fits the register budget (128 rows for D <= 128, 64 for D = 256), at least 16 (tl.dot minimum).
    `wide`: some tile is fp32 (an f32 cache, or fp32 queries): tiles and stages are halved so that the
    kernel stays inside the 99 KiB of shared memory a block gets on sm_86 / sm_89 (RTX 30xx / 40xx);
    tests/test_kernel_compile.py checks every config against each architecture's limit.
    A D = 256 prefill chunk (sequential, T > PREFILL_MIN_T; a tree is a verify step, up to 128 nodes): `formats`
    (the K / V format codes) and `shared` (the device's opt-in shared memory per block) pick 128-row tiles on 8
    warps; a D = 256 step over K and V of one quantized type takes STEP_TILES' rows a tile and stages where
    `shared` allows; a chain step of 65-128 rows over at least LONG_STEP_ROWS (`kv_rows`) q8_0 / tq3 rows takes
    LONG_STEP_TILES' instead."""
    rows = T * G
    if D == 256 and T > PREFILL_MIN_T and not wide and not tree:
        if any(formats):          # tq3 runs faster on 32 KV rows a tile; 64 rows: one stage times as two
            wide_n = shared >= BIG_TILE_SHARED and FORMAT_CODE["tq3"] not in formats
            # two stages of q8_0's words (cp.async) take 105 KiB at 32 rows: more than sm_86 / sm_89's 99 KiB
            one = wide_n or (FORMAT_CODE["q8_0"] in formats and shared < BIG_TILE_SHARED)
            return dict(BLOCK_M=128, BLOCK_N=64 if wide_n else 32, num_warps=8, num_stages=1 if one else 2)
        if shared >= BIG_TILE_SHARED:
            return dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2)
    if D <= 64:
        cap, bn, warps, stages = 128, 64, 4, 3
    elif D <= 128:
        cap, bn, warps, stages = 128, 64, 8, 2
    else:
        cap, bn, warps, stages = 64, 32, 4, 2
    bm = max(16, min(cap, _next_pow2(rows)))
    if bm <= 16 and D >= 128:      # decode: few rows, long tiles of K/V per iteration
        bn = 64
    if D == 256 and not wide and formats[0] == formats[1] and shared >= BIG_TILE_SHARED:
        if not tree and 64 < rows <= 128 and kv_rows >= LONG_STEP_ROWS and formats[0] in LONG_STEP_TILES:
            return dict(LONG_STEP_TILES[formats[0]])
        bn, stages = STEP_TILES.get((formats[0], "tree" if tree else "decode" if bm <= 16 else "verify"), (bn, stages))
    if wide:
        bm = max(16, bm // 2)
        bn = max(16, bn // 2)
        stages = max(1, stages - 1)
    return dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)


def pick_splits(T: int, D: int, programs: int, kv_rows: int, sm_count: int, tree: bool = False) -> int:
    """KV splits for `programs` (row blocks x KV heads) programs a split: about two programs an SM, at least
    MIN_SPLIT_ROWS cache rows a split. A head-dim-256 prefill chunk's 128-row tiles halve the programs, which would
    double the splits: its fp32 partials [n_splits, T, H, D] are kept to PREFILL_SPLIT_ROWS rows (25 MiB on the
    27B; the 64-row tiles reached 34 MiB at 683 tokens), as the memory plan counts none."""
    want = -(-2 * sm_count // programs)
    n = max(1, min(MAX_SPLITS, want, -(-kv_rows // MIN_SPLIT_ROWS)))
    if D == 256 and T > PREFILL_MIN_T and not tree:
        n = max(1, min(n, PREFILL_SPLIT_ROWS // T))
    return n


_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def supports(q: torch.Tensor, k_cache, v_cache=None) -> bool:
    """Whether `attention` handles these caches (head dim, dtypes, GQA ratio); each a dense tensor or a
    PackedKV (q8_0 / q4_0 / tq3)."""
    T, H, D = q.shape
    Hk = k_cache.shape[1]
    return (HAVE_TRITON and D in HEAD_DIMS and H % Hk == 0 and q.dtype in _FLOATS
            and all(isinstance(c, PackedKV) or (c.dtype in _FLOATS and c.shape[2] == D)
                    for c in (k_cache, v_cache if v_cache is not None else k_cache))
            and k_cache.shape[2] == D)


def _side(cache, q: torch.Tensor):
    """(tensor the kernel reads, format code, compute dtype) of one K/V side."""
    if isinstance(cache, PackedKV):     # the kernel reads 32-bit words (rows of a head dim of 64, 128 or 256)
        return cache.data.view(torch.int32), FORMAT_CODE[cache.fmt], q.dtype
    return cache, 0, cache.dtype


def _word_strides(buf: torch.Tensor, fmt: int) -> tuple[int, int, int]:
    """(row stride, head stride, VEC) of a side for `_load_kv_tile`: a packed side's strides in units of VEC
    words, VEC = 4 (16 bytes) where both strides allow it, so that the compiler knows its rows' alignment."""
    vec = 4 if fmt and buf.stride(0) % 4 == 0 and buf.stride(1) % 4 == 0 else 1
    return buf.stride(0) // vec, buf.stride(1) // vec, vec


def _launch(q, kbuf, vbuf, kfmt, vfmt, out, partials, slots_arg, base_arg, anc, stride_at, positions, kv_rows: int,
            n_splits: int, split_tiles: int, cfg: dict, scale: float, window: int, tree: bool, split: bool,
            resume: bool = False, ring: int = 0):
    """One `_attn_kernel` launch over K / V rows < kv_rows (kbuf / vbuf: what `_side` gives)."""
    T, H, D = q.shape
    Hk = kbuf.shape[1]
    kdt = q.dtype if kfmt else kbuf.dtype
    vdt = q.dtype if vfmt else vbuf.dtype
    upcast = _INTERPRET and (kdt != torch.float32 or vdt != torch.float32)
    po, pm, pl = partials
    ks0, ks1, kvec = _word_strides(kbuf, kfmt)
    vs0, vs1, vvec = _word_strides(vbuf, vfmt)
    _attn_kernel[(triton.cdiv(T * (H // Hk), cfg["BLOCK_M"]), Hk, n_splits)](
        q, kbuf, vbuf, out, po, pm, pl, slots_arg, base_arg, anc, positions if window else slots_arg,
        q.stride(0), q.stride(1), ks0, ks1, vs0, vs1,
        out.stride(0), out.stride(1), stride_at,
        T, H, kv_rows, n_splits, split_tiles, scale * _LOG2E, window, ring,
        G=H // Hk, D=D, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], TREE=tree, SPLIT=split, UPCAST=upcast,
        IEEE_K=kdt == torch.float32 or upcast, IEEE_V=vdt == torch.float32 or upcast, KFMT=kfmt, VFMT=vfmt,
        WINDOW=window > 0, KVEC=kvec, VVEC=vvec, RESUME=resume, RING=ring > 0, num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
        **launch_options(q.device, _attn_kernel))


def _reduce(partials, out, n_splits: int):
    po, pm, pl = partials
    _, T, H, D = po.shape
    bd = min(D, 64)
    _reduce_kernel[(T * H, D // bd)](
        po, pm, pl, out, T * H, H, n_splits, out.stride(0), out.stride(1),
        D=D, BLOCK_S=MAX_SPLITS, BLOCK_D=bd, num_warps=4,
        **launch_options(po.device, _reduce_kernel))   # one compile, any split


def rotate_groups(x: torch.Tensor, inverse: bool = False, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """`kvquant.rotate` (x's 128-value groups by tq3's R, or R^T) in one launch, written as out_dtype (x's dtype by
    default): the step's query before a tq3 K, its output after a tq3 V."""
    x = x.contiguous()
    y = torch.empty(x.shape, dtype=out_dtype or x.dtype, device=x.device)
    n_groups = x.numel() // TQ3_GROUP
    bg = 16
    programs = min(triton.cdiv(n_groups, bg), 2 * _limits(x.device)[0])
    _rotate_kernel[(programs,)](x, rotation_signs(x.device), y, n_groups, INVERSE=inverse, BLOCK_G=bg, num_warps=4,
                                **launch_options(x.device, _rotate_kernel))
    return y


def _partials(n_splits: int, T: int, H: int, D: int, device):
    """fp32 split partials: unnormalised output [n_splits, T, H, D], running max and sum [n_splits, T, H]."""
    return (torch.empty(n_splits, T, H, D, dtype=torch.float32, device=device),
            torch.empty(n_splits, T, H, dtype=torch.float32, device=device),
            torch.empty(n_splits, T, H, dtype=torch.float32, device=device))


def dequantize_rows(packed: PackedKV, row0: int, n_rows: int, out: torch.Tensor) -> torch.Tensor:
    """Rows row0 .. row0 + n_rows - 1 of a quantized cache decoded into out[:n_rows] ([>= n_rows, Hk, D], any float
    dtype; tq3 stays in the rotated domain, as the kernel computes it) by one Triton launch. Returns that view."""
    Hk, D = packed.shape[1], packed.head_dim
    if out.shape[0] < n_rows or tuple(out.shape[1:]) != (Hk, D) or out.stride(2) != 1:
        raise ValueError(f"out must be [>= {n_rows}, {Hk}, {D}] with a contiguous head dim, got {tuple(out.shape)}")
    src, fmt, _ = _side(packed, out)
    s0, s1, vec = _word_strides(src, fmt)
    bn = 64
    _dequant_kernel[(triton.cdiv(n_rows, bn), Hk)](
        src, out, row0, n_rows, s0, s1, out.stride(0), out.stride(1),
        FMT=fmt, BLOCK_N=bn, D=D, VEC=vec, num_warps=4)
    return out[:n_rows]


# A prefill chunk over a quantized cache decodes every visible row once per segment of SEGMENT_ROWS rows into a
# scratch in the query's dtype, then runs the dense kernel over it, each segment going on from the partials of the
# one before (RESUME). The quantized tiles decode the rows once per 128 queries instead. H100, 24 / 4 heads of 256,
# a 4,096-token chunk at 32K / 131K rows (benchmarks/bench_prefill_attention.py --segments 0,8192,32768,
# 2026-12-06), TFLOP/s with the quantized tiles -> segments of 8K / 16K / 32K rows: q8_0 101.9 -> 401.7 / 425.0 /
# 449.4 and 102.9 -> 385.2 / 399.2 / 417.1; q4_0 148.6 -> 351.0 / 378.6 / 394.3 and 150.1 -> 343.3 / 355.4 / 372.5;
# tq3 87.4 -> 358.4 / 410.8 / 420.3 and 89.3 -> 378.8 / 396.0 / 413.2 (bf16: 445.4, 447.0).
# Memory: the scratch (2 x SEGMENT_ROWS x Hk x D x 2 bytes: 128 MiB on the 27B) and fp32 partials of the chunk
# (max(T, PREFILL_SPLIT_ROWS) rows x H x (D + 2) x 4: 100 MiB at 4,096 tokens), counted by the memory plan.
SEGMENT_ROWS = 32768


def segment_rows_for(T: int, quantized: bool, tree: bool = False, window: int = 0) -> int:
    """The segment the engine's attention takes for a step of T tokens (0: the quantized tiles read the cache)."""
    if quantized and not tree and not window and T > PREFILL_MIN_T:
        return SEGMENT_ROWS
    return 0


def segment_scratch_bytes(T: int, S: int, H: int, Hk: int, D: int, act_bytes: int, quant_sides: int) -> int:
    """Device bytes the segmented path takes beyond the output for T queries over S rows with `quant_sides` of K / V
    quantized: the scratch of the decoded rows and the fp32 partials (0 where `segment_rows_for` picks none)."""
    if not segment_rows_for(T, quant_sides > 0):
        return 0
    rows = -(-min(SEGMENT_ROWS, S) // 64) * 64         # whole tiles (64: pick_config's largest BLOCK_N)
    return quant_sides * rows * Hk * D * act_bytes + max(T, PREFILL_SPLIT_ROWS) * H * (D + 2) * 4


def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float, kv_rows: int,
              slots: torch.Tensor | None = None, base: torch.Tensor | None = None,
              ancestors: torch.Tensor | None = None, n_splits: int | None = None,
              config: dict | None = None, positions: torch.Tensor | None = None, window: int = 0,
              segment_rows: int | None = None, ring: int = 0) -> torch.Tensor:
    """Triton attention of q [T, H, D] over cache rows < kv_rows. Sequential: `slots` [T] int64. Tree:
    `base` [1] int64 and `ancestors` [T, T] bool (any strides). Returns [T, H, D] in q's dtype.
    n_splits / config override the host heuristics (benchmarks, tests). window > 0: query t sees only cache
    rows > positions[t] - window (positions [T] int64; cache rows are positions, tree nodes are shallower than
    the window). segment_rows: over a quantized K or V, decode the rows into a dense scratch this many at a time
    (sequential steps without a window); None: `segment_rows_for`, 0: the quantized tiles. ring > 0: the caches
    are a sliding layer's ring of `ring` rows, position p at row p % ring (sequential steps with a window;
    kv_rows then counts positions, and no visible position may be older than the ring holds)."""
    if not HAVE_TRITON:
        raise RuntimeError("triton is not installed")
    if q.dim() != 3 or len(k_cache.shape) != 3 or tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError(f"q must be [T, H, D] and k/v caches [capacity, Hk, D]; got {tuple(q.shape)}, "
                         f"{tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    T, H, D = q.shape
    Hk = k_cache.shape[1]
    if not supports(q, k_cache, v_cache):
        kind = lambda c: c.fmt if isinstance(c, PackedKV) else c.dtype
        raise ValueError(f"unsupported attention shape/dtype: q {tuple(q.shape)} {q.dtype}, "
                         f"cache {tuple(k_cache.shape)} K {kind(k_cache)} V {kind(v_cache)}")
    k_tq3 = isinstance(k_cache, PackedKV) and k_cache.fmt == "tq3"
    v_tq3 = isinstance(v_cache, PackedKV) and v_cache.fmt == "tq3"
    kbuf, kfmt, kdt = _side(k_cache, q)
    vbuf, vfmt, vdt = _side(v_cache, q)
    if kbuf.stride(2) != 1 or vbuf.stride(2) != 1 or q.stride(2) != 1:
        raise ValueError("the head dim of q and of the caches must be contiguous")
    if k_tq3:           # <q, R^T c> = <R q, c>: rotate the query instead of every key
        q = rotate_groups(q)
    tree = ancestors is not None
    if ring:
        if ring != k_cache.shape[0] or not window or tree:
            raise ValueError(f"a ring of {ring} rows serves sequential steps with a window over a cache of as many "
                             f"rows; got a cache of {k_cache.shape[0]} rows, window {window}, tree {tree}")
        if kv_rows < 1:
            raise ValueError(f"kv_rows {kv_rows} must be at least 1")
    elif not 0 < kv_rows <= k_cache.shape[0]:
        raise ValueError(f"kv_rows {kv_rows} outside 1..{k_cache.shape[0]}")
    if tree:
        if base is None or slots is not None:
            raise ValueError("tree attention takes base and ancestors (and no slots)")
        if ancestors.shape != (T, T) or ancestors.stride(1) != 1:
            raise ValueError(f"ancestors must be [T, T] = [{T}, {T}] with contiguous rows, got "
                             f"{tuple(ancestors.shape)} strides {ancestors.stride()}")
        anc = ancestors.view(torch.uint8) if ancestors.dtype == torch.bool else ancestors
        slots_arg, base_arg, stride_at = base, base, anc.stride(0)        # SLOTS unused
    else:
        if slots is None or slots.shape != (T,):
            raise ValueError(f"sequential attention needs slots [T] = [{T}]")
        anc, slots_arg, base_arg, stride_at = slots, slots, slots, 0      # BASE / ANC unused
    if window:
        if positions is None or positions.shape != (T,):
            raise ValueError(f"a sliding window needs positions [T] = [{T}]")
    if n_splits is not None and not 1 <= n_splits <= MAX_SPLITS:      # the host's own picks stay inside it
        raise ValueError(f"n_splits must be in 1..{MAX_SPLITS}, got {n_splits}")
    G = H // Hk
    wide = torch.float32 in (q.dtype, kdt, vdt)
    invariant = (quant_kernels.BATCH_INVARIANT and T <= quant_kernels.SMALL_M and config is None
                 and n_splits is None)
    sm_count, shared = _limits(q.device)
    out_dtype = q.dtype
    # tq3 V: the kernel's output is in the rotated domain; keep it fp32 until it is rotated back
    out = torch.empty(T, H, D, dtype=torch.float32 if v_tq3 else q.dtype, device=q.device)
    if segment_rows is None:
        segment_rows = 0 if invariant else segment_rows_for(T, bool(kfmt or vfmt), tree, window)
    if segment_rows and (kfmt or vfmt):
        if tree or window:
            raise ValueError("segments of dense rows serve sequential steps without a window")
        _segmented(q, k_cache, v_cache, out, slots, kv_rows, segment_rows, n_splits, config, scale, wide, sm_count,
                   shared)
    else:
        cfg = dict(pick_config(1 if invariant else T, G, D, wide, (kfmt, vfmt), shared, tree, kv_rows),
                   **(config or {}))
        m_blocks = triton.cdiv(T * G, cfg["BLOCK_M"])
        split_tiles = 0
        if invariant:       # split size from the cache's capacity only: at most MAX_SPLITS splits of it
            rows = k_cache.shape[0] + (cfg["BLOCK_N"] if ring else 0)    # a ring's rows start at any tile edge
            span = max(INVARIANT_MIN_SPLIT_ROWS, _next_pow2(triton.cdiv(rows, MAX_SPLITS)))
            split_tiles = triton.cdiv(span, cfg["BLOCK_N"])
            n_splits = triton.cdiv(min(kv_rows, rows) if ring else kv_rows, split_tiles * cfg["BLOCK_N"])
        if n_splits is None:
            n_splits = pick_splits(T, D, m_blocks * Hk, min(kv_rows, ring or kv_rows), sm_count, tree)
        split = n_splits > 1 or invariant       # invariant: one merge path whether the rows make 1 split or more
        if ring and ring < cfg["BLOCK_N"]:
            raise ValueError(f"a ring of {ring} rows is shorter than a tile of {cfg['BLOCK_N']}")
        partials = _partials(n_splits, T, H, D, q.device) if split else (out, out, out)    # unused: out
        _launch(q, kbuf, vbuf, kfmt, vfmt, out, partials, slots_arg, base_arg, anc, stride_at, positions, kv_rows,
                n_splits, split_tiles, cfg, scale, window, tree, split, ring=ring)
        if split:
            _reduce(partials, out, n_splits)
    if v_tq3:           # sum_j p_j R^T c_j = R^T sum_j p_j c_j
        return rotate_groups(out, inverse=True, out_dtype=out_dtype)
    return out


def _segmented(q, k_cache, v_cache, out, slots, kv_rows: int, segment_rows: int, n_splits: int | None,
               config: dict | None, scale: float, wide: bool, sm_count: int, shared: int):
    """Sequential attention over cache rows < kv_rows, segment_rows at a time: each quantized side's rows of a
    segment decoded into a dense scratch (q's dtype), the dense kernel run over them from the partials the segment
    before left (online softmax across segments: the same sums as one pass, tile by tile)."""
    T, H, D = q.shape
    Hk = k_cache.shape[1]
    G = H // Hk
    cfg = dict(pick_config(T, G, D, wide, (0, 0), shared), **(config or {}))
    bn = cfg["BLOCK_N"]
    seg = -(-min(segment_rows, kv_rows) // bn) * bn        # whole tiles: a segment edge is a tile edge
    scratch = [torch.empty(seg, Hk, D, dtype=q.dtype, device=q.device) if isinstance(c, PackedKV) else None
               for c in (k_cache, v_cache)]
    if n_splits is None:
        n_splits = pick_splits(T, D, triton.cdiv(T * G, cfg["BLOCK_M"]) * Hk, min(seg, kv_rows), sm_count)
        n_splits = max(1, min(n_splits, PREFILL_SPLIT_ROWS // T))      # the plan counts max(T, 1024) rows
    partials = _partials(n_splits, T, H, D, q.device)
    for a in range(0, kv_rows, seg):
        b = min(a + seg, kv_rows)
        kv = [dequantize_rows(c, a, b - a, buf) if buf is not None else c[a:b]
              for c, buf in zip((k_cache, v_cache), scratch)]
        last = b == kv_rows
        split = n_splits > 1 or not last
        seg_slots = slots - a if a else slots
        _launch(q, kv[0], kv[1], 0, 0, out, partials, seg_slots, seg_slots, seg_slots, 0, None, b - a, n_splits, 0,
                cfg, scale, 0, False, split, resume=a > 0)
    if n_splits > 1:
        _reduce(partials, out, n_splits)
