"""The PyTorch reference dequantizer is bit-exact with gguf-py's numpy dequantizers."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize as np_dequantize, quantize as np_quantize

from dflash24.quant.formats import BLOCK_TYPES, block_type, dequantize, random_raw, row_bytes


def _model_path(env: str, use_default: bool) -> str | None:
    path = os.environ.get(env)
    if path and os.path.isfile(path):
        return path
    if use_default:
        try:
            from dflash24.default_model import default_model_path
            path = str(default_model_path())
        except Exception:  # helper not written yet, or the model is not installed
            return None
        return path if os.path.isfile(path) else None
    return None


@pytest.fixture(scope="module")
def gguf05():
    path = _model_path("DFLASH24_TEST_GGUF_05B", use_default=True)
    if path is None:
        pytest.skip("Qwen2.5-Coder-0.5B GGUF not found (set DFLASH24_TEST_GGUF_05B)")
    from dflash24.gguf.reader import GGUFFile
    return GGUFFile(path)


@pytest.fixture(scope="module")
def gguf15():
    path = _model_path("DFLASH24_TEST_GGUF_15B", use_default=False)
    if path is None:
        pytest.skip("Qwen2.5-Coder-1.5B GGUF not found (set DFLASH24_TEST_GGUF_15B)")
    from dflash24.gguf.reader import GGUFFile
    return GGUFFile(path)


def _check_exact(raw: np.ndarray, qtype, cols: int):
    ref = np_dequantize(raw, qtype).reshape(raw.shape[0], cols).astype(np.float32)
    out = dequantize(torch.from_numpy(np.ascontiguousarray(raw)), qtype, cols)
    assert out.dtype == torch.float32 and out.shape == (raw.shape[0], cols)
    assert np.isfinite(ref).all()
    # Bit patterns, not values: also catches -0.0 vs 0.0.
    assert torch.equal(out.view(torch.int32), torch.from_numpy(ref).view(torch.int32)), qtype.name


@pytest.mark.parametrize("qtype", list(BLOCK_TYPES), ids=lambda q: q.name)
def test_random_blocks_bit_exact(qtype):
    g = torch.Generator().manual_seed(int(qtype))
    # 608 = 19 blocks of 32: a row that is not a multiple of 256 (like the 0.5B's 896)
    cols = 768 if block_type(qtype).block == 256 else 608
    raw = random_raw(qtype, 37, cols, generator=g).numpy()
    _check_exact(raw, qtype, cols)


@pytest.mark.parametrize("qtype", [QT.F16, QT.BF16], ids=lambda q: q.name)
def test_random_half_bits_bit_exact(qtype):
    """Every finite 16-bit pattern (subnormals, -0.0) converts exactly."""
    bits = torch.arange(0, 65536, dtype=torch.int32).to(torch.int16)
    raw = bits.view(torch.uint8).reshape(256, 512).numpy()
    vals = raw.view(np.float16 if qtype == QT.F16 else np.uint16)
    if qtype == QT.F16:
        keep = np.isfinite(vals).all(axis=1)
    else:
        keep = ((vals & 0x7F80) != 0x7F80).all(axis=1)
    # Rows with a non-finite value are dropped; with 256 values per row only the rows at the
    # exponent-all-ones range disappear.
    _check_exact(raw[keep], qtype, 256)


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_0, QT.Q5_0], ids=lambda q: q.name)
def test_gguf_quantized_bit_exact(qtype):
    """Blocks written by gguf-py's own quantizer (realistic scales) dequantize identically."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((16, 256)).astype(np.float32) * 0.02
    raw = np_quantize(w, qtype)
    _check_exact(raw, qtype, 256)
    # Sanity on the format itself: the round trip is within one quantisation step (1/8 of the
    # block max for 4-bit, whose positive end clips at +7 steps).
    back = dequantize(torch.from_numpy(raw), qtype, 256).numpy()
    assert np.abs(back - w).max() <= 0.13 * np.abs(w).max()


def _real_slices(f, wanted: set[str]):
    seen = set()
    for name, info in f.tensors.items():
        if info.qtype.name in wanted and info.qtype.name not in seen:
            seen.add(info.qtype.name)
            yield name, info
        elif info.qtype.name in wanted and name == "output.weight":
            yield name, info


def _check_real(info):
    cols = info.shape[-1]
    rows = info.data.shape[0]
    # A few spread-out row slices keep the test fast on big tensors (the 151936-row output).
    for start in sorted({0, rows // 2, max(rows - 64, 0)}):
        raw = np.asarray(info.data[start:start + 64])
        _check_exact(raw, info.qtype, cols)


def test_real_05b_all_types(gguf05):
    want = {"Q5_0", "Q8_0", "Q4_K", "Q6_K", "F32"}
    got = set()
    for name, info in _real_slices(gguf05, want):
        _check_real(info)
        got.add(info.qtype.name)
    assert got == want


def test_real_15b_all_types(gguf15):
    want = {"Q4_K", "Q6_K", "F32"}
    got = set()
    for name, info in _real_slices(gguf15, want):
        _check_real(info)
        got.add(info.qtype.name)
    assert got == want


def test_unsupported_type_is_named():
    with pytest.raises(ValueError, match="IQ4_XS"):
        dequantize(torch.zeros(1, 136, dtype=torch.uint8), QT.IQ4_XS, 256)
    with pytest.raises(ValueError, match="Q4_K"):
        dequantize(torch.zeros(1, 100, dtype=torch.uint8), QT.Q4_K, 256)   # wrong row length
    assert row_bytes(QT.Q6_K, 512) == 420
