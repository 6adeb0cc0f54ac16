"""The one-kernel RMSNorm (kernels/norm.py) against the PyTorch reference in models/layers.py.

Without CUDA the kernel runs in Triton's interpreter on CPU tensors (conftest sets TRITON_INTERPRET=1).
Bound: fp32 output within 2e-6 relative (the sum of squares is reduced in another order); bf16 output
within one bf16 step of the largest value (2^-7 of max|ref|) of the reference.
"""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

from dflash24.kernels import norm  # noqa: E402
from dflash24.models.layers import rms_norm  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _reference(x, w, eps, gate=None, out_dtype=None):
    """layers.rms_norm on CPU tensors always runs its PyTorch code."""
    return rms_norm(x.cpu(), None if w is None else w.cpu(), eps, None if gate is None else gate.cpu(), out_dtype)


def _close(y, ref, dtype):
    tol = 2e-6 if dtype == torch.float32 else 2 ** -7
    scale = ref.float().abs().max().item()
    assert y.dtype == ref.dtype and y.shape == ref.shape
    assert (y.float().cpu() - ref.float()).abs().max().item() <= tol * scale + 1e-30


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(1, 896), (3, 1536), (2, 5, 128), (7, 64)], ids=str)
def test_matches_reference(shape, dtype):
    g = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(*shape, generator=g) * 3).to(dtype).to(DEV)
    w = torch.randn(shape[-1], generator=g).to(DEV)
    y = norm.rms_norm(x, w, 1e-6)
    _close(y, _reference(x, w, 1e-6), dtype)
    _close(norm.rms_norm(x, None, 1e-5), _reference(x, None, 1e-5), dtype)


def test_strided_rows_and_gate():
    """q = [q | gate] halves of one projection (row stride 2D), and the gated DeltaNet norm with an fp32
    gate and a bf16 result."""
    g = torch.Generator().manual_seed(3)
    qg = torch.randn(3, 4, 2 * 64, generator=g).to(DEV)
    q = qg[..., :64]                                     # rows of 64 with stride 128
    w = torch.randn(64, generator=g).to(DEV)
    _close(norm.rms_norm(q, w, 1e-6), _reference(q, w, 1e-6), torch.float32)
    o = torch.randn(2, 6, 128, generator=g).to(DEV)
    z = torch.randn(2, 6, 128, generator=g).to(DEV)
    w = torch.randn(128, generator=g).to(DEV)
    y = norm.rms_norm(o, w, 1e-6, gate=z, out_dtype=torch.bfloat16)
    _close(y, _reference(o, w, 1e-6, gate=z, out_dtype=torch.bfloat16), torch.bfloat16)


def test_gate_whose_tokens_are_rows_of_a_wider_matrix(monkeypatch):
    """The DeltaNet gate z of a verify step: each token's heads are one row of the fused input projection (token stride
    wider than heads x D). The kernel reads it where it lies (no reshape copy) and gives what a contiguous copy gives,
    bit for bit."""
    g = torch.Generator().manual_seed(6)
    T, H, D = 5, 6, 128
    proj = torch.randn(T, H * D + 40, generator=g).to(torch.bfloat16).to(DEV)
    z = proj[:, 8:8 + H * D].view(T, H, D)                 # token stride H * D + 40
    o = torch.randn(T, H, D, generator=g).to(DEV)
    w = torch.randn(D, generator=g).to(DEV)
    want = norm.rms_norm(o, w, 1e-6, gate=z.contiguous(), out_dtype=torch.bfloat16)
    reshape = torch.Tensor.reshape

    def no_gate_copy(t, *shape):
        assert t.data_ptr() != z.data_ptr() or t.is_contiguous(), "the gate was copied"
        return reshape(t, *shape)

    monkeypatch.setattr(torch.Tensor, "reshape", no_gate_copy)
    y = norm.rms_norm(o, w, 1e-6, gate=z, out_dtype=torch.bfloat16)
    assert torch.equal(y, want)
    _close(y, _reference(o, w, 1e-6, gate=z, out_dtype=torch.bfloat16), torch.bfloat16)


def test_rows_independent_of_batch():
    """A row's result does not depend on the rows around it (M=1 decode and M=16 verify agree bitwise)."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(16, 512, generator=g).to(torch.bfloat16).to(DEV)
    w = torch.randn(512, generator=g).to(DEV)
    full = norm.rms_norm(x, w, 1e-6)
    for i in (0, 5, 15):
        assert torch.equal(norm.rms_norm(x[i:i + 1], w, 1e-6), full[i:i + 1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_add_then_norm_in_one_kernel(dtype):
    """add_rms_norm: the sum equals eager x + r bitwise (one rounding to x's dtype; the CPU interpreter
    truncates to bf16 instead: one bf16 step), the norm is rms_norm of that sum; residual rows may be
    strided; the layouts it does not take return None."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(3, 640, generator=g) * 4).to(dtype).to(DEV)
    rr = torch.randn(3, 2 * 640, generator=g).to(dtype).to(DEV)[:, 640:]          # a column slice
    w = torch.randn(640, generator=g).to(DEV)
    s, y = norm.add_rms_norm(x, rr, w, 1e-6)
    ref = x.cpu() + rr.cpu()
    if DEV == "cuda" or dtype == torch.float32:
        assert torch.equal(s.cpu(), ref)
    else:
        assert ((s.float() - ref.float()).abs() <= 2 ** -7 * ref.float().abs()).all()
    _close(y, _reference(s, w, 1e-6), dtype)
    assert norm.add_rms_norm(x, rr.float() if dtype != torch.float32 else rr.half(), w, 1e-6) is None
    assert norm.add_rms_norm(x, rr[:2], w, 1e-6) is None


@pytest.mark.parametrize("sigmoid", [False, True], ids=["silu", "sigmoid"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_silu_mul_in_one_kernel(dtype, sigmoid):
    """silu(g) * u (and sigmoid(g) * u, the attention output gate) from the two column halves of one
    projection, as eager PyTorch rounds it (bf16: the activation rounded, then the product): within two rounding steps of the reference (the interpreter truncates)."""
    g = torch.Generator().manual_seed(6)
    gu = (torch.randn(4, 2 * 1500, generator=g) * 3).to(dtype).to(DEV)
    gate, up = gu[:, :1500], gu[:, 1500:]
    y = norm.silu_mul(gate, up, sigmoid)
    act = torch.sigmoid if sigmoid else torch.nn.functional.silu
    ref = act(gate.cpu()) * up.cpu()
    assert y.dtype == dtype and y.shape == (4, 1500)
    tol = 2e-6 if dtype == torch.float32 else 2 ** -6
    assert ((y.cpu().float() - ref.float()).abs() <= tol * ref.float().abs() + 1e-6).all()
    assert norm.silu_mul(gate, up[:3]) is None and norm.silu_mul(gate.t(), up.t()) is None


@pytest.mark.parametrize("int8", [False, True], ids=["plain", "int8"])
def test_silu_mul_reads_a_per_head_gate_in_place(int8):
    """The attention output gate: each head's gate is the second half of its [q | gate] columns, (T, H, Dh) with
    heads 2 Dh apart. silu_mul reads it in place (no copy) and gives the bits of the same gate made contiguous
    first, with the same int8 rows; heads that are one run of columns take the plain path."""
    g = torch.Generator().manual_seed(8)
    T, H, D = 3, 4, 64
    qg = (torch.randn(T, H * 2 * D + 40, generator=g) * 3).to(torch.bfloat16).to(DEV)[:, 40:].view(T, H, 2 * D)
    gate, o = qg[..., D:], torch.randn(T, H * D, generator=g).to(torch.bfloat16).to(DEV)
    y = norm.silu_mul(gate, o, True, int8=int8)
    ref = norm.silu_mul(gate.reshape(T, H * D), o, True, int8=int8)
    assert y.shape == (T, H * D) and torch.equal(y, ref)
    if int8:
        assert all(torch.equal(a, b) for a, b in zip(y.int8_rows, ref.int8_rows))
    assert torch.equal(norm.silu_mul(gate[:, :1], o[:, :D], True), norm.silu_mul(gate[:, 0], o[:, :D], True))
    assert norm.silu_mul(gate, o[:, :-1], True) is None and norm.silu_mul(gate.transpose(1, 2), o, True) is None
    from dflash24.models import layers
    cpu = layers.silu_mul(gate.cpu(), o.cpu(), sigmoid=True)                    # the reference takes the same shapes
    assert torch.equal(cpu, torch.sigmoid(gate.cpu().reshape(T, -1)) * o.cpu())


def test_unsupported_layouts_fall_back():
    x = torch.randn(4, 64).to(DEV)
    assert norm.rms_norm(x.t().contiguous().t(), torch.ones(4, device=DEV), 1e-6) is None   # last dim strided
    assert norm.rms_norm(x, torch.ones(32, device=DEV), 1e-6) is None                       # wrong weight size


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_layers_use_the_kernel_on_cuda():
    """layers.rms_norm on CUDA (the fused kernel) matches its CPU reference; with autograd it keeps the
    differentiable reference."""
    x = torch.randn(5, 5120, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(5120, device="cuda")
    with torch.no_grad():
        _close(rms_norm(x, w, 1e-6), _reference(x, w, 1e-6), torch.bfloat16)
    xr = x.float().requires_grad_()
    rms_norm(xr, w, 1e-6).sum().backward()
    assert xr.grad is not None


# A one-token decode step's shapes, shrunk (norm: D not a power of two, the tile's masked tail; gated: DeltaNet's
# gated norm, 12 head rows of 512, two programs of 8 rows; silu: two column blocks, the last of 128), and a verify
# step's (bf16, whole 256-value steps; norm: three steps a row; gated: rows of one 128-value head, 4 heads a token).
DECODE_SHAPES = dict(norm=(1, 160), gated=(1, 12, 512), add=(1, 192), silu=(1, 1152), seed=11)
VERIFY_SHAPES = dict(norm=(5, 768), gated=(3, 4, 128), add=(7, 512), silu=(4, 1280), seed=12)


def _fused_case(case: str, shapes: dict, **flags):
    """One fused kernel's output in `shapes`, with the extra outputs `flags` asks for (int8= / pairs=)."""
    g = torch.Generator().manual_seed(shapes["seed"])
    bf = torch.bfloat16
    if case == "norm":
        t, d = shapes["norm"]
        return norm.rms_norm((torch.randn(t, d, generator=g) * 3).to(bf).to(DEV),
                             torch.randn(d, generator=g).to(DEV), 1e-6, **flags)
    if case == "gated":
        o = torch.randn(*shapes["gated"], generator=g).to(DEV)
        z = torch.randn(*shapes["gated"], generator=g).to(bf).to(DEV)
        return norm.rms_norm(o, torch.randn(shapes["gated"][-1], generator=g).to(DEV), 1e-6, z, bf, **flags)
    if case == "add":
        t, d = shapes["add"]
        x, r = (torch.randn(2, t, d, generator=g) * 2).to(bf).to(DEV)
        return norm.add_rms_norm(x, r, torch.randn(d, generator=g).to(DEV), 1e-6, **flags)[1]
    t, d = shapes["silu"]
    gu = (torch.randn(t, 2 * d, generator=g) * 3).to(bf).to(DEV)
    return norm.silu_mul(gu[:, :d], gu[:, d:], case == "sigmoid", **flags)


@pytest.mark.parametrize("case", ["norm", "gated", "add", "silu", "sigmoid"])
def test_int8_rows_are_the_gemv_rounding_of_the_output(case):
    """With int8=True the kernel's output carries the decode GEMV's int8 activations of exactly its stored values
    (what quantize_x makes of them, both word orders: every type's and Q6_K's), and the output itself is the same
    bits as without them."""
    from gguf import GGMLQuantizationType as QT

    from dflash24.quant import kernels
    y = _fused_case(case, DECODE_SHAPES, int8=True)
    plain = _fused_case(case, DECODE_SHAPES, int8=False)
    assert torch.equal(y, plain) and not hasattr(plain, kernels.INT8_ATTR)
    rows = getattr(y, kernels.INT8_ATTR)
    assert rows.k == y.numel()
    for qtype in (QT.Q4_K, QT.Q6_K):
        xw, dx, xs = kernels.quantize_x(y.reshape(-1), qtype)
        got = rows.for_type(qtype)
        assert torch.equal(got[0], xw) and torch.equal(got[1], dx) and torch.equal(got[2], xs), qtype.name
    assert not torch.equal(rows.words, rows.words6)


def test_int8_rows_need_whole_blocks():
    """Rows that are not whole 32-value blocks get no int8 rows (their GEMVs round x themselves)."""
    from dflash24.quant import kernels
    y = norm.rms_norm(torch.randn(1, 48).to(DEV), None, 1e-6, int8=True)
    assert y is not None and not hasattr(y, kernels.INT8_ATTR)
    y = norm.rms_norm(torch.randn(1, 6, 16).to(DEV), None, 1e-6, int8=True)   # heads of 16: 96 values, rows of 16
    assert y is not None and not hasattr(y, kernels.INT8_ATTR)
    gu = torch.randn(1, 2 * 40).to(DEV)
    y = norm.silu_mul(gu[:, :40], gu[:, 40:], int8=True)
    assert y is not None and not hasattr(y, kernels.INT8_ATTR)


@pytest.mark.parametrize("case", ["norm", "add"])
def test_a_decode_row_over_several_programs_is_the_same_bits(case, monkeypatch):
    """A one-token row written COLS columns a program (each reading the whole row for its mean square) gives the
    same output, residual sum and int8 activations as one program a row, down to the bit; the last program's
    columns partly past the row (160 = 64 + 64 + 32)."""
    from dflash24.quant import kernels

    def run(cols):
        monkeypatch.setattr(norm, "COLS", cols)
        assert norm._tile(1, DECODE_SHAPES[case][1])[0][1] == (-(-DECODE_SHAPES[case][1] // cols) if cols else 1)
        g = torch.Generator().manual_seed(3)
        t, d = DECODE_SHAPES[case]
        x, r = (torch.randn(2, t, d, generator=g) * 3).to(torch.bfloat16).to(DEV)
        w = torch.randn(d, generator=g).to(DEV)
        if case == "norm":
            return [norm.rms_norm(x, w, 1e-6, int8=True)]
        return list(norm.add_rms_norm(x, r, w, 1e-6, int8=True))

    split, whole = run(64), run(0)
    for a, b in zip(split, whole):
        assert torch.equal(a, b)
    for a, b in zip(getattr(split[-1], kernels.INT8_ATTR), getattr(whole[-1], kernels.INT8_ATTR)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("case", ["norm", "add"])
def test_verify_rows_over_several_programs_are_the_same_bits(case, monkeypatch):
    """A verify step's rows (10 of 384, up to COLS_ROWS) written VERIFY_COLS columns a program give the same output,
    residual sum, int8 activations and pair-order copies as whole rows a program, down to the bit; more rows than
    COLS_ROWS keep whole rows a program; a decode row takes COLS, not VERIFY_COLS."""
    from dflash24.quant import kernels
    monkeypatch.setattr(norm, "VERIFY_COLS", 64)
    monkeypatch.setattr(norm, "COLS", 128)
    assert norm._tile(10, 384)[0][1] == 6 and norm._tile(65, 384)[0][1] == 1 and norm._tile(1, 384)[0][1] == 3

    def run(cols_rows):
        monkeypatch.setattr(norm, "COLS_ROWS", cols_rows)
        assert norm._tile(10, 384)[0][1] == (6 if cols_rows else 1)
        g = torch.Generator().manual_seed(5)
        x, r = (torch.randn(2, 2, 5, 384, generator=g) * 3).to(torch.bfloat16).to(DEV)
        w = torch.randn(384, generator=g).to(DEV)
        if case == "norm":
            return [norm.rms_norm(x, w, 1e-6, int8=True, pairs=True)]
        return list(norm.add_rms_norm(x, r, w, 1e-6, int8=True, pairs=True))

    split, whole = run(64), run(0)
    for a, b in zip(split, whole):
        assert torch.equal(a, b)
    for attr in (kernels.INT8_ATTR, kernels.PAIRS_ATTR):
        for a, b in zip(getattr(split[-1], attr), getattr(whole[-1], attr)):
            assert (a is None and b is None) or torch.equal(a, b)   # (the dot orders: where dot_pairs_needed)


@pytest.mark.parametrize("shapes", ["decode", "verify"])
def test_rows_a_program_do_not_change_the_bits(shapes, monkeypatch):
    """The gated norm's short rows (heads) taken up to ROWS a program (16, 4, 1; 12 rows: a partial last program)
    give the same output, int8 activations and pair-order copies, down to the bit."""
    from dflash24.quant import kernels
    sh = dict(DECODE_SHAPES if shapes == "decode" else VERIFY_SHAPES, gated=(1, 12, 128))
    flags = dict(int8=True) if shapes == "decode" else dict(pairs=True)
    attr = kernels.INT8_ATTR if shapes == "decode" else kernels.PAIRS_ATTR
    outs = []
    for rows in (16, 4, 1):
        monkeypatch.setattr(norm, "ROWS", rows)
        assert norm._tile(12, 128)[0][0] == -(-12 // rows)
        outs.append(_fused_case("gated", sh, **flags))
    for y in outs[1:]:
        assert torch.equal(y, outs[0])
        for a, b in zip(getattr(y, attr), getattr(outs[0], attr)):
            assert (a is None and b is None) or torch.equal(a, b)


@pytest.mark.parametrize("dot", [True, False], ids=["dot", "gluon_only"])
@pytest.mark.parametrize("case", ["norm", "gated", "add", "silu", "sigmoid"])
def test_pair_rows_are_the_output_in_pair_order(case, dot, monkeypatch):
    """With pairs=True the kernel's output carries itself in the dot kernel's two pair orders (the copy for 32-weight
    blocks and Q6_K's; only where asked for: `kernels.dot_pairs_needed`) and in the Gluon kernel's two orders, each
    equal to that order of the stored values read as (tokens, K) rows, whatever the kernel's own rows are (the gated
    norm's are single heads); the output itself is the same bits as without."""
    from gguf import GGMLQuantizationType as QT

    from dflash24.quant import kernels
    from dflash24.quant.gluon_matmul import gluon_order
    monkeypatch.setattr(kernels, "DOT_PAIRS", dot)
    y = _fused_case(case, VERIFY_SHAPES, pairs=True)
    plain = _fused_case(case, VERIFY_SHAPES, pairs=False)
    assert torch.equal(y, plain) and not hasattr(plain, kernels.PAIRS_ATTR)
    rows = getattr(y, kernels.PAIRS_ATTR)
    x = y.reshape(y.shape[0], -1)
    for qtype in (QT.Q4_K, QT.Q5_0, QT.Q6_K):
        if dot:
            assert torch.equal(rows.for_type(qtype, x.shape[1]), kernels.pair_order(x, qtype)), qtype.name
        else:
            assert rows.for_type(qtype, x.shape[1]) is None
    for qtype in (QT.Q4_K, QT.Q5_K, QT.Q6_K):
        assert torch.equal(rows.gluon(qtype, x.shape[1]), gluon_order(x, qtype)), qtype.name
    copies = [rows.a, rows.b, rows.g, rows.g16] if dot else [rows.g, rows.g16]
    assert all(not torch.equal(u, v) for i, u in enumerate(copies) for v in copies[i + 1:])
    made = kernels.PairRows.of(x)           # what the benchmarks hand the matmuls: the same copies
    assert all(torch.equal(u, v) for u, v in zip(made[-len(copies):], copies))


def test_dot_pair_orders_only_where_a_verify_matmul_can_run_the_dot_kernel(monkeypatch):
    """The dot kernel's pair orders are written unless the Gluon kernel takes every verify matmul that would read
    them: a device without it (the CPU here), DFLASH24_GLUON=0, the batch-invariant mode and the mmq path all
    need them; a matmul handed pair rows without them runs the dot kernel on x itself, to the same values."""
    from gguf import GGMLQuantizationType as QT

    from dflash24.quant import gluon_matmul, kernels
    from dflash24.quant.packed import pack
    from dflash24.quant.quantize import quantize
    cpu = torch.device("cpu")
    assert kernels.dot_pairs_needed(cpu) == (not gluon_matmul.available(cpu))
    monkeypatch.setattr(gluon_matmul, "available", lambda device: True)
    assert not kernels.dot_pairs_needed(cpu)
    for name, value in (("GLUON", False), ("BATCH_INVARIANT", True), ("SMALL_M_MATMUL", "mmq")):
        with monkeypatch.context() as m:
            m.setattr(kernels, name, value)
            assert kernels.dot_pairs_needed(cpu), name
    with monkeypatch.context() as m:
        m.setattr(kernels, "GLUON_TYPES", kernels.GLUON_TYPES - {QT.Q6_K})
        assert kernels.dot_pairs_needed(cpu)
    monkeypatch.setattr(kernels, "DOT_PAIRS", True)
    assert kernels.dot_pairs_needed(cpu)
    monkeypatch.undo()
    # pair rows without the dot orders reach the dot kernel (no Gluon here): it reads x itself
    g = torch.Generator().manual_seed(2)
    w = torch.randn(64, 512, generator=g)
    x = torch.randn(4, 512, generator=g).to(torch.bfloat16).to(DEV)
    p = pack(quantize(w, QT.Q4_K).to(DEV), QT.Q4_K, 512)
    rows = kernels.PairRows.empty(x.numel(), x.device, dot=False)
    assert rows.a is None and rows.b is None and rows.for_type(QT.Q4_K, 512) is None
    if not kernels._gluon(p, x):
        assert torch.equal(kernels.matmul(x, p, pairs=rows), kernels.matmul(x, p))


def test_pair_rows_only_for_bf16_whole_steps(monkeypatch):
    from dflash24.quant import kernels
    bf = torch.bfloat16
    y = norm.rms_norm(torch.randn(2, 512).to(DEV), None, 1e-6, pairs=True)               # fp32: no bf16 pairs
    assert y is not None and not hasattr(y, kernels.PAIRS_ATTR)
    y = norm.rms_norm(torch.randn(3, 160).to(bf).to(DEV), None, 1e-6, pairs=True)        # 480 values
    assert y is not None and not hasattr(y, kernels.PAIRS_ATTR)
    monkeypatch.setattr(norm, "PAIRS", False)                                            # DFLASH24_NORM_PAIRS=0
    y = norm.rms_norm(torch.randn(2, 512).to(bf).to(DEV), None, 1e-6, pairs=True)
    assert y is not None and not hasattr(y, kernels.PAIRS_ATTR)
