"""Target architectures, chosen by the GGUF `general.architecture` key."""
from __future__ import annotations

from ..gguf.reader import GGUFError, GGUFFile
from .dense import ARCHS as DENSE_ARCHS

SUPPORTED_ARCHS = DENSE_ARCHS + ("qwen35",)


def load_target(gf: GGUFFile, device, dtype, max_positions: int, embed_on_host: bool = False):
    """The target model of `gf`; embed_on_host: token_embd stays in pinned host memory (CUDA)."""
    if gf.arch in DENSE_ARCHS:
        from .dense import DenseModel
        return DenseModel.from_gguf(gf, device, dtype, max_positions, embed_on_host=embed_on_host)
    if gf.arch == "qwen35":
        from .qwen35 import Qwen35Model
        return Qwen35Model.from_gguf(gf, device, dtype, max_positions, embed_on_host=embed_on_host)
    raise GGUFError(f"{gf.path}: unknown architecture {gf.arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}")
