"""The Gluon small-M block matmul (quant/gluon_matmul.py): Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K.

On the CPU: the kernel's K order (where each thread's words and fields land among the MMA operand's K positions)
equals gluon_order of the weights, exactly, via the PyTorch reference that decodes as the kernel does; the kernel
compiles for sm_90 / sm_86 with no shared memory but its x ring (the weights go from global memory straight to
registers). On a GPU (-m gpu): results against reference_matmul and the shipped dot kernel.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from dflash24.quant import gluon_matmul as G
from dflash24.quant import kernels
from dflash24.quant.formats import block_type, dequantize, random_raw
from dflash24.quant.packed import PackedWeight, pack

ROOT = Path(__file__).resolve().parent.parent


TYPES = [QT.Q8_0, QT.Q4_0, QT.Q5_0, QT.Q4_K, QT.Q5_K, QT.Q6_K]
IDS = [t.name for t in TYPES]


def _case(n, k, m, seed, device="cpu", qtype=QT.Q4_K):
    g = torch.Generator().manual_seed(seed)
    raw = random_raw(qtype, n, k, generator=g, d_scale=0.01)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    return raw.to(device), x.to(device), pack(raw, qtype, k).to(device)


@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
@pytest.mark.parametrize("n,k", [(8, 256), (48, 512), (33, 1280)])
def test_kernel_k_order_is_gluon_order(qtype, n, k):
    """Where the kernel finds each weight (its words, high bits and scales, `reference_weights`) is where
    gluon_order puts x's matching column, exactly; and the bf16 weights are the dequantized ones to bf16 rounding."""
    raw, _, p = _case(n, k, 1, seed=n + k, qtype=qtype)
    natural = G.natural_weights(p)
    assert torch.equal(G.reference_weights(p), G.gluon_order(natural, qtype))
    w = dequantize(raw, qtype, k).reshape(n, k).float()
    # per 16 weights: the largest |A| + |B| of the block (three roundings of at most 2^-9 of it)
    bound = (w.abs().reshape(n, -1, 16).amax(-1) + natural.abs().reshape(n, -1, 16).amax(-1)).repeat_interleave(16, 1)
    assert ((natural - w).abs() <= 2.0 ** -7 * bound + 1e-6).all()
    # and they are the dot kernel's PAIRS decode: the same bf16 values in natural order
    x = torch.randn(3, k).to(torch.bfloat16)
    assert torch.allclose(G.gluon_order(x.float(), qtype) @ G.reference_weights(p).T, x.float() @ natural.T,
                          rtol=0, atol=1e-4 * (x.float() @ natural.T).abs().max().item())


@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_gluon_order_is_a_permutation_of_each_step(qtype):
    x = torch.arange(2 * 512, dtype=torch.float32).reshape(2, 512)
    xo = G.gluon_order(x, qtype)
    for s in range(2):
        assert sorted(xo[0, 256 * s:256 * (s + 1)].tolist()) == list(range(256 * s, 256 * (s + 1)))
    # position 128 j + 32 c + 16 p1 + 8 p0 + 2 q + h (j 1, c 2, p1 1, p0 0, q 3, h 1) <- the column of field
    # p + 4 h = 6 of word 8 q + 4 j + c = 30: 32-blocks 32 (2 q + j) + 4 f + c; 16-blocks 16 (4 q + 2 j + c // 2)
    # + 2 f + c % 2
    want = 32 * 7 + 4 * 6 + 2 if qtype != QT.Q6_K else 16 * 15 + 2 * 6 + 0
    assert xo[0, 128 * 1 + 32 * 2 + 16 * 1 + 8 * 0 + 2 * 3 + 1].item() == want
    with pytest.raises(ValueError, match="multiple of 256"):
        G.gluon_order(torch.zeros(1, 288), qtype)


def _bf16_rne(v: torch.Tensor) -> torch.Tensor:
    """float64 v rounded once to bf16's 8 significant bits, half to even (as fma.rn.bf16x2 rounds its exact result);
    bf16 subnormals (below 2^-126) keep a fixed step of 2^-133."""
    m, e = torch.frexp(v)
    e = torch.maximum(e, torch.full_like(e, -125))                  # below the smallest normal: subnormal steps
    return torch.round(torch.ldexp(v, 8 - e)) * torch.pow(2.0, (e - 8).double())


def test_subnormal_codes_are_the_same_weights_scaled():
    """The arithmetic DENORM relies on (`_decode`): a code q as the subnormal bf16 q 2^-133, one fma with A 2^100
    and B 2^-33 (A, B already bf16), rounded once, is the weight bf16(A q + B) times 2^-33 exactly, for every code
    of 6 bits and scales from fp16's smallest to its largest (times the 6-bit sub-scales)."""
    g = torch.Generator().manual_seed(7)
    a = _bf16_rne(torch.exp(torch.empty(4000, dtype=torch.float64).uniform_(-25, 22, generator=g)))
    b = _bf16_rne(-a * torch.empty(4000, dtype=torch.float64).uniform_(0, 40, generator=g))
    q = torch.arange(64, dtype=torch.float64).view(-1, 1)
    t = q * 2.0 ** -133                                               # the code's bits as a bf16 subnormal
    assert torch.equal(_bf16_rne(t), t)
    new = _bf16_rne(t * _bf16_rne(a * 2.0 ** 100) + _bf16_rne(b * 2.0 ** -33)) * 2.0 ** 33
    assert torch.isfinite(new).all() and torch.equal(new, _bf16_rne(q * a + b))
    # a 4-bit code masked in place at bits 4-7 (fields 1 and 3 of Q4_K / Q4_0, no shift): the half-word 16 q is the
    # bf16 16 q 2^-133 (subnormal below 128, the first normal binade from 128 on: one step), and with the scale / 16
    # the same weights, bit for bit
    bits = (torch.arange(16, dtype=torch.int16) << 4).view(torch.bfloat16).double().view(-1, 1)
    assert torch.equal(bits, 16 * q[:16] * 2.0 ** -133)
    in_place = _bf16_rne(bits * _bf16_rne(a * 2.0 ** 96) + _bf16_rne(b * 2.0 ** -33)) * 2.0 ** 33
    assert torch.equal(in_place, new[:16])
    # where it stops: a 5-bit code at bits 4-8 would reach the second binade (twice the step)
    assert (torch.tensor([31 << 4], dtype=torch.int16).view(torch.bfloat16).double() != 31 * 16 * 2.0 ** -133).all()


def test_config_names_what_it_cannot_take():
    _, _, p = _case(8, 256, 1, seed=1)
    with pytest.raises(ValueError, match=f"1..{G.MAX_ROWS} rows"):
        G.config(p, G.MAX_ROWS + 1, torch.device("cpu"))
    other = PackedWeight(QT.Q2_K, 8, 256, {"qs": torch.zeros(8, 32, dtype=torch.int32)})   # no kernel decodes it
    with pytest.raises(ValueError, match="needs Q8_0, Q4_0, Q5_0, Q4_K, Q5_K or Q6_K"):
        G.config(other, 16, torch.device("cpu"))
    q8 = pack(random_raw(QT.Q8_0, 8, 288), QT.Q8_0, 288)                                   # K % 256 != 0
    assert not G.supports(other) and not G.supports(q8) and G.supports(p)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="Gluon"):
            G.matmul(torch.zeros(2, 256, dtype=torch.bfloat16), p)


_COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from dflash24.quant import gluon_matmul as G
out = []
for arch, qt, bm, bn, pdl, acc2, past in [(90, 3, 16, 64, True, True, 1), (90, 4, 32, 64, True, False, 2),
                                          (90, 5, 16, 128, False, True, 0), (86, 5, 16, 64, False, False, 1),
                                          (86, 4, 16, 64, False, True, 0), (86, 3, 32, 128, False, False, 2),
                                          (90, 3, 64, 64, False, False, 2), (86, 4, 64, 64, False, False, 2),
                                          (90, 5, 64, 64, True, False, 0), (90, 1, 16, 64, True, True, 1),
                                          (90, 2, 16, 64, True, True, 1), (86, 2, 32, 128, False, False, 2),
                                          (90, 1, 64, 64, False, False, 2), (90, 0, 16, 64, True, True, 1),
                                          (90, 0, 32, 64, True, False, 2), (86, 0, 16, 128, False, False, 0)]:
    fn = G._kq_kernel
    scale = "*i32" if qt in (0, 1, 2, 5) else "*i16"
    sig = {"x_ptr": "*bf16", "y_ptr": "*bf16", "b_ptr": "*fp32", "qs_ptr": "*i32",
           "qh_ptr": "*i64" if qt not in (0, 1, 3) else scale, "sc_ptr": scale, "mn_ptr": scale, "d_ptr": "*fp16",
           "dm_ptr": "*fp16", "M": "i32", "N": "i32",
           "NSTEP": "i32", "s_xm": "i32", "s_qs": "i32", "s_qh": "i32", "s_sc": "i32", "s_d": "i32",
           "steps_per_split": "i32"}
    const = {"QTYPE": qt, "BLOCK_M": bm, "BLOCK_N": bn, **G.layouts(bm, bn), "HAS_BIAS": acc2, "ACC2": acc2,
             "X_PAST_M": past, "PDL": pdl, "DENORM": qt != 4 or bm != 32, "WG": False}
    sig.update({k: "constexpr" for k in const})
    div = ["x_ptr", "y_ptr", "qs_ptr", "qh_ptr", "sc_ptr", "mn_ptr", "d_ptr", "dm_ptr", "s_xm", "s_qs", "s_sc"]
    src = GluonASTSource(fn=fn, signature=sig, attrs={(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k in div},
                         constexprs={(fn.arg_names.index(k),): v for k, v in const.items()})
    c = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=4))
    ptx = c.asm["ptx"]
    out.append(dict(arch=arch, qtype=qt, bm=bm, bn=bn, pdl=pdl, shared=c.metadata.shared, mma=ptx.count("mma.sync"),
                    local=ptx.count(".local"), wait=ptx.count("griddepcontrol.wait")))
print(json.dumps(out))
"""


@pytest.mark.skipif(not G.HAVE_GLUON, reason="triton without Gluon")
def test_compiles_with_weights_straight_to_registers():
    """The real compiler, no GPU, every type: shared memory is the x ring alone (2 steps x BM x 256 bf16), so no
    weight word goes through shared memory, and the step's dots are mma.sync."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run([sys.executable, "-c", _COMPILE], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for r in json.loads(proc.stdout.strip().splitlines()[-1]):
        assert r["shared"] == 2 * r["bm"] * 256 * 2, r
        assert r["mma"] > 0 and r["local"] == 0 and r["wait"] == r["pdl"], r


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [1, 2, 15, 16, 17, 23, 32])
@pytest.mark.parametrize("n,k", [(200, 512), (1024, 5120), (5120, 2048)])
@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_matmul_vs_reference_gpu(qtype, n, k, m):
    raw, x, p = _case(n, k, m, seed=n + k + m, device="cuda", qtype=qtype)
    ref = kernels.reference_matmul(x, raw, qtype, k)
    y = G.matmul(x, p)
    assert y.shape == (m, n) and y.dtype == torch.float32
    assert (y - ref).abs().max().item() <= 1e-2 * ref.abs().max().item()
    if qtype in (QT.Q8_0, QT.Q4_0, QT.Q5_0):
        # the dot kernel decodes these in fp32 (no PAIRS decode): against the bf16 weights this kernel multiplies
        want = x.float() @ G.natural_weights(p).to(x.device).T
        assert (y - want).abs().max().item() <= 1e-4 * ref.abs().max().item()
        return
    # the same bf16 weights and x as the dot kernel: the two differ by the order of fp32 sums only
    y_dot = kernels._matmul_dot(x, p, kernels.dot_config(p, m, x.device), torch.float32, None)
    assert (y - y_dot).abs().max().item() <= 1e-4 * ref.abs().max().item()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [2, 16, 23])
@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_subnormal_codes_give_the_same_bits_gpu(qtype, m):
    """DENORM: the codes as subnormal bf16 and one fma a pair (weights times 2^-33, sums times 2^33) give exactly
    the bits of the two-fma decode, split K and ACC2 included: the GPU keeps bf16 subnormal inputs and every
    scaling is by a power of two."""
    raw, x, p = _case(1024, 2048, m, seed=m, device="cuda", qtype=qtype)
    for cfg in (None, dict(G.config(p, m, x.device), split=2, per=4, acc2=True)):
        base = dict(cfg or G.config(p, m, x.device))
        y_old = G.matmul(x, p, dict(base, denorm=False))
        y_new = G.matmul(x, p, dict(base, denorm=True))
        assert torch.equal(y_old, y_new)
    huge = raw.clone()      # scales near fp16's largest: A 2^100 and (A + B) 2^-33 stay finite
    if qtype in (QT.Q4_K, QT.Q5_K, QT.Q6_K):
        size = block_type(qtype).nbytes
        d_at = size - 2 if qtype == QT.Q6_K else 0                      # where the block's fp16 d sits
        blk = huge.view(1024, -1, size)
        blk[:8, :, d_at:d_at + 2] = torch.tensor([0xFF, 0x7B], dtype=torch.uint8, device="cuda")    # 65504
        ph = pack(huge, qtype, 2048)
        y = G.matmul(x, ph, dict(G.config(ph, m, x.device), denorm=True))
        assert torch.isfinite(y).all()
        assert (y - kernels.reference_matmul(x, huge, qtype, 2048)).abs().max() <= 1e-2 * y.abs().max()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("split,acc2", [(1, False), (2, True), (4, False)])
@pytest.mark.parametrize("block_n", [32, 64])
@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_bias_split_and_dtype_gpu(qtype, block_n, split, acc2):
    raw, x, p = _case(96, 1024, 16, seed=5, device="cuda", qtype=qtype)
    bias = torch.randn(96, device="cuda")
    cfg = dict(BLOCK_M=16, BLOCK_N=block_n, split=split, per=4 // split, acc2=acc2)
    y = G.matmul(x, p, cfg, out_dtype=torch.bfloat16, bias=bias)
    ref = kernels.reference_matmul(x, raw, qtype, 1024) + bias
    assert y.dtype == torch.bfloat16
    assert (y.float() - ref).abs().max().item() <= 1e-2 * ref.abs().max().item()


def test_a_gluon_that_does_not_compile_falls_back_to_the_dot_kernel(monkeypatch):
    """A triton whose Gluon API the kernel does not fit (a compile error, a renamed call): the first verify matmul
    warns once and returns the tl.dot kernel's result; later ones go there directly."""
    from triton.compiler.errors import CompilationError
    raw, x, p = _case(64, 512, 5, seed=3)
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise CompilationError("gluon_matmul.py", None, "async_copy_global_to_shared has been removed")

    monkeypatch.setattr(kernels, "GLUON", True)
    monkeypatch.setattr(kernels, "_gluon", lambda p, x: kernels.GLUON)
    monkeypatch.setattr(G, "matmul", broken)
    want = kernels._matmul_dot(x, p, None, torch.float32, None)
    with pytest.warns(RuntimeWarning, match="Gluon small-M matmul does not compile"):
        y = kernels.matmul(x, p)
    assert torch.equal(y, want) and len(calls) == 1 and kernels.GLUON is False
    assert torch.equal(kernels.matmul(x, p), want) and len(calls) == 1


def test_a_warpgroup_mma_that_fails_falls_back_to_its_mma_sync_tiles(monkeypatch):
    """The warpgroup-MMA form (WG) refused before it runs (here: a TMA descriptor the driver will not encode): the
    verify matmul warns once, takes WG off and returns the mma.sync tiles' result; Gluon stays on. Any other error
    is raised, not swallowed."""
    raw, x, p = _case(64, 512, 5, seed=3)
    seen = []

    def rows(x, p, out_dtype, bias, x_order):
        seen.append(bool(G.WG_TILES))
        if G.WG_TILES:
            raise RuntimeError("Triton Error [CUDA]: Failed to create tensor map descriptor: invalid argument")
        return torch.full((x.shape[0], p.n), 7.0)

    monkeypatch.setattr(kernels, "GLUON", True)
    monkeypatch.setattr(kernels, "_gluon", lambda p, x: kernels.GLUON)
    monkeypatch.setattr(kernels, "_gluon_rows", rows)
    monkeypatch.setattr(G, "WG_TILES", {(QT.Q4_K, 16)})
    with pytest.warns(RuntimeWarning, match="warpgroup-MMA form"):
        y = kernels.matmul(x, p)
    assert (y == 7.0).all() and seen == [True, False] and not G.WG_TILES and kernels.GLUON

    def broken(*args):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    monkeypatch.setattr(G, "WG_TILES", {(QT.Q4_K, 16)})
    monkeypatch.setattr(kernels, "_gluon_rows", broken)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        kernels.matmul(x, p)
    assert G.WG_TILES and kernels.GLUON


def test_more_rows_than_a_launch_go_as_near_equal_chunks(monkeypatch):
    """33..GLUON_MAX_ROWS rows of x: `gluon_launches` launches, as near-equal chunks, each written into its rows of
    one output with its rows of the pair-order copy; with a Gluon that does not compile, rows past SMALL_M take the
    dequantized path."""
    from triton.compiler.errors import CompilationError
    raw, x, p = _case(40, 512, 70, seed=7)
    chunks = []

    def fake(xc, pc, out_dtype, bias, x_order, out=None):    # the reference, written where the kernel would write
        chunks.append((xc.shape[0], None if x_order is None else x_order.data_ptr()))
        out = torch.empty(xc.shape[0], pc.n, dtype=out_dtype) if out is None else out
        assert out.shape == (xc.shape[0], pc.n) and out.is_contiguous()
        out.copy_((kernels.reference_matmul(xc, raw, QT.Q4_K, 512) + bias).to(out_dtype))
        return out

    monkeypatch.setattr(kernels, "GLUON", True)
    monkeypatch.setattr(kernels, "_gluon", lambda p, x: kernels.GLUON and 2 <= x.shape[0] <= 96)
    monkeypatch.setattr(G, "matmul", fake)
    bias = torch.randn(40)
    pairs = kernels.PairRows.empty(x.numel(), x.device)
    y = kernels.matmul(x, p, bias=bias, pairs=pairs)
    assert [c[0] for c in chunks] == [35, 35] and y.dtype == torch.bfloat16        # x's dtype past SMALL_M
    g = pairs.gluon(QT.Q4_K, 512)
    assert [c[1] for c in chunks] == [g[0].data_ptr(), g[35].data_ptr()]
    assert torch.equal(y, (kernels.reference_matmul(x, raw, QT.Q4_K, 512) + bias).to(torch.bfloat16))
    chunks.clear()
    assert kernels.matmul(x[:32], p, bias=bias).dtype == torch.float32 and chunks == [(32, None)]   # one launch

    def broken(*args, **kwargs):
        raise CompilationError("gluon_matmul.py", None, "removed")

    monkeypatch.setattr(G, "matmul", broken)
    with pytest.warns(RuntimeWarning, match="does not compile"):
        y = kernels.matmul(x, p)
    assert kernels.GLUON is False and y.dtype == torch.bfloat16
    assert torch.equal(y, kernels._matmul_large(x, p).to(torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [33, 64, 65, 96])
@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_more_rows_than_a_launch_gpu(qtype, m):
    """kernels.matmul past MAX_ROWS rows (a tree verify of budget 32..95, a short prefill): every chunk's rows are
    the same bits as the Gluon matmul of those rows alone, and within the reference's bound, bias and dtype kept."""
    raw, x, p = _case(1024, 5120, m, seed=m, device="cuda", qtype=qtype)
    bias = torch.randn(1024, device="cuda")
    assert kernels._gluon(p, x)
    y = kernels.matmul(x, p, out_dtype=torch.bfloat16, bias=bias)
    ref = kernels.reference_matmul(x, raw, qtype, 5120) + bias
    assert y.shape == (m, 1024) and y.dtype == torch.bfloat16
    assert (y.float() - ref).abs().max().item() <= 1e-2 * ref.abs().max().item()
    n = kernels.gluon_launches(m)
    assert n == {33: 2, 64: 1, 65: 2, 96: 2}[m]
    for i in range(n):
        r0, r1 = i * m // n, (i + 1) * m // n
        assert torch.equal(y[r0:r1], G.matmul(x[r0:r1], p, out_dtype=torch.bfloat16, bias=bias))


def test_64_row_tiles_with_max_rows_64(monkeypatch):
    """MAX_ROWS 64: a launch of 33..64 rows takes a 64-row tile (BLOCK_N 64, no ACC2, rows past M read again from
    the first); kernels.matmul makes one launch of 40..64 rows, two near-equal ones of 33..39 (GLUON_ROWS64_FROM),
    and near-equal chunks of up to 64 past 64; with MAX_ROWS 32, chunks of up to 32."""
    _, _, p = _case(8, 256, 1, seed=1)
    monkeypatch.setattr(G, "MAX_ROWS", 64)
    cfgs = {m: G.config(p, m, torch.device("cpu")) for m in (16, 17, 32, 33, 64)}
    assert [cfgs[m]["BLOCK_M"] for m in (16, 17, 32, 33, 64)] == [16, 32, 32, 64, 64]
    assert cfgs[33]["BLOCK_N"] == 64 and not cfgs[33]["acc2"]
    assert G.past_mode(33, 64) == 2 and G.past_mode(64, 64) == 0
    with pytest.raises(ValueError, match="1..64 rows"):
        G.config(p, 65, torch.device("cpu"))
    raw, x, p = _case(40, 512, 96, seed=3)
    rows = []

    def fake(xc, pc, out_dtype, bias, x_order, out=None):
        rows.append(xc.shape[0])
        out = torch.empty(xc.shape[0], pc.n, dtype=out_dtype) if out is None else out
        out.copy_(kernels.reference_matmul(xc, raw, QT.Q4_K, 512).to(out_dtype))
        return out

    monkeypatch.setattr(kernels, "GLUON", True)
    monkeypatch.setattr(kernels, "_gluon", lambda p, x: kernels.GLUON and 2 <= x.shape[0] <= 96)
    monkeypatch.setattr(G, "matmul", fake)
    for m in (33, 39, 40, 64, 65, 96):
        kernels.matmul(x[:m], p)
    assert rows == [16, 17, 19, 20, 40, 64, 32, 33, 48, 48]
    rows.clear()
    monkeypatch.setattr(G, "MAX_ROWS", 32)
    kernels.matmul(x[:40], p)
    kernels.matmul(x, p)
    assert rows == [20, 20, 32, 32, 32]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [33, 48, 64])
@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_64_row_tile_gpu(qtype, m, monkeypatch):
    """One 64-row launch: within the reference's bound, and each row within fp32 summation order of the same rows
    in launches of up to 32 (the same bf16 products; only the split and order of the fp32 sums may differ)."""
    raw, x, p = _case(1024, 5120, m, seed=5 * m, device="cuda", qtype=qtype)
    ref = kernels.reference_matmul(x, raw, qtype, 5120)
    scale = ref.abs().max().item()
    monkeypatch.setattr(G, "MAX_ROWS", 64)
    y64 = G.matmul(x, p)
    assert G.config(p, m, x.device)["BLOCK_M"] == 64
    monkeypatch.setattr(G, "MAX_ROWS", 32)
    y32 = kernels.matmul(x, p)
    assert (y64 - ref).abs().max().item() <= 1e-2 * scale
    assert (y64 - y32).abs().max().item() <= 1e-5 * scale


def test_rows_past_m_mode_by_rows(monkeypatch):
    """A full tile reads no row past M (the kernel as before); a 16-row tile zero-fills the rest, a 32-row tile
    reads rows again from the first (never row M - 1 for all of them); X_PAST_M overrides the choice."""
    assert [G.past_mode(m, 16) for m in (1, 9, 15, 16)] == [1, 1, 1, 0]
    assert [G.past_mode(m, 32) for m in (17, 23, 31, 32)] == [2, 2, 2, 0]
    monkeypatch.setattr(G, "X_PAST_M", 0)
    assert G.past_mode(17, 32) == 0 and G.past_mode(9, 16) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [3, 9, 17, 23])
@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_rows_past_m_do_not_change_the_rows_below_gpu(qtype, m, monkeypatch):
    """Whatever fills a tile's rows past M (row M - 1 again, zeros, rows from the first), the M rows of y are the
    same bits: each row of the MMA sums its own products only."""
    raw, x, p = _case(1024, 5120, m, seed=7 * m, device="cuda", qtype=qtype)
    ys = []
    for mode in (0, 1, 2):
        monkeypatch.setattr(G, "X_PAST_M", mode)
        ys.append(G.matmul(x, p))
    assert torch.equal(ys[0], ys[1]) and torch.equal(ys[0], ys[2])
    ref = kernels.reference_matmul(x, raw, qtype, 5120)
    assert (ys[0] - ref).abs().max().item() <= 1e-2 * ref.abs().max().item()


@pytest.mark.skipif(not G.HAVE_GLUON, reason="triton without Gluon")
def test_denorm_decode_of_4_bit_codes_issues_fewer_instructions():
    """The real compiler for sm_90, no GPU (benchmarks/gluon_sass.py): Q4_K's 16 x 64 tile as shipped, decoded as
    subnormals with fields 1 / 3 read in place, issues at least 15 % fewer instructions a step than the two-fma decode
    (one bf16x2 op a pair, one shift a word instead of three), and fits 128 registers without spilling."""
    cuobjdump = Path(__import__("triton").__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cuobjdump.exists():
        pytest.skip("this triton ships no cuobjdump")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    out = {}
    for name, setting in [("plain", "G.DENORM_TILES.discard((QT.Q4_K, 16)); G.NREG.pop((QT.Q4_K, 16))"),
                          ("denorm", "")]:
        proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gluon_sass.py"), "--type", "Q4_K",
                               "--shape", "17408x5120", "--m", "16", "--set", setting],
                              capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    plain, denorm = out["plain"]["sass_main_loop"], out["denorm"]["sass_main_loop"]
    assert out["denorm"]["cfg"]["denorm"] and out["denorm"]["registers"] <= 128
    assert denorm["local_memory"] == 0 and denorm["by_opcode"]["HMMA"] == plain["by_opcode"]["HMMA"]
    assert denorm["instructions"] <= 0.85 * plain["instructions"], (plain, denorm)
    assert denorm["by_opcode"]["SHF"] <= plain["by_opcode"]["SHF"] // 2, (plain, denorm)


def _layout_builder():
    """Triton's own layout algebra, without a GPU: a builder that turns Gluon layouts into linear layouts."""
    try:
        from triton._C.libtriton import gluon_ir, ir
    except ImportError:
        pytest.skip("this triton has no Gluon builder")
    ctx = ir.context()
    ir.load_dialects(ctx)
    builder = gluon_ir.GluonOpBuilder(ctx)

    def to_linear(layout, shape, keep=(ctx, builder)):       # the builder's context lives as long as this
        return keep[1].to_linear_layout(layout._to_ir(keep[1]), shape)
    return to_linear


@pytest.mark.skipif(not G.HAVE_WGMMA, reason="triton without Gluon's warpgroup MMA")
@pytest.mark.parametrize("block_n", [64, 128])
@pytest.mark.parametrize("block_m", [16, 32, 64])
def test_warpgroup_mma_layouts_need_no_data_movement(block_m, block_n):
    """`layouts(wg=True)`: the decoded weights' registers, as `_half_weights` flattens them to (n, k = 32 c + 16 p1 +
    8 p0 + 2 q + h), are exactly the warpgroup MMA's A operand (the same register, lane and warp for every weight, so
    the conversion moves nothing); and x as TMA writes a step, a (4, BM, 64) box, is byte for byte the (BM, 256)
    NVMMA tile the MMA reads (`_as_step`)."""
    from triton.experimental.gluon import language as gl
    to_linear = _layout_builder()
    lay = G.layouts(block_m, block_n, wg=True)

    def flat(v):            # a DEC basis (n, q, c, p1, p0, h) -> (n, k)
        n, q, c, p1, p0, h = v
        return [n, 32 * c + 16 * p1 + 8 * p0 + 2 * q + h]
    dec = lay["DEC_L"]
    a_op = to_linear(gl.DotOperandLayout(0, lay["MMA_L"], 2), [block_n, 128])
    assert [flat(v) for v in dec.reg_bases] == a_op.reg_bases
    assert [flat(v) for v in dec.lane_bases] == a_op.lane_bases
    assert [flat(v) for v in dec.warp_bases] == a_op.warp_bases
    boxes = to_linear(G.X_TMA_L, [4, block_m, 64])
    tile = to_linear(lay["XSMEM_L"], [block_m, 256])
    assert [[m, 64 * j + c] for j, m, c in boxes.offset_bases] == tile.offset_bases


@pytest.mark.skipif(not G.HAVE_WGMMA, reason="triton without Gluon's warpgroup MMA")
def test_warpgroup_mma_tiles_compile_for_sm_90():
    """The real compiler for sm_90, no GPU (benchmarks/gluon_sass.py): the WG tiles of 16, 32 and 64 rows of x issue 16
    warpgroup MMAs a 256-weight step whatever the rows (mma.sync issues 32 a warp at 16 rows, 64 at 32), move nothing
    through shared memory or shuffles but x (the MMA reads it; no ldmatrix), and do not spill."""
    cuobjdump = Path(__import__("triton").__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cuobjdump.exists():
        pytest.skip("this triton ships no cuobjdump")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    setting = "G.WG_TILES |= {(q, h) for q in G.TYPES for h in (16, 32, 64)}; G.hopper = lambda d: True"
    for qtype, shape, m in [("Q4_K", "17408x5120", 16), ("Q4_K", "17408x5120", 23), ("Q6_K", "5120x17408", 48),
                            ("Q8_0", "1024x5120", 23)]:
        proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gluon_sass.py"), "--type", qtype,
                               "--shape", shape, "--m", str(m), "--set", setting],
                              capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        loop = out["sass_main_loop"]
        assert out["cfg"]["wg"], out
        assert loop["by_opcode"].get("HGMMA") == 16 and "HMMA" not in loop["by_opcode"], out
        assert loop["shared_and_shuffles"] == 0 and loop["local_memory"] == 0, out
        assert out["shared_bytes"] >= 2 * out["cfg"]["BLOCK_M"] * 512, out      # the two-step x ring


def test_warpgroup_mma_only_where_asked(monkeypatch):
    """WG_TILES empty (the default until timed): no config asks for the warpgroup MMA, on any device; listed, only
    on a GPU that has it (compute capability 9.x)."""
    _, _, p = _case(64, 512, 16, seed=3)
    cpu = torch.device("cpu")
    monkeypatch.setattr(G, "WG_TILES", set())
    assert "wg" not in G.config(p, 16, cpu)
    monkeypatch.setattr(G, "WG_TILES", {(QT.Q4_K, 16)})
    assert "wg" not in G.config(p, 16, cpu)                      # not a Hopper GPU
    monkeypatch.setattr(G, "hopper", lambda device: True)
    cfg = G.config(p, 16, cpu)
    assert cfg["wg"] and (cfg["BLOCK_N"], cfg["acc2"]) == (G.WG_TILE[16][0], False) and "nreg" not in cfg
    assert "wg" not in G.config(p, 23, cpu)                      # (Q4_K, 32) not listed
    # 33..39 rows: two launches of up to 32 rows on mma.sync, one 64-row launch where the 64-row tiles are WG
    assert kernels.gluon_launches(33) == 2 and kernels.gluon_launches(33, wg64=True) == 1
    assert kernels.gluon_launches(65, wg64=True) == 2


_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


@pytest.mark.gpu
@pytest.mark.skipif(not _HOPPER or not G.HAVE_WGMMA, reason="needs a compute capability 9.x GPU")
@pytest.mark.parametrize("m", [2, 9, 16, 17, 23, 32, 33, 48, 64])
@pytest.mark.parametrize("n,k", [(200, 512), (1024, 5120)])
@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_warpgroup_mma_vs_mma_sync_gpu(qtype, n, k, m):
    """WG: the same bf16 weights and x as the mma.sync tiles, on the warpgroup MMA with x by TMA (rows past M read as
    zeros): they differ by the order of fp32 sums only. Split K (an empty split included), bias and a bf16 output as
    well."""
    raw, x, p = _case(n, k, m, seed=n + m, device="cuda", qtype=qtype)
    ref = kernels.reference_matmul(x, raw, qtype, k)
    scale = ref.abs().max().item()
    y_mma = G.matmul(x, p, G.config(p, m, x.device, wg=False))
    cfg = G.config(p, m, x.device, wg=True)
    y = G.matmul(x, p, cfg)
    assert y.shape == (m, n) and (y - ref).abs().max().item() <= 1e-2 * scale
    assert (y - y_mma).abs().max().item() <= 1e-4 * scale
    bias = torch.randn(n, device="cuda")
    for split in (2, 3):
        c = dict(cfg, split=split, per=-(-(k // 256) // split))
        yb = G.matmul(x, p, c, out_dtype=torch.bfloat16, bias=bias)
        assert yb.dtype == torch.bfloat16
        assert (yb.float() - (y_mma + bias)).abs().max().item() <= 1e-2 * scale


@pytest.mark.gpu
@pytest.mark.skipif(not _HOPPER or not G.HAVE_WGMMA, reason="needs a compute capability 9.x GPU")
def test_warpgroup_mma_in_a_cuda_graph_gpu():
    """The TMA descriptor of x is made at capture and baked into the graph: replays read x's buffer as it is then."""
    raw, x, p = _case(1024, 5120, 23, seed=7, device="cuda")
    cfg = G.config(p, 23, x.device, wg=True)
    xo = G.gluon_order(x, p.qtype).contiguous()
    out = torch.empty(23, 1024, device="cuda")
    G.matmul(x, p, cfg, x_order=xo, out=out)                     # compiled outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        G.matmul(x, p, cfg, x_order=xo, out=out)
    x2 = torch.randn_like(x)
    xo.copy_(G.gluon_order(x2, p.qtype))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, G.matmul(x2, p, cfg))
