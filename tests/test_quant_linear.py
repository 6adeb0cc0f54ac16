"""QuantLinear / QuantEmbedding: interface, CPU path vs the reference, errors; GPU path with -m gpu."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT

from dflash24.gguf.reader import TensorInfo
from dflash24.quant.formats import dequantize, random_raw
from dflash24.quant.linear import QuantEmbedding, QuantLinear

TYPES = [QT.F32, QT.F16, QT.BF16, QT.Q8_0, QT.Q4_0, QT.Q5_0, QT.Q4_K, QT.Q5_K, QT.Q6_K]


def _info(qtype, rows, cols, seed=0, name="blk.0.test.weight") -> TensorInfo:
    raw = random_raw(qtype, rows, cols, generator=torch.Generator().manual_seed(seed), d_scale=0.01)
    return TensorInfo(name, qtype, (rows, cols), raw.numpy())


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_linear_cpu_matches_reference(qtype):
    info = _info(qtype, 48, 512, seed=int(qtype))
    bias = torch.randn(48)
    lin = QuantLinear.from_gguf(info, "cpu", torch.float32, bias=bias)
    assert (lin.in_features, lin.out_features, lin.qtype) == (512, 48, qtype)
    assert lin.nbytes == 48 * 512 * 4 + 48 * 4
    x = torch.randn(2, 3, 512)
    y = lin(x)
    w = dequantize(torch.from_numpy(np.asarray(info.data)), qtype, 512)
    assert y.shape == (2, 3, 48) and y.dtype == torch.float32
    assert torch.allclose(y, x @ w.T + bias, rtol=1e-5, atol=1e-5)
    yb = lin(x.bfloat16())
    assert yb.dtype == torch.bfloat16


def test_linear_errors_name_the_tensor():
    info = _info(QT.Q4_K, 8, 256)
    bad = TensorInfo("blk.3.ffn_up.weight", QT.IQ4_XS, (8, 256), np.zeros((8, 136), np.uint8))
    with pytest.raises(ValueError, match=r"blk\.3\.ffn_up\.weight.*IQ4_XS"):
        QuantLinear.from_gguf(bad, "cpu")
    with pytest.raises(ValueError, match="bias"):
        QuantLinear.from_gguf(info, "cpu", bias=torch.zeros(7))
    lin = QuantLinear.from_gguf(info, "cpu")
    with pytest.raises(ValueError, match="features"):
        lin(torch.zeros(1, 255))


@pytest.mark.parametrize("qtype", [QT.Q5_0, QT.Q4_K, QT.Q6_K, QT.F32], ids=lambda q: q.name)
def test_embedding_cpu(qtype):
    info = _info(qtype, 100, 256, seed=2, name="token_embd.weight")
    emb = QuantEmbedding.from_gguf(info, "cpu", torch.bfloat16)
    ids = torch.tensor([5, 0, 99, 5])
    out = emb(ids)
    full = dequantize(torch.from_numpy(np.asarray(info.data)), qtype, 256)
    assert out.shape == (4, 256) and out.dtype == torch.bfloat16
    assert torch.equal(out, full[ids].bfloat16())
    assert emb.nbytes == info.n_bytes                 # rows stay packed


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_0, QT.Q5_0, QT.Q4_K, QT.Q5_K, QT.Q6_K], ids=lambda q: q.name)
def test_embedding_kernel_gives_the_reference_bits(qtype):
    """The one-launch gather + decode of embedding rows (quant/embed.py; Triton's interpreter here) gives the
    reference dequantizer's values bit for bit, scales random half floats of every range (subnormals included),
    in fp32 (bf16: within the interpreter's truncation); an id outside the table reads the nearest row."""
    from dflash24.quant import embed
    pytest.importorskip("triton")
    dev = "cuda" if torch.cuda.is_available() else "cpu"      # CPU: Triton's interpreter
    table = random_raw(qtype, 40, 512, generator=torch.Generator().manual_seed(int(qtype)))
    ids = torch.tensor([0, 39, 7, 7, 21, -3, 40])
    ref = dequantize(table, qtype, 512)[ids.clamp(0, 39)].to(dev)
    table, ids = table.to(dev), ids.to(dev)
    got = embed.embed_rows(table, ids, qtype, 512, torch.float32)
    torch.testing.assert_close(got, ref, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(embed.embed_rows(table[ids.clamp(0, 39)], None, qtype, 512, torch.float32), got)  # in order
    bf = embed.embed_rows(table, ids[:5], qtype, 512, torch.bfloat16).float()    # the interpreter truncates to bf16
    fin = ref[:5].isfinite() & (ref[:5].abs() < 3e38)                               # (the GPU test: the same bits)
    assert ((bf - ref[:5]).abs() <= 2 ** -7 * ref[:5].abs())[fin].all()
    assert embed.embed_rows(table, ids[:0], qtype, 512, torch.float32).shape == (0, 512)


def test_embedding_kernel_refuses_what_it_cannot_read():
    from dflash24.quant import embed
    pytest.importorskip("triton")
    f16 = random_raw(QT.F16, 4, 256, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="no kernel for F16"):
        embed.embed_rows(f16, torch.tensor([1]), QT.F16, 256, torch.float32)
    q4 = random_raw(QT.Q4_K, 4, 512, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"\(4, 144\) uint8 Q4_K table"):
        embed.embed_rows(q4, torch.tensor([1]), QT.Q4_K, 256, torch.float32)
    with pytest.raises(ValueError, match="contiguous"):
        embed.embed_rows(q4[:, :144], torch.tensor([1]), QT.Q4_K, 256, torch.float32)


# ---------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [1, 7, 16, 100])
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_linear_gpu_matches_cpu(qtype, m):
    info = _info(qtype, 1024, 2048, seed=int(qtype))
    bias = torch.randn(1024)
    cpu = QuantLinear.from_gguf(info, "cpu", torch.float32, bias=bias)
    gpu = QuantLinear.from_gguf(info, "cuda", torch.bfloat16, bias=bias)
    if qtype in (QT.Q8_0, QT.Q4_0, QT.Q5_0, QT.Q4_K, QT.Q5_K, QT.Q6_K):
        assert gpu.packed is not None and gpu.nbytes < 1024 * 2048 * 2   # stays in blocks (Q8_0: 34 B / 32)
    x = torch.randn(m, 2048)
    ref = cpu(x)
    y = gpu(x.cuda().bfloat16())
    assert y.dtype == torch.bfloat16 and y.shape == (m, 1024)
    assert (y.float().cpu() - ref).abs().max() <= 1e-2 * ref.abs().max()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("host", [False, True])
@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K, QT.Q5_K, QT.Q8_0, QT.Q5_0, QT.F16], ids=lambda q: q.name)
def test_embedding_gpu(host, qtype):
    """Gather + decode on the GPU (one kernel for the block types, embed.py; a gather + PyTorch for F16): the CPU
    reference's bits, from a device table and from pinned host memory, inside a CUDA graph too."""
    info = _info(qtype, 1000, 1024, seed=4, name="token_embd.weight")
    emb = QuantEmbedding.from_gguf(info, "cuda", torch.bfloat16, host=host)
    assert emb.nbytes == (0 if host else info.n_bytes)
    ids = torch.tensor([3, 999, 0, 3], device="cuda")
    out = emb(ids)
    full = dequantize(torch.from_numpy(np.asarray(info.data)), qtype, 1024)
    assert torch.equal(out.cpu(), full[ids.cpu()].bfloat16())
    # Capturable: the gather + dequantize replay inside a CUDA graph.
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out_g = emb(ids)
    ids.copy_(torch.tensor([1, 2, 3, 4]))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out_g.cpu(), full[[1, 2, 3, 4]].bfloat16())


def test_fused_linear_stacks_what_it_can():
    """FusedLinear: layers of one block type (and all-dense layers of one dtype) become one stacked weight;
    outputs come back per layer, in order, equal to each layer alone; biases travel with their rows."""
    from dflash24.quant.linear import FusedLinear
    from dflash24.quant.packed import pack
    from dflash24.quant.formats import random_raw
    g = torch.Generator().manual_seed(4)
    k = 256

    def packed(qt, n, bias=False):
        raw = random_raw(qt, n, k, generator=g, d_scale=0.01)
        return QuantLinear(k, n, qt, packed=pack(raw, qt, k), bias=torch.randn(n, generator=g) if bias else None)

    a, b, c, d = packed(QT.Q4_K, 24), packed(QT.Q6_K, 8), packed(QT.Q4_K, 40), packed(QT.Q4_K, 16, bias=True)
    fused = FusedLinear(a, b, c, d)
    assert [len(i) for i in fused.groups] == [2, 1, 1]                    # a + c stacked; b (Q6_K), d (bias) alone
    assert fused.parts[0].packed.n == 64 and fused.nbytes == a.nbytes + b.nbytes + c.nbytes + d.nbytes
    e, f = (QuantLinear(k, 5, QT.F32, weight=torch.randn(5, k, generator=g)),
            QuantLinear(k, 3, QT.F16, weight=torch.randn(3, k, generator=g)))
    dense = FusedLinear(e, f)
    assert len(dense.parts) == 1                                          # dense float weights of one dtype
    x = torch.randn(3, k, generator=g)
    cases = [(dense, (e, f))]
    from dflash24.quant import kernels
    if kernels.HAVE_TRITON:                                               # packed layers: the Triton kernels
        cases.append((fused, (a, b, c, d)))
    for fl, layers in cases:
        outs = fl(x)
        assert [o.shape[-1] for o in outs] == [lin.out_features for lin in layers]
        for o, lin in zip(outs, layers):
            want = lin(x)
            assert torch.allclose(o, want, rtol=0, atol=1e-5 * want.abs().max().item())

