"""Strict weight loading from a GGUF file: every tensor's shape is checked, every tensor must be used.

Architectures ask the Loader for tensors by GGUF name; `finish()` raises if the file holds tensors no
module asked for (a wrong architecture or a mis-converted file), naming them.
"""
from __future__ import annotations

import torch

from ..gguf.reader import GGUFError, GGUFFile
from ..quant.linear import QuantEmbedding, QuantLinear
from ..quant.formats import dequantize


class Loader:
    def __init__(self, gf: GGUFFile, device, dtype, ignore_prefixes: tuple[str, ...] = (), embed_on_host: bool = False):
        self.gf, self.device, self.dtype = gf, torch.device(device), dtype
        self.used: set[str] = set()
        self.ignore_prefixes = ignore_prefixes
        self.embed_on_host = embed_on_host

    def _get(self, name: str, shape: tuple[int, ...], optional: bool):
        info = self.gf.tensors.get(name)
        if info is None:
            if optional:
                return None
            raise GGUFError(f"{self.gf.path}: tensor {name!r} is missing")
        if tuple(info.shape) != tuple(shape):
            raise GGUFError(f"{self.gf.path}: tensor {name!r} has shape {info.shape}, expected {tuple(shape)}")
        self.used.add(name)
        return info

    def dense(self, name: str, shape: tuple[int, ...], optional: bool = False, dtype=torch.float32):
        """A small tensor, dequantized to a plain torch tensor (norms, biases, conv weights)."""
        info = self._get(name, shape, optional)
        if info is None:
            return None
        raw = torch.from_numpy(info.data.copy())                           # [rows, row_bytes] uint8
        try:
            w = dequantize(raw, info.qtype, info.shape[-1])
        except ValueError as e:
            raise GGUFError(f"{self.gf.path}: tensor {name!r}: {e}") from None
        return w.reshape(shape).to(device=self.device, dtype=dtype)

    def vector(self, name: str, n: int, optional: bool = False):
        return self.dense(name, (n,), optional)

    def linear(self, prefix: str, n_in: int, n_out: int, optional: bool = False):
        info = self._get(prefix + ".weight", (n_out, n_in), optional)
        if info is None:
            return None
        bias = self.dense(prefix + ".bias", (n_out,), optional=True)
        try:
            return QuantLinear.from_gguf(info, self.device, self.dtype, bias=bias)
        except ValueError as e:
            raise GGUFError(f"{self.gf.path}: tensor {info.name!r}: {e}") from None

    def embedding(self, name: str, vocab: int, dim: int):
        """Token embedding; with embed_on_host (CUDA) its rows stay in pinned host memory."""
        info = self._get(name, (vocab, dim), False)
        try:
            return QuantEmbedding.from_gguf(info, self.device, self.dtype, host=self.embed_on_host)
        except ValueError as e:
            raise GGUFError(f"{self.gf.path}: tensor {name!r}: {e}") from None

    def tied_output(self, name: str):
        """LM head sharing the token embedding (files without `output.weight`)."""
        info = self.gf.tensor(name)
        return QuantLinear.from_gguf(info, self.device, self.dtype)

    def finish(self):
        unused = [n for n in self.gf.tensors if n not in self.used and not n.startswith(self.ignore_prefixes)]
        if unused:
            more = f" (+{len(unused) - 8} more)" if len(unused) > 8 else ""
            raise GGUFError(f"{self.gf.path}: unexpected tensors for architecture {self.gf.arch!r}: "
                            f"{', '.join(unused[:8])}{more}")


def check_attention_shape(gf: GGUFFile, n_heads: int, n_kv_heads: int, head_dim: int, rope_dim: int) -> None:
    """Refuse head counts and a rotary width that no attention layer can have, naming the metadata."""
    if n_heads % n_kv_heads:
        raise GGUFError(f"{gf.path}: {gf.full_key('attention.head_count')!r} = {n_heads} is not a multiple of "
                        f"{gf.full_key('attention.head_count_kv')!r} = {n_kv_heads}")
    if rope_dim % 2 or rope_dim > head_dim:
        raise GGUFError(f"{gf.path}: {gf.full_key('rope.dimension_count')!r} = {rope_dim} must be even and at most "
                        f"the head dimension {head_dim}")
