"""Q4_K small-M matmul written in Gluon (Triton's explicit-layout dialect): y = x @ W^T for 2..32 rows of x.

Why a second kernel for what `kernels._dot_kernel` does: that kernel is bound by its own decode and dots, not by
memory (BENCHMARKS.md, part80 / part81), and Triton chooses where its weight words live (a cp.async ring in shared
memory, read back per MMA operand). Here every layout is written down, so each thread loads from global memory,
into registers, exactly the words its `mma.sync` B operand needs, one step ahead of their use, and decodes them in
place: no shared memory, no barrier, no layout conversion that moves data between threads.

The words a thread owns. A 256-weight step of a row is 32 planar words (packed.py: field f of word w of 32-block b
holds weight 32 b + 4 f + w). Thread lane q = lane % 4 of a row takes words 8q .. 8q + 7 (32 contiguous bytes, two
16-byte loads): the words of 32-blocks 2q and 2q + 1, so it computes the scales of two blocks, not eight. Word
8q + 4j + c, fields p and p + 4 (one bf16x2 pair, as in `_bf16_pairs`) are the B operand's K positions
    k = 128 j + 32 c + 16 (p // 2) + 8 (p % 2) + 2 q + h        (h = 0: field p, h = 1: field p + 4)
which is where `mma.sync.m16n8k16` wants lane q's two consecutive K values of rows n = lane // 4 (+ 8 per warp, +
32 per register repeat). K is permuted, so x is too: within every 32-block, position 8 c + 4 (p // 2) + 2 (p % 2) +
h of `gluon_order(x)` holds x's weight 16 h + 4 p + c (`gluon_order`); the x tile a thread needs is then 64
contiguous bytes per row per half step.

The values: the same bf16 weights as the dot kernel's PAIRS decode (128 + q from one lop3, then two bf16x2 fma
with the block's A / 16 and A + B rounded to bf16), multiplied on tensor cores with fp32 accumulation; only the
order of the fp32 sums differs. Reference: `kernels.reference_matmul`.

Gluon runs only compiled, on an NVIDIA GPU of compute capability 8.0 or more (no CPU interpreter): `available()`.
"""
from __future__ import annotations

import torch
from gguf import GGMLQuantizationType as QT

from ..kernels.pdl import launch_options
from .packed import PackedWeight

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
    _barrier = getattr(gl, "thread_barrier", None) or gl.barrier     # renamed after triton 3.6
    HAVE_GLUON = True
except ImportError:        # triton without Gluon (before 3.5), or no triton
    gluon = None
    gl = None
    HAVE_GLUON = False

STEP = 256                 # weights of K a step (one Q4_K super-block)


def gluon_order(x: torch.Tensor) -> torch.Tensor:
    """x (M, K) in the kernel's K order: within each 256-column step, position 128 j + 32 c + 16 p1 + 8 p0 + 2 q + h
    holds column 32 (2 q + j) + 16 h + 8 p1 + 4 p0 + c (module docstring)."""
    m, k = x.shape
    if k % STEP:
        raise ValueError(f"gluon_order: K must be a multiple of {STEP}, got {k}")
    # column dims (q, j, h, p1, p0, c) -> position dims (j, c, p1, p0, q, h)
    return x.reshape(m, k // STEP, 4, 2, 2, 2, 2, 4).permute(0, 1, 3, 7, 5, 6, 2, 4).reshape(m, k)


def reference_weights(p: PackedWeight) -> torch.Tensor:
    """PyTorch reference of what the kernel decodes: W (N, K) fp32 in the kernel's K order, each weight found where
    the kernel finds it (word 8 q + 4 j + c of a step, fields p and p + 4, block 2 q + j's scales) and rounded to
    bf16 as its bf16x2 fma rounds it. Equals gluon_order(W) of the dequantized W to bf16 rounding: the test of the
    index algebra the kernel's layouts encode."""
    if p.qtype != QT.Q4_K or p.k % STEP:
        raise ValueError(f"gluon Q4_K: needs Q4_K with K % {STEP} == 0, got {p.qtype.name}, K={p.k}")
    a = {k: v.cpu() for k, v in p.arrays.items()}
    n, steps = p.n, p.k // STEP
    words = a["qs"].reshape(n, steps, 4, 2, 4).to(torch.int64) & 0xFFFFFFFF       # (n, s, q, j, c)
    f = (torch.arange(2).view(2, 1, 1) * 2 + torch.arange(2).view(1, 2, 1) + 4 * torch.arange(2).view(1, 1, 2))
    codes = (words[..., None, None, None] >> (4 * f)) & 0xF                       # (n, s, q, j, c, p1, p0, h)
    blk = lambda t: t.reshape(n, steps, 4, 2).float()                              # noqa: E731 - block 2 q + j
    d = a["d"].reshape(n, steps).float()[:, :, None, None]
    dm = a["dmin"].reshape(n, steps).float()[:, :, None, None]
    aa = d * blk(a["sc"]) * 16.0
    bb = -(aa + dm * blk(a["mn"]))
    ap = (aa * 0.0625).to(torch.bfloat16).float()[..., None, None, None, None]
    bp = (aa + bb).to(torch.bfloat16).float()[..., None, None, None, None]
    w = (codes.float() * ap + bp).to(torch.bfloat16).float()
    # (n, s, q, j, c, p1, p0, h) -> K position 128 j + 32 c + 16 p1 + 8 p0 + 2 q + h of each step
    return w.permute(0, 1, 3, 4, 5, 6, 2, 7).reshape(n, p.k)


_CAPABLE: dict = {}


def available(device: torch.device) -> bool:
    """Whether the kernel can run on `device`: Gluon importable, a CUDA device of compute capability 8.0+."""
    if not HAVE_GLUON or device.type != "cuda":
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


def layouts(block_m: int, block_n: int) -> dict:
    """The kernel's layouts for 4 warps (constexpr arguments). DEC: the decoded weights (BN, 4 q, 4 c, 2 p1, 2 p0,
    2 h), rows n = lane // 4 + 8 warp + 32 repeat, q = lane % 4, registers h, p0, p1, c (so that permuted to
    (n, c, p1, p0, q, h) and flattened it is the mma B operand's register order); WORD: its words (BN, 4, 4);
    SCALE: per (row, q) (BN, 4); P1 / P0: the pair index dims; XCOPY: the x step tile (BM, 256) for cp.async;
    XSMEM: its shared-memory ring; MMA: the accumulator."""
    if block_m not in (16, 32) or block_n not in (32, 64, 128, 256):
        raise ValueError(f"gluon Q4_K tile: BLOCK_M 16 or 32 and BLOCK_N 32..256, got {block_m}, {block_n}")
    z = [0] * 5

    def at(d, v):
        b = list(z) + [0]
        b[d] = v
        return b
    dec = gl.DistributedLinearLayout(
        reg_bases=[at(5, 1), at(4, 1), at(3, 1), at(2, 1), at(2, 2)]
        + [at(0, 32 << i) for i in range(_log2(block_n // 32))],
        lane_bases=[at(1, 1), at(1, 2), at(0, 1), at(0, 2), at(0, 4)],
        warp_bases=[at(0, 8), at(0, 16)], block_bases=[], shape=[block_n, 4, 4, 2, 2, 2])
    word = gl.SliceLayout(3, gl.SliceLayout(4, gl.SliceLayout(5, dec)))
    return dict(DEC_L=dec, WORD_L=word, SCALE_L=gl.SliceLayout(2, word),
                P1_L=_index_layout(dec, 3), P0_L=_index_layout(dec, 4),
                XCOPY_L=gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0]),
                XSMEM_L=gl.SwizzledSharedLayout(8, 1, 8, [1, 0]),
                MMA_L=gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 4], instr_shape=[16, 8]))


if HAVE_GLUON:

    @gluon.jit
    def _e6(v, d0: gl.constexpr, d1: gl.constexpr, d2: gl.constexpr, d3: gl.constexpr, d4: gl.constexpr):
        """expand_dims of a 1-D index over five dims, lowest first (the inverse of _index_layout)."""
        return gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(v, d0), d1), d2), d3), d4)

    @gluon.jit
    def _decode(words, sc, mn, d, dm, DEC_L: gl.constexpr, P1_L: gl.constexpr, P0_L: gl.constexpr):
        """The half step's weights as the (BN, 4, 4, 2, 2, 2) bf16 tile of DEC_L: word (n, q, c), fields p = 2 p1 +
        p0 (h = 0) and p + 4 (h = 1), each A q + B of its block like `_bf16_pairs` PAIRS 3 (128 + q from one lop3,
        q = (128 + q) * 1 - 128, A q + B; bf16x2, one asm a pair: pack 2 over h, which DEC_L keeps in neighbouring
        registers). sc, mn: the block's 6-bit scale / min (BN, 4) int32; d, dm: (BN, 1) fp32."""
        a = d * sc.to(gl.float32) * 16.0                          # _affine (Q4_K): w = a f + b, f = 1 + q / 16
        b = -(a + dm * mn.to(gl.float32))
        ab = (a * 0.0625).to(gl.bfloat16).to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
        bb = (a + b).to(gl.bfloat16).to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
        magic = gl.full([words.shape[0], 4, 4, 2, 2, 2], 0x43004300, gl.int32, DEC_L)
        ap = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(ab | (ab << 16), 2), 3), 4), 5)
        bp = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(bb | (bb << 16), 2), 3), 4), 5)
        p1 = _e6(gl.arange(0, 2, layout=P1_L), 0, 1, 2, 4, 5)
        p0 = _e6(gl.arange(0, 2, layout=P0_L), 0, 1, 2, 3, 5)
        s = gl.expand_dims(gl.expand_dims(gl.expand_dims(words, 3), 4), 5) >> (8 * p1 + 4 * p0)
        s, magic = gl.broadcast(s, magic)
        ap, _ = gl.broadcast(ap, magic)
        bp, _ = gl.broadcast(bp, magic)
        return gl.inline_asm_elementwise(
            "{ .reg .b32 t, one, m128, q; lop3.b32 t, $1, 0x000F000F, $3, 0xEA; "
            "mov.b32 one, 0x3F803F80; mov.b32 m128, 0xC300C300; "
            "fma.rn.bf16x2 q, t, one, m128; fma.rn.bf16x2 $0, q, $5, $7; }",
            "=r,r,r,r,r,r,r,r,r", [s, magic, ap, bp], dtype=gl.bfloat16, is_pure=True, pack=2)

    @gluon.jit
    def _half_step(acc, words, sc, mn, d, dm, x_smem, BLOCK_N: gl.constexpr, DEC_L: gl.constexpr,
                   P1_L: gl.constexpr, P0_L: gl.constexpr, MMA_L: gl.constexpr):
        """acc + x . W^T over one half step (128 weights of K); x_smem: the (BM, 128) x tile in K order."""
        w = _decode(words, sc, mn, d, dm, DEC_L, P1_L, P0_L)
        w = gl.reshape(gl.permute(w, [0, 2, 3, 4, 1, 5]), [BLOCK_N, 128])   # k = 32 c + 16 p1 + 8 p0 + 2 q + h
        w = gl.convert_layout(gl.permute(w, [1, 0]), gl.DotOperandLayout(1, MMA_L, 2))
        xk = x_smem.load(gl.DotOperandLayout(0, MMA_L, 2))
        return mma_v2(xk, w, acc)

    @gluon.jit
    def _q4k_kernel(x_ptr, y_ptr, qs_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, M, N, NSTEP, s_xm, s_qs, s_sc, s_d,
                    steps_per_split, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    DEC_L: gl.constexpr, WORD_L: gl.constexpr, SCALE_L: gl.constexpr, P1_L: gl.constexpr,
                    P0_L: gl.constexpr, XCOPY_L: gl.constexpr, XSMEM_L: gl.constexpr, MMA_L: gl.constexpr,
                    ACC2: gl.constexpr = False, PDL: gl.constexpr = False):
        """y[pid_k, m, n] = x[m, :] . W[n, :] over steps pid_k * steps_per_split ... of row tile pid_n: the split-K
        partials (kernels._finish sums them). x: gluon_order(x) (M, K) bf16; sc / mn: the int16 view of the
        packed byte arrays (s_sc in int16); qs, d, dmin as packed.py stores them."""
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
        wp = qs_ptr + gl.expand_dims(r2 * s_qs + q2 * 8, 2) + c3     # words 8 q + c of step 0 (half 0)
        sp = r2 * s_sc + q2                                          # the int16 of blocks 2 q, 2 q + 1 of step 0
        dp = rows * s_d

        tx = gl.minimum(gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, XCOPY_L)), M - 1).to(gl.int64)
        xc = gl.arange(0, 256, layout=gl.SliceLayout(0, XCOPY_L))
        xp = x_ptr + gl.expand_dims(tx * s_xm, 1) + gl.expand_dims(xc, 0)
        sc0 = gl.minimum(s0, NSTEP - 1)                              # an empty split loads in range
        w_a = gl.load(wp + sc0 * 32)                                 # the weights need nothing of the kernel
        w_b = gl.load(wp + sc0 * 32 + 4)                             # before: loaded ahead of the PDL wait
        sc = gl.load(sc_ptr + sp + sc0 * 4).to(gl.int32)
        mn = gl.load(mn_ptr + sp + sc0 * 4).to(gl.int32)
        d = gl.load(d_ptr + dp + sc0).to(gl.float32)
        dm = gl.load(dm_ptr + dp + sc0).to(gl.float32)
        if PDL:         # kernels/pdl.py: wait for the kernel before (it writes x), then let the next one be scheduled
            gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                      is_pure=False, pack=1)
        xs = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_M, 256], XSMEM_L)
        async_copy.async_copy_global_to_shared(xs.index(0), xp + sc0 * 256)
        async_copy.commit_group()
        acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, MMA_L)
        acc_b = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, MMA_L)     # ACC2: the second half step's own chain
        for s in range(s0, s1):
            # step s + 1's words and scales into registers (the last step again at the end) while s is computed
            sn = gl.minimum(s + 1, s1 - 1)
            nw_a = gl.load(wp + sn * 32)
            nw_b = gl.load(wp + sn * 32 + 4)
            nsc = gl.load(sc_ptr + sp + sn * 4).to(gl.int32)
            nmn = gl.load(mn_ptr + sp + sn * 4).to(gl.int32)
            nd = gl.load(d_ptr + dp + sn).to(gl.float32)
            ndm = gl.load(dm_ptr + dp + sn).to(gl.float32)
            # x of step s in shared memory; every warp done with step s - 1, so its buffer takes step s + 1
            async_copy.wait_group(0)
            _barrier()
            buf = (s - s0) % 2                                        # the prologue filled buffer 0
            async_copy.async_copy_global_to_shared(xs.index(1 - buf), xp + sn * 256)
            async_copy.commit_group()
            xt = xs.index(buf)
            d2 = gl.expand_dims(d, 1)
            dm2 = gl.expand_dims(dm, 1)
            acc = _half_step(acc, w_a, sc & 0xFF, mn & 0xFF, d2, dm2, xt.slice(0, 128, dim=1), BLOCK_N, DEC_L,
                             P1_L, P0_L, MMA_L)
            xt_b = xt.slice(128, 128, dim=1)
            if ACC2:    # two chains of dots a step (the halves' accumulators), summed at the end
                acc_b = _half_step(acc_b, w_b, (sc >> 8) & 0xFF, (mn >> 8) & 0xFF, d2, dm2, xt_b, BLOCK_N, DEC_L,
                                   P1_L, P0_L, MMA_L)
            else:
                acc = _half_step(acc, w_b, (sc >> 8) & 0xFF, (mn >> 8) & 0xFF, d2, dm2, xt_b, BLOCK_N, DEC_L,
                                 P1_L, P0_L, MMA_L)
            w_a, w_b, sc, mn, d, dm = nw_a, nw_b, nsc, nmn, nd, ndm
        async_copy.wait_group(0)

        om = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, MMA_L))
        on = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, MMA_L))
        yp = y_ptr + pid_k.to(gl.int64) * M * N + gl.expand_dims(om.to(gl.int64) * N, 1) + gl.expand_dims(on, 0)
        if ACC2:
            acc = acc + acc_b
        gl.store(yp, acc, mask=gl.expand_dims(om < M, 1) & gl.expand_dims(on < N, 0))


# (BLOCK_N, waves) of a tile height (BLOCK_M 16: up to 16 rows of x, 32: up to 32); waves: about how many programs
# an SM the K split aims for (kernels._split). Best per shape on an H200 (2026-12-04, `gpu_pending.sh part82` /
# `part83`, benchmarks/bench_gluon_q4k.py; us, against the next best tile): the 27B's Q4_K matmuls as FusedLinear
# stacks them, and two unstacked.
TILE_BY_SHAPE = {
    (34816, 5120, 16): (64, 6),     # 49.46 (64 x 3: 52.73)
    (17408, 5120, 16): (64, 6),     # 28.18 (64 x 2: 31.54)
    (5120, 17408, 16): (64, 3),     # 28.80 (64 x 2: 28.94)
    (14336, 5120, 16): (64, 3),     # 22.41 (64 x 2: 22.66)
    (13312, 5120, 16): (64, 8),     # 22.10 (64 x 6: 22.42)
    (12288, 5120, 16): (64, 2),     # 20.24 (64 x 6: 21.90)
    (6240, 5120, 16): (64, 3),      # 11.88 (64 x 4: 12.06)
    (6144, 5120, 16): (64, 3),      # 13.34 (64 x 4: 13.38)
    (5120, 6144, 16): (64, 2),      # 12.06 (64 x 4: 12.39)
    (34816, 5120, 32): (128, 4),    # 67.94 (128 x 3: 68.27)
    (17408, 5120, 32): (128, 3),    # 37.61 (128 x 2: 42.14)
    (5120, 17408, 32): (64, 2),     # 36.04 (64 x 6: 38.88)
    (14336, 5120, 32): (128, 3),    # 30.61 (128 x 4: 32.51)
    (13312, 5120, 32): (128, 4),    # 28.14 (64 x 4: 30.00)
    (12288, 5120, 32): (64, 2),     # 25.98 (128 x 3: 26.92)
    (6240, 5120, 32): (128, 2),     # 14.88 (64 x 2: 15.82)
    (6144, 5120, 32): (128, 2),     # 15.80 (64 x 2: 17.68)
    (5120, 6144, 32): (128, 2),     # 14.65 (64 x 2: 14.79)
}
# Other shapes: 64 rows, 3 waves (16); 128 rows, 2 waves (32): the tiles nearest the best on most shapes above.
TILE = {16: (64, 3), 32: (128, 2)}


def config(p: PackedWeight, m: int, device, block_n: int | None = None, waves: int | None = None) -> dict:
    """Launch config for m rows (1..32): tile, K split (steps of 256 per program)."""
    from .kernels import _sms, _split
    if p.qtype != QT.Q4_K or p.k % STEP:
        raise ValueError(f"gluon Q4_K matmul: needs Q4_K with K % {STEP} == 0, got {p.qtype.name}, K={p.k}")
    if not 1 <= m <= 32:
        raise ValueError(f"gluon Q4_K matmul: 1..32 rows of x, got {m}")
    block_m = 16 if m <= 16 else 32
    bn, wv = TILE_BY_SHAPE.get((p.n, p.k, block_m), TILE[block_m])
    bn, wv = block_n or bn, waves or wv
    split, per = _split(-(-p.n // bn), p.k // STEP, 1, _sms(device), waves=wv, min_steps=2)
    return dict(BLOCK_M=block_m, BLOCK_N=bn, split=split, per=per)


def matmul(x: torch.Tensor, p: PackedWeight, cfg: dict | None = None, out_dtype: torch.dtype = torch.float32,
           bias: torch.Tensor | None = None, x_order: torch.Tensor | None = None) -> torch.Tensor:
    """y (M, N) = x (M, K) @ W^T (+ bias) for a packed Q4_K W and 1..32 rows of bf16 x, on a GPU (`available`).
    x_order: x already in gluon_order (else made here)."""
    if not available(x.device):
        raise RuntimeError("the Gluon Q4_K matmul needs triton with Gluon and an NVIDIA GPU of compute capability 8+")
    if x.dtype != torch.bfloat16:
        raise ValueError(f"gluon Q4_K matmul: x must be bfloat16, got {x.dtype}")
    from .kernels import _finish
    m = x.shape[0]
    cfg = cfg or config(p, m, x.device)
    xo = (x_order if x_order is not None else gluon_order(x)).contiguous()
    a = p.arrays
    sc, mn = a["sc"].view(torch.int16), a["mn"].view(torch.int16)
    y = torch.empty((cfg["split"], m, p.n), device=x.device, dtype=torch.float32)
    grid = (-(-p.n // cfg["BLOCK_N"]), cfg["split"])
    _q4k_kernel[grid](xo, y, a["qs"], sc, mn, a["d"], a["dmin"], m, p.n, p.k // STEP, xo.stride(0),
                      a["qs"].stride(0), sc.stride(0), a["d"].stride(0), cfg["per"],
                      BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], **layouts(cfg["BLOCK_M"], cfg["BLOCK_N"]),
                      ACC2=cfg.get("acc2", False),
                      num_warps=4, **launch_options(x.device))
    if cfg["split"] == 1:
        out = y[0] if bias is None else y[0] + bias.float()
        return out.to(out_dtype)
    return _finish(y, cfg["split"], out_dtype, bias)
