"""Write GGUF files (tests and tools): tiny random models, hand-made hostile files, converted vocabularies.

    write_gguf(path, {"general.architecture": "qwen2", "qwen2.block_count": 2, ...},
               [("token_embd.weight", raw, GGMLQuantizationType.Q8_0, (vocab, d)), ...])

Tensors are given as (name, data, qtype, shape) with `shape` in PyTorch order (rows, cols) = reversed ggml
`ne`. `data` is either the raw blocks (any uint8 array holding exactly the tensor's bytes) or, for F32 / F16,
a float array of the shape, or a callable returning one of those (called when the tensor is written, so big
files are generated tensor by tensor); `quantize_tensor` and `random_blocks` make raw blocks. The file is
written under a temporary name and renamed when complete.
Metadata values are typed from Python: str, bool, int (UINT32 when it fits, else INT32 / INT64 / UINT64),
float (FLOAT32), lists of one of those; `(value, GGUFValueType.X)` or `(list, GGUFValueType.X)` forces a type
(for a list the type given is the element type).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import quantize

Q = GGMLQuantizationType
# the types gguf-py's reference `quantize` implements (F32 / F16 are written directly)
GGUF_PY_QUANTIZERS = (Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1)

# Byte offsets of the fp16 scale fields (d, then dmin where there is one) inside one block, and the
# largest |quant x sub-block scale| of the type, used to give random blocks finite, small weights.
_SCALE_OFFSETS = {Q.Q8_0: (0,), Q.Q4_0: (0,), Q.Q5_0: (0,), Q.Q4_1: (0, 2), Q.Q5_1: (0, 2),
                  Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.Q2_K: (80, 82), Q.Q3_K: (108,)}
_MAX_QUANT = {Q.Q8_0: 128, Q.Q4_0: 8, Q.Q5_0: 16, Q.Q4_1: 15, Q.Q5_1: 31, Q.Q4_K: 15 * 63, Q.Q5_K: 31 * 63,
              Q.Q6_K: 32 * 128, Q.Q2_K: 3 * 15, Q.Q3_K: 4 * 32}


def tensor_nbytes(qtype: GGMLQuantizationType, shape: Sequence[int]) -> int:
    """Bytes of a tensor of `shape` (PyTorch order: the last dimension is the contiguous one)."""
    block, type_bytes = GGML_QUANT_SIZES[Q(qtype)]
    if not shape or shape[-1] % block:
        raise ValueError(f"{Q(qtype).name}: the last dimension of {tuple(shape)} must be a multiple of {block}")
    return int(np.prod(shape[:-1], dtype=np.int64)) * (shape[-1] // block) * type_bytes


def quantize_tensor(values: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """Raw blocks (uint8) of a float array: gguf-py's reference quantizers (F32, F16, BF16, Q8_0, Q4_0,
    Q4_1, Q5_0, Q5_1), and dflash24's own for Q6_K / Q4_K (gguf-py has none); other types are refused."""
    qtype = Q(qtype)
    values = np.ascontiguousarray(values, dtype=np.float32)
    if qtype == Q.F32:
        return values.view(np.uint8).reshape(*values.shape[:-1], -1)
    if qtype == Q.F16:
        return values.astype(np.float16).view(np.uint8).reshape(*values.shape[:-1], -1)
    if qtype in (Q.Q6_K, Q.Q4_K):
        from ..quant.quantize import quantize as quantize_k
        rows = quantize_k(values.reshape(-1, values.shape[-1]), qtype).numpy()
        return rows.reshape(*values.shape[:-1], -1)
    if qtype not in GGUF_PY_QUANTIZERS:
        raise ValueError(f"no quantizer for {qtype.name}; use random_blocks() for random weights")
    return quantize(values, qtype)


def random_blocks(shape: Sequence[int], qtype: GGMLQuantizationType, rng: np.random.Generator | None = None,
                  scale: float = 0.02) -> np.ndarray:
    """Random but valid raw blocks of a tensor of `shape`: random quants, every fp16 scale set to a finite
    value so that |weights| stay below about 3 x `scale`. F32/F16/BF16 get normal(0, scale) values."""
    qtype = Q(qtype)
    rng = rng or np.random.default_rng(0)
    shape = tuple(int(s) for s in shape)
    if qtype in (Q.F32, Q.F16, Q.BF16):
        v = (rng.standard_normal(shape) * scale).astype(np.float32)
        if qtype == Q.BF16:
            return (v.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(*shape[:-1], -1)
        return quantize_tensor(v, qtype)
    if qtype not in _SCALE_OFFSETS:
        raise ValueError(f"random_blocks: {qtype.name} is not supported")
    block, type_bytes = GGML_QUANT_SIZES[qtype]
    nbytes = tensor_nbytes(qtype, shape)
    raw = rng.integers(0, 256, size=nbytes, dtype=np.uint8).reshape(-1, type_bytes)
    d = (rng.uniform(0.5, 1.5, size=(raw.shape[0], 1)) * 2 * scale / _MAX_QUANT[qtype]).astype(np.float16).view(np.uint8)
    for off in _SCALE_OFFSETS[qtype]:
        raw[:, off:off + 2] = d
    return raw.reshape(*shape[:-1], -1) if len(shape) > 1 else raw.reshape(-1)


def _int_type(values: Iterable[int]) -> GGUFValueType:
    lo, hi = min(values, default=0), max(values, default=0)
    if lo >= 0:
        return GGUFValueType.UINT32 if hi < 2**32 else GGUFValueType.UINT64
    return GGUFValueType.INT32 if -2**31 <= lo and hi < 2**31 else GGUFValueType.INT64


def _scalar_type(v: Any) -> GGUFValueType:
    if isinstance(v, bool):
        return GGUFValueType.BOOL
    if isinstance(v, (int, np.integer)):
        return _int_type([int(v)])
    if isinstance(v, (float, np.floating)):
        return GGUFValueType.FLOAT32
    if isinstance(v, str):
        return GGUFValueType.STRING
    raise TypeError(f"cannot store a {type(v).__name__} in GGUF metadata")


def _add_metadata(w: GGUFWriter, key: str, value: Any) -> None:
    forced = None
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], GGUFValueType):
        value, forced = value
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        value = list(value)
        if forced is not None:
            sub = forced
        elif all(isinstance(x, bool) for x in value) and value:
            sub = GGUFValueType.BOOL
        elif all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in value):
            sub = _int_type(int(x) for x in value) if value else GGUFValueType.INT32
            # llama.cpp reads token types as int32 arrays; keep small int arrays signed-compatible
            if sub == GGUFValueType.UINT32 and all(int(x) < 2**31 for x in value):
                sub = GGUFValueType.INT32
        elif all(isinstance(x, (int, float, np.number)) and not isinstance(x, bool) for x in value):
            sub = GGUFValueType.FLOAT32
        elif all(isinstance(x, str) for x in value):
            sub = GGUFValueType.STRING
        else:
            raise TypeError(f"metadata {key!r}: a GGUF array holds one type of element")
        w.add_key_value(key, value, GGUFValueType.ARRAY, sub_type=sub)
    else:
        w.add_key_value(key, value, forced or _scalar_type(value))


def _raw(name: str, data: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> np.ndarray:
    data = np.ascontiguousarray(data)
    if data.dtype != np.uint8:
        if qtype == Q.F32 and data.dtype == np.float32 or qtype == Q.F16 and data.dtype == np.float16:
            data = data.view(np.uint8)
        else:
            raise ValueError(f"tensor {name!r}: give {qtype.name} data as raw uint8 blocks, not {data.dtype}")
    want = tensor_nbytes(qtype, shape)
    if data.nbytes != want:
        raise ValueError(f"tensor {name!r}: {data.nbytes} bytes of data for {qtype.name} {shape} (needs {want})")
    return data.reshape(-1)


def write_gguf(path: str | os.PathLike, metadata: Mapping[str, Any],
               tensors: Iterable[tuple[str, Any, GGMLQuantizationType, Sequence[int]]] = (),
               alignment: int | None = None) -> str:
    """Write a GGUF file; returns its path. `metadata` must hold `general.architecture`.

    A tensor's data may also be a callable returning the array: it is called only when that tensor is
    written, so a large model can be generated tensor by tensor without holding it all in memory."""
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ValueError("metadata must hold general.architecture (a string)")
    path = os.fspath(path)
    w = GGUFWriter(path, arch)          # writes general.architecture itself
    if alignment is None:
        alignment = metadata.get("general.alignment")
    if alignment is not None:
        w.add_custom_alignment(int(alignment))   # tensor data is padded to it, and general.alignment written
    for key, value in metadata.items():
        if key not in ("general.architecture", "general.alignment"):
            _add_metadata(w, key, value)
    pending = []
    for name, data, qtype, shape in tensors:
        qtype, shape = Q(qtype), tuple(int(s) for s in shape)
        if not callable(data):
            data = _raw(name, data, qtype, shape)           # check eagerly what is already there
        block, type_bytes = GGML_QUANT_SIZES[qtype]
        byte_shape = (*shape[:-1], shape[-1] // block * type_bytes)
        w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), tensor_nbytes(qtype, shape), raw_dtype=qtype)
        pending.append((name, data, qtype, shape))
    tmp = f"{path}.{os.getpid()}.partial"        # written aside and renamed: never a half-written file at `path`
    try:
        w.write_header_to_file(Path(tmp))
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for name, data, qtype, shape in pending:
            w.write_tensor_data(_raw(name, data() if callable(data) else data, qtype, shape))
        w.close()
        os.replace(tmp, path)
    except BaseException:
        w.close()
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path
