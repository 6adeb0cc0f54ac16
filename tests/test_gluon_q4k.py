"""The Gluon Q4_K small-M matmul (quant/gluon_q4k.py).

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

from dflash24.quant import gluon_q4k as G
from dflash24.quant import kernels
from dflash24.quant.formats import dequantize, random_raw
from dflash24.quant.packed import pack

ROOT = Path(__file__).resolve().parent.parent


def _case(n, k, m, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    raw = random_raw(QT.Q4_K, n, k, generator=g, d_scale=0.01)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    return raw.to(device), x.to(device), pack(raw, QT.Q4_K, k).to(device)


def _natural_bf16_weights(p):
    """The dot kernel's PAIRS decode of p in natural K order (weight 32 b + 4 f + w = field f of word w of 32-block
    b): A q + B with A / 16 and A + B rounded to bf16, then the result."""
    a = p.arrays
    n, steps = p.n, p.k // 256
    words = a["qs"].reshape(n, steps, 8, 4).to(torch.int64) & 0xFFFFFFFF
    codes = (words[..., None] >> (4 * torch.arange(8))) & 0xF                      # (n, s, b, w, f)
    d = a["d"].reshape(n, steps).float()[:, :, None]
    dm = a["dmin"].reshape(n, steps).float()[:, :, None]
    aa = d * a["sc"].reshape(n, steps, 8).float() * 16.0
    bb = -(aa + dm * a["mn"].reshape(n, steps, 8).float())
    ap = (aa * 0.0625).to(torch.bfloat16).float()[..., None, None]
    bp = (aa + bb).to(torch.bfloat16).float()[..., None, None]
    w = (codes.float() * ap + bp).to(torch.bfloat16).float()
    return w.permute(0, 1, 2, 4, 3).reshape(n, p.k)


@pytest.mark.parametrize("n,k", [(8, 256), (48, 512), (33, 1280)])
def test_kernel_k_order_is_gluon_order(n, k):
    raw, _, p = _case(n, k, 1, seed=n + k)
    natural = _natural_bf16_weights(p)
    assert torch.equal(G.reference_weights(p), G.gluon_order(natural))
    # and the natural decode is the dequantized weight to bf16 rounding (three roundings of at most 2^-9 each)
    w = dequantize(raw, QT.Q4_K, k).reshape(n, k).float()
    a = (p.arrays["d"].reshape(n, -1).float().abs() * 63 * 16).repeat_interleave(256, dim=1)
    assert ((natural - w).abs() <= 3 * 2.0 ** -8 * (a + w.abs()) + 1e-6).all()


def test_gluon_order_is_a_permutation_of_each_step():
    x = torch.arange(2 * 512, dtype=torch.float32).reshape(2, 512)
    xo = G.gluon_order(x)
    for s in range(2):
        assert sorted(xo[0, 256 * s:256 * (s + 1)].tolist()) == list(range(256 * s, 256 * (s + 1)))
    # position 128 j + 32 c + 16 p1 + 8 p0 + 2 q + h <- column 32 (2 q + j) + 16 h + 8 p1 + 4 p0 + c
    assert xo[0, 128 * 1 + 32 * 2 + 16 * 1 + 8 * 0 + 2 * 3 + 1].item() == 32 * 7 + 16 + 8 + 2
    with pytest.raises(ValueError, match="multiple of 256"):
        G.gluon_order(torch.zeros(1, 288))


def test_config_names_what_it_cannot_take():
    _, _, p = _case(8, 256, 1, seed=1)
    with pytest.raises(ValueError, match="1..32 rows"):
        G.config(p, 33, torch.device("cpu"))
    q8 = pack(random_raw(QT.Q8_0, 8, 256), QT.Q8_0, 256)
    with pytest.raises(ValueError, match="needs Q4_K"):
        G.config(q8, 16, torch.device("cpu"))
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="Gluon"):
            G.matmul(torch.zeros(2, 256, dtype=torch.bfloat16), p)


_COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from dflash24.quant import gluon_q4k as G
out = []
for arch, bm, bn, pdl in [(90, 16, 64, True), (90, 32, 64, True), (90, 16, 128, False), (86, 16, 64, False)]:
    fn = G._q4k_kernel
    sig = {"x_ptr": "*bf16", "y_ptr": "*fp32", "qs_ptr": "*i32", "sc_ptr": "*i16", "mn_ptr": "*i16",
           "d_ptr": "*fp16", "dm_ptr": "*fp16", "M": "i32", "N": "i32", "NSTEP": "i32", "s_xm": "i32", "s_qs": "i32",
           "s_sc": "i32", "s_d": "i32", "steps_per_split": "i32"}
    const = {"BLOCK_M": bm, "BLOCK_N": bn, **G.layouts(bm, bn), "PDL": pdl}
    sig.update({k: "constexpr" for k in const})
    div = ["x_ptr", "y_ptr", "qs_ptr", "sc_ptr", "mn_ptr", "d_ptr", "dm_ptr", "s_xm", "s_qs", "s_sc"]
    src = GluonASTSource(fn=fn, signature=sig, attrs={(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k in div},
                         constexprs={(fn.arg_names.index(k),): v for k, v in const.items()})
    c = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=4))
    ptx = c.asm["ptx"]
    out.append(dict(arch=arch, bm=bm, bn=bn, pdl=pdl, shared=c.metadata.shared, mma=ptx.count("mma.sync"),
                    local=ptx.count(".local"), wait=ptx.count("griddepcontrol.wait")))
print(json.dumps(out))
"""


@pytest.mark.skipif(not G.HAVE_GLUON, reason="triton without Gluon")
def test_compiles_with_weights_straight_to_registers():
    """The real compiler, no GPU: shared memory is the x ring alone (2 steps x BM x 256 bf16), so no weight word
    goes through shared memory, and the step's dots are mma.sync."""
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
def test_matmul_vs_reference_gpu(n, k, m):
    raw, x, p = _case(n, k, m, seed=n + k + m, device="cuda")
    ref = kernels.reference_matmul(x, raw, QT.Q4_K, k)
    y = G.matmul(x, p)
    assert y.shape == (m, n) and y.dtype == torch.float32
    assert (y - ref).abs().max().item() <= 1e-2 * ref.abs().max().item()
    # the same bf16 weights and x as the dot kernel: the two differ by the order of fp32 sums only
    y_dot = kernels._matmul_dot(x, p, kernels.dot_config(p, m, x.device), torch.float32, None)
    assert (y - y_dot).abs().max().item() <= 1e-4 * ref.abs().max().item()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("split", [1, 2, 4])
def test_bias_split_and_dtype_gpu(split):
    raw, x, p = _case(96, 1024, 16, seed=5, device="cuda")
    bias = torch.randn(96, device="cuda")
    cfg = dict(BLOCK_M=16, BLOCK_N=64, split=split, per=4 // split)
    y = G.matmul(x, p, cfg, out_dtype=torch.bfloat16, bias=bias)
    ref = kernels.reference_matmul(x, raw, QT.Q4_K, 1024) + bias
    assert y.dtype == torch.bfloat16
    assert (y.float() - ref).abs().max().item() <= 1e-2 * ref.abs().max().item()
