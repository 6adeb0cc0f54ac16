"""QuantLinear and QuantEmbedding: layers whose weights stay in GGUF blocks.

Interface (fixed, other modules rely on it):
  QuantLinear.from_gguf(info, device, compute_dtype=torch.float32, bias=None)
      .in_features, .out_features, .qtype, .nbytes (bytes held on the device)
      forward(x[..., in]) -> [..., out] in x.dtype
  QuantEmbedding.from_gguf(info, device, compute_dtype=torch.float32, host=False)
      forward(ids LongTensor (len,)) -> (len, dim) in compute_dtype
  FusedLinear(*linears)(x) -> [each layer's output]: layers reading the same x, stacked where they can be

CPU: the weight is dequantized once at load (reference dequantizer) and F.linear does the work.
CUDA: block weights are repacked (packed.py, same bits) and multiplied by the Triton kernels
(kernels.py), path chosen by M = rows of x; float weights and tiny tensors are dense tensors.
Forward passes do no host sync and allocate only M-dependent buffers, so they can be captured in a
CUDA graph for a fixed M (after one warm-up call has compiled the kernels).
"""
from __future__ import annotations

import warnings

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as QT

from ..gguf.reader import TensorInfo
from . import embed
from .formats import block_type, dequantize
from .packed import PACKED_TYPES, PackedWeight, pack

# Weights below this many elements are kept dense on CUDA (the kernels' launch config targets big
# matrices, and dense costs at most 128 KiB in bf16 here).
DENSE_BELOW = 1 << 16
# Embedding rows of a block-type table on the GPU gathered and decoded in one Triton kernel (embed.py; a pinned host
# table: gathered as bytes, then decoded by it); off: a gather, then the PyTorch dequantizer (~20 small kernels).
EMBED_KERNEL = True


def _raw_tensor(info: TensorInfo, what: str) -> torch.Tensor:
    try:
        block_type(info.qtype)
    except ValueError as e:
        raise ValueError(f"{info.name}: {e}") from None
    if len(info.shape) != 2:
        raise ValueError(f"{info.name}: {what} needs a 2-D tensor, got shape {info.shape}")
    with warnings.catch_warnings():
        # the GGUF memory map is read-only; the tensor is only read (copied to the device or dequantized)
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(np.ascontiguousarray(info.data))           # (rows, row_bytes) uint8


def _use_triton(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    from . import kernels
    return kernels.HAVE_TRITON


class QuantLinear(torch.nn.Module):
    def __init__(self, in_features: int, out_features: int, qtype, *, weight: torch.Tensor | None = None,
                 packed: PackedWeight | None = None, bias: torch.Tensor | None = None):
        super().__init__()
        if (weight is None) == (packed is None):
            raise ValueError("QuantLinear needs exactly one of a dense weight or a packed weight")
        self.in_features = in_features
        self.out_features = out_features
        self.qtype = QT(int(qtype))
        self.packed = packed
        self.register_buffer("weight", weight, persistent=False)
        self.register_buffer("bias", bias, persistent=False)
        held = packed.nbytes if packed is not None else weight.numel() * weight.element_size()
        self.nbytes = held + (0 if bias is None else bias.numel() * bias.element_size())

    @classmethod
    def from_gguf(cls, info: TensorInfo, device, compute_dtype=torch.float32, bias: torch.Tensor | None = None):
        device = torch.device(device)
        raw = _raw_tensor(info, "QuantLinear")
        out_f, in_f = info.shape
        if bias is not None and tuple(bias.shape) != (out_f,):
            raise ValueError(f"{info.name}: bias of shape {tuple(bias.shape)} does not match {out_f} outputs")
        if _use_triton(device) and info.qtype in PACKED_TYPES and out_f * in_f >= DENSE_BELOW:
            packed = pack(raw.to(device), info.qtype, in_f)
            b = None if bias is None else bias.to(device=device, dtype=torch.float32)
            return cls(in_f, out_f, info.qtype, packed=packed, bias=b)
        # Dense: dequantize on the target device (fast on CUDA), keep compute_dtype.
        w = dequantize(raw.to(device), info.qtype, in_f).to(compute_dtype)    # (out, in)
        b = None if bias is None else bias.to(device=device, dtype=compute_dtype)
        return cls(in_f, out_f, info.qtype, weight=w, bias=b)

    def forward(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """x [..., in] -> [..., out] in out_dtype (default x.dtype; the packed kernels accumulate in fp32 and
        round only at the store, so out_dtype=float32 keeps e.g. logits unrounded)."""
        if x.shape[-1] != self.in_features:
            raise ValueError(f"QuantLinear: input has {x.shape[-1]} features, expected {self.in_features}")
        if self.packed is None:            # dense: in the weight's precision when it is fp32 (CPU), else x's
            dt = torch.float32 if out_dtype == torch.float32 and self.weight.dtype == torch.float32 else x.dtype
            b = None if self.bias is None else self.bias.to(dt)
            y = F.linear(x.to(dt), self.weight.to(dt), b)
            return y if out_dtype is None else y.to(out_dtype)
        from .kernels import INT8_ATTR, PAIRS_ATTR, quant_matmul
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)                                  # (M, in)
        if x2.shape[0] == 0:
            return x.new_empty(*lead, self.out_features)
        int8 = getattr(x, INT8_ATTR, None)           # the row's int8 rounding, made with it (kernels.Int8Rows)
        pairs = getattr(x, PAIRS_ATTR, None)         # the rows in the dot kernel's pair order (kernels.PairRows)
        y = quant_matmul(x2, self.packed, bias=self.bias, out_dtype=out_dtype, int8=int8, pairs=pairs)  # (M, out)
        return y.reshape(*lead, self.out_features)

    def densify(self, dtype: torch.dtype) -> int:
        """Replace the packed blocks by the dequantized weight in `dtype` (e.g. a frozen target during drafter
        training, where every forward is a large-M matmul that would dequantize them again); returns the
        bytes now held. A dense layer stays as it is."""
        if self.packed is not None:
            from .kernels import dequant_rows
            w = torch.empty((self.out_features, self.in_features), dtype=dtype, device=self.packed.device)
            self.weight = dequant_rows(self.packed, 0, self.out_features, w)
            self.packed = None
            bias_bytes = 0 if self.bias is None else self.bias.numel() * self.bias.element_size()
            self.nbytes = w.numel() * w.element_size() + bias_bytes
        return self.nbytes

    def extra_repr(self) -> str:
        kind = "packed" if self.packed is not None else "dense"
        return f"in={self.in_features}, out={self.out_features}, {self.qtype.name} {kind}, {self.nbytes} bytes"


def _merge_key(lin: QuantLinear):
    """Layers with equal keys can be stacked row-wise into one weight: the same packed block type (or both
    dense, of one dtype), the same input width, and biases on all or none."""
    kind = ("packed", lin.qtype) if lin.packed is not None else ("dense", lin.weight.dtype)
    return kind, lin.in_features, lin.bias is not None


def stack_rows(linears: list[QuantLinear]) -> QuantLinear:
    """One QuantLinear whose output rows are those of `linears` in order (equal `_merge_key`s)."""
    first = linears[0]
    n = sum(lin.out_features for lin in linears)
    bias = None if first.bias is None else torch.cat([lin.bias for lin in linears])
    if first.packed is None:
        return QuantLinear(first.in_features, n, first.qtype, weight=torch.cat([lin.weight for lin in linears]),
                           bias=bias)
    arrays = {k: torch.cat([lin.packed.arrays[k] for lin in linears]) for k in first.packed.arrays}
    return QuantLinear(first.in_features, n, first.qtype, bias=bias,
                       packed=PackedWeight(first.qtype, n, first.packed.k, arrays))


class FusedLinear(torch.nn.Module):
    """Linear layers that read the same input, run as few matmuls as their weights allow: layers whose weights
    can be stacked (`_merge_key`) become one QuantLinear, so one kernel launch and one int8 rounding of x
    serve them all (the synthetic 27B Q4_K_M decode step: 313 matmuls instead of 497). forward(x) -> one
    output per layer, in the order given (column slices of the stacked output: the last dim is contiguous,
    rows are strided).
    Each is that layer's output: the same rows of the same kernel, which may split K differently for the
    larger N, so values agree to fp32 rounding. Two parts of different block types that one token reads run as one
    GEMV launch where `kernels.gemv_two` takes them (the same bits as two GEMVs with K unsplit)."""

    def __init__(self, *linears: QuantLinear):
        super().__init__()
        groups: dict = {}
        for i, lin in enumerate(linears):
            groups.setdefault(_merge_key(lin), []).append(i)
        self.groups = list(groups.values())                            # layer indices per stacked weight
        self.parts = torch.nn.ModuleList(stack_rows([linears[i] for i in idx]) if len(idx) > 1 else linears[idx[0]]
                                         for idx in self.groups)
        self.sizes = [[linears[i].out_features for i in idx] for idx in self.groups]
        self.nbytes = sum(part.nbytes for part in self.parts)
        self._two_shapes_ok: dict = {}                # device -> kernels.gemv_two_ok of the two parts (_two_ok)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        out: list = [None] * sum(map(len, self.groups))
        ys = self._one_launch(x)
        for j, (part, idx, sizes) in enumerate(zip(self.parts, self.groups, self.sizes)):
            y = ys[j] if ys is not None else part(x)
            for i, yi in zip(idx, y.split(sizes, dim=-1) if len(idx) > 1 else (y,)):
                out[i] = yi
        return out

    def _two_ok(self, device) -> bool:
        """Whether `kernels.gemv_two` takes the two parts on `device` (both packed, no bias). Its shape check is made
        once a device: it depends only on the weights' shapes and types and the device's SM count."""
        a, b = self.parts
        if a.packed is None or b.packed is None or a.bias is not None or b.bias is not None:
            return False
        if device not in self._two_shapes_ok:
            from . import kernels
            self._two_shapes_ok[device] = kernels.gemv_two_ok(a.packed, b.packed, device)
        return self._two_shapes_ok[device]

    def _one_launch(self, x: torch.Tensor) -> tuple | None:
        """Both parts' outputs from one GEMV launch (`kernels.gemv_two`), where x is one row with its int8 rounding
        and there are two parts of different block types that it takes; else None (each part on its own)."""
        if len(self.parts) != 2 or x.numel() != x.shape[-1]:
            return None
        from . import kernels
        a, b = self.parts
        int8 = getattr(x, kernels.INT8_ATTR, None)
        if not kernels.GEMV_TWO or kernels.DECODE_MATMUL != "gemv" or int8 is None or not self._two_ok(x.device):
            return None
        lead = x.shape[:-1]
        ya, yb = kernels.gemv_two(x, a.packed, b.packed, out_dtype=x.dtype, int8=int8)
        return ya.reshape(*lead, a.out_features), yb.reshape(*lead, b.out_features)


if torch.cuda.is_available():
    try:
        import triton
        import triton.language as tl

        from ..kernels.pdl import launch_options, pdl_enter

        @triton.jit
        def _gather_rows_kernel(table_ptr, ids_ptr, out_ptr, row_bytes, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
            """out[i, :] = table[ids[i], :] (bytes). The table may be pinned host memory: the GPU
            reads it over PCIe (zero-copy), so only the gathered rows cross the bus."""
            pdl_enter(PDL)
            i = tl.program_id(0)
            row = tl.load(ids_ptr + i).to(tl.int64)
            for c in range(0, row_bytes, BLOCK):
                offs = c + tl.arange(0, BLOCK)
                m = offs < row_bytes
                v = tl.load(table_ptr + row * row_bytes + offs, mask=m)
                tl.store(out_ptr + i.to(tl.int64) * row_bytes + offs, v, mask=m)
    except ImportError:
        _gather_rows_kernel = None
else:
    _gather_rows_kernel = None


class QuantEmbedding(torch.nn.Module):
    """Embedding table kept in GGUF blocks; only gathered rows are dequantized.

    `host=True` (CUDA only) leaves the packed table in pinned host memory and gathers rows with a
    zero-copy kernel (the 27B table is 682 MiB of GPU memory saved); the device holds nothing.
    """

    def __init__(self, table: torch.Tensor, qtype, dim: int, compute_dtype, host: bool):
        super().__init__()
        self.qtype = QT(int(qtype))
        self.num_embeddings = table.shape[0]
        self.embedding_dim = dim
        self.compute_dtype = compute_dtype
        self.host = host
        self.table = table                       # (rows, row_bytes) uint8; not a buffer: .to() must not move it
        self.nbytes = 0 if host else table.numel()

    @classmethod
    def from_gguf(cls, info: TensorInfo, device, compute_dtype=torch.float32, host: bool = False):
        device = torch.device(device)
        raw = _raw_tensor(info, "QuantEmbedding")
        dim = info.shape[1]
        if host and device.type == "cuda":
            if _gather_rows_kernel is None:
                raise ValueError(f"{info.name}: host=True needs triton for the zero-copy gather")
            table = raw.pin_memory()
            m = cls(table, info.qtype, dim, compute_dtype, host=True)
            m.device = device
            return m
        m = cls(raw.to(device), info.qtype, dim, compute_dtype, host=False)
        m.device = device
        return m

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.reshape(-1)
        kernel = EMBED_KERNEL and embed.supports(self.qtype)
        if kernel and self.table.is_cuda:
            return embed.embed_rows(self.table, ids.to(self.device, non_blocking=True), self.qtype,
                                    self.embedding_dim, self.compute_dtype)
        if self.host:
            ids = ids.to(self.device, non_blocking=True)
            rows = torch.empty((ids.numel(), self.table.shape[1]), dtype=torch.uint8, device=self.device)
            if ids.numel():
                _gather_rows_kernel[(ids.numel(),)](self.table, ids, rows, self.table.shape[1], BLOCK=1024,
                                                    **launch_options(ids.device, _gather_rows_kernel))
            if kernel:                   # the gathered rows decoded on the device (one more launch)
                return embed.embed_rows(rows, None, self.qtype, self.embedding_dim, self.compute_dtype)
        else:
            rows = self.table.index_select(0, ids.to(self.table.device))   # (len, row_bytes)
        return dequantize(rows, self.qtype, self.embedding_dim).to(self.compute_dtype)

    def extra_repr(self) -> str:
        where = "pinned host" if self.host else str(self.table.device)
        return f"{self.num_embeddings}x{self.embedding_dim} {self.qtype.name} on {where}"
