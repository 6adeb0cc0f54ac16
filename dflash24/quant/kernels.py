"""Triton matmul on packed GGUF blocks: y[M, N] = x[M, K] @ W[N, K]^T, W dequantized in registers.

Layout of W: see `packed.py` (planar blocks: field f of word w of scale block b holds the code of
weight BS*b + WPB*f + w). Three paths, chosen by M (rows of x):
- GEMV (M = 1, decode; `gemv`): memory bound. A one-warp program owns BLOCK_N rows and streams G scale
  blocks per step as one [BLOCK_N, G, WPB] int32 tile (16-byte loads, cp.async pipelined). Every code is turned into a float
  with two integer ops and no int->float conversion: its bits go to the top of an fp32 mantissa,
  `f = 1 + code / 2^B`, exact. A block's weights are `w = A*f + B` (A, B per row and block), so
  `sum w*x = A * sum f*x + B * sum x`: one FMA per weight, and the scales are applied once per block.
- dot, small M (2..64, verification of a drafted block; `matmul`): the same tile, each field's
  weights `A*f + B` rounded to x.dtype and multiplied on tensor cores (tl.dot, M padded to 16/32/64),
  so every weight tile is read and decoded ONCE for all M rows. Split-K when N alone is short.
- large M (prefill, M > 64): W is dequantized a chunk of rows at a time into a small x.dtype scratch
  (same values as the dot path) and multiplied by cuBLAS (torch.matmul): the full weight is never
  materialised; the scratch stays in L2.
Split-K partials go to a (SPLIT, M, N) fp32 buffer summed by torch: deterministic, graph capturable.

Reference for every kernel: `reference_matmul` (dequantize with formats.dequantize + fp32 matmul).
"""
from __future__ import annotations

import os

import torch
from gguf import GGMLQuantizationType as QT

from .formats import dequantize
from .packed import GEOMETRY, PackedWeight

try:
    import triton
    import triton.language as tl
    HAVE_TRITON = True
except ImportError:  # CPU-only installs run the reference path
    triton = None
    tl = None
    HAVE_TRITON = False

# Under TRITON_INTERPRET=1 (CPU tests) bf16 tl.dot gives garbage in triton 3.9's interpreter.
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

# Kernel-side type codes (constexpr).
_CODE = {QT.Q8_0: 0, QT.Q4_0: 1, QT.Q5_0: 2, QT.Q4_K: 3, QT.Q5_K: 4, QT.Q6_K: 5}
SMALL_M = 64            # M above this: dequantize chunks + cuBLAS


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
        else:                               # Q6_K 6-bit: nibble -> 17..20, qh bits 2F..2F+1 -> 21..22
            bits = (_shift(words, 4 * F - 17) & 0x1E0000) | (_shift(hi, 2 * F - 21) & 0x600000) | 0x3F800000
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def _load_raw(qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, r, blk, wi, bm,
                  s_qs, s_qh, s_sc, s_d, QTYPE: tl.constexpr, WPB: tl.constexpr):
        """Words (and high bits) of rows r (BN,1,1) x blocks blk (1,G,1) x words wi (1,1,WPB), and the
        raw scale fields of each (row, block) as (BN, G) tiles; blocks with bm False read as 0."""
        words = tl.load(qs_ptr + r * s_qs + blk * WPB + wi, mask=bm, other=0)
        if QTYPE == 2 or QTYPE == 4 or QTYPE == 5:
            hi = tl.load(qh_ptr + r * s_qh + blk * WPB + wi, mask=bm, other=0).to(tl.int32)
        else:
            hi = words
        r = tl.reshape(r, (r.shape[0], 1))              # scales: 2-D (BN, G) tiles
        blk = tl.reshape(blk, (1, blk.shape[1]))
        bm = tl.reshape(bm, (1, bm.shape[1]))
        if QTYPE <= 2:      # one f16 scale per 32 weights
            d = tl.load(d_ptr + r * s_d + blk, mask=bm, other=0)
            dmin = d
            sc = d
            mn = d
        elif QTYPE == 3 or QTYPE == 4:
            d = tl.load(d_ptr + r * s_d + blk // 8, mask=bm, other=0)
            dmin = tl.load(dm_ptr + r * s_d + blk // 8, mask=bm, other=0)
            sc = tl.load(sc_ptr + r * s_sc + blk, mask=bm, other=0)
            mn = tl.load(mn_ptr + r * s_sc + blk, mask=bm, other=0)
        else:               # Q6_K: int8 scale per 16 weights, f16 d per 256
            d = tl.load(d_ptr + r * s_d + blk // 16, mask=bm, other=0)
            sc = tl.load(sc_ptr + r * s_sc + blk, mask=bm, other=0)
            dmin = d
            mn = sc
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
    def _load_tile(qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, r, blk, wi, bm,
                   s_qs, s_qh, s_sc, s_d, QTYPE: tl.constexpr, BS: tl.constexpr, WPB: tl.constexpr):
        """_load_raw + _affine: words, high bits, and A, B (BN, G)."""
        words, hi, d, dmin, sc, mn = _load_raw(qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, r, blk, wi, bm,
                                               s_qs, s_qh, s_sc, s_d, QTYPE, WPB)
        a, b = _affine(d, dmin, sc, mn, QTYPE)
        return words, hi, a, b

    @triton.jit
    def _gemv_step(x_ptr, words, hi, a, b, blk, wi, bm, acc,
                   QTYPE: tl.constexpr, BS: tl.constexpr, FPW: tl.constexpr, WPB: tl.constexpr):
        p = tl.zeros(words.shape, dtype=tl.float32)
        xs = tl.zeros((1, words.shape[1], WPB), dtype=tl.float32)
        for f in tl.static_range(FPW):
            xv = tl.load(x_ptr + blk * BS + f * WPB + wi, mask=bm, other=0).to(tl.float32)
            p += _field(words, hi, f, QTYPE) * xv
            xs += xv
        return acc + a * tl.sum(p, axis=2) + b * tl.sum(xs, axis=2)

    @triton.jit
    def _gemv_kernel(x_ptr, y_ptr, qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr,
                     N, NBLK, s_qs, s_qh, s_sc, s_d, blocks_per_split,
                     QTYPE: tl.constexpr, BS: tl.constexpr, FPW: tl.constexpr,
                     BLOCK_N: tl.constexpr, G: tl.constexpr, STAGES: tl.constexpr):
        """y[pid_k, n] = sum over this program's scale blocks of W[n, k] * x[k]  (fp32 partials)."""
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
        acc = tl.zeros((BLOCK_N, G), dtype=tl.float32)
        # tl.range with num_stages: the word / scale tiles of the next steps are copied to shared
        # memory asynchronously (cp.async) while this step computes.
        for bb in tl.range(b0, b1, G, num_stages=STAGES):
            blk = bb + gi
            bm = blk < b1
            words, hi, a, b = _load_tile(qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, r, blk, wi, bm,
                                         s_qs, s_qh, s_sc, s_d, QTYPE, BS, WPB)
            acc = _gemv_step(x_ptr, words, hi, a, b, blk, wi, bm, acc, QTYPE, BS, FPW, WPB)
        out = tl.sum(acc, axis=1)
        tl.store(y_ptr + pid_k.to(tl.int64) * N + rows, out, mask=row_ok)

    @triton.jit
    def _dot_kernel(x_ptr, y_ptr, qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr,
                    M, N, NBLK, s_xm, s_qs, s_qh, s_sc, s_d, blocks_per_split,
                    QTYPE: tl.constexpr, BS: tl.constexpr, FPW: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr, UPCAST: tl.constexpr):
        """y[pid_k, m, n] = partial x[m, :] . W[n, :] over this program's blocks, via tl.dot per field."""
        WPB: tl.constexpr = BS // FPW
        KF: tl.constexpr = G * WPB                     # K of one field's dot
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
        cb = c // WPB                                  # block of column c of a field's (BN, KF) tile
        cw = c % WPB
        xm = x_ptr + offs_m[:, None].to(tl.int64) * s_xm
        b0 = pid_k * blocks_per_split
        b1 = tl.minimum(b0 + blocks_per_split, NBLK)
        DT: tl.constexpr = x_ptr.dtype.element_ty
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for bb in range(b0, b1, G):
            blk = bb + gi
            bm = blk < b1
            words, hi, a, b = _load_tile(qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, r, blk, wi, bm,
                                         s_qs, s_qh, s_sc, s_d, QTYPE, BS, WPB)
            a3 = a[:, :, None]
            b3 = b[:, :, None]
            kb = bb + cb
            xmask = m_ok[:, None] & (kb < b1)[None, :]
            for f in tl.static_range(FPW):
                w = tl.reshape(_field(words, hi, f, QTYPE) * a3 + b3, (BLOCK_N, KF)).to(DT)
                xv = tl.load(xm + (kb * BS + f * WPB + cw)[None, :], mask=xmask, other=0)
                if UPCAST:   # the CPU interpreter computes bf16 tl.dot wrongly: same rounded values in fp32
                    xv = xv.to(tl.float32)
                    w = w.to(tl.float32)
                acc = tl.dot(xv, tl.trans(w), acc)
        y = y_ptr + (pid_k * M + offs_m[:, None]).to(tl.int64) * N + rows[None, :]
        tl.store(y, acc, mask=m_ok[:, None] & row_ok[None, :])

    @triton.jit
    def _dequant_kernel(out_ptr, qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr,
                        row0, N, NBLK, s_out, s_qs, s_qh, s_sc, s_d,
                        QTYPE: tl.constexpr, BS: tl.constexpr, FPW: tl.constexpr,
                        BLOCK_N: tl.constexpr, G: tl.constexpr):
        """out[n - row0, k] = W[n, k] in out's dtype (the values the dot path multiplies)."""
        WPB: tl.constexpr = BS // FPW
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        rows = row0 + pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        rows = tl.where(row_ok, rows, N - 1)
        r = rows[:, None, None].to(tl.int64)
        gi = tl.arange(0, G)[None, :, None]
        wi = tl.arange(0, WPB)[None, None, :]
        blk = pid_k * G + gi
        bm = blk < NBLK
        words, hi, a, b = _load_tile(qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, r, blk, wi, bm,
                                     s_qs, s_qh, s_sc, s_d, QTYPE, BS, WPB)
        o = out_ptr + (r - row0) * s_out + blk * BS + wi
        om = bm & row_ok[:, None, None]
        DT: tl.constexpr = out_ptr.dtype.element_ty
        a3 = a[:, :, None]
        b3 = b[:, :, None]
        for f in tl.static_range(FPW):
            tl.store(o + f * WPB, (_field(words, hi, f, QTYPE) * a3 + b3).to(DT), mask=om)


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


# Per type: (BLOCK_N, G, num_warps) of the GEMV; G blocks of BS weights per step.
# One warp per program: x's (1, G, WPB) tiles then share the weight tile's register layout (with more
# warps Triton spreads the small x tile differently and converts every product through shared memory).
# Measured on an H200 (benchmarks/tune_quant.py): 4 rows x 3 stages beat 2/8 rows and register prefetch.
_GEMV_TILE = {QT.Q8_0: (4, 16, 1), QT.Q4_0: (4, 32, 1), QT.Q5_0: (4, 32, 1), QT.Q4_K: (4, 32, 1),
              QT.Q5_K: (4, 32, 1), QT.Q6_K: (4, 64, 1)}
_GEMV_STAGES = 3
_GEMV_WAVES = 4


def gemv_config(p: PackedWeight, device) -> dict:
    """Heuristic launch config of the M=1 path (shape based; no autotuning at load)."""
    block_n, g, warps = _GEMV_TILE[p.qtype]
    bs, _ = GEOMETRY[p.qtype]
    nblk = p.k // bs
    g = min(g, triton.next_power_of_2(nblk)) if HAVE_TRITON else g
    n_prog = -(-p.n // block_n)
    split, per = _split(n_prog, nblk, g, _sms(device), waves=_GEMV_WAVES, min_steps=2)
    return dict(BLOCK_N=block_n, G=g, num_warps=warps, split=split, per=per, stages=_GEMV_STAGES)


_DOT_WAVES = 4


def dot_config(p: PackedWeight, m: int, device) -> dict:
    """Launch config of the tl.dot path for m rows (m <= SMALL_M; K split the same for every m, so
    each row's result does not depend on how many rows come with it)."""
    bs, fpw = GEOMETRY[p.qtype]
    block_m = 16 if m <= 16 else (32 if m <= 32 else 64)
    block_n, warps, stages = 64, 4, 2
    g = 256 // bs                                      # 256 weights per step: a field's dot has K = 32 (Q8_0: 64)
    nblk = p.k // bs
    n_prog = -(-p.n // block_n)
    split, per = _split(n_prog, nblk, g, _sms(device), waves=_DOT_WAVES, min_steps=2)
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, G=g, num_warps=warps, num_stages=stages,
                split=split, per=per)


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


def gemv(x: torch.Tensor, p: PackedWeight, cfg: dict | None = None) -> torch.Tensor:
    """x (K,) or (1, K) -> (1, N) fp32 (caller casts)."""
    if not HAVE_TRITON:
        raise RuntimeError("triton is not installed")
    x = x.reshape(-1)
    if x.numel() != p.k:
        raise ValueError(f"gemv: x has {x.numel()} values, weight has K={p.k}")
    x = x.contiguous()
    cfg = cfg or gemv_config(p, x.device)
    ptrs, strides = _args(p)
    bs, fpw = GEOMETRY[p.qtype]
    split = cfg["split"]
    y = torch.empty((split, 1, p.n), device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(p.n, cfg["BLOCK_N"]), split)
    _gemv_kernel[grid](x, y, *ptrs, p.n, p.k // bs, *strides, cfg["per"],
                       QTYPE=_CODE[p.qtype], BS=bs, FPW=fpw, BLOCK_N=cfg["BLOCK_N"], G=cfg["G"],
                       STAGES=cfg.get("stages", _GEMV_STAGES), num_warps=cfg["num_warps"])
    return y[0] if split == 1 else y.sum(0)


def _matmul_dot(x: torch.Tensor, p: PackedWeight, cfg: dict | None = None) -> torch.Tensor:
    m = x.shape[0]
    cfg = cfg or dot_config(p, m, x.device)
    ptrs, strides = _args(p)
    bs, fpw = GEOMETRY[p.qtype]
    split = cfg["split"]
    y = torch.empty((split, m, p.n), device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(m, cfg["BLOCK_M"]), triton.cdiv(p.n, cfg["BLOCK_N"]), split)
    _dot_kernel[grid](x, y, *ptrs, m, p.n, p.k // bs, x.stride(0), *strides, cfg["per"],
                      QTYPE=_CODE[p.qtype], BS=bs, FPW=fpw, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
                      G=cfg["G"], UPCAST=_INTERPRET and x.dtype != torch.float32,
                      num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return y[0] if split == 1 else y.sum(0)


def dequant_rows(p: PackedWeight, row0: int, row1: int, out: torch.Tensor) -> torch.Tensor:
    """out[: row1 - row0] = W[row0:row1] in out.dtype (out: (>= rows, K), unit stride in K)."""
    ptrs, strides = _args(p)
    bs, fpw = GEOMETRY[p.qtype]
    nblk = p.k // bs
    block_n, g = 16, max(1, 512 // bs)
    grid = (triton.cdiv(row1 - row0, block_n), triton.cdiv(nblk, g))
    _dequant_kernel[grid](out, *ptrs, row0, row1, nblk, out.stride(0), *strides,
                          QTYPE=_CODE[p.qtype], BS=bs, FPW=fpw, BLOCK_N=block_n, G=g, num_warps=4)
    return out


SCRATCH_BYTES = 24 << 20          # bf16 weight chunk of the large-M path (stays in the 50 MiB L2)


def _matmul_large(x: torch.Tensor, p: PackedWeight) -> torch.Tensor:
    """(M, K) -> (M, N) in x.dtype: dequantize a chunk of rows into scratch, cuBLAS, next chunk."""
    m = x.shape[0]
    chunk = max(256, SCRATCH_BYTES // (x.element_size() * p.k) // 256 * 256)
    chunk = min(chunk, p.n)
    w = torch.empty((chunk, p.k), device=x.device, dtype=x.dtype)
    y = torch.empty((m, p.n), device=x.device, dtype=x.dtype)
    for n0 in range(0, p.n, chunk):
        n1 = min(p.n, n0 + chunk)
        dequant_rows(p, n0, n1, w)
        torch.matmul(x, w[: n1 - n0].T, out=y[:, n0:n1])
    return y


def matmul(x: torch.Tensor, p: PackedWeight, cfg: dict | None = None) -> torch.Tensor:
    """x (M, K) -> (M, N): the tl.dot path for M <= SMALL_M (fp32 out), dequantized chunks + cuBLAS
    above (x.dtype out). A cfg forces the dot path."""
    if not HAVE_TRITON:
        raise RuntimeError("triton is not installed")
    if x.dim() != 2 or x.shape[1] != p.k:
        raise ValueError(f"matmul: x must be (M, {p.k}), got {tuple(x.shape)}")
    if x.stride(1) != 1:
        x = x.contiguous()
    if cfg is None and x.shape[0] > SMALL_M:
        return _matmul_large(x, p)
    return _matmul_dot(x, p, cfg)


def quant_matmul(x: torch.Tensor, p: PackedWeight) -> torch.Tensor:
    """x (M, K) -> (M, N) in x.dtype; the path is chosen by M (GEMV for M = 1, tl.dot otherwise)."""
    if x.shape[0] == 1:
        y = gemv(x, p)
    else:
        y = matmul(x, p)
    return y.to(x.dtype)
