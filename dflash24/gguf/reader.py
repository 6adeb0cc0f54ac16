"""Read a GGUF file: metadata as plain Python values, tensors as memory-mapped raw blocks.

GGUF (ggml's format, versions 2 and 3, little-endian): magic b"GGUF", u32 version, u64 tensor count,
u64 metadata count; then the metadata key/values (u64-length strings, u32 value types, arrays as
u32 element type + u64 count); then per tensor: name, u32 n_dims, n_dims x u64 `ne` (ne[0] contiguous),
u32 ggml type, u64 offset; then padding to `general.alignment` (default 32) and the tensor data.

The header is parsed here (not with gguf-py's reader, which takes seconds on a 150k-token vocabulary)
because a file is untrusted input: every count and length is checked against the bytes that remain before
anything is allocated, so truncated or hostile files fail with a `GGUFError` that says what is wrong.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES


class GGUFError(ValueError):
    """A GGUF file that cannot be used, with the reason in the message."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]        # PyTorch order: (rows, cols) = reversed ggml ne; a weight is (out, in)
    data: np.ndarray              # raw bytes, uint8, memory-mapped: shape (rows, row_bytes); rows = 1 for 1-D

    @property
    def n_bytes(self) -> int:
        return int(self.data.nbytes)

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))


_REQUIRED = object()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{text[:40]}... ({type(value).__name__})" if len(text) > 40 else f"{text} ({type(value).__name__})"


# GGUF value types: id -> (name, struct format or None)
_UINT8, _INT8, _UINT16, _INT16, _UINT32, _INT32, _FLOAT32, _BOOL, _STRING, _ARRAY, _UINT64, _INT64, _FLOAT64 = range(13)
_SCALAR = {_UINT8: "<B", _INT8: "<b", _UINT16: "<H", _INT16: "<h", _UINT32: "<I", _INT32: "<i", _FLOAT32: "<f",
           _BOOL: "<?", _UINT64: "<Q", _INT64: "<q", _FLOAT64: "<d"}
_NUMPY = {_UINT8: "<u1", _INT8: "<i1", _UINT16: "<u2", _INT16: "<i2", _UINT32: "<u4", _INT32: "<i4",
          _FLOAT32: "<f4", _BOOL: "<u1", _UINT64: "<u8", _INT64: "<i8", _FLOAT64: "<f8"}
_MAX_DIMS = 4                   # GGML_MAX_DIMS
_MAX_NESTING = 8                # arrays of arrays


class _Cursor:
    """Bounds-checked little-endian reads from a bytes-like buffer."""

    def __init__(self, buf, path: str):
        self.buf, self.pos, self.end, self.path = buf, 0, len(buf), path

    def fail(self, what: str):
        raise GGUFError(f"{self.path}: {what}")

    def need(self, n: int, what: str):
        if n < 0 or self.pos + n > self.end:
            self.fail(f"truncated header: {what} needs {n:,} bytes at offset {self.pos:,} but the file has {self.end:,}")

    def scalar(self, fmt: str, what: str):
        size = struct.calcsize(fmt)
        self.need(size, what)
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += size
        return v

    def u32(self, what):
        return self.scalar("<I", what)

    def u64(self, what):
        return self.scalar("<Q", what)

    def string(self, what: str, strict: bool = False) -> str:
        n = self.u64(f"length of {what}")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8", errors="strict" if strict else "replace")
        except UnicodeDecodeError:
            self.fail(f"{what} is not valid UTF-8: {raw[:40]!r}")

    def value(self, vtype: int, what: str, depth: int = 0) -> Any:
        if vtype in _SCALAR:
            v = self.scalar(_SCALAR[vtype], what)
            return bool(v) if vtype == _BOOL else v
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            if depth >= _MAX_NESTING:
                self.fail(f"{what}: arrays nested deeper than {_MAX_NESTING}")
            etype = self.u32(f"element type of {what}")
            count = self.u64(f"length of {what}")
            if etype in _NUMPY:
                size = count * np.dtype(_NUMPY[etype]).itemsize
                self.need(size, f"{what} ({count:,} elements)")
                arr = np.frombuffer(self.buf, dtype=_NUMPY[etype], count=count, offset=self.pos)
                self.pos += size
                return [bool(x) for x in arr] if etype == _BOOL else arr.tolist()
            if etype in (_STRING, _ARRAY):
                self.need(count * 8, f"{what} ({count:,} elements)")   # each element has at least a u64 length
                if etype == _STRING:
                    return self._strings(count, what)
                return [self.value(_ARRAY, f"{what}[{i}]", depth + 1) for i in range(count)]
            self.fail(f"{what}: unknown array element type {etype}")
        self.fail(f"{what}: unknown value type {vtype}")

    def _strings(self, count: int, what: str) -> list[str]:
        buf, pos, end, out = self.buf, self.pos, self.end, []
        unpack = struct.Struct("<Q").unpack_from
        for i in range(count):
            if pos + 8 > end:
                self.pos = pos
                self.need(8, f"length of {what}[{i}]")
            n = unpack(buf, pos)[0]
            pos += 8
            if n > end - pos:
                self.pos = pos
                self.need(n, f"{what}[{i}]")
            out.append(bytes(buf[pos:pos + n]).decode("utf-8", errors="replace"))
            pos += n
        self.pos = pos
        return out


class GGUFFile:
    """One opened GGUF file.

    `metadata` maps every key to a Python value (str, int, float, bool or list); `tensors` maps names to
    `TensorInfo` whose `data` is a read-only memory map of the file (nothing is read until used).
    An unknown architecture is not an error here; the model loader decides what it can run.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise GGUFError(f"{self.path}: no such file")
        self.file_size = size = os.path.getsize(self.path)
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise GGUFError(f"{self.path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        cur = _Cursor(memoryview(self._map), self.path)
        cur.pos = 4
        self.version = cur.u32("version")
        if self.version not in (2, 3):
            if self.version & 0xFFFF == 0 and self.version:
                raise GGUFError(f"{self.path}: big-endian GGUF files are not supported")
            raise GGUFError(f"{self.path}: unsupported GGUF version {self.version} (supported: 2, 3)")
        n_tensors = cur.u64("tensor count")
        n_kv = cur.u64("metadata count")
        # A key/value takes at least 8 (key length) + 1 + 4 (type) + 1 bytes; a tensor info at least 8+1+4+8+4+8.
        if n_kv * 14 > size - cur.pos:
            raise GGUFError(f"{self.path}: metadata count {n_kv:,} is impossible for a file of {size:,} bytes")
        if n_tensors * 33 > size - cur.pos:
            raise GGUFError(f"{self.path}: tensor count {n_tensors:,} is impossible for a file of {size:,} bytes")

        self.metadata: dict[str, Any] = {}
        for i in range(n_kv):
            key = cur.string(f"metadata key #{i}", strict=True)
            if key in self.metadata:
                raise GGUFError(f"{self.path}: metadata key {key!r} appears twice")
            vtype = cur.u32(f"type of metadata {key!r}")
            self.metadata[key] = cur.value(vtype, f"metadata {key!r}")

        infos = []
        for i in range(n_tensors):
            name = cur.string(f"name of tensor #{i}", strict=True)
            n_dims = cur.u32(f"dimension count of tensor {name!r}")
            if not 1 <= n_dims <= _MAX_DIMS:
                raise GGUFError(f"{self.path}: tensor {name!r} has {n_dims} dimensions (1..{_MAX_DIMS} allowed)")
            ne = [cur.u64(f"shape of tensor {name!r}") for _ in range(n_dims)]
            type_id = cur.u32(f"type of tensor {name!r}")
            offset = cur.u64(f"data offset of tensor {name!r}")
            infos.append((name, ne, type_id, offset))

        alignment = self.metadata.get("general.alignment", 32)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise GGUFError(f"{self.path}: general.alignment = {alignment!r} is not a power of two")
        self.alignment = alignment
        self.data_offset = -(-cur.pos // alignment) * alignment      # tensor data starts at the next aligned byte
        if n_tensors and self.data_offset > size:
            raise GGUFError(f"{self.path}: truncated: the file ends ({size:,} bytes) before its tensor data")

        self.tensors: dict[str, TensorInfo] = {}
        for name, ne, type_id, offset in infos:
            if name in self.tensors:
                raise GGUFError(f"{self.path}: tensor {name!r} appears twice")
            self.tensors[name] = self._tensor_info(name, ne, type_id, offset)
        if "general.architecture" not in self.metadata:
            raise GGUFError(f"{self.path}: metadata lacks general.architecture")
        if not isinstance(self.metadata["general.architecture"], str):
            raise GGUFError(f"{self.path}: general.architecture is not a string")

    def _tensor_info(self, name: str, ne: list[int], type_id: int, offset: int) -> TensorInfo:
        try:
            qtype = GGMLQuantizationType(type_id)
            block, type_bytes = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise GGUFError(f"{self.path}: tensor {name!r} has unknown type id {type_id}") from None
        if any(x <= 0 for x in ne):
            raise GGUFError(f"{self.path}: tensor {name!r} has invalid shape {ne}")
        if ne[0] % block:
            raise GGUFError(f"{self.path}: tensor {name!r} ({qtype.name}) row of {ne[0]} is not a multiple of its block size {block}")
        if offset % self.alignment:
            raise GGUFError(f"{self.path}: tensor {name!r} data offset {offset} is not aligned to {self.alignment}")
        row_bytes = ne[0] // block * type_bytes
        rows = 1
        for x in ne[1:]:
            rows *= x                                     # Python ints: no overflow on hostile shapes
        start = self.data_offset + offset
        end = start + rows * row_bytes
        if end > self.file_size:
            raise GGUFError(f"{self.path}: truncated: tensor {name!r} ({qtype.name} {list(reversed(ne))}) ends at byte "
                            f"{end:,} but the file has {self.file_size:,}")
        raw = self._map[start:end].reshape(rows, row_bytes)
        return TensorInfo(name, qtype, tuple(reversed(ne)), raw)

    # -- metadata helpers -------------------------------------------------------------------------
    @property
    def arch(self) -> str:
        return str(self.metadata["general.architecture"])

    def full_key(self, key: str) -> str:
        """`key` as stored: one that does not start with `general.`, `tokenizer.` or the architecture is
        under the architecture prefix (`block_count` -> `qwen2.block_count`)."""
        return key if key.startswith(("general.", "tokenizer.", self.arch + ".")) else f"{self.arch}.{key}"

    def get(self, key: str, default: Any = None) -> Any:
        """Metadata value of `full_key(key)`, or `default`."""
        return self.metadata.get(self.full_key(key), default)

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise GGUFError(f"{self.path}: metadata key {self.full_key(key)!r} is missing")
        return value

    def int_value(self, key: str, default: Any = _REQUIRED, minimum: int = 1, per_layer: bool = False) -> int:
        """An integer metadata value of at least `minimum` (`default` where the key is absent; required if no
        default). per_layer: an array of integers (one a layer, as hybrid files store some head counts) gives
        its largest element."""
        value = self.require(key) if default is _REQUIRED else self.get(key, default)
        if per_layer and isinstance(value, list) and value and all(_is_int(x) for x in value):
            value = max(value)
        if not _is_int(value):
            raise GGUFError(f"{self.path}: metadata {self.full_key(key)!r} is {_shown(value)}, expected an integer")
        if value < minimum:
            raise GGUFError(f"{self.path}: metadata {self.full_key(key)!r} is {value}, expected at least {minimum}")
        return value

    def float_value(self, key: str, default: Any = _REQUIRED) -> float:
        """A finite, positive number from the metadata (`default` where the key is absent)."""
        value = self.require(key) if default is _REQUIRED else self.get(key, default)
        if not (_is_int(value) or isinstance(value, float)) or not 0 < value < float("inf"):
            raise GGUFError(f"{self.path}: metadata {self.full_key(key)!r} is {_shown(value)}, "
                            f"expected a finite positive number")
        return float(value)

    def layer_count(self) -> int:
        """Layers that have tensors in the file: 1 + the largest N of a `blk.N.` tensor name (0 if none)."""
        ids = [int(n.split(".")[1]) for n in self.tensors if n.startswith("blk.") and n.split(".")[1].isdigit()]
        return max(ids, default=-1) + 1

    def check_block_count(self, n_layers: int) -> None:
        """Refuse a layer count the file's tensors cannot hold (before anything is sized by it)."""
        have = self.layer_count()
        if n_layers > have:
            raise GGUFError(f"{self.path}: metadata {self.full_key('block_count')!r} says {n_layers} layers but the "
                            f"file has tensors for {have}")

    def tensor(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise GGUFError(f"{self.path}: tensor {name!r} is missing") from None

    def weight_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors.values())
