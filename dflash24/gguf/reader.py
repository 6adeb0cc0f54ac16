"""Read a GGUF file: metadata as plain Python values, tensors as memory-mapped raw blocks.

Parsing is done by the `gguf` library (gguf-py, the reference reader from llama.cpp). This module adds
what an engine needs on top: validation with clear errors (truncated files, hostile sizes, unknown
tensor types), shapes in PyTorch order, and typed metadata access.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.constants import GGML_QUANT_SIZES


class GGUFError(ValueError):
    """A GGUF file that cannot be used, with the reason in the message."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]        # PyTorch order: (rows, cols) = reversed ggml ne; a weight is (out, in)
    data: np.ndarray              # raw bytes, uint8, memory-mapped: shape (rows, row_bytes) for 2-D tensors

    @property
    def n_bytes(self) -> int:
        return int(self.data.nbytes)

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))


def _field_value(field) -> Any:
    vtype = field.types[0] if field.types else None
    if vtype == GGUFValueType.ARRAY:
        etype = field.types[1] if len(field.types) > 1 else None
        if etype == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    if vtype == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")
    return field.parts[field.data[0]].tolist()[0]


class GGUFFile:
    """One opened GGUF file.

    `metadata` maps every key to a Python value (str, int, float, bool or list); `tensors` maps names to
    `TensorInfo` whose `data` is a read-only memory map of the file (nothing is read until used).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise GGUFError(f"{self.path}: no such file")
        size = os.path.getsize(self.path)
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise GGUFError(f"{self.path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
        try:
            reader = GGUFReader(self.path, "r")
        except (ValueError, IndexError, OverflowError, KeyError, TypeError, MemoryError) as e:
            raise GGUFError(f"{self.path}: corrupt or truncated GGUF header ({type(e).__name__}: {e})") from e
        self.file_size = size
        self.metadata: dict[str, Any] = {}
        for name, field in reader.fields.items():
            if name.startswith("GGUF."):
                continue
            try:
                self.metadata[name] = _field_value(field)
            except (IndexError, ValueError) as e:
                raise GGUFError(f"{self.path}: metadata key {name!r} is malformed ({e})") from e
        self.tensors: dict[str, TensorInfo] = {}
        for t in reader.tensors:
            self.tensors[t.name] = self._tensor_info(t)
        if "general.architecture" not in self.metadata:
            raise GGUFError(f"{self.path}: metadata lacks general.architecture")

    def _tensor_info(self, t) -> TensorInfo:
        try:
            qtype = GGMLQuantizationType(int(t.tensor_type))
        except ValueError:
            raise GGUFError(f"{self.path}: tensor {t.name!r} has unknown type id {int(t.tensor_type)}") from None
        ne = [int(x) for x in t.shape]                   # ggml order: ne[0] is the contiguous dimension
        if any(x <= 0 for x in ne):
            raise GGUFError(f"{self.path}: tensor {t.name!r} has invalid shape {ne}")
        block, type_bytes = GGML_QUANT_SIZES[qtype]
        if ne[0] % block:
            raise GGUFError(f"{self.path}: tensor {t.name!r} ({qtype.name}) row of {ne[0]} is not a multiple of its block size {block}")
        row_bytes = ne[0] // block * type_bytes
        rows = int(np.prod(ne[1:])) if len(ne) > 1 else 1
        end = int(t.data_offset) + rows * row_bytes
        if end > self.file_size:
            raise GGUFError(f"{self.path}: truncated: tensor {t.name!r} ends at byte {end} but the file has {self.file_size}")
        raw = np.memmap(self.path, dtype=np.uint8, mode="r", offset=int(t.data_offset), shape=(rows, row_bytes))
        return TensorInfo(t.name, qtype, tuple(reversed(ne)), raw)

    # -- metadata helpers -------------------------------------------------------------------------
    @property
    def arch(self) -> str:
        return str(self.metadata["general.architecture"])

    def get(self, key: str, default: Any = None) -> Any:
        """Metadata value; a key without a dot is looked up under the architecture prefix."""
        full = key if key.startswith(("general.", "tokenizer.")) or key.startswith(self.arch + ".") else f"{self.arch}.{key}"
        return self.metadata.get(full, default)

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            full = key if "." in key.split(".")[0] or key.startswith(("general.", "tokenizer.")) else f"{self.arch}.{key}"
            raise GGUFError(f"{self.path}: metadata key {full!r} is missing")
        return value

    def tensor(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise GGUFError(f"{self.path}: tensor {name!r} is missing") from None

    def weight_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors.values())
