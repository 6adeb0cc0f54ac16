"""QuantLinear: a linear layer whose weight stays in GGUF blocks.

Provisional implementation (dequantize once with gguf-py); the quant module replaces it with the
PyTorch reference dequantizer on CPU and Triton block kernels on CUDA. The interface is fixed:
  QuantLinear.from_gguf(info, device, compute_dtype, bias=None)
  forward(x[..., in]) -> [..., out] in x.dtype
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from gguf.quants import dequantize as _np_dequantize

from ..gguf.reader import TensorInfo


class QuantLinear(torch.nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, qtype, nbytes: int):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.qtype = qtype
        self.nbytes = nbytes
        self.register_buffer("weight", weight, persistent=False)
        self.register_buffer("bias", bias, persistent=False)

    @classmethod
    def from_gguf(cls, info: TensorInfo, device, compute_dtype=torch.float32, bias: torch.Tensor | None = None):
        w = _np_dequantize(np.asarray(info.data), info.qtype).reshape(info.shape)
        w = torch.from_numpy(np.ascontiguousarray(w)).to(device=device, dtype=compute_dtype)
        if bias is not None:
            bias = bias.to(device=device, dtype=compute_dtype)
        return cls(w, bias, info.qtype, info.n_bytes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))
