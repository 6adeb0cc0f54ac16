"""Triton block-matmul kernels vs the PyTorch reference (dequantize + fp32 matmul).

Without CUDA the kernels run in Triton's CPU interpreter on tiny shapes; `-m gpu` runs real sizes.
Error bound (stated per dtype in TOL): max|y - ref| <= TOL * max|ref|. bf16: the dot path rounds the
dequantized weights to bf16 (2^-9 relative) and the output is bf16; fp32: the dot path uses tf32 on a
GPU (2^-11 relative per product). The GEMV (M = 1) rounds x to int8 per 32 values: against the
reference on that rounded x it is exact up to fp32 rounding (TOL_INT8_EXACT), against the reference on
the original x the rounding costs at most INT8_ACT_TOL * max|ref| (observed up to 1.2e-2 on random data).
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    # Must be set before triton is imported: kernels are built as interpreted functions then.
    os.environ["TRITON_INTERPRET"] = "1"

import pytest
from gguf import GGMLQuantizationType as QT

triton = pytest.importorskip("triton")

from dflash24.quant import kernels  # noqa: E402
from dflash24.quant.formats import random_raw  # noqa: E402
from dflash24.quant.packed import PACKED_TYPES, pack, packed_nbytes, unpack  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 2e-3, torch.bfloat16: 1e-2, torch.float16: 5e-3}
TOL_INT8_EXACT = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}   # bf16/f16: output rounding
INT8_ACT_TOL = 3e-2
IDS = lambda q: q.name  # noqa: E731


def _cols(qtype) -> int:
    # K-quants: 3 super-blocks (a tail tile for BLOCK_K=512); 32-blocks: 19 blocks, not a multiple of 256
    return 768 if qtype in (QT.Q4_K, QT.Q5_K, QT.Q6_K) else 608


def _case(qtype, n, k, m, dtype, seed, device=DEV):
    g = torch.Generator().manual_seed(seed)
    raw = random_raw(qtype, n, k, generator=g, d_scale=0.01)
    x = torch.randn(m, k, generator=g).to(dtype)
    return raw, x, pack(raw.to(device), qtype, k), x.to(device)


def _rounded_x(x: torch.Tensor) -> torch.Tensor:
    """x (1, K) as the GEMV sees it: int8 codes per 32 values times their scale."""
    q, dx = kernels.reference_quantize_x(x.reshape(-1).float().cpu())
    return (q.float().reshape(-1, 32) * dx[:, None]).reshape(1, -1)


def _split_every_step(cfg: dict, nblk: int) -> dict:
    """A dot config with K split at every step of G blocks (the last split short when G does not divide nblk)."""
    return dict(cfg, split=-(-nblk // cfg["G"]), per=cfg["G"])


def _check(y, x, raw, qtype, k, dtype):
    if x.shape[0] == 1:                               # GEMV: int8 activations
        ref = kernels.reference_matmul(_rounded_x(x), raw, qtype, k)
        err = (y.float().cpu() - ref).abs().max().item()
        assert err <= TOL_INT8_EXACT[dtype] * ref.abs().max().item(), f"{qtype.name} GEMV {dtype}: err {err:.3g}"
        full = kernels.reference_matmul(x.cpu(), raw, qtype, k)
        assert (y.float().cpu() - full).abs().max().item() <= INT8_ACT_TOL * full.abs().max().item()
        return
    ref = kernels.reference_matmul(x.cpu(), raw, qtype, k)                    # (M, N) fp32
    y = y.float().cpu()
    assert y.shape == ref.shape
    err = (y - ref).abs().max().item()
    scale = ref.abs().max().item()
    assert scale > 0
    assert err <= TOL[dtype] * scale, f"{qtype.name} M={x.shape[0]} {dtype}: err {err:.3g} vs max {scale:.3g}"


@pytest.mark.parametrize("qtype", PACKED_TYPES, ids=IDS)
def test_pack_is_lossless(qtype):
    k = _cols(qtype)
    raw = random_raw(qtype, 9, k, generator=torch.Generator().manual_seed(3))
    p = pack(raw, qtype, k)
    assert torch.equal(unpack(p), raw)
    assert p.nbytes == packed_nbytes(qtype, 9, k)
    assert p.nbytes <= raw.numel() * 1.03            # only the 6-bit K scales widen (+4 B / 256)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("m", [1, 2, 16, 23, 80])
@pytest.mark.parametrize("qtype", PACKED_TYPES, ids=IDS)
def test_kernel_vs_reference_tiny(qtype, m, dtype):
    k = _cols(qtype)
    n = 40                                            # not a multiple of BLOCK_N: clamped rows
    raw, x, p, xd = _case(qtype, n, k, m, dtype, seed=m + 100 * int(qtype))
    y = kernels.quant_matmul(xd, p)
    assert y.dtype == dtype
    _check(y, x, raw, qtype, k, dtype)


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K, QT.Q5_0], ids=IDS)
def test_split_k_and_fp16(qtype):
    """Forced split-K (partials summed by torch) and fp16 activations on both paths."""
    k = 1024 if qtype != QT.Q5_0 else 1120
    raw, x, p, xd = _case(qtype, 24, k, 1, torch.float16, seed=7)
    nblk = k // kernels.GEOMETRY[qtype][0]
    cfg = kernels.gemv_config(p, xd.device)
    per = 24 if qtype == QT.Q6_K else 8                # blocks per split: a multiple of G = 4
    cfg.update(G=4, split=-(-nblk // per), per=per)    # last split short (and a partial step for Q5_0)
    _check(kernels.gemv(xd, p, cfg), x, raw, qtype, k, torch.float16)
    raw, x, p, xd = _case(qtype, 24, k, 5, torch.float16, seed=8)
    cfg = _split_every_step(kernels.dot_config(p, 5, xd.device), nblk)
    _check(kernels.matmul(xd, p, cfg), x, raw, qtype, k, torch.float16)


def _variants_agree(agree, gemv_cfgs, raw, x, p, xd, qtype, k):
    """agree(run, cfg) (runs variants of cfg, asserts they agree, returns one output) over the GEMV configs, then the
    dot config unsplit and split at every step, in both orientations; the last output of each against the
    reference."""
    for cfg in gemv_cfgs:
        y = agree(lambda c: kernels.gemv(xd[:1], p, c), cfg)
    _check(y, x[:1], raw, qtype, k, torch.float32)
    for split in (False, True):
        cfg = kernels.dot_config(p, 5, xd.device)
        if split:
            cfg = _split_every_step(cfg, k // kernels.GEOMETRY[qtype][0])
        for w_as_a in (False, True):
            y = agree(lambda c: kernels.matmul(xd, p, c), dict(cfg, w_as_a=w_as_a))
    _check(y, x, raw, qtype, k, torch.float32)


@pytest.mark.parametrize("qtype", PACKED_TYPES, ids=IDS)
def test_scale_words_agree(qtype):
    """The block scales read as the int32 words holding them (kernels._load_scales WORDS 1..3) give the output of
    the 1- / 2-byte loads, GEMV and dot, unsplit and split-K with short last splits and steps smaller than a K
    super-block, rows whose f16 scales start at odd element offsets and an odd count of them in all (the padded
    tail). Equal on the CPU interpreter; on a GPU the two compile to different instruction orders (fp32 rounding)."""
    k = 1280 if qtype in (QT.Q4_K, QT.Q5_K, QT.Q6_K) else 608          # 5 super-blocks / 19 blocks per row
    raw, x, p, xd = _case(qtype, 21, k, 5, torch.float32, seed=31)
    d = p.arrays["d"]
    assert d.numel() % 2 and d.untyped_storage().nbytes() >= (d.numel() + 1) * 2   # the last word is allocated
    nblk = k // kernels.GEOMETRY[qtype][0]
    g_small = 4 if qtype != QT.Q6_K else 8

    def agree(run, cfg):
        ref = run(dict(cfg, scale_words=0))
        for words in (1, 2, 3):                     # bit 0: the f16 fields as words, bit 1: the byte fields
            y = run(dict(cfg, scale_words=words))
            assert (y - ref).abs().max().item() <= 1e-6 * ref.abs().max().item(), (cfg, words)
        return ref

    base = kernels.gemv_config(p, xd.device)
    _variants_agree(agree, (base, dict(base, G=g_small, per=2 * g_small, split=-(-nblk // (2 * g_small)))),
                    raw, x, p, xd, qtype, k)


@pytest.mark.parametrize("qtype", PACKED_TYPES, ids=IDS)
def test_row_run_agrees(qtype):
    """Each row's words of a step loaded as one run (cfg row_run, `_load_step_words`) give the values of the
    (rows, blocks, words) load: GEMV and dot, both orientations, unsplit and split-K with short last splits
    (masked blocks inside a run). Equal on the CPU interpreter; on a GPU the two compile to different instruction
    orders, and an fp32 multiply-add contracted one way and not the other can move a decoded weight across a bf16
    rounding boundary: a few weights one bf16 step apart (measured on the H200: up to 1.1e-4 of max |y| for Q6_K at
    the 27B shapes), where one wrong block would be ~1e-2."""
    k = 1280 if qtype in (QT.Q4_K, QT.Q5_K, QT.Q6_K) else 608
    tol = 1e-6 if DEV == "cpu" else 5e-4
    raw, x, p, xd = _case(qtype, 21, k, 5, torch.float32, seed=33)
    nblk = k // kernels.GEOMETRY[qtype][0]

    def agree(run, cfg):
        ref = run(dict(cfg, row_run=False))
        y = run(dict(cfg, row_run=True))
        assert (y - ref).abs().max().item() <= tol * ref.abs().max().item(), cfg
        return y

    g = kernels.gemv_config(p, xd.device)
    _variants_agree(agree, (g, dict(g, per=g["G"], split=-(-nblk // g["G"]))), raw, x, p, xd, qtype, k)


@pytest.mark.parametrize("qtype", PACKED_TYPES, ids=IDS)
def test_gemv_row_pair_agrees(qtype):
    """A 2-row GEMV tile run as two one-row tiles sharing x (cfg row_pair) gives the (2, G) tile's output: an odd
    row count (the last program's second row clamped and not stored), unsplit and split-K with a short last split,
    with and without row runs, and with a bias; against the reference too."""
    k = 1280 if qtype in (QT.Q4_K, QT.Q5_K, QT.Q6_K) else 608
    tol = 1e-6 if DEV == "cpu" else 1e-5
    raw, x, p, xd = _case(qtype, 21, k, 1, torch.float32, seed=35)
    bias = torch.randn(21, device=xd.device)
    nblk = k // kernels.GEOMETRY[qtype][0]
    base = dict(kernels.gemv_config(p, xd.device), BLOCK_N=2)
    g = base["G"]
    for cfg in (base, dict(base, per=g, split=-(-nblk // g))):
        for row_run in (False, True):
            c = dict(cfg, row_run=row_run)
            ref = kernels.gemv(xd, p, dict(c, row_pair=False), bias=bias)
            y = kernels.gemv(xd, p, dict(c, row_pair=True), bias=bias)
            assert (y - ref).abs().max().item() <= tol * ref.abs().max().item(), (cfg["split"], row_run)
    _check(y - bias, x, raw, qtype, k, torch.float32)
    with pytest.raises(ValueError, match="row_pair needs BLOCK_N 2"):
        kernels.gemv(xd, p, dict(base, BLOCK_N=4, row_pair=True))


def test_fused_linear_runs_two_block_types_as_one_launch(monkeypatch):
    """A DeltaNet in_proj as the 27B has it (qkv Q5_K; z, beta, alpha Q4_K, stacked into one weight): with GEMV_TWO
    a one-token x carrying its int8 rows gets both parts from one `gemv_two` launch, the same bits as each part's own
    GEMV; without its int8 rows, or with two tokens, each part runs on its own."""
    from dflash24.quant.linear import FusedLinear, QuantLinear
    k = 512
    lins = []
    for i, (q, n) in enumerate(((QT.Q5_K, 12), (QT.Q4_K, 6), (QT.Q4_K, 3), (QT.Q4_K, 3))):
        raw = random_raw(q, n, k, generator=torch.Generator().manual_seed(80 + i), d_scale=0.01)
        lins.append(QuantLinear(k, n, q, packed=pack(raw.to(DEV), q, k)))
    fused = FusedLinear(*lins)
    assert len(fused.parts) == 2
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(90)).to(DEV)
    w4, dx, xs = kernels.quantize_x(x.reshape(-1), QT.Q4_K)
    setattr(x, kernels.INT8_ATTR, kernels.Int8Rows(w4, kernels.quantize_x(x.reshape(-1), QT.Q6_K)[0], dx, xs))
    calls = []
    real = kernels.gemv_two
    monkeypatch.setattr(kernels, "gemv_two", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setattr(kernels, "GEMV_TWO", False)
    ref = fused(x)
    monkeypatch.setattr(kernels, "GEMV_TWO", True)
    out = fused(x)
    assert calls == [1]
    assert [o.shape for o in out] == [(1, 12), (1, 6), (1, 3), (1, 3)]
    assert all(torch.equal(a, b) for a, b in zip(out, ref))
    fused(x.clone())                                  # no int8 rows on it
    fused(torch.randn(2, k).to(DEV))                  # two tokens: the small-M path
    assert calls == [1]


@pytest.mark.parametrize("qa,qb", [(QT.Q5_K, QT.Q4_K), (QT.Q4_K, QT.Q6_K), (QT.Q6_K, QT.Q5_0)], ids=str)
def test_gemv_two_gives_each_weights_gemv_bits(qa, qb):
    """Two weights of one x in one launch (`gemv_two`, the 27B's DeltaNet qkv Q5_K with its z / beta / alpha Q4_K,
    an attention layer's q / k Q4_K with a Q6_K v): each output the same bits as that weight's own GEMV, odd row
    counts (a last pair's second row clamped and not stored), with x's int8 rows made ahead and without."""
    k = 1024
    raw_a, x, pa, xd = _case(qa, 13, k, 1, torch.float32, seed=61)
    raw_b, _, pb, _ = _case(qb, 7, k, 1, torch.float32, seed=62)
    assert kernels.gemv_two_ok(pa, pb, xd.device)
    w4, dx, xs = kernels.quantize_x(xd.reshape(-1), QT.Q4_K)
    rows = kernels.Int8Rows(w4, kernels.quantize_x(xd.reshape(-1), QT.Q6_K)[0], dx, xs)
    for int8 in (rows, None):
        ya, yb = kernels.gemv_two(xd, pa, pb, int8=int8)
        assert ya.shape == (1, 13) and yb.shape == (1, 7)
        assert torch.equal(ya, kernels.gemv(xd, pa, int8=rows))
        assert torch.equal(yb, kernels.gemv(xd, pb, int8=rows))
    _check(ya, x, raw_a, qa, k, torch.float32)
    _check(yb, x, raw_b, qb, k, torch.float32)
    _, _, pc, _ = _case(qb, 7, 2 * k, 1, torch.float32, seed=63)
    assert not kernels.gemv_two_ok(pa, pc, xd.device)
    with pytest.raises(ValueError, match="gemv_two: needs two weights of K=1024"):
        kernels.gemv_two(xd, pa, pc)


def test_gemv_two_runs_a_weight_that_alone_splits_k_unsplit(monkeypatch):
    """A weight too short to fill the GPU alone splits K in its own GEMV (the 27B attention's Q6_K v: 1,024 rows, 2
    splits and a sum launch); `gemv_two` still takes it with its partner and runs both unsplit: each output the
    bits of that weight's unsplit GEMV, within fp32 summation order of its split one."""
    monkeypatch.setattr(kernels, "_GEMV_WAVES", 64)               # as if the GPU had many more SMs than rows
    k = 4096                                                      # 4 steps: 2 splits of 2
    raw_a, x, pa, xd = _case(QT.Q4_K, 40, k, 1, torch.float32, seed=64)
    raw_b, _, pb, _ = _case(QT.Q6_K, 8, k, 1, torch.float32, seed=65)
    ca, cb = kernels.gemv_config(pa, xd.device), kernels.gemv_config(pb, xd.device)
    assert ca["split"] > 1 and cb["split"] > 1
    assert kernels.gemv_two_ok(pa, pb, xd.device)
    ya, yb = kernels.gemv_two(xd, pa, pb)
    assert torch.equal(ya, kernels.gemv(xd, pa, kernels.gemv_config(pa, xd.device, unsplit=True)))
    assert torch.equal(yb, kernels.gemv(xd, pb, kernels.gemv_config(pb, xd.device, unsplit=True)))
    torch.testing.assert_close(yb, kernels.gemv(xd, pb), rtol=1e-5, atol=1e-5 * yb.abs().max().item())
    _check(yb, x, raw_b, QT.Q6_K, k, torch.float32)


@pytest.mark.parametrize("qtype", PACKED_TYPES, ids=IDS)
def test_gemv_unrolled_loop_gives_the_same_bits(qtype):
    """The GEMV loop unrolled (cfg unroll, kernels._GEMV_UNROLL) sums the same steps in the same order: the same bits
    as the plain loop, with a step count the factor does not divide (a remainder loop), split-K, 1- and 2-row tiles."""
    k = 1792
    raw, x, p, xd = _case(qtype, 5, k, 1, torch.float32, seed=41)
    g = k // kernels.GEOMETRY[qtype][0] // 7                # 7 steps of 8 (Q6_K: 16) blocks, split 5 + 2
    base = dict(kernels.gemv_config(p, xd.device), G=g, per=5 * g, split=2)
    for bn, pair in ((1, False), (2, True)):
        c = dict(base, BLOCK_N=bn, row_pair=pair)
        ref = kernels.gemv(xd, p, dict(c, unroll=1))
        assert torch.equal(kernels.gemv(xd, p, dict(c, unroll=3)), ref), bn
    _check(ref, x, raw, qtype, k, torch.float32)


@pytest.mark.parametrize("qtype", PACKED_TYPES, ids=IDS)
def test_gemv_prefetched_loop_gives_the_same_bits(qtype):
    """The row-pair GEMV with the next step's tiles loaded before this step's sums (cfg prefetch, a register double
    buffer) sums the same steps in the same order: the same bits as the plain loop, for an odd row count, unsplit
    and split-K with a short last split, with and without row runs, masked and on whole steps (cfg whole: unmasked
    loads, two steps an iteration), and two steps ahead on whole steps (prefetch 2: three buffers, three steps an
    iteration, 0, 1 or 2 steps left after the loop); it needs the row-pair plain loop, whole needs whole steps, and
    two steps ahead needs whole steps."""
    k = 1792
    raw, x, p, xd = _case(qtype, 5, k, 1, torch.float32, seed=43)
    g = k // kernels.GEOMETRY[qtype][0] // 7                # 7 steps of 8 (Q6_K: 16) blocks
    base = dict(kernels.gemv_config(p, xd.device), BLOCK_N=2, G=g, row_pair=True, stages=1)
    for split in ({"split": 1, "per": 7 * g}, {"split": 2, "per": 5 * g}, {"split": 3, "per": 3 * g}):
        for row_run in (False, True):
            c = dict(base, row_run=row_run, **split)
            ref = kernels.gemv(xd, p, dict(c, prefetch=0, whole=False))
            assert torch.equal(kernels.gemv(xd, p, dict(c, prefetch=1, whole=False)), ref), (split, row_run)
            # whole steps (7 unsplit; 5 + 2 and 3 + 3 + 1 split): no masks; prefetched one step ahead, two steps an
            # iteration and an odd last one; two steps ahead, three steps an iteration and 1 / 2 / 0 left after it
            for prefetch in (0, 1, 2):
                assert torch.equal(kernels.gemv(xd, p, dict(c, prefetch=prefetch, whole=True)), ref), \
                    (split, row_run, prefetch)
    _check(ref, x, raw, qtype, k, torch.float32)
    with pytest.raises(ValueError, match="prefetch needs the row-pair GEMV"):
        kernels.gemv(xd, p, dict(base, row_pair=False, prefetch=1))
    with pytest.raises(ValueError, match="whole steps"):
        kernels.gemv(xd, p, dict(base, split=2, per=5 * g - 1, whole=True))
    with pytest.raises(ValueError, match="2 on whole steps only"):
        kernels.gemv(xd, p, dict(base, split=1, per=7 * g, prefetch=2, whole=False))


def test_gemv_prefetch_is_chosen_for_long_k_only(monkeypatch):
    """DFLASH24_GEMV_PREFETCH (kernels.GEMV_PREFETCH): the GEMV config prefetches, with its type's register cap, on
    weights of K >= _GEMV_PREFETCH_MIN_K (the 27B's ffn_down) and nowhere else; gemv_two takes two weights that both
    prefetch (not one that does with one that does not); the outputs keep their bits."""
    k_long = kernels._GEMV_PREFETCH_MIN_K
    raw, x, p, xd = _case(QT.Q4_K, 3, k_long, 1, torch.float32, seed=44)
    p6 = _case(QT.Q6_K, 5, k_long, 1, torch.float32, seed=46)[2]
    p50 = _case(QT.Q5_0, 5, k_long, 1, torch.float32, seed=47)[2]
    short = _case(QT.Q4_K, 3, 512, 1, torch.float32, seed=45)[2]
    monkeypatch.setattr(kernels, "_GEMV_WAVES", 0)            # unsplit, as the 27B's many rows are
    monkeypatch.setattr(kernels, "GEMV_PREFETCH", False)
    ref, ref6 = kernels.gemv(xd, p), kernels.gemv(xd, p6)
    assert not kernels.gemv_config(p, xd.device)["prefetch"]
    monkeypatch.setattr(kernels, "GEMV_PREFETCH", True)
    cfg = kernels.gemv_config(p, xd.device)
    assert cfg["prefetch"] == 1 and cfg["maxnreg"] == kernels._GEMV_PREFETCH_REGS[QT.Q4_K]
    monkeypatch.setattr(kernels, "_GEMV_AHEAD", {QT.Q4_K: 2})              # two steps ahead where steps are whole
    assert kernels.gemv_config(p, xd.device)["prefetch"] == 2 and torch.equal(kernels.gemv(xd, p), ref)
    monkeypatch.setattr(kernels, "GEMV_WHOLE", False)
    assert kernels.gemv_config(p, xd.device)["prefetch"] == 1
    monkeypatch.setattr(kernels, "GEMV_WHOLE", True)
    monkeypatch.setattr(kernels, "_GEMV_AHEAD", {})
    assert not kernels.gemv_config(short, xd.device)["prefetch"]
    assert not kernels.gemv_config(p50, xd.device)["prefetch"]
    assert not kernels.gemv_two_ok(p, p50, xd.device)
    assert torch.equal(kernels.gemv(xd, p), ref)
    ya, yb = kernels.gemv_two(xd, p, p6)
    assert torch.equal(ya, ref) and torch.equal(yb, ref6)


@pytest.mark.parametrize("lop3", [False, True], ids=["", "lop3"])
@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q5_0, QT.Q4_K, QT.Q5_K, QT.Q6_K], ids=IDS)
def test_bf16_pairs_agree(qtype, lop3, monkeypatch):
    """The dot kernel's PAIRS decode (two 4- to 6-bit weights per 32-bit op, bf16 fma with A and B rounded to bf16:
    kernels._bf16_pairs) against the reference and against the per-field decode: M = 5 / 16 / 23, both
    orientations, unsplit and split-K at every step (short last splits). The two decodes differ by at most a bf16
    step on a weight (A and B rounded first); a field pair taken in the wrong order or from the wrong word would be
    off by the size of the weights themselves (~1 of max |y|). lop3: the GPU's PAIRS 3 at every M
    (kernels._PAIRS_LOP3_FROM; the CPU interpreter runs one arithmetic for both), else PAIRS 1 at every M."""
    if lop3 and DEV == "cpu":
        pytest.skip("PAIRS 1 and 3 differ only in their PTX")
    monkeypatch.setattr(kernels, "_PAIRS_LOP3_FROM", 0 if lop3 else 1 << 30)
    k = 608 if qtype in (QT.Q4_0, QT.Q5_0) else 1280
    nblk = k // kernels.GEOMETRY[qtype][0]
    for m in (5, 16, 23):
        raw, x, p, xd = _case(qtype, 21, k, m, torch.bfloat16, seed=40 + m)
        for split in (False, True):
            cfg = kernels.dot_config(p, m, xd.device)
            if split:
                cfg = _split_every_step(cfg, nblk)
            for w_as_a in (False, True):
                c = dict(cfg, w_as_a=w_as_a)
                assert kernels._pairs(dict(c, pairs=True), p, xd) == (2 if DEV == "cpu" else 3 if lop3 else 1)
                plain = kernels.matmul(xd, p, dict(c, pairs=False)).float()
                y = kernels.matmul(xd, p, dict(c, pairs=True))
                _check(y, x, raw, qtype, k, torch.bfloat16)
                err = (y.float() - plain).abs().max().item()
                assert err <= 1e-2 * plain.abs().max().item(), (m, split, w_as_a, err)


def _pair_order_cases(qtype, k, seed):
    """(m, split, w_as_a, raw, x, p, xd, xp, cfg): M = 5 / 16 / 23, x in bf16 and in pair_order (xp), the PAIRS dot
    config unsplit and split at every step, in both orientations."""
    nblk = k // kernels.GEOMETRY[qtype][0]
    for m in (5, 16, 23):
        raw, x, p, xd = _case(qtype, 21, k, m, torch.bfloat16, seed=seed + m)
        xp = kernels.pair_order(xd, qtype).contiguous()
        for split in (False, True):
            cfg = dict(kernels.dot_config(p, m, xd.device), pairs=True)
            if split:
                cfg = _split_every_step(cfg, nblk)
            for w_as_a in (False, True):
                yield m, split, w_as_a, raw, x, p, xd, xp, dict(cfg, w_as_a=w_as_a)


def test_bf16_pairs_field_form(monkeypatch):
    """The PAIRS decode's field form for Q4_K (kernels.PAIRS_FIELD: halves 1 + q / 16, one bf16x2 fma with a and b)
    against the fp32 reference within the bf16 bound (TOL) and within it of the integer form's rows. A field pair
    shifted to the wrong bits or taken from the wrong word is off by the weights' own size (~1 of max |y|). x in pair
    order and not, both orientations, split at every step."""
    qtype, k = QT.Q4_K, 512
    for m, split, w_as_a, raw, x, p, xd, xp, c in _pair_order_cases(qtype, k, 70):
        ref = kernels.reference_matmul(x, raw, qtype, k)
        scale = ref.abs().max().item()
        monkeypatch.setattr(kernels, "PAIRS_FIELD", False)
        integer = kernels._matmul_dot(xd, p, c, torch.float32, None, x_pairs=xp).cpu()
        monkeypatch.setattr(kernels, "PAIRS_FIELD", True)
        assert kernels._pairs(c, p, xd) == (5 if DEV == "cpu" else 4)
        for x_pairs in (xp, None):
            field = kernels._matmul_dot(xd, p, c, torch.float32, None, x_pairs=x_pairs).cpu()
            assert (field - ref).abs().max().item() <= TOL[torch.bfloat16] * scale, (m, split, w_as_a)
            assert (field - integer).abs().max().item() <= TOL[torch.bfloat16] * scale, (m, split, w_as_a)


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q5_0, QT.Q4_K, QT.Q5_K, QT.Q6_K], ids=IDS)
def test_pair_order_x_gives_the_same_rows(qtype):
    """XPERM: x handed to the dot kernel in `pair_order` (each pair's x one contiguous run). With x as the dot's
    first operand the products meet in the same K order as when x is permuted in registers: the same bits. With
    the weights first (W_AS_A) the in-register path permutes the weights instead (another K order): within fp32
    summation error. Unsplit and split at every step."""
    k = 512
    for m, split, w_as_a, raw, x, p, xd, xp, c in _pair_order_cases(qtype, k, 60):
        plain = kernels._matmul_dot(xd, p, c, torch.float32, None)
        mine = kernels._matmul_dot(xd, p, c, torch.float32, None, x_pairs=xp)
        if w_as_a:
            assert (mine - plain).abs().max().item() <= 1e-5 * plain.abs().max().item(), (m, split)
        else:
            assert torch.equal(mine, plain), (m, split)
        _check(mine, x, raw, qtype, k, torch.bfloat16)


def test_pair_order_needs_whole_steps():
    x = torch.randn(2, 608, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="K % 256"):
        kernels.pair_order(x, QT.Q4_0)
    with pytest.raises(ValueError, match="8 fields a word"):
        kernels.pair_order(torch.randn(2, 512), QT.Q8_0)
    # the permutation moves columns only: each row keeps its values
    y = kernels.pair_order(torch.arange(2 * 512.0).reshape(2, 512), QT.Q4_K)
    assert torch.equal(y.sort(dim=1).values, torch.arange(2 * 512.0).reshape(2, 512))


def test_bf16_pairs_round_to_nearest_even():
    """The interpreter's PAIRS arithmetic rounds to bf16 as the GPU does (to nearest, ties to even): Triton's CPU
    interpreter itself truncates fp32 -> bf16 (toward zero), which shrank every PAIRS output by ~0.2 % of max |y| and
    failed a 1 % bound with the bf16 store's own truncation on top (test_bias_and_output_dtype_in_the_store)."""
    raw, x, p, xd = _case(QT.Q4_K, 24, 512, 5, torch.bfloat16, seed=36)
    ref = kernels.reference_matmul(x, raw, QT.Q4_K, 512)
    cfg = dict(kernels.dot_config(p, 5, xd.device), pairs=True)
    err = kernels.matmul(xd, p, cfg, out_dtype=torch.float32).float().cpu() - ref
    # the mean error toward zero, relative to the mean |y|: about 5e-3 with truncated A, B and weights (3e-4 here
    # with rounding to nearest); a bf16 step is 2^-8 relative, so 2^-10 splits the two
    shrink = (err * ref.sign()).mean().item() / ref.abs().mean().item()
    assert abs(shrink) <= 2 ** -10, shrink
    assert err.abs().max().item() <= 4e-3 * ref.abs().max().item()


def test_bf16_pairs_only_for_codes_below_128_and_bf16():
    raw, x, p, xd = _case(QT.Q4_K, 8, 256, 4, torch.float32, seed=1)
    cfg = dict(kernels.dot_config(p, 4, xd.device), pairs=True)
    assert kernels._pairs(cfg, p, xd) == 0                        # fp32 x: the pairs are bf16
    assert kernels._pairs(cfg, p, xd.to(torch.bfloat16)) in (1, 2)
    assert kernels._pairs(dict(cfg, pairs=False), p, xd.to(torch.bfloat16)) == 0
    raw, x, q, xd = _case(QT.Q8_0, 8, 256, 4, torch.bfloat16, seed=1)
    assert kernels._pairs(cfg, q, xd) == 0                        # Q8_0's bytes: 128 + q is not exact in bf16


def test_scale_words_fall_back_on_unaligned_rows(monkeypatch):
    """Byte scale rows whose starts are not 4-byte aligned (a row stride not a multiple of 4) are read as bytes,
    not words (a word would straddle two rows): the config drops WORDS bit 1 and the output stays right."""
    from dflash24.quant.packed import PackedWeight
    k = 1280
    raw, x, p, xd = _case(QT.Q4_K, 21, k, 1, torch.float32, seed=32)
    arrays = dict(p.arrays)
    for name in ("sc", "mn"):
        wide = torch.zeros((21, k // 32 + 1), dtype=arrays[name].dtype, device=arrays[name].device)
        wide[:, : k // 32] = arrays[name]
        arrays[name] = wide[:, : k // 32]                      # row stride k / 32 + 1 = 41 bytes
    q = PackedWeight(QT.Q4_K, 21, k, arrays)
    monkeypatch.setitem(kernels._SCALE_WORDS, QT.Q4_K, (3, 3))
    assert kernels.dot_config(p, 5, xd.device)["scale_words"] == 3
    assert kernels.dot_config(q, 5, xd.device)["scale_words"] == 1
    cfg = dict(kernels.gemv_config(p, xd.device), scale_words=kernels._scale_words(q, 0))
    assert cfg["scale_words"] == 1
    ref = kernels.gemv(xd, p, dict(cfg, scale_words=0))
    assert (kernels.gemv(xd, q, cfg) - ref).abs().max().item() <= 1e-6 * ref.abs().max().item()


@pytest.mark.parametrize("qtype", PACKED_TYPES, ids=IDS)
def test_dequant_rows_every_tile(qtype):
    """The large-M path's dequantization (benchmarks/tune_dequant.py sweeps its tile) writes exactly the
    reference weight (to fp32 rounding: K-quants fold d * scale and dmin * min into one multiply-add), for any
    rows window, tile height and blocks per program (tail tiles in both dims)."""
    from dflash24.quant.formats import dequantize
    k = _cols(qtype)
    raw = random_raw(qtype, 37, k, generator=torch.Generator().manual_seed(11), d_scale=0.01)
    ref = dequantize(raw, qtype, k).reshape(37, k)
    p = pack(raw.to(DEV), qtype, k)
    bs = kernels.GEOMETRY[qtype][0]
    for cfg in (None, dict(BLOCK_N=8, G=max(1, 1024 // bs), num_warps=2), dict(BLOCK_N=32, G=1, num_warps=8)):
        out = torch.full((40, k), float("nan"), device=DEV)
        kernels.dequant_rows(p, 5, 37, out, cfg)
        err = (out[:32].cpu() - ref[5:37].float()).abs().max().item()
        assert err <= 1e-6 * ref.abs().max().item(), (cfg, err)
        assert out[32:].isnan().all()                   # rows past row1 - row0 untouched


def test_large_m_scratch_follows_the_prefill_plan(monkeypatch):
    """The large-M path dequantizes SCRATCH_BYTES pieces; inside `scratch_plan(rows, row_bytes)` a matmul of m < rows
    rows takes (rows - m) * row_bytes (the memory the plan holds for its missing rows), so fewer pieces, the same
    product; at m >= rows, or after the block (also when it raised), SCRATCH_BYTES again."""
    k, n, m = 256, 600, 80
    raw, x, p, xd = _case(QT.Q4_K, n, k, m, torch.float32, seed=7)
    monkeypatch.setattr(kernels, "SCRATCH_BYTES", 1)             # the smallest pieces: 256 rows
    pieces = []
    dequant_rows = kernels.dequant_rows

    def recording(p_, row0, row1, out, cfg=None):
        pieces.append((row0, row1))
        return dequant_rows(p_, row0, row1, out, cfg)
    monkeypatch.setattr(kernels, "dequant_rows", recording)

    def run():
        pieces.clear()
        return kernels.quant_matmul(xd, p).cpu()
    y = run()
    assert pieces == [(0, 256), (256, 512), (512, 600)]
    _check(y, x, raw, QT.Q4_K, k, torch.float32)
    with kernels.scratch_plan(m + 1, 512 * k * 4):               # one spare row of 512 fp32 weight rows
        assert kernels.scratch_bytes(m) == 512 * k * 4 and kernels.scratch_bytes(m + 1) == 1
        y_two = run()
        assert pieces == [(0, 512), (512, 600)]
        with kernels.scratch_plan(m + 2, 1 << 30):               # nested: the inner plan, then the outer again
            y_one = run()
            assert pieces == [(0, 600)]
        run()
        assert pieces == [(0, 512), (512, 600)]
    with kernels.scratch_plan(m, 1 << 30):                       # a full chunk: nothing spare
        run()
        assert pieces == [(0, 256), (256, 512), (512, 600)]
    with pytest.raises(RuntimeError), kernels.scratch_plan(4096, 1 << 30):
        raise RuntimeError("a failed prefill")
    assert kernels.SCRATCH_PLAN == (0, 0) and kernels.scratch_bytes(m) == 1
    for other in (y_two, y_one):
        assert (other - y).abs().max().item() <= 1e-5 * y.abs().max().item()


@pytest.mark.parametrize("m", [3, 23])
@pytest.mark.parametrize("qtype", PACKED_TYPES, ids=IDS)
def test_dot_weights_as_first_operand(qtype, m):
    """The dot kernel's W_AS_A variant (y^T = W . x^T; a launch-config choice the sweep times) gives the same
    values as the other orientation, unsplit and split-K with a bias."""
    k = _cols(qtype)
    raw, x, p, xd = _case(qtype, 40, k, m, torch.float32, seed=70 + m)
    bias = torch.randn(40, generator=torch.Generator().manual_seed(5)).to(DEV)
    nblk = k // kernels.GEOMETRY[qtype][0]
    for split in (False, True):
        cfg = kernels.dot_config(p, m, xd.device)
        if split:
            cfg = _split_every_step(cfg, nblk)
        base = kernels.matmul(xd, p, dict(cfg, w_as_a=False), bias=bias)
        swapped = kernels.matmul(xd, p, dict(cfg, w_as_a=True), bias=bias)
        assert torch.allclose(swapped, base, rtol=0, atol=1e-5 * base.abs().max().item())
    _check(swapped - bias, x, raw, qtype, k, torch.float32)


@pytest.mark.parametrize("n_tiles, steps, programs", [(2, 5, 3), (2, 5, 4), (3, 7, 4), (5, 3, 7), (136, 20, 264),
                                                      (40, 68, 396), (96, 20, 264), (1, 20, 8), (4, 1, 9), (3, 2, 2)])
def test_stream_split_covers_every_step_once(n_tiles, steps, programs):
    """The STREAM split (`stream_split` and the arithmetic the dot kernel and the partial sum share): the programs'
    runs tile the steps end to end, each at least 2 steps long where there are 2; every row tile's pieces land in
    distinct slots below the slot count, and the sum kernel's count of a tile's slots is the number written."""
    total = n_tiles * steps
    p_count, slots = kernels.stream_split(n_tiles, steps, programs)
    assert 1 <= p_count <= programs
    runs = [(p * total // p_count, (p + 1) * total // p_count) for p in range(p_count)]
    assert runs[0][0] == 0 and runs[-1][1] == total
    assert all(a[1] == b[0] for a, b in zip(runs, runs[1:]))
    assert all(s1 - s0 >= min(2, total) for s0, s1 in runs)
    written: dict[int, list[int]] = {}
    for p, (s0, s1) in enumerate(runs):
        for t in range(s0 // steps, (s1 - 1) // steps + 1):
            first = ((t * steps + 1) * p_count - 1) // total            # as the kernel computes it
            assert runs[first][0] <= t * steps < runs[first][1]
            written.setdefault(t, []).append(p - first)
    assert sorted(written) == list(range(n_tiles))
    for t, used in written.items():
        assert used == list(range(len(used))) and len(used) <= slots
        first = ((t * steps + 1) * p_count - 1) // total
        assert ((t * steps + steps) * p_count - 1) // total - first + 1 == len(used)     # the sum kernel's count
    assert slots - 1 <= max(len(u) for u in written.values()) <= slots             # a bound at most one over


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K, QT.Q8_0], ids=IDS)
def test_stream_split_gives_the_split_k_rows(qtype):
    """The dot kernel with the STREAM split (programs whose runs cross row tiles, row tiles split among up to three
    programs, a partial last row tile, a bias) gives the plain split's values, in both orientations, and the
    reference's."""
    k = 1280 if qtype in (QT.Q4_K, QT.Q5_K, QT.Q6_K) else 608
    m = 5
    raw, x, p, xd = _case(qtype, 40, k, m, torch.float32, seed=91)
    bias = torch.randn(40, generator=torch.Generator().manual_seed(6)).to(DEV)
    base = dict(kernels.dot_config(p, m, xd.device), BLOCK_N=16, stream=0)          # 3 row tiles, the last short
    spt = -(-(k // kernels.GEOMETRY[qtype][0]) // base["G"])
    plain = kernels.matmul(xd, p, base, bias=bias)
    for want in (4, 7):
        programs, slots = kernels.stream_split(3, spt, want)
        assert slots >= 2
        for w_as_a in (False, True):
            cfg = dict(base, stream=programs, split=slots, w_as_a=w_as_a)
            y = kernels.matmul(xd, p, cfg, bias=bias)
            assert (y - plain).abs().max().item() <= 1e-5 * plain.abs().max().item(), (want, w_as_a)
    _check(y - bias, x, raw, qtype, k, torch.float32)


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K, QT.Q8_0], ids=IDS)
def test_decode_matmul_dot_matches_verify_rows(qtype, monkeypatch):
    """DFLASH24_DECODE_MATMUL=dot: a one-token matmul takes the verify path, so its row equals row 0 of a
    16-token step to fp32 rounding (the int8 GEMV differs by its activation rounding)."""
    k = _cols(qtype)
    raw, x, p, xd = _case(qtype, 40, k, 16, torch.float32, seed=90)
    block = kernels.quant_matmul(xd, p)
    monkeypatch.setattr(kernels, "DECODE_MATMUL", "dot")
    one = kernels.quant_matmul(xd[:1], p)
    scale = block.abs().max().item()
    assert (one - block[:1]).abs().max().item() <= 1e-6 * scale
    monkeypatch.setattr(kernels, "DECODE_MATMUL", "gemv")
    assert (kernels.quant_matmul(xd[:1], p) - block[:1]).abs().max().item() > 1e-5 * scale


def test_paths_by_m():
    """quant_matmul picks GEMV for M=1 and the dot kernel otherwise; both agree on the same row (within
    the int8-activation bound of the GEMV)."""
    raw, x, p, xd = _case(QT.Q4_K, 32, 512, 16, torch.float32, seed=5)
    y16 = kernels.quant_matmul(xd, p)
    y1 = kernels.quant_matmul(xd[:1], p)
    assert torch.allclose(y1.cpu(), y16[:1].cpu(), rtol=0, atol=INT8_ACT_TOL * y16.abs().max().item())
    ref = kernels.reference_matmul(_rounded_x(x[:1]), raw, QT.Q4_K, 512)
    assert torch.allclose(y1.cpu(), ref, rtol=0, atol=TOL_INT8_EXACT[torch.float32] * ref.abs().max().item())


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q6_K], ids=IDS)
def test_quantize_x_matches_reference(qtype):
    """The int8 activation codes, their scales and their 16-value sums equal the PyTorch reference
    exactly, and the packed words hold the codes in the order the weight words pair with."""
    g = torch.Generator().manual_seed(21)
    x = (torch.randn(256, generator=g) * torch.linspace(0.01, 30, 256)).to(DEV)
    x[32:64] = 0                                      # an all-zero block: scale 0, codes 0
    xw, dx, xs = kernels.quantize_x(x, qtype)
    q, dx_ref = kernels.reference_quantize_x(x.cpu())
    assert torch.equal(dx.cpu(), dx_ref)
    assert torch.equal(xs.cpu(), q.reshape(-1, 16).sum(1).to(torch.int32))
    assert int(q.abs().max()) == 127
    codes = (xw.cpu().view(torch.int8).reshape(-1, 8, 4)).to(torch.int32)    # (blocks, word j, byte i)
    j = torch.arange(8).view(8, 1)
    i = torch.arange(4).view(1, 4)
    # Q6_K's 16-blocks: words 0-3 hold the x of the even fields of both blocks' two weight words, 4-7 the odd
    pos = j + 8 * i if qtype != QT.Q6_K else 16 * ((j // 2) % 2) + 2 * (j // 4) + j % 2 + 4 * i
    assert torch.equal(codes, q.reshape(-1, 32)[:, pos])


def _rounded_rows(x: torch.Tensor) -> torch.Tensor:
    """x (M, K) as the int8 paths see it, row by row (_rounded_x)."""
    return torch.cat([_rounded_x(row) for row in x])


@pytest.mark.parametrize("m", [2, 16, 23, 64])
@pytest.mark.parametrize("qtype", PACKED_TYPES, ids=IDS)
def test_mmq_vs_reference_tiny(qtype, m):
    """The int8 tensor-core small-M kernel: exact integer sums per block, so on the int8-rounded x it equals
    the reference to fp32 rounding (unsplit, and split-K with a shorter last split, with a bias), and on x itself
    it stays within the int8 activation bound."""
    k = _cols(qtype)
    raw, x, p, xd = _case(qtype, 40, k, m, torch.float32, seed=130 + m)
    bias = torch.randn(40, generator=torch.Generator().manual_seed(6)).to(DEV)
    ref = kernels.reference_matmul(_rounded_rows(x), raw, qtype, k)
    full = kernels.reference_matmul(x, raw, qtype, k)
    for split in (False, True):
        cfg = kernels.mmq_config(p, m, xd.device)
        if split:                                    # 3 groups per split, a shorter last split
            cfg.update(split=-(-(k // 32) // 3), per=3)
        else:
            cfg.update(split=1, per=k // 32)
        y = (kernels.matmul(xd, p, cfg, bias=bias) - bias).cpu()
        err = (y - ref).abs().max().item()
        assert err <= TOL_INT8_EXACT[torch.float32] * ref.abs().max().item(), f"{qtype.name} M={m} split={split}: {err:.3g}"
        assert (y - full).abs().max().item() <= INT8_ACT_TOL * full.abs().max().item()


@pytest.mark.parametrize("qtype", PACKED_TYPES, ids=IDS)
def test_quantize_xm_matches_the_gemv_codes(qtype):
    """Each row's int8 codes, scales and 16-value sums equal the GEMV's reference rounding exactly, stored in
    the order the mmq kernel's weight code tiles unpack to (byte t of a group: its low then its high nibble)."""
    g = torch.Generator().manual_seed(22)
    x = (torch.randn(3, 256, generator=g) * torch.linspace(0.01, 30, 256)).to(DEV)
    x[1, 32:64] = 0                                   # an all-zero group: scale 0, codes 0
    xq, dx, xs = kernels.quantize_xm(x, qtype)
    e = torch.arange(32)
    if qtype == QT.Q8_0:
        pos = 8 * (e % 4) + e // 4
    elif qtype == QT.Q6_K:
        t, tt = e // 2, (e // 2) % 8
        pos = 16 * (t // 8) + 4 * (tt % 4) + tt // 4 + 2 * (e % 2)
    else:
        t = e // 2
        pos = 8 * (t % 4) + t // 4 + 4 * (e % 2)
    assert sorted(pos.tolist()) == list(range(32))
    for i in range(3):
        q, dx_ref = kernels.reference_quantize_x(x[i].cpu())
        assert torch.equal(dx[i].cpu(), dx_ref)
        assert torch.equal(xs[i].cpu(), q.reshape(-1, 16).sum(1).to(torch.int32))
        assert torch.equal(xq[i].cpu().to(torch.int32).reshape(-1, 32), q.reshape(-1, 32)[:, pos])


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K, QT.Q8_0, QT.Q5_0], ids=IDS)
def test_mmq_rows_match_the_decode_gemv(qtype, monkeypatch):
    """With DFLASH24_SMALL_M_MATMUL=mmq a verify step's rows and the decode GEMV of the same token round x
    the same way and sum the same exact block integers: they agree to fp32 summation order (the bf16 dot path
    differs from the GEMV by the activation rounding, ~1e-2)."""
    k = _cols(qtype)
    raw, x, p, xd = _case(qtype, 40, k, 16, torch.float32, seed=91)
    monkeypatch.setattr(kernels, "SMALL_M_MATMUL", "mmq")
    block = kernels.quant_matmul(xd, p)
    scale = block.abs().max().item()
    for i in (0, 7, 15):
        one = kernels.quant_matmul(xd[i:i + 1], p)
        assert (one - block[i:i + 1]).abs().max().item() <= 2e-6 * scale


# ---------------------------------------------------------------------------------- GPU, real sizes
GPU_SHAPES = [(5120, 17408), (17408, 5120), (2048, 896)]


def _gpu_case(qtype, shape, m, seed):
    """Random blocks of a real shape and bf16 x on the GPU: (raw, x, packed); K-quants need K % 256 == 0."""
    n, k = shape
    if k % 256 and qtype in (QT.Q4_K, QT.Q5_K, QT.Q6_K):
        pytest.skip("K-quants need K % 256 == 0")
    g = torch.Generator().manual_seed(seed)
    raw = random_raw(qtype, n, k, generator=g, d_scale=0.01).cuda()
    x = torch.randn(m, k, generator=g).to(torch.bfloat16).cuda()
    return raw, x, pack(raw, qtype, k)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [1, 2, 16, 23, 64, 512])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("qtype", PACKED_TYPES, ids=IDS)
def test_kernel_vs_reference_gpu(qtype, shape, m):
    n, k = shape
    raw, x, p = _gpu_case(qtype, shape, m, seed=n + k + m)
    y = kernels.quant_matmul(x, p)
    if m == 1:                                        # GEMV: exact on the int8-rounded x, bounded on x
        ref = kernels.reference_matmul(_rounded_x(x).cuda(), raw, qtype, k)
        err = (y.float() - ref).abs().max().item()
        assert err <= TOL_INT8_EXACT[torch.bfloat16] * ref.abs().max().item(), f"{qtype.name} {shape}: {err}"
        full = kernels.reference_matmul(x, raw, qtype, k)
        assert (y.float() - full).abs().max().item() <= INT8_ACT_TOL * full.abs().max().item()
        return
    ref = kernels.reference_matmul(x, raw, qtype, k)                          # on the GPU (fp32)
    err = (y.float() - ref).abs().max().item()
    assert err <= TOL[torch.bfloat16] * ref.abs().max().item(), f"{qtype.name} {shape} M={m}: {err}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [2, 16, 23, 64])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("qtype", PACKED_TYPES, ids=IDS)
def test_mmq_vs_reference_gpu(qtype, shape, m):
    """The int8 tensor-core kernel at real sizes: exact on the int8-rounded x (fp32 output), bounded on x."""
    n, k = shape
    raw, x, p = _gpu_case(qtype, shape, m, seed=n + k + m + 1)
    y = kernels.matmul(x, p, kernels.mmq_config(p, m, x.device))
    ref = kernels.reference_matmul(_rounded_rows(x.float().cpu()).cuda(), raw, qtype, k)
    err = (y - ref).abs().max().item()
    assert err <= TOL_INT8_EXACT[torch.float32] * ref.abs().max().item(), f"{qtype.name} {shape} M={m}: {err}"
    full = kernels.reference_matmul(x, raw, qtype, k)
    assert (y - full).abs().max().item() <= INT8_ACT_TOL * full.abs().max().item()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [1, 16])
def test_cuda_graph_capture_gpu(m):
    raw, x, p, xd = _case(QT.Q4_K, 4096, 5120, m, torch.bfloat16, seed=11, device="cuda")
    y_eager = kernels.quant_matmul(xd, p)                                     # compiles
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_graph = kernels.quant_matmul(xd, p)
    xd.copy_(torch.randn_like(xd))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y_graph, kernels.quant_matmul(xd, p))
    assert not torch.equal(y_graph, y_eager)


@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("split", [False, True])
def test_bias_and_output_dtype_in_the_store(m, split):
    """Bias add and the cast to the layer's dtype happen in the kernel's store (unsplit) or after the
    split-K sum (split): both equal reference + bias, rounded once to bf16."""
    qtype, k = QT.Q4_K, 512
    raw, x, p, xd = _case(qtype, 24, k, m, torch.bfloat16, seed=31 + m)
    bias = (torch.randn(24, generator=torch.Generator().manual_seed(2)) * 5).to(DEV)
    if m == 1:
        cfg = kernels.gemv_config(p, xd.device)
        if split:
            cfg.update(G=4, split=4, per=4)
        y = kernels.gemv(xd, p, cfg, out_dtype=torch.bfloat16, bias=bias)
        ref = kernels.reference_matmul(_rounded_x(x), raw, qtype, k) + bias.cpu()
        tol = TOL_INT8_EXACT[torch.bfloat16]
    else:
        cfg = kernels.dot_config(p, m, xd.device)
        if split:
            cfg.update(split=2, per=8)
        y = kernels.matmul(xd, p, cfg, out_dtype=torch.bfloat16, bias=bias)
        ref = kernels.reference_matmul(x, raw, qtype, k) + bias.cpu()
        tol = TOL[torch.bfloat16]
    assert y.dtype == torch.bfloat16 and y.shape == (m, 24)
    assert (y.float().cpu() - ref).abs().max().item() <= tol * ref.abs().max().item()


@pytest.mark.parametrize("m", [1, 4])
def test_fp32_output_from_bf16_activations(m):
    """out_dtype=float32 (the LM head's logits): the store keeps the fp32 accumulator, so the result is not
    rounded to bf16 (bf16 logits tie often and a tie broken differently by decode and verify changes greedy
    output). Dense layers honour it too."""
    from dflash24.quant.linear import QuantLinear
    qtype, k = QT.Q6_K, 768
    raw, x, p, xd = _case(qtype, 24, k, m, torch.bfloat16, seed=7 + m)
    lin = QuantLinear(k, 24, qtype, packed=p)
    y32, y16 = lin(xd, out_dtype=torch.float32), lin(xd)
    assert y32.dtype == torch.float32 and y16.dtype == torch.bfloat16
    # the same accumulator, rounded once or not at all (within one bf16 step: the interpreter truncates)
    assert ((y32 - y16.float()).abs() <= y32.abs() * 2 ** -7 + 1e-6).all()
    assert (y32 != y32.to(torch.bfloat16).float()).any()     # ...and fp32 really carries more bits
    w = torch.randn(24, k, generator=torch.Generator().manual_seed(1))
    dense = QuantLinear(k, 24, QT.F32, weight=w)
    xf = torch.randn(m, k, generator=torch.Generator().manual_seed(2))
    assert torch.equal(dense(xf, out_dtype=torch.float32), torch.nn.functional.linear(xf, w))
    assert dense(xf.to(torch.bfloat16), out_dtype=torch.float32).dtype == torch.float32


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q8_0], ids=IDS)
def test_batch_invariant_rows(qtype, monkeypatch):
    """DFLASH24_BATCH_INVARIANT: a one-token matmul, row 0 of a 16-token verify and row 0 of a 23-token tree
    verify are the same bits, split-K included (64-row tiles for every M, partials summed in one order)."""
    k = _cols(qtype)
    raw, x, p, xd = _case(qtype, 40, k, 23, torch.float32, seed=91)
    monkeypatch.setattr(kernels, "BATCH_INVARIANT", True)
    monkeypatch.setattr(kernels, "DECODE_MATMUL", "dot")
    bs, _ = kernels.GEOMETRY[qtype]
    for split in (1, 2):
        def cfg(m):
            c = kernels.dot_config(p, m, xd.device)
            if split == 2:                               # K in two halves of whole steps
                steps = -(-(k // bs) // c["G"])
                c.update(split=2, per=-(-steps // 2) * c["G"])      # blocks per split, whole steps
            return c
        assert cfg(1)["BLOCK_M"] == cfg(23)["BLOCK_M"] == 64
        one, v16, v23 = (kernels.matmul(xd[:m], p, cfg(m)) for m in (1, 16, 23))
        assert torch.equal(one[0], v16[0]) and torch.equal(one[0], v23[0]) and torch.equal(v16[5], v23[5])
        _check(v23, x, raw, qtype, k, torch.float32)     # and right


def test_matmul_env_settings_checked_at_import():
    """Bad DFLASH24_DECODE_MATMUL / DFLASH24_SMALL_M_MATMUL values and combinations fail at import with a clear
    message; DFLASH24_BATCH_INVARIANT=1 alone (decode on the dot path) imports."""
    import subprocess
    import sys

    def env_error(**env):
        r = subprocess.run([sys.executable, "-c", "import dflash24.quant.kernels"], capture_output=True, text=True,
                           env={**os.environ, **env})
        return r.returncode != 0 and r.stderr.strip().splitlines()[-1]

    assert "must be gemv or dot" in env_error(DFLASH24_DECODE_MATMUL="int8")
    assert "DFLASH24_DECODE_MATMUL=dot" in env_error(DFLASH24_BATCH_INVARIANT="1", DFLASH24_DECODE_MATMUL="gemv")
    assert env_error(DFLASH24_BATCH_INVARIANT="1") is False
    assert env_error(DFLASH24_BATCH_INVARIANT="1", DFLASH24_DECODE_MATMUL="dot") is False
    assert "must be dot or mmq" in env_error(DFLASH24_SMALL_M_MATMUL="int8")
    assert "DFLASH24_SMALL_M_MATMUL=dot" in env_error(DFLASH24_BATCH_INVARIANT="1", DFLASH24_SMALL_M_MATMUL="mmq")
    assert env_error(DFLASH24_SMALL_M_MATMUL="mmq") is False


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K, QT.Q8_0], ids=IDS)
def test_densify_gives_the_reference_weight(qtype):
    """QuantLinear.densify (a frozen target for drafter training): the packed blocks become the reference
    dequantized weight to fp32 rounding (the K-quants' scale products are formed in another order), and the
    layer's output is the reference matmul's."""
    from dflash24.quant.formats import dequantize
    from dflash24.quant.linear import QuantLinear
    raw, x, p, xd = _case(qtype, 24, _cols(qtype), 3, torch.float32, seed=11)
    lin = QuantLinear(_cols(qtype), 24, qtype, packed=p)
    held = lin.densify(torch.float32)
    assert lin.packed is None and held == 24 * _cols(qtype) * 4
    ref = dequantize(raw, qtype, _cols(qtype)).float()
    assert (lin.weight.cpu() - ref).abs().max() <= 1e-6 * ref.abs().max()
    torch.testing.assert_close(lin(xd).cpu(), kernels.reference_matmul(x, raw, qtype, _cols(qtype)),
                               rtol=1e-5, atol=1e-5)


def test_training_target_densified_only_when_it_fits(monkeypatch):
    """The drafter trainer dequantizes a frozen target once when the dense weights take at most a quarter of
    the free GPU memory, and leaves it packed otherwise."""
    from dflash24.quant.linear import QuantLinear
    from dflash24.train.trainer import densify_target
    k = _cols(QT.Q8_0)
    model = torch.nn.Sequential(*[QuantLinear(k, 16, QT.Q8_0, packed=_case(QT.Q8_0, 16, k, 1, torch.float32, s)[2])
                                  for s in range(2)])
    dense_bytes = 2 * 16 * k * 2
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (4 * dense_bytes - 1, 10**12))
    assert not densify_target(model, torch.bfloat16, "cpu") and all(m.packed is not None for m in model)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (4 * dense_bytes, 10**12))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    assert densify_target(model, torch.bfloat16, "cpu")
    assert all(m.packed is None and m.weight.dtype == torch.bfloat16 for m in model)


@pytest.mark.parametrize("split", [2, 7])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_split_sum_is_the_partials_in_split_order(split, stream, out_dtype, monkeypatch):
    """The split-K sum (`_finish`) equals the partials added in split order (+ bias, one rounding to out_dtype)
    whatever the values a program (SUM_BLOCK: 16 values, a tail program past the 120; 512, one program); with STREAM
    each row tile adds only the slots its programs wrote."""
    m, n, tile_n, spt = 3, 40, 16, 3                                 # 3 row tiles, the last one short
    g = torch.Generator().manual_seed(split + 10 * stream)
    if stream:
        programs, split = kernels.stream_split(-(-n // tile_n), spt, split)
        st = (tile_n, spt, programs)
        total = -(-n // tile_n) * spt
        t = torch.arange(n) // tile_n
        first = ((t * spt + 1) * programs - 1) // total
        slots = ((t * spt + spt) * programs - 1) // total - first + 1           # per column, as the kernel counts
    else:
        st, slots = None, torch.full((n,), split)
    y = torch.randn(split, m, n, generator=g)
    bias = torch.randn(n, generator=g)
    want = y[0].clone()
    for i in range(1, split):
        want = want + torch.where(slots > i, y[i], torch.zeros(()))
    want = (want + bias).to(out_dtype)
    outs = []
    for block in (16, 512):
        monkeypatch.setattr(kernels, "SUM_BLOCK", block)
        outs.append(kernels._finish(y.to(DEV), split, out_dtype, bias.to(DEV), st).cpu())
    assert torch.equal(outs[0], outs[1])
    if out_dtype == torch.float32:
        assert torch.equal(outs[1], want)
    else:       # one rounding to bf16 (the interpreter's cast may round otherwise than torch's): within an ulp
        assert ((outs[1].float() - want.float()).abs() <= want.float().abs() * 2.0 ** -7).all()
