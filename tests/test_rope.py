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
