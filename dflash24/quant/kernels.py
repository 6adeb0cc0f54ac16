"""Triton matmul on packed GGUF blocks: y[M, N] = x[M, K] @ W[N, K]^T, W dequantized in registers.

Layout of W: see `packed.py`. Three paths, chosen by M (rows of x):
- GEMV (M = 1, decode): memory bound. Each program owns BLOCK_N rows and streams a K range
  (split-K when N alone does not fill the GPU); products accumulate in fp32 registers with FMAs.
- dot, small M (2..64, verification of a drafted block): one M tile (BLOCK_M = 16/32/64, padded)
  so every weight tile is dequantized ONCE and used by all M rows through tl.dot (tensor cores).
- dot, large M (prefill): the same kernel with M tiles of 64/128 and wide N tiles; compute bound.

How a tile is decoded. A K tile of BLOCK_K weights is read as BLOCK_K/2 "byte columns" j. For the
nibble formats byte j gives two weights, k_lo(j) (low nibble) and k_hi(j) (high nibble), in GGUF's
run order (see packed.py); for Q8_0 the two halves of the tile play that role. So every format
decodes to two fp32 tiles (BLOCK_N, BLOCK_K/2) plus the two index vectors k_lo, k_hi, and x is
loaded at those same indices: the K order inside a tile is permuted identically on both operands,
so no in-register shuffle of the weights is needed. Split-K writes fp32 partial sums to a
(SPLIT_K, M, N) buffer that torch sums afterwards: deterministic, and capturable in a CUDA graph.

Reference for every kernel: `reference_matmul` (dequantize with formats.dequantize + fp32 matmul).
"""
from __future__ import annotations

import os

import torch
from gguf import GGMLQuantizationType as QT

from .formats import dequantize
from .packed import PackedWeight

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
# Byte columns per group with one constant scale (see _decode_tile); BLOCK_K/2 must be a multiple
# (and BLOCK_K a multiple of 128 for Q6_K's 128-weight runs).
_GROUP = {QT.Q8_0: 32, QT.Q4_0: 16, QT.Q5_0: 16, QT.Q4_K: 32, QT.Q5_K: 32, QT.Q6_K: 16}


def reference_matmul(x: torch.Tensor, raw: torch.Tensor, qtype, k: int) -> torch.Tensor:
    """The PyTorch reference of every kernel here: (M, K) x raw GGUF rows (N, row_bytes) -> (M, N) fp32."""
    w = dequantize(raw, qtype, k)                                             # (N, K) fp32
    return x.float() @ w.to(x.device).T


if HAVE_TRITON:

    @triton.jit
    def _decode_tile(qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr,
                     rows, k0, K, s_qs, s_qh, s_sc, s_d,
                     QTYPE: tl.constexpr, BLOCK_K: tl.constexpr, G: tl.constexpr):
        """Weights of rows `rows` (BLOCK_N,) and K tile [k0, k0 + BLOCK_K) as two fp32 tiles
        (BLOCK_N, R, G) with their K indices (1, R, G); weights past K are 0.

        The tile's BLOCK_K/2 byte columns are viewed as R groups of G columns over which every
        scale is constant, so scales are loaded once per (row, group), not once per weight.
        """
        HB: tl.constexpr = BLOCK_K // 2
        R: tl.constexpr = HB // G
        g = tl.arange(0, G)[None, None, :]                                   # (1, 1, G)
        t = tl.arange(0, R)[None, :, None]                                   # (1, R, 1)
        j = t * G + g                                                        # byte column (1, R, G)
        r = rows[:, None, None].to(tl.int64)      # int64 row offsets: vocab-sized tables pass 2^31 bytes
        if QTYPE == 0:   # Q8_0 (G = 32 = one block): weight k = d[k/32] * q[k]; halves of the tile
            k_lo = k0 + j
            k_hi = k0 + HB + j
            m_lo = k_lo < K
            m_hi = k_hi < K
            q_lo = tl.load(qs_ptr + r * s_qs + k_lo, mask=m_lo, other=0).to(tl.float32)
            q_hi = tl.load(qs_ptr + r * s_qs + k_hi, mask=m_hi, other=0).to(tl.float32)
            blk = (k0 // 32 + t)
            d_lo = tl.load(d_ptr + r * s_d + blk, mask=(k0 + t * 32) < K, other=0).to(tl.float32)
            d_hi = tl.load(d_ptr + r * s_d + blk + HB // 32, mask=(k0 + HB + t * 32) < K, other=0).to(tl.float32)
            w_lo = q_lo * d_lo
            w_hi = q_hi * d_hi
        elif QTYPE == 1 or QTYPE == 2:   # Q4_0 / Q5_0 (G = 16 bytes = one block of 32 weights)
            k_lo = k0 + t * 32 + g
            k_hi = k_lo + 16
            mk = k_lo < K
            mt = (k0 + t * 32) < K                                           # (1, R, 1)
            b = tl.load(qs_ptr + r * s_qs + (k0 // 2 + j), mask=mk, other=0).to(tl.int32)
            d = tl.load(d_ptr + r * s_d + (k0 // 32 + t), mask=mt, other=0).to(tl.float32)
            q_lo = b & 15
            q_hi = b >> 4
            if QTYPE == 1:
                q_lo = q_lo - 8
                q_hi = q_hi - 8
            else:
                h = tl.load(qh_ptr + r * s_qh + (k0 // 32 + t), mask=mt, other=0)   # (BN, R, 1) int32
                q_lo = (q_lo | (((h >> g) & 1) << 4)) - 16
                q_hi = (q_hi | (((h >> (g + 16)) & 1) << 4)) - 16
            w_lo = d * q_lo.to(tl.float32)
            w_hi = d * q_hi.to(tl.float32)
        elif QTYPE == 3 or QTYPE == 4:   # Q4_K / Q5_K (G = 32 bytes = one run of 64 weights)
            k_lo = k0 + t * 64 + g
            k_hi = k_lo + 32
            mk = k_lo < K
            kt = k0 + t * 64                                                 # (1, R, 1) run start
            mt = kt < K
            b = tl.load(qs_ptr + r * s_qs + (k0 // 2 + j), mask=mk, other=0).to(tl.int32)
            sb = kt // 256
            d = tl.load(d_ptr + r * s_d + sb, mask=mt, other=0).to(tl.float32)
            dmin = tl.load(dm_ptr + r * s_d + sb, mask=mt, other=0).to(tl.float32)
            sub = kt // 32                                                   # low nibbles: sub-block sub
            sc_lo = tl.load(sc_ptr + r * s_sc + sub, mask=mt, other=0).to(tl.float32)
            sc_hi = tl.load(sc_ptr + r * s_sc + sub + 1, mask=mt, other=0).to(tl.float32)
            mn_lo = tl.load(mn_ptr + r * s_sc + sub, mask=mt, other=0).to(tl.float32)
            mn_hi = tl.load(mn_ptr + r * s_sc + sub + 1, mask=mt, other=0).to(tl.float32)
            q_lo = b & 15
            q_hi = b >> 4
            if QTYPE == 4:
                # qh byte i of a super-block holds bit s of weight s*32 + i (s = sub-block in it)
                h = tl.load(qh_ptr + r * s_qh + (sb * 32 + g), mask=mk, other=0).to(tl.int32)
                q_lo = q_lo | (((h >> (sub % 8)) & 1) << 4)
                q_hi = q_hi | (((h >> (sub % 8 + 1)) & 1) << 4)
            w_lo = (d * sc_lo) * q_lo.to(tl.float32) - dmin * mn_lo
            w_hi = (d * sc_hi) * q_hi.to(tl.float32) - dmin * mn_hi
        else:   # Q6_K (G = 16: one int8 scale per 16 weights); ql runs of 128 weights = 64 bytes
            i = (t % 4) * 16 + g                                             # byte in its 64-byte run
            k_lo = k0 + (t // 4) * 128 + i
            k_hi = k_lo + 64
            mk = k_lo < K
            kt = k0 + (t // 4) * 128 + (t % 4) * 16                          # (1, R, 1) group start
            mt = kt < K
            b = tl.load(qs_ptr + r * s_qs + (k0 // 2 + j), mask=mk, other=0).to(tl.int32)
            # weight e of a super-block (h = e // 128, u = e % 128): qh byte h*32 + u%32, bits 2*(u//32)
            hidx = (kt // 256) * 64 + ((kt % 256) // 128) * 32 + i % 32
            h = tl.load(qh_ptr + r * s_qh + hidx, mask=mk, other=0).to(tl.int32)
            sh = ((t % 4) // 2) * 2                                          # (1, R, 1)
            q_lo = ((b & 15) | (((h >> sh) & 3) << 4)) - 32
            q_hi = ((b >> 4) | (((h >> (sh + 4)) & 3) << 4)) - 32
            d = tl.load(d_ptr + r * s_d + kt // 256, mask=mt, other=0).to(tl.float32)
            s_lo = tl.load(sc_ptr + r * s_sc + kt // 16, mask=mt, other=0).to(tl.float32)
            s_hi = tl.load(sc_ptr + r * s_sc + kt // 16 + 4, mask=mt, other=0).to(tl.float32)
            w_lo = (d * s_lo) * q_lo.to(tl.float32)
            w_hi = (d * s_hi) * q_hi.to(tl.float32)
        return w_lo, w_hi, k_lo, k_hi

    @triton.jit
    def _gemv_kernel(x_ptr, y_ptr, qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr,
                     N, K, s_qs, s_qh, s_sc, s_d, tiles_per_split,
                     QTYPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, G: tl.constexpr):
        """y[pid_k, n] = sum over this program's K tiles of W[n, k] * x[k]  (fp32 partials)."""
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        rows = tl.where(row_ok, rows, N - 1)          # clamped rows: loads need no row mask
        n_tiles = tl.cdiv(K, BLOCK_K)
        t0 = pid_k * tiles_per_split
        t1 = tl.minimum(t0 + tiles_per_split, n_tiles)
        acc = tl.zeros((BLOCK_N, BLOCK_K // 2 // G, G), dtype=tl.float32)
        for t in range(t0, t1):
            k0 = t * BLOCK_K
            w_lo, w_hi, k_lo, k_hi = _decode_tile(qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr,
                                                  rows, k0, K, s_qs, s_qh, s_sc, s_d, QTYPE, BLOCK_K, G)
            x_lo = tl.load(x_ptr + k_lo, mask=k_lo < K, other=0).to(tl.float32)      # (1, R, G)
            x_hi = tl.load(x_ptr + k_hi, mask=k_hi < K, other=0).to(tl.float32)
            acc += w_lo * x_lo + w_hi * x_hi
        out = tl.sum(tl.sum(acc, axis=2), axis=1)
        tl.store(y_ptr + pid_k.to(tl.int64) * N + rows, out, mask=row_ok)

    @triton.jit
    def _dot_kernel(x_ptr, y_ptr, qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr,
                    M, N, K, s_xm, s_qs, s_qh, s_sc, s_d, tiles_per_split,
                    QTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, G: tl.constexpr, UPCAST: tl.constexpr):
        """y[pid_k, m, n] = partial x[m, :] . W[n, :] over this program's K tiles, via tl.dot."""
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        pid_k = tl.program_id(2)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        m_ok = offs_m < M
        rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        rows = tl.where(row_ok, rows, N - 1)
        n_tiles = tl.cdiv(K, BLOCK_K)
        t0 = pid_k * tiles_per_split
        t1 = tl.minimum(t0 + tiles_per_split, n_tiles)
        DT: tl.constexpr = x_ptr.dtype.element_ty
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for t in range(t0, t1):
            k0 = t * BLOCK_K
            w3_lo, w3_hi, k3_lo, k3_hi = _decode_tile(qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr,
                                                      rows, k0, K, s_qs, s_qh, s_sc, s_d, QTYPE, BLOCK_K, G)
            # (BN, R, G) -> (BN, HB): row-major order kept, so columns still match k_lo / k_hi
            w_lo = tl.reshape(w3_lo, (BLOCK_N, BLOCK_K // 2))
            w_hi = tl.reshape(w3_hi, (BLOCK_N, BLOCK_K // 2))
            k_lo = tl.reshape(k3_lo, (BLOCK_K // 2,))
            k_hi = tl.reshape(k3_hi, (BLOCK_K // 2,))
            xm = x_ptr + offs_m[:, None] * s_xm
            x_lo = tl.load(xm + k_lo[None, :], mask=m_ok[:, None] & (k_lo < K)[None, :], other=0)
            x_hi = tl.load(xm + k_hi[None, :], mask=m_ok[:, None] & (k_hi < K)[None, :], other=0)
            # (BLOCK_M, HB) x (HB, BLOCK_N): weights cast to the activation dtype (fp32 -> tf32 on GPU)
            w_lo = w_lo.to(DT)
            w_hi = w_hi.to(DT)
            if UPCAST:   # the CPU interpreter computes bf16 tl.dot wrongly: same rounded values in fp32
                x_lo = x_lo.to(tl.float32)
                x_hi = x_hi.to(tl.float32)
                w_lo = w_lo.to(tl.float32)
                w_hi = w_hi.to(tl.float32)
            acc = tl.dot(x_lo, tl.trans(w_lo), acc)
            acc = tl.dot(x_hi, tl.trans(w_hi), acc)
        y = y_ptr + (pid_k * M + offs_m[:, None]).to(tl.int64) * N + rows[None, :]
        tl.store(y, acc, mask=m_ok[:, None] & row_ok[None, :])


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


def _split(n_programs: int, n_tiles: int, sms: int, waves: int, min_tiles: int) -> tuple[int, int]:
    """(split_k, tiles per split) so that about `waves` programs per SM exist when N alone is short."""
    want = waves * sms
    split = 1
    if n_programs < want:
        split = max(1, min(-(-want // n_programs), n_tiles // min_tiles))
    per = -(-n_tiles // split)
    split = -(-n_tiles // per)                       # no empty splits
    return split, per


def gemv_config(p: PackedWeight, device) -> dict:
    """Heuristic launch config of the M=1 path (shape based; no autotuning at load)."""
    if p.qtype in (QT.Q8_0, QT.Q6_K):
        block_n, block_k, warps = 8, 256, 4
    else:
        block_n, block_k, warps = 8, 512, 4
    n_prog = -(-p.n // block_n)
    n_tiles = -(-p.k // block_k)
    split, per = _split(n_prog, n_tiles, _sms(device), waves=8, min_tiles=4)
    return dict(BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, split=split, per=per)


def dot_config(p: PackedWeight, m: int, device) -> dict:
    """Launch config of the tl.dot path for m rows."""
    if m <= 64:
        block_m = 16 if m <= 16 else (32 if m <= 32 else 64)
        block_n, block_k, warps, stages = 32, 256, 4, 2
        waves = 4
    else:
        block_m = 64 if m <= 128 else 128
        block_n, block_k, warps, stages = 128, 128, 8, 2
        waves = 1
    n_prog = -(-m // block_m) * -(-p.n // block_n)
    n_tiles = -(-p.k // block_k)
    split, per = _split(n_prog, n_tiles, _sms(device), waves=waves, min_tiles=4)
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, num_stages=stages,
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
    split = cfg["split"]
    y = torch.empty((split, 1, p.n), device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(p.n, cfg["BLOCK_N"]), split)
    _gemv_kernel[grid](x, y, *ptrs, p.n, p.k, *strides, cfg["per"],
                       QTYPE=_CODE[p.qtype], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
                       G=_GROUP[p.qtype], num_warps=cfg["num_warps"])
    return y[0] if split == 1 else y.sum(0)


def matmul(x: torch.Tensor, p: PackedWeight, cfg: dict | None = None) -> torch.Tensor:
    """x (M, K) -> (M, N) fp32 with the tl.dot path (any M >= 1)."""
    if not HAVE_TRITON:
        raise RuntimeError("triton is not installed")
    if x.dim() != 2 or x.shape[1] != p.k:
        raise ValueError(f"matmul: x must be (M, {p.k}), got {tuple(x.shape)}")
    if x.stride(1) != 1:
        x = x.contiguous()
    m = x.shape[0]
    cfg = cfg or dot_config(p, m, x.device)
    ptrs, strides = _args(p)
    split = cfg["split"]
    y = torch.empty((split, m, p.n), device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(m, cfg["BLOCK_M"]), triton.cdiv(p.n, cfg["BLOCK_N"]), split)
    _dot_kernel[grid](x, y, *ptrs, m, p.n, p.k, x.stride(0), *strides, cfg["per"],
                      QTYPE=_CODE[p.qtype], BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
                      BLOCK_K=cfg["BLOCK_K"], G=_GROUP[p.qtype], UPCAST=_INTERPRET and x.dtype == torch.bfloat16,
                      num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return y[0] if split == 1 else y.sum(0)


def quant_matmul(x: torch.Tensor, p: PackedWeight) -> torch.Tensor:
    """x (M, K) -> (M, N) in x.dtype; the path is chosen by M (GEMV for M = 1, tl.dot otherwise)."""
    if x.shape[0] == 1:
        y = gemv(x, p)
    else:
        y = matmul(x, p)
    return y.to(x.dtype)
