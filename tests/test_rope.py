"""The one-kernel rotary embedding (kernels/rope.py) against Rotary's PyTorch reference (models/layers.py).

Without CUDA the kernel runs in Triton's interpreter on CPU tensors. Bound: fp32 within 1e-6 of max|x|
(the kernel may fuse a multiply and an add); bf16 within one bf16 step (the interpreter truncates to bf16
where the reference rounds).
"""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

from dflash24.kernels import rope as fused  # noqa: E402
from dflash24.models.layers import Rotary  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("neox,rot,d,heads", [(True, 64, 256, 3), (True, 64, 64, 2), (False, 128, 128, 2),
                                              (True, 32, 80, 1)])
def test_matches_reference(neox, rot, d, heads, dtype):
    g = torch.Generator().manual_seed(rot + d + heads)
    r = Rotary(rot, 10000.0, 512, neox)
    wide = (torch.randn(5, heads * d * 2, generator=g) * 3).to(dtype)
    x = wide[:, :heads * d].view(5, heads, d)                      # token rows strided (a projection's slice)
    pos = torch.tensor([0, 7, 300, 511, 2])
    ref = r(x, pos)                                                # CPU: the reference path
    y = fused.rope(x.to(DEV), pos.to(DEV), r.cos.to(DEV), r.sin.to(DEV), rot, neox)
    assert y is not None and y.dtype == dtype and y.shape == x.shape and y.is_contiguous()
    tol = 1e-6 if dtype == torch.float32 else 2 ** -7
    scale = ref.float().abs().max().item()
    assert (y.cpu().float() - ref.float()).abs().max().item() <= tol * scale
    assert torch.equal(y.cpu()[..., rot:], x[..., rot:])          # the unrotated part is copied


def test_layouts_it_does_not_take():
    r = Rotary(64, 10000.0, 16, True)
    x = torch.randn(2, 3, 128)
    pos = torch.tensor([1, 2])
    assert fused.rope(x.transpose(1, 2).contiguous().transpose(1, 2), pos, r.cos, r.sin, 64, True) is None
    assert fused.rope(x, pos[:1], r.cos, r.sin, 64, True) is None
    assert fused.rope(x[:, :, :32], pos, r.cos, r.sin, 64, True) is None        # rot_dim wider than the head


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("norm", [True, False], ids=["qk_norm", "no_norm"])
@pytest.mark.parametrize("neox,rot,d,heads,kv_heads", [(True, 64, 256, 4, 2), (False, 32, 64, 3, 1)])
def test_qk_norm_rope_write_matches_the_separate_steps(neox, rot, d, heads, kv_heads, norm, dtype):
    """One kernel = rms_norm per head (qwen3 / qwen35) + rotary on q and k + k / v written at the step's slots."""
    from dflash24.cache.kv import KVCache
    from dflash24.models.layers import rms_norm
    g = torch.Generator().manual_seed(d + heads + norm)
    r = Rotary(rot, 10000.0, 512, neox)
    T, eps = 4, 1e-6
    wide = (torch.randn(T, (heads + 2 * kv_heads) * d + 8, generator=g) * 3).to(dtype)    # a fused projection
    q = wide[:, :heads * d].view(T, heads, d)
    k = wide[:, heads * d:(heads + kv_heads) * d].view(T, kv_heads, d)
    v = wide[:, (heads + kv_heads) * d:(heads + 2 * kv_heads) * d].view(T, kv_heads, d)
    qw = (1 + torch.rand(d, generator=g)).to(dtype) if norm else None
    kw = (1 + torch.rand(d, generator=g)).to(dtype) if norm else None
    pos = torch.tensor([5, 6, 300, 511])
    slots = torch.tensor([9, 2, 0, 15])                               # cache rows need not follow positions
    qr, kr = (rms_norm(q, qw, eps), rms_norm(k, kw, eps)) if norm else (q, k)
    q_ref, k_ref = r(qr, pos), r(kr, pos)                           # CPU: the reference paths
    ref = KVCache(2, 16, kv_heads, d, dtype)
    ref.write(1, slots, k_ref, v)

    cache = KVCache(2, 16, kv_heads, d, dtype, device=DEV)
    rows = cache.dense_layer(1)
    dev = [t.to(DEV) if t is not None else None for t in (q, k, v, qw, kw, pos, slots)]
    qo = fused.qk_norm_rope_write(*dev[:5], eps, dev[5], dev[6], r.cos.to(DEV), r.sin.to(DEV), rot, neox, *rows)
    assert qo is not None and qo.shape == q.shape and qo.dtype == dtype and qo.is_contiguous()
    tol = 1e-5 if dtype == torch.float32 else 2 ** -6      # bf16: two roundings (norm, rotary), each one step
    for got, want in ((qo, q_ref), (cache.k[1], ref.k[1]), (cache.v[1], ref.v[1])):
        scale = want.float().abs().max().item()
        err = (got.cpu().float() - want.float()).abs().max().item()
        assert err <= tol * scale, (err, scale)
    assert torch.equal(cache.v[1].cpu(), ref.v[1])                  # v is copied, not computed
    assert not cache.k[0].any() and not cache.v[0].any()            # other layers untouched
    untouched = torch.ones(16, dtype=torch.bool)
    untouched[slots] = False
    assert not cache.k[1].cpu()[untouched].any()


def test_qk_norm_rope_write_declines_what_it_cannot_write():
    from dflash24.cache.kv import KVCache
    r = Rotary(32, 10000.0, 16, True)
    q, k = torch.randn(2, 2, 64), torch.randn(2, 1, 64)
    pos = torch.tensor([1, 2])
    assert KVCache(1, 8, 1, 64, k_type="q8_0", v_type=torch.float32).dense_layer(0) is None   # quantized K
    rows = KVCache(1, 8, 1, 64, torch.bfloat16).dense_layer(0)                # cache dtype != q's dtype
    assert fused.qk_norm_rope_write(q, k, k, None, None, 1e-6, pos, pos, r.cos, r.sin, 32, True, *rows) is None
    rows = KVCache(1, 8, 1, 64, torch.float32).dense_layer(0)
    assert fused.qk_norm_rope_write(q, k, k, None, None, 1e-6, pos[:1], pos, r.cos, r.sin, 32, True, *rows) is None
    assert fused.qk_norm_rope_write(q, k, k, torch.ones(64), None, 1e-6, pos, pos, r.cos, r.sin, 32, True,
                                    *rows) is None                        # a q norm without a k norm
