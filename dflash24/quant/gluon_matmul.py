"""Small-M block matmul written in Gluon (Triton's explicit-layout dialect): y = x @ W^T for 2..MAX_ROWS rows of x and
W in Q4_K, Q5_K or Q6_K (the verify steps' matmuls of a Q4_K_M model), or Q4_0 / Q5_0 (a Q4_0 model's; the same
planar words as Q4_K / Q5_K, one fp16 scale per 32-block), or Q8_0 (a Q8_0 drafter's; `_decode8`).

Why a second kernel for what `kernels._dot_kernel` does: that kernel is bound by its own decode and dots, not by
memory (BENCHMARKS.md, part80 / part81), and Triton chooses where its weight words live (a cp.async ring in shared
memory, read back per MMA operand). Here every layout is written down, so each thread loads from global memory,
into registers, exactly the words its `mma.sync` B operand needs, one step ahead of their use, and decodes them in
place: no shared memory for the weights, no layout conversion that moves data between threads.

The words a thread owns. A 256-weight step of a row is 32 planar words (packed.py: field f of word w of scale
block b holds weight BS b + WPB f + w; Q4_K / Q5_K: BS 32, WPB 4; Q6_K: BS 16, WPB 2). Lane q = lane % 4 of a row
takes words 8q .. 8q + 7 (32 contiguous bytes, two 16-byte loads): the words of two 32-blocks (four 16-blocks), so
it computes the scales of those, not of all eight (sixteen). Word 8q + 4j + c, fields p and p + 4 (one bf16x2
pair, as in `_bf16_pairs`) are the B operand's K positions
    k = 128 j + 32 c + 16 (p // 2) + 8 (p % 2) + 2 q + h        (h = 0: field p, h = 1: field p + 4)
which is where `mma.sync.m16n8k16` wants lane q's two consecutive K values of rows n = lane // 4 (+ 8 per warp, +
32 per register repeat). K is permuted, so x is too (`gluon_order`: one order for the 32-blocks, one for Q6_K's
16-blocks); the norms write x in both (kernels.PairRows), and x reaches the MMA through a two-step cp.async ring in
shared memory and `ldmatrix`.

The values: the same bf16 weights as the dot kernel's PAIRS decode (128 + q from one lop3 with the code's high bits,
then two bf16x2 fma with the block's A / 2^bits and A + B rounded to bf16; Q4_0 / Q5_0: d and -8 d / -16 d; for
DENORM_TILES one fma of the code as a subnormal bf16), multiplied on tensor cores with fp32 accumulation; only the
order of the fp32 sums differs. Reference: `kernels.reference_matmul`; `reference_weights` decodes as the kernel
does, word for word.

A swapped orientation (decoded weights as the mma A operand, x rows as 8-column tiles) was written and measured on
2026-12-04 and was slower at 8 / 16 / 23 rows on the 27B shapes, see BENCHMARKS.md "Session of 2026-12-04 21:11
UTC" (gpu_pending.sh part105).

On Hopper (`WG`, WG_TILES): the same decode, but the weights are the A operand of the warpgroup MMA (wgmma) straight
from registers (`layouts` wg puts them where its fragment wants them, checked against Triton's own layout in the
tests), and x is its B operand, which the MMA reads from shared memory itself, once for the four warps; x gets
there by TMA, a two-step ring behind mbarriers. With mma.sync each warp reads all of x with ldmatrix and issues
BM / 16 x 32 MMAs a step for its 16 rows of W, so a tile's cost grows with its rows of x; the warpgroup MMA issues
16 a step whatever the rows (16 .. 64).

Gluon runs only compiled, on an NVIDIA GPU of compute capability 8.0 or more (no CPU interpreter): `available()`.
"""
from __future__ import annotations

import os

import torch
from gguf import GGMLQuantizationType as QT

from ..kernels.pdl import launch_options
from .packed import GEOMETRY, PackedWeight, _unplanar

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait      # what kernels/pdl.py's pdl_enter calls
    _barrier = getattr(gl, "thread_barrier", None) or gl.barrier     # renamed after triton 3.6
    # cp.async global -> shared: async_copy_global_to_shared up to triton 3.8, async_load from 3.9 (same arguments)
    _async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
    HAVE_GLUON = True
except ImportError:        # triton without Gluon (before 3.5), or no triton
    gluon = None
    gl = None
    HAVE_GLUON = False
try:                       # Hopper's warpgroup MMA and TMA (`WG`)
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared   # renamed as cp.async's
    X_TMA_L = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=3)
    HAVE_WGMMA = HAVE_GLUON
except ImportError:
    HAVE_WGMMA = False

STEP = 256                 # weights of K a step (one K-quant super-block)
TYPES = (QT.Q8_0, QT.Q4_0, QT.Q5_0, QT.Q4_K, QT.Q5_K, QT.Q6_K)
# Rows of x a launch (BLOCK_M 16, 32 or 64); kernels.matmul launches more as chunks (kernels.gluon_launches: 33..39
# rows still as two launches of up to 32, measured faster there). 64 verifies a tree of 39..63 nodes in one launch
# instead of two, each of which reads and decodes every weight (2026-12-05, H200: budget 48 28.77 -> 26.81 ms).
MAX_ROWS = 64
_BITS = {QT.Q4_0: 4, QT.Q5_0: 5, QT.Q4_K: 4, QT.Q5_K: 5, QT.Q6_K: 6}
_LEGACY = (QT.Q8_0, QT.Q4_0, QT.Q5_0)      # one fp16 d per 32-block, w = d q (q - 8, q - 16): no super-block
# How a tile's rows of x past M are read: 0 row M - 1 again, 1 not loaded (zero-filled), 2 row t % M again; None:
# `past_mode`'s choice by rows (2026-12-04, part100 / part101: a row read again by every row past M, 15 of them at 17
# rows, made a 17-node tree verify 0.7 ms longer than a 23-node one)
X_PAST_M: int | None = None


# The (type, tile height) whose codes the kernel decodes as subnormal bf16 (`_decode` DENORM: one bf16x2 fma a pair
# instead of two, the same bits). On an H100 (2026-12-06, `gpu_pending.sh part139`, the 27B's stacked shapes, us,
# two fmas -> one): Q5_K 10240x5120 at 16 rows 26.97 -> 26.11 (-> 22.20 capped at 128 registers: four programs an
# SM, NREG), at 23 rows 28.59 -> 26.63; Q6_K 5120x17408 42.10 -> 42.21 / 44.40 -> 40.09, the LM head 429.74 ->
# 426.39 / 478.05 -> 447.71; but Q4_K at 16 rows the same in sum (34816x5120 53.26 -> 55.09, 5120x17408 29.85 ->
# 28.64: 138 registers instead of 124, three programs an SM) and slower at 23 (66.72 -> 69.73). The loop's SASS (sm_90,
# a 16 x 64 tile, instructions a step): Q4_K 418 -> 348, Q5_K 645 -> 539, Q6_K 622 -> 508, yet the kernel is bound by
# latency and occupancy, not by issue. Q4_0 / Q5_0 at 16 rows (another H100, 2026-12-06 07:35, `part141`, issue #2's
# shapes 17408x5120, 5120x17408, 12288x5120, 248320x5120 at the table's tiles, us): Q4_0 25.72 / 26.50 / 19.19 /
# 308.72 -> 24.87 / 25.32 / 18.72 / 267.04, Q5_0 34.30 / 36.52 / 27.52 / 398.62 -> 32.66 / 34.75 / 25.85 / 392.48
# (their taller tiles not timed: two fmas).
# Since 2026-12-07 the 4-bit codes' fields 1 / 3 are read in place (`_decode`: one shift a word instead of three;
# Q4_K 16 x 64 loop 418 -> 333 instructions at 128 registers) and Q8_0 has a subnormal decode of its own (`_decode8`:
# one lop3 + one fma a pair instead of six ops; 16 x 32 loop 305 -> 197). On an H100 (2026-12-08 00:37,
# `gpu_pending.sh part202`, one process, two runs each, ms): the 27B's 16-token verify 9.830 / 9.856 -> 9.719 / 9.703
# and tree verify of 23 nodes 12.359 / 12.338 -> 11.976 / 12.054 with Q4_K's tiles of 16 and 32 rows (16 capped at
# 128 registers; uncapped the verify got slower, 10.04 / 10.02). Q4_K's 64-row tiles keep two fmas: not timed, and
# 178 registers instead of 168 would leave two programs an SM instead of three. Q8_0 (issue #2's shapes, us summed):
# 23 rows 616.6 -> 590.8, every shape faster; 16 rows 575.7 -> 588.9 (17408x5120 42.82 -> 47.19), so its 16-row
# tiles keep the six.
DENORM_TILES = ({(q, h) for q in (QT.Q5_K, QT.Q6_K) for h in (16, 32, 64)} | {(QT.Q4_K, 16), (QT.Q4_K, 32)}
                | {(QT.Q4_0, 16), (QT.Q5_0, 16), (QT.Q8_0, 32)})
# Register caps (maxnreg) by (type, tile height), from the same runs.
NREG = {(QT.Q5_K, 16): 128, (QT.Q4_K, 16): 128}
# The (type, tile height) that run on Hopper's warpgroup MMA (`WG`) on a GPU of compute capability 9.x (H100 /
# H200). With mma.sync every warp reads the whole x tile from shared memory (ldmatrix) for its own 16 rows of W, so a
# step's shared-memory reads grow with the tile's rows of x (16 rows x 64 rows of W: 32 KB a 256-weight step, 32
# rows: 64 KB, 64 rows: 128 KB, against about 14.5 bytes of weights a clock an SM brings in), as do the mma.sync
# instructions; the warpgroup MMA reads x from shared memory once for the four warps and issues one instruction
# per 16 weights of K whatever the rows. Not timed yet, so empty: DFLASH24_WGMMA=1 puts every type and height on
# it (`benchmarks/ab_steps.py` policy `wg`, `gpu_pending.sh part205`).
WG_TILES = ({(q, h) for q in TYPES for h in (16, 32, 64)} if os.environ.get("DFLASH24_WGMMA", "0") == "1"
            else set())
# (BLOCK_N, waves) of a WG tile by height: 64 rows of W (one warpgroup MMA's M) or 128. 128 rows take 251-255
# registers (one program an SM) and spill 7-33 ops at 32 / 64 rows of x (Q4_K / Q5_K / Q6_K, sm_90, Triton 3.6).
WG_TILE = {16: (64, 3), 32: (64, 3), 64: (64, 3)}
# Register caps of WG tiles by (type, height). Uncapped, the 16-row tiles of Q4_K / Q5_K / Q6_K / Q8_0 take 135-166
# registers (three programs an SM); Q4_K's, Q6_K's and Q8_0's fit 128 without a spill (four), Q5_K's spill 3 ops
# (sm_90, Triton 3.6, benchmarks/gluon_sass.py).
WG_NREG: dict = {}


def past_mode(m: int, block_m: int) -> int:
    """X_PAST_M's choice for m rows in a tile of block_m (part101, Q4_K 34816x5120, us): a full tile has no rows past
    M, so it compiles as the kernel did (0; wrapping forced on it cost a 16-token verify 0.14 ms); a 16-row tile
    zero-fills (9 rows: 45.99 zeros, 48.07 wrapped, 58.44 again); a 32-row tile wraps (17 / 23 rows: 65.92 / 66.77
    wrapped, 69.75 / 70.62 zeros, 72.50 / 69.20 again)."""
    if X_PAST_M is not None:
        return X_PAST_M
    return 0 if m >= block_m else 1 if block_m == 16 else 2


def gluon_order(x: torch.Tensor, qtype=QT.Q4_K) -> torch.Tensor:
    """x (M, K) in the kernel's K order for `qtype`: within each 256-column step, position 128 j + 32 c + 16 p1 +
    8 p0 + 2 q + h holds the column of field p + 4 h (p = 2 p1 + p0) of word 8 q + 4 j + c (module docstring):
    32-blocks (Q4_K, Q5_K): 32 (2 q + j) + 16 h + 8 p1 + 4 p0 + c; Q6_K's 16-blocks: 64 q + 32 j + 16 (c // 2) +
    8 h + 4 p1 + 2 p0 + c % 2."""
    m, k = x.shape
    if k % STEP:
        raise ValueError(f"gluon_order: K must be a multiple of {STEP}, got {k}")
    if GEOMETRY[QT(int(qtype))][0] == 32:
        # column dims (q, j, h, p1, p0, c) -> position dims (j, c, p1, p0, q, h)
        return x.reshape(m, k // STEP, 4, 2, 2, 2, 2, 4).permute(0, 1, 3, 7, 5, 6, 2, 4).reshape(m, k)
    # column dims (q, j, cb, h, p1, p0, cw) -> position dims (j, cb, cw, p1, p0, q, h), c = 2 cb + cw
    return x.reshape(m, k // STEP, 4, 2, 2, 2, 2, 2, 2).permute(0, 1, 3, 4, 8, 6, 7, 2, 5).reshape(m, k)


def _check(p: PackedWeight) -> None:
    if p.qtype not in TYPES or p.k % STEP:
        raise ValueError(f"gluon matmul: needs Q8_0, Q4_0, Q5_0, Q4_K, Q5_K or Q6_K with K % {STEP} == 0, got "
                         f"{p.qtype.name}, K={p.k}")


def _affine(p: PackedWeight, n: int, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(A / 2^bits, A + B) per scale block (n, steps, blocks) in fp32 then rounded to bf16, as the kernel makes them:
    w = A f + B with f = 1 + code / 2^bits (kernels._affine); so w = (A / 2^bits) code + (A + B)."""
    a = {k: v.cpu() for k, v in p.arrays.items()}
    if p.qtype in _LEGACY:      # A / 2^bits = d, A + B = -2^(bits - 1) d (Q8_0: signed codes, A + B unused)
        d = a["d"].reshape(n, steps, 8).float()
        off = -float(2 ** (_BITS[p.qtype] - 1)) if p.qtype != QT.Q8_0 else 0.0
        return d.to(torch.bfloat16).float(), (d * off).to(torch.bfloat16).float()
    d = a["d"].reshape(n, steps).float()[:, :, None]
    if p.qtype == QT.Q6_K:
        ds = d * a["sc"].reshape(n, steps, 16).float()
        aa, bb = ds * 64.0, ds * -96.0
    else:
        aa = d * a["sc"].reshape(n, steps, 8).float() * (16.0 if p.qtype == QT.Q4_K else 32.0)
        bb = -(aa + a["dmin"].reshape(n, steps).float()[:, :, None] * a["mn"].reshape(n, steps, 8).float())
    inv = 2.0 ** -_BITS[p.qtype]
    return (aa * inv).to(torch.bfloat16).float(), (aa + bb).to(torch.bfloat16).float()


def reference_weights(p: PackedWeight) -> torch.Tensor:
    """PyTorch reference of what the kernel decodes: W (N, K) fp32 in the kernel's K order, each weight found where
    the kernel finds it (word 8 q + 4 j + c of a step, fields p and p + 4, the high bits and scales of that word's
    block) and rounded to bf16 as its bf16x2 fma rounds it. Equals gluon_order of the bf16 weights in natural order
    (`natural_weights`): the test of the index algebra the kernel's layouts encode."""
    _check(p)
    a = {k: v.cpu() for k, v in p.arrays.items()}
    n, steps = p.n, p.k // STEP
    if p.qtype == QT.Q8_0:      # word 16 q + 8 j + 4 p0 + c, bytes p1 (h = 0) and p1 + 2 (h = 1), block 2 q + j
        words = a["qs"].reshape(n, steps, 4, 2, 2, 4)                              # (n, s, q, j, p0, c)
        f = (torch.arange(2).view(2, 1) + 2 * torch.arange(2).view(1, 2))           # (p1, h) -> byte p1 + 2 h
        codes = ((words[..., None, None].to(torch.int64) >> (8 * f)) & 0xFF)        # (n, s, q, j, p0, c, p1, h)
        codes = (codes ^ 0x80) - 0x80                                                 # int8
        ap, _ = _affine(p, n, steps)
        w = (codes.float() * ap.reshape(n, steps, 4, 2)[:, :, :, :, None, None, None, None]).to(torch.bfloat16)
        # -> K position 128 j + 32 c + 16 p1 + 8 p0 + 2 q + h of each step
        return w.float().permute(0, 1, 3, 5, 6, 4, 2, 7).reshape(n, p.k)
    words = a["qs"].reshape(n, steps, 4, 2, 4).to(torch.int64) & 0xFFFFFFFF        # (n, s, q, j, c)
    f = (torch.arange(2).view(2, 1, 1) * 2 + torch.arange(2).view(1, 2, 1) + 4 * torch.arange(2).view(1, 1, 2))
    codes = (words[..., None, None, None] >> (4 * f)) & 0xF                        # (n, s, q, j, c, p1, p0, h)
    c = torch.arange(4).view(4, 1, 1, 1)
    if p.qtype in (QT.Q5_0, QT.Q5_K):      # byte 8 q + 4 j + c of qh, bit f: field f's 5th bit
        hb = a["qh"].reshape(n, steps, 4, 2, 4).to(torch.int64)
        codes = codes | (((hb[..., None, None, None] >> f) & 1) << 4)
    elif p.qtype == QT.Q6_K:    # 16-block 4 q + 2 j + c // 2's int32 >> 2 (c % 2): field f at 8 (f // 2) + 4 (f % 2)
        hb = a["qh"].reshape(n, steps, 4, 2, 2).to(torch.int64) & 0xFFFFFFFF
        hb = hb[:, :, :, :, c.view(4) // 2] >> (2 * (c.view(4) % 2))                 # (n, s, q, j, c)
        codes = codes | (((hb[..., None, None, None] >> (8 * (f // 2) + 4 * (f % 2))) & 3) << 4)
    ap, bp = _affine(p, n, steps)
    if p.qtype == QT.Q6_K:      # blocks 4 q + 2 j + c // 2
        blk = lambda t: t.reshape(n, steps, 4, 2, 2)[:, :, :, :, c.view(4) // 2]    # noqa: E731
    else:                       # blocks 2 q + j, for every c
        blk = lambda t: t.reshape(n, steps, 4, 2, 1)                                 # noqa: E731
    w = (codes.float() * blk(ap)[..., None, None, None] + blk(bp)[..., None, None, None]).to(torch.bfloat16).float()
    # (n, s, q, j, c, p1, p0, h) -> K position 128 j + 32 c + 16 p1 + 8 p0 + 2 q + h of each step
    return w.permute(0, 1, 3, 4, 5, 6, 2, 7).reshape(n, p.k)


def natural_weights(p: PackedWeight) -> torch.Tensor:
    """The bf16 weights the kernel (and the dot kernel's PAIRS decode) multiplies, in natural K order: code * A /
    2^bits + (A + B), the two bf16-rounded, rounded once to bf16 (packed._unplanar gives the codes)."""
    _check(p)
    n, steps = p.n, p.k // STEP
    codes = _unplanar(p.to("cpu"), 0, n)
    codes = codes.view(torch.int8).float() if p.qtype == QT.Q8_0 else codes.float()
    ap, bp = _affine(p, n, steps)
    bs = GEOMETRY[p.qtype][0]
    return (codes * ap.reshape(n, -1).repeat_interleave(bs, 1) + bp.reshape(n, -1).repeat_interleave(bs, 1)
            ).to(torch.bfloat16).float()


_CAPABLE: dict = {}


def available(device: torch.device) -> bool:
    """Whether the kernel can run on `device`: Gluon importable, an NVIDIA GPU (not ROCm, which torch also calls
    "cuda") of compute capability 8.0+."""
    if not HAVE_GLUON or device.type != "cuda" or torch.version.hip is not None:
        return False
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _CAPABLE:
        _CAPABLE[key] = torch.cuda.get_device_capability(key)[0] >= 8
    return _CAPABLE[key]


def _log2(v: int) -> int:
    if v <= 0 or v & (v - 1):
        raise ValueError(f"expected a power of two, got {v}")
    return v.bit_length() - 1


def _index_layout(parent, dim: int):
    """The 1-D layout of an index along `dim` of `parent` that expand_dims over every other dim (lowest first)
    turns back into `parent`: the other dims sliced away, highest first."""
    lay = parent
    for d in reversed(range(parent.rank)):
        if d != dim:
            lay = gl.SliceLayout(d, lay)
    return lay


def layouts(block_m: int, block_n: int, wg: bool = False) -> dict:
    """The kernel's layouts for 4 warps (constexpr arguments). DEC: the decoded weights (BN, 4 q, 4 c, 2 p1, 2 p0,
    2 h), rows n = lane // 4 + 8 warp + 32 repeat, q = lane % 4, registers h, p0, p1, c (so that permuted to
    (n, c, p1, p0, q, h) and flattened it is the mma B operand's register order); WORD: its words (BN, 4, 4);
    WLOAD: the words as loaded (WORD, or with wg its registers reordered for 16-byte loads);
    WORD8: Q8_0's words (BN, 4 q, 2 p0, 4 c), the 8 of a half step's block contiguous in a thread's registers;
    SCALE: per (row, q) (BN, 4); P1 / P0: the pair index dims; XCOPY: the x step tile (BM, 256) for cp.async;
    XSMEM: its shared-memory ring; MMA: the accumulator.
    wg (`WG`, Hopper's warpgroup MMA): the weights are the A operand, from registers, rows n = lane // 4 + 8 r +
    16 warp + 64 repeat (each warp 16 rows, the m16 x k16 fragment); x is the B operand, read by the MMA from shared
    memory in the NVMMA 128-byte swizzle (XSMEM, (BM, 256) a step; TMA writes it as X_TMA_L's (4, BM, 64) box,
    the same bytes); the accumulator is (BN, BM), rows of W by rows of x. BLOCK_N 64 or 128."""
    if block_m not in (16, 32, 64) or block_n not in ((64, 128) if wg else (32, 64, 128, 256)):
        raise ValueError(f"gluon matmul tile: BLOCK_M 16, 32 or 64 and BLOCK_N {'64 or 128' if wg else '32..256'}, "
                         f"got {block_m}, {block_n}")
    z = [0] * 5

    def at(d, v):
        b = list(z) + [0]
        b[d] = v
        return b
    if wg:
        row_regs = [at(0, 8)], [at(0, 64 << i) for i in range(_log2(block_n // 64))]
        row_warps = [at(0, 16), at(0, 32)]
    else:
        row_regs = [], [at(0, 32 << i) for i in range(_log2(block_n // 32))]
        row_warps = [at(0, 8), at(0, 16)]
    dec = gl.DistributedLinearLayout(
        reg_bases=[at(5, 1)] + row_regs[0] + [at(4, 1), at(3, 1), at(2, 1), at(2, 2)] + row_regs[1],
        lane_bases=[at(1, 1), at(1, 2), at(0, 1), at(0, 2), at(0, 4)],
        warp_bases=row_warps, block_bases=[], shape=[block_n, 4, 4, 2, 2, 2])
    word = gl.SliceLayout(3, gl.SliceLayout(4, gl.SliceLayout(5, dec)))
    z4 = [0] * 4

    def at4(d, v):
        b = list(z4)
        b[d] = v
        return b

    def rows4(bases):
        return [at4(0, b[0]) for b in bases]
    word8 = gl.DistributedLinearLayout(
        reg_bases=[at4(3, 1), at4(3, 2), at4(2, 1)] + rows4(row_regs[0] + row_regs[1]),
        lane_bases=[at4(1, 1), at4(1, 2), at4(0, 1), at4(0, 2), at4(0, 4)],
        warp_bases=rows4(row_warps), block_bases=[], shape=[block_n, 4, 2, 4])
    word_load = word
    if wg:      # a row's 4 words of a half step as one 16-byte load: c first in a thread's registers, then n + 8
        word_load = gl.DistributedLinearLayout(
            reg_bases=[[0, 0, 1], [0, 0, 2]] + [[b[0], 0, 0] for b in row_regs[0] + row_regs[1]],
            lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
            warp_bases=[[b[0], 0, 0] for b in row_warps], block_bases=[], shape=[block_n, 4, 4])
        x_smem = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        mma = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, block_m, 16])
    else:
        x_smem = gl.SwizzledSharedLayout(8, 1, 8, [1, 0])
        mma = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 4], instr_shape=[16, 8])
    return dict(DEC_L=dec, WORD_L=word, WLOAD_L=word_load, WORD8_L=word8, SCALE_L=gl.SliceLayout(2, word),
                P1_L=_index_layout(dec, 3), P0_L=_index_layout(dec, 4),
                XCOPY_L=gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0]), XSMEM_L=x_smem, MMA_L=mma)


if HAVE_GLUON:

    @gluon.jit
    def _e6(v, d0: gl.constexpr, d1: gl.constexpr, d2: gl.constexpr, d3: gl.constexpr, d4: gl.constexpr):
        """expand_dims of a 1-D index over five dims, lowest first (the inverse of _index_layout)."""
        return gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(v, d0), d1), d2), d3), d4)

    @gluon.jit
    def _e3(v):
        """(BN, 4, 4) -> (BN, 4, 4, 1, 1, 1) of the decode layout."""
        return gl.expand_dims(gl.expand_dims(gl.expand_dims(v, 3), 4), 5)

    @gluon.jit
    def _pack_bf16(v):
        """fp32 v rounded to bf16, twice in one int32 (a bf16x2 operand)."""
        b = v.to(gl.bfloat16).to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
        return b | (b << 16)

    @gluon.jit
    def _pair_scales(a, INV: gl.constexpr, ab, DENORM: gl.constexpr):
        """`_decode`'s scales as bf16x2 int32: A / 2^bits = a INV, the same / 16 (DENORM's fields read in place at bits
        4-7, `_decode`) and A + B = ab, from fp32; with DENORM times 2^100, 2^96 and 2^-33 (exact: powers of two) for
        its subnormal codes."""
        if DENORM:
            return (_pack_bf16(a * (INV * 1.2676506002282294e30)), _pack_bf16(a * (INV * 7.922816251426434e28)),
                    _pack_bf16(ab * 1.1641532182693481e-10))
        return _pack_bf16(a * INV), _pack_bf16(a * (INV * 0.0625)), _pack_bf16(ab)

    @gluon.jit
    def _scales(sw, mw, d, dm, J: gl.constexpr, QTYPE: gl.constexpr, c3, DENORM: gl.constexpr):
        """(A / 2^bits, A / 2^(bits + 4), A + B) of each word's block for half step J as bf16x2 int32 (`_pair_scales`):
        (BN, 4, 1) for the 32-block types (one block per (row, q): 2 q + J; sw / mw the int32 of the int16 holding the
        step's 6-bit scales / mins of blocks 2 q, 2 q + 1; Q8_0 / Q4_0 / Q5_0: sw the int32 holding the fp16 d of
        blocks 2 q, 2 q + 1; Q8_0's B = -128 d serves its DENORM decode only), (BN, 4, 4) for Q6_K (blocks 4 q + 2 J +
        c // 2; sw the int32 holding the int8 scales of blocks 4 q .. 4 q + 3). d, dm: (BN, 1) fp32. Same fp32
        arithmetic as kernels._affine."""
        if QTYPE <= 2:                          # d of block 2 q + J; w = d q - 2^(bits-1) d (Q8_0: d q)
            dj = ((sw >> (16 * J)) & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
            if QTYPE == 0:                      # DENORM's Q8_0 codes are byte + 128 (`_decode8`)
                bq = dj * -128.0
            elif QTYPE == 1:
                bq = dj * -8.0
            else:
                bq = dj * -16.0
            ap, ap16, bp = _pair_scales(gl.expand_dims(dj, 2), 1.0, gl.expand_dims(bq, 2), DENORM)
        elif QTYPE == 5:
            lo = (sw << (24 - 16 * J)) >> 24                       # int8 scale of block 4 q + 2 J (sign kept)
            hi = (sw << (16 - 16 * J)) >> 24                       # ... and of 4 q + 2 J + 1
            sc = gl.where(c3 < 2, gl.expand_dims(lo, 2), gl.expand_dims(hi, 2))
            ds = gl.expand_dims(d, 2) * sc.to(gl.float32)
            a = ds * 64.0
            ap, ap16, bp = _pair_scales(a, 0.015625, a + ds * -96.0, DENORM)
        else:
            sc = ((sw >> (8 * J)) & 0xFF).to(gl.float32)
            mn = ((mw >> (8 * J)) & 0xFF).to(gl.float32)
            if QTYPE == 3:
                a = gl.expand_dims(d * sc * 16.0, 2)
                ap, ap16, bp = _pair_scales(a, 0.0625, a + -(a + gl.expand_dims(dm * mn, 2)), DENORM)
            else:
                a = gl.expand_dims(d * sc * 32.0, 2)
                ap, ap16, bp = _pair_scales(a, 0.03125, a + -(a + gl.expand_dims(dm * mn, 2)), DENORM)
        return ap, ap16, bp

    @gluon.jit
    def _high_bits(hw, c3, QTYPE: gl.constexpr):
        """Each word's high code bits (BN, 4, 4) int32, placed for _decode. Q5_K: hw the int32 of the half step's 4
        qh bytes (byte c: word c, bit f: field f's 5th bit); field f < 4 goes to bit 4 + f, field f + 4 to bit
        20 + f, so that >> p puts fields p and p + 4 at bits 4 and 20. Q6_K: hw the int64 of the half step's two
        16-blocks' int32, the word's >> 2 (c % 2) (field f at 8 (f // 2) + 4 (f % 2), packed._q6k_shift). Q5_0: as
        Q5_K (the same qh layout)."""
        if QTYPE == 4 or QTYPE == 2:
            b = gl.expand_dims(hw, 2) >> (8 * c3)
            return ((b << 4) & 0xF0) | ((b << 16) & 0xF00000)
        else:
            lo = (hw & 0xFFFFFFFF).to(gl.int32)
            hi = (hw >> 32).to(gl.int32)
            return gl.where(c3 < 2, gl.expand_dims(lo, 2), gl.expand_dims(hi, 2)) >> (2 * (c3 % 2))

    @gluon.jit
    def _decode(words, hb, ap, ap16, bp, QTYPE: gl.constexpr, DEC_L: gl.constexpr, P1_L: gl.constexpr,
                P0_L: gl.constexpr, DENORM: gl.constexpr):
        """The half step's weights as the (BN, 4, 4, 2, 2, 2) bf16 tile of DEC_L: word (n, q, c), fields p = 2 p1 +
        p0 (h = 0) and p + 4 (h = 1), each A q + B of its block like `_bf16_pairs` PAIRS 3 (128 + q from one lop3
        of the nibbles with the high bits and 0x4300, q = (128 + q) * 1 - 128, A q + B; bf16x2, one asm a pair:
        pack 2 over h, which DEC_L keeps in neighbouring registers). hb: _high_bits (unused for Q4_K); ap, ap16, bp:
        _scales. Q4_0 / Q5_0 as Q4_K / Q5_K.
        DENORM: the code's bits alone (no 0x4300) are the subnormal bf16 q 2^-133, exact, so one fma of it with
        (A / 2^bits) 2^100 and (A + B) 2^-33 makes the same bf16 weight times 2^-33 (the product is exact, the one
        rounding commutes with the power of two): one bf16x2 op a pair instead of two. The kernel's sums are
        multiplied by 2^33 before the store. (bf16 fma keeps subnormal inputs: PTX has no .ftz for bf16x2.)
        DENORM with 4-bit codes (Q4_K, Q4_0): a half-word's bits b < 256 are the bf16 b 2^-133 (the subnormals and
        the first normal binade share one step), so a code masked in place at bits 4-7 is 16 q 2^-133: fields p = 1,
        3 are read without a shift, with ap16 = ap / 16 (exact). One shift a word (by 8, for fields 2, 3) instead of
        three; the products, so the bits, are those of the shifted codes."""
        p1 = _e6(gl.arange(0, 2, layout=P1_L), 0, 1, 2, 4, 5)
        p0 = _e6(gl.arange(0, 2, layout=P0_L), 0, 1, 2, 3, 5)
        pp = 2 * p1 + p0
        IN_PLACE: gl.constexpr = DENORM and (QTYPE == 1 or QTYPE == 3)
        if IN_PLACE:
            s = _e3(words) >> (8 * p1)
            mask = 0x000F000F << (4 * p0)
        else:
            s = _e3(words) >> (4 * pp)
            mask = 0x000F000F + 0 * p0          # the same mask, as a tensor: the asm takes it as an operand
        if DENORM:
            magic = gl.full([words.shape[0], 4, 4, 2, 2, 2], 0, gl.int32, DEC_L)
        else:
            magic = gl.full([words.shape[0], 4, 4, 2, 2, 2], 0x43004300, gl.int32, DEC_L)
        if QTYPE == 4 or QTYPE == 2:      # 5th bits of fields p, p + 4 (at 4 + p, 20 + p) -> bits 4, 20
            h = ((_e3(hb) >> pp) & 0x00100010) | magic
        elif QTYPE == 5:    # 2 high bits of fields p, p + 4 (at 4 p, 4 p + 16) -> bits 4-5, 20-21
            h6 = _e3(hb)
            h = (gl.where(pp == 0, h6 << 4, h6 >> gl.maximum(4 * pp - 4, 0)) & 0x00300030) | magic
        else:
            h = magic
        s, h = gl.broadcast(s, h)
        mask, _ = gl.broadcast(mask, h)
        ap = _e3(ap)
        if IN_PLACE:                        # fields 1, 3 (p0 = 1) in place: their scale / 16
            ap = gl.where(p0 == 0, ap, _e3(ap16))
        ap, _ = gl.broadcast(ap, h)
        bp, _ = gl.broadcast(_e3(bp), h)
        if DENORM:
            return gl.inline_asm_elementwise(
                "{ .reg .b32 t; lop3.b32 t, $1, $5, $3, 0xEA; fma.rn.bf16x2 $0, t, $7, $9; }",
                "=r,r,r,r,r,r,r,r,r,r,r", [s, h, mask, ap, bp], dtype=gl.bfloat16, is_pure=True, pack=2)
        return gl.inline_asm_elementwise(
            "{ .reg .b32 t, one, m128, q; lop3.b32 t, $1, $5, $3, 0xEA; "
            "mov.b32 one, 0x3F803F80; mov.b32 m128, 0xC300C300; "
            "fma.rn.bf16x2 q, t, one, m128; fma.rn.bf16x2 $0, q, $7, $9; }",
            "=r,r,r,r,r,r,r,r,r,r,r", [s, h, mask, ap, bp], dtype=gl.bfloat16, is_pure=True, pack=2)

    @gluon.jit
    def _decode8(words, ap, bp, DEC_L: gl.constexpr, P1_L: gl.constexpr, DENORM: gl.constexpr):
        """Q8_0's half step as the (BN, 4, 4, 2, 2, 2) bf16 tile of DEC_L. words: (BN, 4 q, 2 p0, 4 c) of WORD8_L,
        word 16 q + 8 J + 4 p0 + c of the step (block 2 q + J), whose bytes p1 (h = 0) and p1 + 2 (h = 1) are the
        pair (K position 128 J + 32 c + 16 p1 + 8 p0 + 2 q + h: the 32-blocks' gluon_order). Per pair, exactly: the
        low nibbles b as bf16 128 + b and the high nibbles a as 128 + (a ^ 8) (one lop3 each: mask, then or / xor
        0x4300 with bit 3), v = 16 (128 + (a ^ 8)) - 2304 = 16 (a ^ 8) - 256, code = v + (128 + b), each exact in
        bf16 (|code| <= 128); then d * code rounded once. ap: _scales' d (bf16x2).
        DENORM: the byte xor 0x80 (code + 128, 0..255) alone in its half-word is the bf16 (code + 128) 2^-133 (the
        subnormals and the first normal binade share one step), so one lop3 and one fma with d 2^100 and -128 d 2^-33
        (ap, bp) make the same bf16 weight times 2^-33 (`_decode`'s DENORM; the kernel's sums are multiplied by
        2^33)."""
        w = gl.convert_layout(gl.permute(words, [0, 1, 3, 2]), gl.SliceLayout(3, gl.SliceLayout(5, DEC_L)))
        p1 = _e6(gl.arange(0, 2, layout=P1_L), 0, 1, 2, 4, 5)
        s = gl.expand_dims(gl.expand_dims(w, 3), 5) >> (8 * p1)
        zero = gl.full([words.shape[0], 4, 4, 2, 2, 2], 0, gl.int32, DEC_L)
        s, zero = gl.broadcast(s, zero)
        ap, _ = gl.broadcast(_e3(ap), zero)
        if DENORM:
            bp, _ = gl.broadcast(_e3(bp), zero)
            return gl.inline_asm_elementwise(
                "{ .reg .b32 t; lop3.b32 t, $1, 0x00FF00FF, 0x00800080, 0x6A; fma.rn.bf16x2 $0, t, $3, $5; }",
                "=r,r,r,r,r,r,r", [s, ap, bp], dtype=gl.bfloat16, is_pure=True, pack=2)
        return gl.inline_asm_elementwise(
            "{ .reg .b32 tb, sa, ta, v, q, c16, cm, one, mz; "
            "lop3.b32 tb, $1, 0x000F000F, 0x43004300, 0xEA; shr.b32 sa, $1, 4; "
            "lop3.b32 ta, sa, 0x000F000F, 0x43084308, 0x6A; "
            "mov.b32 c16, 0x41804180; mov.b32 cm, 0xC510C510; mov.b32 one, 0x3F803F80; mov.b32 mz, 0x80008000; "
            "fma.rn.bf16x2 v, ta, c16, cm; fma.rn.bf16x2 q, tb, one, v; fma.rn.bf16x2 $0, q, $3, mz; }",
            "=r,r,r,r,r", [s, ap], dtype=gl.bfloat16, is_pure=True, pack=2)

    @gluon.jit
    def _half_weights(words, hw, sw, mw, d, dm, c3, J: gl.constexpr, QTYPE: gl.constexpr, BLOCK_N: gl.constexpr,
                      DEC_L: gl.constexpr, WORD_L: gl.constexpr, P1_L: gl.constexpr, P0_L: gl.constexpr,
                      DENORM: gl.constexpr):
        """Half step J's weights (BN, 128) bf16, k = 32 c + 16 p1 + 8 p0 + 2 q + h, in DEC_L's registers. words: as
        loaded (WLOAD_L; Q8_0: WORD8_L); a thread's own registers in WORD_L's order."""
        ap, ap16, bp = _scales(sw, mw, d, dm, J, QTYPE, c3, DENORM)
        if QTYPE != 0:
            words = gl.convert_layout(words, WORD_L)
        hb = words
        if QTYPE == 2 or QTYPE == 4 or QTYPE == 5:                   # the types with high code bits
            hb = _high_bits(hw, c3, QTYPE)
        if QTYPE == 0:
            w = _decode8(words, ap, bp, DEC_L, P1_L, DENORM)
        else:
            w = _decode(words, hb, ap, ap16, bp, QTYPE, DEC_L, P1_L, P0_L, DENORM)
        return gl.reshape(gl.permute(w, [0, 2, 3, 4, 1, 5]), [BLOCK_N, 128])

    @gluon.jit
    def _half_step(acc, words, hw, sw, mw, d, dm, x_smem, c3, J: gl.constexpr, QTYPE: gl.constexpr,
                   BLOCK_N: gl.constexpr, DEC_L: gl.constexpr, WORD_L: gl.constexpr, P1_L: gl.constexpr,
                   P0_L: gl.constexpr, MMA_L: gl.constexpr, DENORM: gl.constexpr):
        """acc + x . W^T over half step J (128 weights of K) with mma.sync; x_smem: the (BM, 128) x tile in K order."""
        w = _half_weights(words, hw, sw, mw, d, dm, c3, J, QTYPE, BLOCK_N, DEC_L, WORD_L, P1_L, P0_L, DENORM)
        w = gl.convert_layout(gl.permute(w, [1, 0]), gl.DotOperandLayout(1, MMA_L, 2))
        xk = x_smem.load(gl.DotOperandLayout(0, MMA_L, 2))
        return mma_v2(xk, w, acc)

    @gluon.jit
    def _load_step(wp, hp, sp, mp, dp, dmp, s, QTYPE: gl.constexpr):
        """Step s's words (two halves, (BN, 4, 4) int32; Q8_0: (BN, 4, 2, 4), `_decode8`), high bits of each half
        (Q5_K / Q5_0: the int32 of its 4 qh bytes, from one int64 load; Q6_K: the int64 of its two 16-blocks; the
        others: unused), scale / min words (BN, 4) int32 (Q8_0 / Q4_0 / Q5_0: the int32 of the fp16 d of blocks
        2 q, 2 q + 1; no mins), d / dmin (BN,) fp32 (dmin unused for Q6_K; neither for Q8_0 / Q4_0 / Q5_0, whose
        loads the compiler then drops)."""
        if QTYPE == 0:                             # Q8_0: 64 words a step, 8 a block
            w_a = gl.load(wp + s * 64)
            w_b = gl.load(wp + s * 64 + 8)
        else:
            w_a = gl.load(wp + s * 32)
            w_b = gl.load(wp + s * 32 + 4)
        sw = gl.load(sp + s * 4).to(gl.int32)
        if QTYPE <= 1 or QTYPE == 3:
            h_a = sw                               # placeholders of the loop-carried values (never used)
            h_b = sw
        elif QTYPE == 2 or QTYPE == 4:
            h = gl.load(hp + s * 4)
            h_a = (h & 0xFFFFFFFF).to(gl.int32)
            h_b = (h >> 32).to(gl.int32)
        else:
            h_a = gl.load(hp + s * 8)
            h_b = gl.load(hp + s * 8 + 1)
        d = gl.load(dp + s).to(gl.float32)
        if QTYPE == 5 or QTYPE <= 2:       # no mins: placeholders
            mw = sw
            dm = d
        else:
            mw = gl.load(mp + s * 4).to(gl.int32)
            dm = gl.load(dmp + s).to(gl.float32)
        return w_a, w_b, h_a, h_b, sw, mw, d, dm

    @gluon.jit
    def _mma_loop(xp, xmask, wp, hp, sp, mp, dp, dmp, s0, s1, sc0, w_a, w_b, h_a, h_b, sw, mw, d, dm, c3,
                  QTYPE: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, DEC_L: gl.constexpr,
                  WORD_L: gl.constexpr, P1_L: gl.constexpr, P0_L: gl.constexpr, XSMEM_L: gl.constexpr,
                  MMA_L: gl.constexpr, ACC2: gl.constexpr, DENORM: gl.constexpr):
        """`_kq_kernel`'s steps s0 .. s1 - 1 with mma.sync: the (BM, BN) sums. w_a ... dm: step sc0's, loaded; x
        (xp: the (BM, 256) step tile's pointers) through a two-step cp.async ring and ldmatrix."""
        xs = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_M, 256], XSMEM_L)
        _async_load(xs.index(0), xp + sc0 * 256, mask=xmask)
        async_copy.commit_group()
        acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, MMA_L)
        acc_b = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, MMA_L)     # ACC2: the second half step's own chain
        for s in range(s0, s1):
            # step s + 1's weights into registers (the last step again at the end) while s is computed
            sn = gl.minimum(s + 1, s1 - 1)
            nw_a, nw_b, nh_a, nh_b, nsw, nmw, nd, ndm = _load_step(wp, hp, sp, mp, dp, dmp, sn, QTYPE)
            # x of step s in shared memory; every warp done with step s - 1, so its buffer takes step s + 1
            async_copy.wait_group(0)
            _barrier()
            buf = (s - s0) % 2                                        # the prologue filled buffer 0
            _async_load(xs.index(1 - buf), xp + sn * 256, mask=xmask)
            async_copy.commit_group()
            xt = xs.index(buf)
            d2 = gl.expand_dims(d, 1)
            dm2 = gl.expand_dims(dm, 1)
            acc = _half_step(acc, w_a, h_a, sw, mw, d2, dm2, xt.slice(0, 128, dim=1), c3, 0, QTYPE, BLOCK_N,
                             DEC_L, WORD_L, P1_L, P0_L, MMA_L, DENORM)
            xt_b = xt.slice(128, 128, dim=1)
            if ACC2:    # two chains of dots a step (the halves' accumulators), summed at the end
                acc_b = _half_step(acc_b, w_b, h_b, sw, mw, d2, dm2, xt_b, c3, 1, QTYPE, BLOCK_N, DEC_L, WORD_L,
                                   P1_L, P0_L, MMA_L, DENORM)
            else:
                acc = _half_step(acc, w_b, h_b, sw, mw, d2, dm2, xt_b, c3, 1, QTYPE, BLOCK_N, DEC_L, WORD_L, P1_L,
                                 P0_L, MMA_L, DENORM)
            w_a, w_b, h_a, h_b, sw, mw, d, dm = nw_a, nw_b, nh_a, nh_b, nsw, nmw, nd, ndm
        async_copy.wait_group(0)
        if ACC2:
            acc = acc + acc_b
        return acc

    if hasattr(gl.shared_memory_descriptor, "reinterpret"):      # `_reinterpret` up to triton 3.8
        @gluon.jit
        def _as_step(xt, BLOCK_M: gl.constexpr, XSMEM_L: gl.constexpr):
            """A step's x as TMA wrote it, (4, BM, 64), viewed as the (BM, 256) it is (the same bytes)."""
            return xt.reinterpret(gl.bfloat16, [BLOCK_M, 256], XSMEM_L)
    else:
        @gluon.jit
        def _as_step(xt, BLOCK_M: gl.constexpr, XSMEM_L: gl.constexpr):
            """A step's x as TMA wrote it, (4, BM, 64), viewed as the (BM, 256) it is (the same bytes)."""
            return xt._reinterpret(gl.bfloat16, [BLOCK_M, 256], XSMEM_L)

    @gluon.jit
    def _x_step(x_desc, xt, bar, s, BLOCK_M: gl.constexpr):
        """Step s's x, (BM, 256) bf16, into xt by one TMA copy (rows past M zero-filled): x_desc views x as (K / 64,
        M, 64), so the box (4, BM, 64) lands as four (BM, 64) blocks end to end, which is the NVMMA layout of
        (BM, 256) (`_as_step`). bar: its mbarrier, told the bytes to expect."""
        mbarrier.expect(bar, BLOCK_M * 512)
        _tma_load(x_desc, [4 * s, 0, 0], bar, xt)

    @gluon.jit
    def _wg_loop(x_desc, wp, hp, sp, mp, dp, dmp, s0, s1, sc0, w_a, w_b, h_a, h_b, sw, mw, d, dm, c3,
                 QTYPE: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, DEC_L: gl.constexpr,
                 WORD_L: gl.constexpr, P1_L: gl.constexpr, P0_L: gl.constexpr, XSMEM_L: gl.constexpr,
                 MMA_L: gl.constexpr, DENORM: gl.constexpr):
        """`_kq_kernel`'s steps s0 .. s1 - 1 with Hopper's warpgroup MMA: the (BN, BM) sums. Each half step's
        decoded weights (`_half_weights`, already in the A operand's registers: `layouts` wg) times x^T, which the
        MMA reads from shared memory: a ring of two steps filled by TMA (x_desc). At the top of step s, after a
        barrier (every warp waited for step s - 1's MMAs at its end), step s + 1's x is copied into step s - 1's
        buffer: a step ahead of its use. TMA and the MMA both access shared memory through the async proxy, so no
        proxy fence is needed (a copy by threads, cp.async, would need one a step, which waits on the loads in
        flight)."""
        A_L: gl.constexpr = gl.DotOperandLayout(0, MMA_L, 2)
        xs = gl.allocate_shared_memory(gl.bfloat16, [2, 4, BLOCK_M, 64], X_TMA_L)
        bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for b in gl.static_range(2):
            mbarrier.init(bars.index(b), count=1)
        _barrier()
        _x_step(x_desc, xs.index(0), bars.index(0), sc0, BLOCK_M)
        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, MMA_L)
        for s in range(s0, s1):
            t = s - s0
            sn = gl.minimum(s + 1, s1 - 1)
            nw_a, nw_b, nh_a, nh_b, nsw, nmw, nd, ndm = _load_step(wp, hp, sp, mp, dp, dmp, sn, QTYPE)
            _barrier()
            _x_step(x_desc, xs.index((t + 1) % 2), bars.index((t + 1) % 2), sn, BLOCK_M)
            d2 = gl.expand_dims(d, 1)
            dm2 = gl.expand_dims(dm, 1)
            xt = _as_step(xs.index(t % 2), BLOCK_M, XSMEM_L)
            wa = gl.convert_layout(_half_weights(w_a, h_a, sw, mw, d2, dm2, c3, 0, QTYPE, BLOCK_N, DEC_L, WORD_L, P1_L,
                                                 P0_L, DENORM), A_L)
            mbarrier.wait(bars.index(t % 2), (t // 2) & 1)
            acc = warpgroup_mma(wa, xt.slice(0, 128, dim=1).permute([1, 0]), acc, is_async=True)
            wb = gl.convert_layout(_half_weights(w_b, h_b, sw, mw, d2, dm2, c3, 1, QTYPE, BLOCK_N, DEC_L, WORD_L, P1_L,
                                                 P0_L, DENORM), A_L)
            acc = warpgroup_mma(wb, xt.slice(128, 128, dim=1).permute([1, 0]), acc, is_async=True)
            acc, wa, wb = warpgroup_mma_wait(0, deps=[acc, wa, wb])
            w_a, w_b, h_a, h_b, sw, mw, d, dm = nw_a, nw_b, nh_a, nh_b, nsw, nmw, nd, ndm
        # the copy issued past the last step (into a buffer no step reads) lands before the barriers go
        n = gl.maximum(s1 - s0, 0)      # (an empty split's n is 0: the prologue's copy)
        mbarrier.wait(bars.index(n % 2), (n // 2) & 1)
        for b in gl.static_range(2):
            mbarrier.invalidate(bars.index(b))
        return acc

    @gluon.jit
    def _kq_kernel(x_ptr, y_ptr, b_ptr, qs_ptr, qh_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, M, N, NSTEP, s_xm, s_qs,
                   s_qh, s_sc, s_d, steps_per_split, QTYPE: gl.constexpr, BLOCK_M: gl.constexpr,
                   BLOCK_N: gl.constexpr, DEC_L: gl.constexpr, WORD_L: gl.constexpr, WLOAD_L: gl.constexpr,
                   WORD8_L: gl.constexpr, SCALE_L: gl.constexpr, P1_L: gl.constexpr, P0_L: gl.constexpr,
                   XCOPY_L: gl.constexpr, XSMEM_L: gl.constexpr, MMA_L: gl.constexpr, HAS_BIAS: gl.constexpr = False,
                   ACC2: gl.constexpr = False, X_PAST_M: gl.constexpr = 0, PDL: gl.constexpr = False,
                   DENORM: gl.constexpr = False, WG: gl.constexpr = False):
        """y[pid_k, m, n] = x[m, :] . W[n, :] over steps pid_k * steps_per_split ... of row tile pid_n: the split-K
        partials in fp32 (kernels._finish sums them); unsplit, the result itself, + bias[n] with HAS_BIAS, in y's
        dtype. x: gluon_order(x, qtype) (M, K) bf16. Views of the packed arrays
        (`_views`), each indexed (row, 4 s + q) per step s and lane q (Q6_K's qh (row, 8 s + 2 q + j)): sc / mn
        int16 (Q6_K: sc int32), qh int64; qs, d, dmin as packed.py stores them. WG: Hopper's warpgroup MMA, the
        layouts of `layouts(..., wg=True)` (the weights from registers, x read by the MMA from shared memory)."""
        pid_n = gl.program_id(0)
        pid_k = gl.program_id(1)
        s0 = pid_k * steps_per_split
        s1 = gl.minimum(s0 + steps_per_split, NSTEP)

        rows = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, SCALE_L))
        rows = gl.minimum(rows, N - 1).to(gl.int64)                  # clamped: loads need no row mask
        r2 = gl.expand_dims(rows, 1)                                 # (BN, 1)
        q2 = gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, SCALE_L)), 0)                 # (1, 4)
        c3 = gl.expand_dims(gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, WORD_L))),
                                           0), 1)                    # (1, 1, 4)
        if QTYPE == 0:          # Q8_0: words 16 q + 4 p0 + c of step 0 (half 0), WORD8_L
            r8 = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, gl.SliceLayout(
                2, gl.SliceLayout(3, WORD8_L))))
            r8 = gl.minimum(r8, N - 1).to(gl.int64)
            q8 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, WORD8_L))))
            p8 = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, WORD8_L))))
            c8 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, WORD8_L))))
            wp = (qs_ptr + gl.expand_dims(gl.expand_dims(gl.expand_dims(r8 * s_qs, 1), 2), 3)
                  + gl.expand_dims(gl.expand_dims(gl.expand_dims(16 * q8, 0), 2), 3)
                  + gl.expand_dims(gl.expand_dims(gl.expand_dims(4 * p8, 0), 1), 3)
                  + gl.expand_dims(gl.expand_dims(gl.expand_dims(c8, 0), 1), 2))
        else:                   # words 8 q + c of step 0 (half 0), in WLOAD_L
            rl = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, gl.SliceLayout(2, WLOAD_L)))
            ql = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, WLOAD_L)))
            cl = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, WLOAD_L)))
            wp = (qs_ptr + gl.expand_dims(gl.expand_dims(gl.minimum(rl, N - 1).to(gl.int64) * s_qs, 1)
                                          + gl.expand_dims(ql * 8, 0), 2) + gl.expand_dims(gl.expand_dims(cl, 0), 1))
        sp = sc_ptr + r2 * s_sc + q2                                 # the scale word of lane q, step 0
        mp = mn_ptr + r2 * s_sc + q2
        if QTYPE == 5:
            hp = qh_ptr + r2 * s_qh + 2 * q2
        else:
            hp = qh_ptr + r2 * s_qh + q2
        dp = d_ptr + rows * s_d
        dmp = dm_ptr + rows * s_d

        if not WG:              # x_ptr: x itself (WG: a TMA descriptor of it, `_x_step`)
            tx = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, XCOPY_L))
            xc = gl.arange(0, 256, layout=gl.SliceLayout(0, XCOPY_L))
            if X_PAST_M == 2:   # the tile's rows past M (`past_mode`): row t % M again
                tr = tx % M
            else:               # row M - 1 again (0), or not loaded (1: zero-filled)
                tr = gl.minimum(tx, M - 1)
            xp = x_ptr + gl.expand_dims(tr.to(gl.int64) * s_xm, 1) + gl.expand_dims(xc, 0)
            xmask = None
            if X_PAST_M == 1:   # (xc < 256: always true, it gives the mask the tile's shape)
                xmask = gl.expand_dims(tx < M, 1) & gl.expand_dims(xc < 256, 0)
        sc0 = gl.minimum(s0, NSTEP - 1)                              # an empty split loads in range
        # the weights need nothing of the kernel before: loaded ahead of the PDL wait
        w_a, w_b, h_a, h_b, sw, mw, d, dm = _load_step(wp, hp, sp, mp, dp, dmp, sc0, QTYPE)
        if PDL:         # kernels/pdl.py: wait for the kernel before (it writes x), then let the next one be scheduled
            gdc_wait()
            gdc_launch_dependents()
        if WG:
            acc = _wg_loop(x_ptr, wp, hp, sp, mp, dp, dmp, s0, s1, sc0, w_a, w_b, h_a, h_b, sw, mw, d, dm, c3,
                           QTYPE, BLOCK_M, BLOCK_N, DEC_L, WORD_L, P1_L, P0_L, XSMEM_L, MMA_L, DENORM)
        else:
            acc = _mma_loop(xp, xmask, wp, hp, sp, mp, dp, dmp, s0, s1, sc0, w_a, w_b, h_a, h_b, sw, mw, d, dm, c3,
                            QTYPE, BLOCK_M, BLOCK_N, DEC_L, WORD_L, P1_L, P0_L, XSMEM_L, MMA_L, ACC2, DENORM)

        y0 = y_ptr + pid_k.to(gl.int64) * M * N
        if WG:                  # acc (BN, BM): rows of W by rows of x
            om = gl.expand_dims(gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, MMA_L)), 0)
            on = gl.expand_dims(pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, MMA_L)), 1)
        else:                   # acc (BM, BN)
            om = gl.expand_dims(gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, MMA_L)), 1)
            on = gl.expand_dims(pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, MMA_L)), 0)
        if DENORM:
            acc = acc * 8589934592.0                                  # 2^33: _decode's weights were times 2^-33
        if HAS_BIAS:
            acc = acc + gl.load(b_ptr + on, mask=on < N, other=0.0).to(gl.float32)
        gl.store(y0 + om.to(gl.int64) * N + on, acc.to(y_ptr.dtype.element_ty), mask=(om < M) & (on < N))


# (BLOCK_N, waves, ACC2) of a tile height (BLOCK_M 16: up to 16 rows of x, 32: up to 32); waves: about how many
# programs an SM the K split aims for (kernels._split); ACC2: the two half steps accumulate in two chains of dots,
# summed at the end. Best per shape on an H200 (2026-12-04, benchmarks/bench_gluon_matmul.py in `gpu_pending.sh
# part82`, `part83`, `part85`, `part86`; us, against the next best tile): the 27B's matmuls as FusedLinear stacks
# them, and three unstacked. ACC2 at 16 rows (`part85`, Q4_K at the table's tiles): 34816x5120 48.06 -> 44.85,
# 13312x5120 21.28 -> 20.34, 14336x5120 22.45 -> 21.90, 6240x5120 11.90 -> 11.29, 5120x6144 11.96 -> 11.72; at 32
# rows it costs Q4_K's 128-row tiles (34816x5120 71.61 -> 73.99: 254 registers), and gains with 64 rows (Q5_K, Q6_K).
TILE_BY_SHAPE = {
    (QT.Q4_K, 34816, 5120, 16): (32, 6, True),     # H100 part140: 47.81 (64 x 6: 52.45); H200: 64 x 6 49.46
    (QT.Q4_K, 17408, 5120, 16): (64, 6, True),     # 28.18 (64 x 2: 31.54)
    (QT.Q4_K, 5120, 17408, 16): (32, 4, True),     # H100 part140: 27.19 (64 x 3: 29.09); H200: 64 x 3 28.80
    (QT.Q4_K, 14336, 5120, 16): (64, 3, True),     # 22.41 (64 x 2: 22.66)
    (QT.Q4_K, 13312, 5120, 16): (64, 8, True),     # 22.10 (64 x 6: 22.42)
    (QT.Q4_K, 12288, 5120, 16): (64, 2, True),     # 20.24 (64 x 6: 21.90)
    (QT.Q4_K, 6240, 5120, 16): (64, 3, True),      # 11.88 (64 x 4: 12.06)
    (QT.Q4_K, 6144, 5120, 16): (64, 3, True),      # 13.34 (64 x 4: 13.38)
    (QT.Q4_K, 5120, 6144, 16): (64, 2, True),      # 12.06 (64 x 4: 12.39)
    (QT.Q4_K, 34816, 5120, 32): (64, 2, True),     # H100 part141: 63.66 (128 x 4: 67.60; the 27B tree verify 23
                                                   # 12.73-12.76 -> 12.65-12.71 ms, part142); H200: 128 x 4 67.94
    (QT.Q4_K, 17408, 5120, 32): (128, 3, False),   # 37.61 (128 x 2: 42.14)
    (QT.Q4_K, 5120, 17408, 32): (64, 2, False),    # 36.04 (64 x 6: 38.88)
    (QT.Q4_K, 14336, 5120, 32): (128, 3, False),   # 30.61 (128 x 4: 32.51)
    (QT.Q4_K, 13312, 5120, 32): (128, 4, False),   # 28.14 (64 x 4: 30.00)
    (QT.Q4_K, 12288, 5120, 32): (64, 2, False),    # 25.98 (128 x 3: 26.92)
    (QT.Q4_K, 6240, 5120, 32): (128, 2, False),    # 14.88 (64 x 2: 15.82)
    (QT.Q4_K, 6144, 5120, 32): (128, 2, False),    # 15.80 (64 x 2: 17.68)
    (QT.Q4_K, 5120, 6144, 32): (128, 2, False),    # 14.65 (64 x 2: 14.79)
    (QT.Q6_K, 5120, 17408, 16): (32, 4, True),     # H100 part140: 34.65 (64 x 6: 41.04); H200: 64 x 6 35.10
    (QT.Q6_K, 1024, 5120, 16): (32, 2, False),     # H100 part140: 6.21 (64 x 3 ACC2: 6.92)
}
# Other shapes: per type and tile height. Q5_K / Q6_K (`part86`, us): 16 rows 10240x5120 22.04 (64 x 2 ACC2:
# 23.17), 1024x5120 6.99, 248320x5120 348.85; 32 rows 10240x5120 28.65 (128 x 2: 31.18), 5120x17408 40.60 (128 x
# 4: 48.78), 1024x5120 7.78 (128 x 2: 8.45), 248320x5120 433.42 (128 x 2: 452.66).
# 64-row tiles: BLOCK_N 64, no ACC2 (the accumulator then holds as many values a thread as a 32 x 128 tile's).
# 4 warps (2026-12-05, H200, us at 33 / 48 / 64 rows, 2 warps -> 4): Q4_K 5120x17408 74.3 -> 63.5, 70.3 -> 64.8,
# 69.9 -> 66.4; Q6_K 5120x17408 78.4 -> 77.0, 79.0 -> 78.1, 80.5 -> 76.2; Q4_K 34816x5120 115.5 -> 115.2, 115.0 ->
# 114.6, 109.9 -> 110.0. Q5_K 10240x5120 at 64 rows (2026-12-05, H100, `part119`; us at 33 / 48 / 64 rows, waves
# 2 -> 3): 45.80 -> 41.13, 46.70 -> 42.14, 47.98 -> 43.40 (4 waves: 42.82, 44.02, 46.27).
# Q4_0 / Q5_0 (2026-12-06, an H100, `gpu_pending.sh part137`: issue #2's shapes 17408x5120, 5120x17408, 12288x5120,
# 248320x5120; us at 16 rows, then 23): Q4_0 64 x 3 without ACC2 26.06, 26.43, 19.20, 271.37 (with: 30.78, 26.45,
# 22.33, 280.83); 64 x 2 ACC2 34.59, 32.74, 22.69, 347.62 (Q4_K's 128 x 2: 42.28, 38.31, 30.26, 341.70). Q5_0 64 x 6
# ACC2 34.22, 36.53, 27.35, 360.41 (64 x 3: 39.75, 35.92, 28.01, 397.80); 64 x 2 ACC2 44.64, 41.61, 28.75, 426.98.
# Q8_0 (`part138`, the same shapes): 32 x 4 at 16 rows 41.89, 38.73, 30.16, 463.39 (64 x 3: 48.85, 42.36, 36.96,
# 464.56); 64 x 2 at 23 rows 47.28, 44.91, 32.00, 487.90 (32 x 4: 51.92, 49.16, 43.11, 584.84). Their 64-row
# tiles are Q4_K's / Q5_K's (Q8_0: 64 x 4), not timed.
# 32-wide tiles (one weight row a thread: 80-96 registers, six programs an SM) at 16 rows (H100, 2026-12-06,
# `part140`, us, the table's 64-wide tile -> 32 x 4 ACC2): Q5_K 10240x5120 22.47 -> 19.69, Q6_K 5120x17408 41.04 ->
# 34.65, the Q6_K LM head 490.36 -> 415.46, Q4_K 34816x5120 52.45 -> 48.01 (32 x 6: 47.81), 5120x17408 29.09 ->
# 27.19; but Q4_K 13312 / 14336 / 6240 x 5120 23.03 / 22.60 / 11.79 -> 24.62 / 26.23 / 12.01, and at 23 rows every
# 32-wide tile was slower (34816x5120 65.77 -> 74.57).
TILE = {QT.Q4_K: {16: (64, 3, True), 32: (128, 2, False), 64: (64, 4, False)},
        QT.Q4_0: {16: (64, 3, False), 32: (64, 2, True), 64: (64, 4, False)},
        QT.Q8_0: {16: (32, 4, False), 32: (64, 2, False), 64: (64, 4, False)},
        QT.Q5_0: {16: (64, 6, True), 32: (64, 2, True), 64: (64, 3, False)},
        QT.Q5_K: {16: (32, 4, True), 32: (64, 2, True), 64: (64, 3, False)},
        QT.Q6_K: {16: (32, 4, True), 32: (64, 2, True), 64: (64, 4, False)}}


def _views(p: PackedWeight) -> dict | None:
    """The packed arrays as the kernel reads them (`_kq_kernel`), or None where an array's start or row stride does
    not allow the wider view: sc / mn as int16 (Q6_K sc as int32; Q4_0 / Q5_0: d as int32), qh as int64, one element
    per (row, 4 s + q) (Q6_K qh per (row, 8 s + 2 q + j)). Made once per weight (`supports` and every `matmul` ask
    for them)."""
    if "_gluon_views" not in p.__dict__:
        p.__dict__["_gluon_views"] = _make_views(p)
    return p.__dict__["_gluon_views"]


def _make_views(p: PackedWeight) -> dict | None:
    a = p.arrays
    try:
        if p.qtype == QT.Q6_K:
            sc, mn = a["sc"].view(torch.int32), a["sc"].view(torch.int32)
        elif p.qtype in _LEGACY:        # the scale words are d's: two fp16 a word
            sc = mn = a["d"].view(torch.int32)
        else:
            sc, mn = a["sc"].view(torch.int16), a["mn"].view(torch.int16)
        qh = a["qh"].view(torch.int64) if "qh" in a else sc
    except RuntimeError:
        return None
    if any(t.data_ptr() % t.element_size() for t in (sc, mn, qh)):
        return None
    return dict(qs=a["qs"], qh=qh, sc=sc, mn=mn, d=a["d"], dm=a.get("dmin", a["d"]))


def supports(p: PackedWeight) -> bool:
    """Whether `matmul` takes p (a type it decodes, whole 256-weight steps, arrays it can view)."""
    return p.qtype in TYPES and p.k % STEP == 0 and _views(p) is not None


def hopper(device) -> bool:
    """Whether `device` takes the warpgroup MMA (`WG`): compute capability 9.x and a triton that has it in Gluon."""
    if not HAVE_WGMMA or not available(device):
        return False
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _HOPPER:
        _HOPPER[key] = torch.cuda.get_device_capability(key)[0] == 9
    return _HOPPER[key]


_HOPPER: dict = {}


def config(p: PackedWeight, m: int, device, block_n: int | None = None, waves: int | None = None,
           wg: bool | None = None) -> dict:
    """Launch config for m rows (1..MAX_ROWS): tile, K split (steps of 256 per program). wg: the warpgroup MMA
    (`WG`) or not; None: as WG_TILES says, on a GPU that has it (`hopper`)."""
    from .kernels import _sms, _split
    _check(p)
    if not 1 <= m <= MAX_ROWS:
        raise ValueError(f"gluon matmul: 1..{MAX_ROWS} rows of x, got {m}")
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    if wg is None:
        wg = (p.qtype, block_m) in WG_TILES and hopper(device)
    if wg:
        (bn, wv), acc2 = WG_TILE[block_m], False
    else:
        bn, wv, acc2 = TILE_BY_SHAPE.get((p.qtype, p.n, p.k, block_m), TILE[p.qtype][block_m])
    bn, wv = block_n or bn, waves or wv
    split, per = _split(-(-p.n // bn), p.k // STEP, 1, _sms(device), waves=wv, min_steps=2)
    cfg = dict(BLOCK_M=block_m, BLOCK_N=bn, split=split, per=per, acc2=acc2)
    caps = WG_NREG if wg else NREG
    if wg:
        cfg["wg"] = True
    if (p.qtype, block_m) in caps and block_n is None:
        cfg["nreg"] = caps[(p.qtype, block_m)]
    if (p.qtype, block_m) in DENORM_TILES:
        cfg["denorm"] = True
    return cfg


def matmul(x: torch.Tensor, p: PackedWeight, cfg: dict | None = None, out_dtype: torch.dtype = torch.float32,
           bias: torch.Tensor | None = None, x_order: torch.Tensor | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """y (M, N) = x (M, K) @ W^T (+ bias) for a packed W of TYPES and 1..MAX_ROWS rows of bf16 x, on a GPU
    (`available`). x_order: x already in gluon_order(x, p.qtype) (else made here). cfg: `config`'s, optionally
    with "nreg", a cap on registers a thread (triton's maxnreg), and "denorm" (`_decode`'s / `_decode8`'s DENORM;
    `config` sets it from DENORM_TILES). out: a contiguous (M, N) tensor of out_dtype that y is written into (else a
    new one)."""
    if not available(x.device):
        raise RuntimeError("the Gluon matmul needs triton with Gluon and an NVIDIA GPU of compute capability 8+")
    if x.dtype != torch.bfloat16:
        raise ValueError(f"gluon matmul: x must be bfloat16, got {x.dtype}")
    v = _views(p)
    if v is None:
        raise ValueError(f"gluon matmul: the packed {p.qtype.name} arrays do not allow the kernel's views")
    from .kernels import _CODE, _finish
    m = x.shape[0]
    cfg = cfg or config(p, m, x.device)
    xo = (x_order if x_order is not None else gluon_order(x, p.qtype)).contiguous()
    split = cfg["split"]
    # unsplit, the kernel stores the result itself (bias added, in out_dtype): no launch after it
    if out is not None and (out.shape != (m, p.n) or out.dtype != out_dtype or not out.is_contiguous()):
        raise ValueError(f"gluon matmul: out must be a contiguous ({m}, {p.n}) {out_dtype} tensor, got "
                         f"{tuple(out.shape)} {out.dtype}")
    if split == 1 and out is not None:
        y = out.unsqueeze(0)
    else:
        y = torch.empty((split, m, p.n), device=x.device, dtype=out_dtype if split == 1 else torch.float32)
    in_kernel_bias = bias is not None and split == 1
    if in_kernel_bias and (bias.shape != (p.n,) or not bias.is_contiguous()):
        raise ValueError(f"gluon matmul: bias must be a contiguous ({p.n},) tensor, got {tuple(bias.shape)}")
    grid = (-(-p.n // cfg["BLOCK_N"]), split)
    wg = cfg.get("wg", False)
    if wg and not HAVE_WGMMA:
        raise RuntimeError("gluon matmul: this triton's Gluon has no warpgroup MMA (cfg['wg'])")
    # WG: x through a TMA descriptor of x as (K / 64, M, 64), a step's box (4, BLOCK_M, 64), rows past M read as
    # zeros (`_x_step`)
    x_arg = (TensorDescriptor(xo, [p.k // 64, m, 64], [64, xo.stride(0), 1], [4, cfg["BLOCK_M"], 64], X_TMA_L)
             if wg else xo)
    _kq_kernel[grid](x_arg, y, bias if in_kernel_bias else y, v["qs"], v["qh"], v["sc"], v["mn"], v["d"], v["dm"], m,
                     p.n, p.k // STEP, xo.stride(0), v["qs"].stride(0), v["qh"].stride(0), v["sc"].stride(0),
                     v["d"].stride(0), cfg["per"], QTYPE=_CODE[p.qtype], BLOCK_M=cfg["BLOCK_M"],
                     BLOCK_N=cfg["BLOCK_N"], **layouts(cfg["BLOCK_M"], cfg["BLOCK_N"], wg), HAS_BIAS=in_kernel_bias,
                     ACC2=cfg.get("acc2", False) and not wg, X_PAST_M=past_mode(m, cfg["BLOCK_M"]),
                     DENORM=cfg.get("denorm", False), WG=wg, num_warps=4,
                     **launch_options(x.device, _kq_kernel),
                     **({"maxnreg": cfg["nreg"]} if cfg.get("nreg") else {}))
    return y[0] if split == 1 else _finish(y, split, out_dtype, bias, out=out)
