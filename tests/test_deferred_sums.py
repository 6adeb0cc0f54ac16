"""Split-K partial sums left to the residual add + norm that reads the matmul's result (quant.kernels.deferred_sums):
the norm sums them in split order itself, so everything it writes (s, the normed row, its int8 / pair-order rows)
and the matmul's result it writes on the way are the bits of the matmul that summed its own partials. Triton's
interpreter on the CPU; the same on a GPU."""
from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as QT

pytest.importorskip("triton")

from dflash24.kernels import norm  # noqa: E402
from dflash24.models import layers  # noqa: E402
from dflash24.quant import kernels  # noqa: E402
from dflash24.quant.formats import random_raw  # noqa: E402
from dflash24.quant.packed import pack  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _deferring(monkeypatch):
    monkeypatch.setattr(kernels, "DEFER_SUMS", True)          # off by default (DFLASH24_DEFER_SUMS=1) until timed


def _weight(n: int, k: int, seed: int):
    return pack(random_raw(QT.Q4_K, n, k, generator=torch.Generator().manual_seed(seed), d_scale=0.01).to(DEV),
                QT.Q4_K, k)


def _matmul(x, p, bias, split: int):
    """x @ W^T + bias in bf16 with K split in `split` (the GEMV for one row, the tl.dot kernel for more)."""
    if x.shape[0] == 1:
        cfg = kernels.gemv_config(p, x.device)
        g = cfg["G"]
        nblk = p.k // 32
        return kernels.gemv(x, p, dict(cfg, split=split, per=-(-nblk // split // g) * g), out_dtype=x.dtype,
                            bias=bias)
    cfg = kernels.dot_config(p, x.shape[0], x.device)
    steps = p.k // 256
    return kernels.matmul(x, p, dict(cfg, split=split, per=-(-steps // split) * cfg["G"], stream=0),
                          out_dtype=x.dtype, bias=bias)


@pytest.mark.parametrize("rows,d,split,bias", [(1, 2048, 2, False), (3, 2048, 4, True), (5, 512, 2, False),
                                               (16, 2048, 2, False)],
                         ids=["decode-int8", "cols-bias", "whole-rows", "verify-pairs"])
def test_the_norm_sums_deferred_partials_to_the_same_bits(rows, d, split, bias, monkeypatch):
    if DEV == "cpu":
        monkeypatch.setitem(kernels._GEMV_TILE, QT.Q4_K, (64, 8, 1, 1))      # 32x fewer interpreted programs
    g = torch.Generator().manual_seed(rows)
    k = 256 * split
    p = _weight(d, k, seed=d + split)
    b = torch.randn(d, generator=g).to(DEV) if bias else None
    a = torch.randn(rows, k, generator=g).to(torch.bfloat16).to(DEV)
    x = torch.randn(rows, d, generator=g).to(torch.bfloat16).to(DEV)
    w = (torch.rand(d, generator=g) + 0.5).to(DEV)
    flags = dict(int8=rows == 1, pairs=rows == 16)
    ref = _matmul(a, p, b, split)
    assert not hasattr(ref, kernels.SPLIT_ATTR)
    with kernels.deferred_sums():
        res = _matmul(a, p, b, split)
    parts = getattr(res, kernels.SPLIT_ATTR)
    assert parts.y.shape == (split, rows, d)
    s0, y0 = norm.add_rms_norm(x, ref, w, 1e-6, **flags)
    s1, y1 = norm.add_rms_norm(x, res, w, 1e-6, **flags)
    assert torch.equal(s1, s0) and torch.equal(y1, y0)
    assert torch.equal(res, ref) and not hasattr(res, kernels.SPLIT_ATTR)       # written on the way, settled
    for attr in (kernels.INT8_ATTR, kernels.PAIRS_ATTR):
        assert hasattr(y1, attr) == hasattr(y0, attr)
        if hasattr(y0, attr):
            assert all(torch.equal(u, v) for u, v in zip(getattr(y1, attr), getattr(y0, attr)))


def test_settle_and_the_reference_path_write_the_partials_first(monkeypatch):
    p = _weight(512, 1024, seed=3)
    a = torch.randn(4, 1024).to(torch.bfloat16).to(DEV)
    x = torch.randn(4, 512).to(torch.bfloat16).to(DEV)
    ref = _matmul(a, p, None, 2)
    with kernels.deferred_sums():
        res = _matmul(a, p, None, 2)
        res2 = _matmul(a, p, None, 2)
    assert kernels.settle(res) is res and torch.equal(res, ref) and not hasattr(res, kernels.SPLIT_ATTR)
    assert kernels.settle(ref) is ref                                    # nothing deferred: unchanged
    monkeypatch.setattr(layers, "_use_fused_norm", lambda *a: False)     # the PyTorch add + norm
    s, _ = layers.add_rms_norm(x, res2, torch.ones(512, device=DEV), 1e-6)
    assert torch.equal(s, x + ref) and not hasattr(res2, kernels.SPLIT_ATTR)


def test_only_inside_the_context_and_not_when_off(monkeypatch):
    p = _weight(512, 1024, seed=4)
    a = torch.randn(4, 1024).to(torch.bfloat16).to(DEV)
    with kernels.deferred_sums():
        with kernels.deferred_sums():
            pass
        assert hasattr(_matmul(a, p, None, 2), kernels.SPLIT_ATTR)     # an inner context restores the outer one
        assert not hasattr(_matmul(a, p, None, 1), kernels.SPLIT_ATTR)  # unsplit: the kernel stored it
    assert not hasattr(_matmul(a, p, None, 2), kernels.SPLIT_ATTR)
    monkeypatch.setattr(kernels, "DEFER_SUMS", False)
    with kernels.deferred_sums():
        assert not hasattr(_matmul(a, p, None, 2), kernels.SPLIT_ATTR)
