"""Token-embedding rows straight from GGUF blocks: one Triton kernel gathers each id's row of the raw table and
decodes it (gather + dequantize in one launch, instead of an index_select and the ~20 small PyTorch ops of
`formats.dequantize` in every decode / verify step). A table in pinned host memory is first gathered row by row
into device memory (coalesced reads over PCIe), then decoded there by the same kernel (ids None).

The values are those of `formats.dequantize` (the reference, bit-exact with gguf-py) in the same fp32 operation
order, fused multiply-adds off, then rounded to the output dtype: the same bits.
"""
from __future__ import annotations

import torch
from gguf import GGMLQuantizationType as QT

from .formats import block_type

try:
    import triton
    import triton.language as tl

    from ..kernels.pdl import launch_options, pdl_enter
    HAVE_TRITON = True
except ImportError:  # pragma: no cover - the CPU path needs no Triton
    HAVE_TRITON = False

# The block types the kernel decodes (the others, e.g. F16 / BF16 / F32 tables, take the PyTorch path).
TYPES = (QT.Q8_0, QT.Q4_0, QT.Q5_0, QT.Q4_K, QT.Q5_K, QT.Q6_K)
_CODE = {qt: i for i, qt in enumerate(TYPES)}

if HAVE_TRITON:

    @triton.jit
    def _f16_at(p):
        """The little-endian half float at byte pointers p, as fp32 (exact)."""
        lo = tl.load(p).to(tl.uint16)
        hi = tl.load(p + 1).to(tl.uint16)
        return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)

    @triton.jit
    def _embed_rows_kernel(table_ptr, ids_ptr, out_ptr, n_rows, row_bytes, DIM, QTYPE: tl.constexpr,
                           BS: tl.constexpr, NBYTES: tl.constexpr, BLOCK: tl.constexpr, GATHER: tl.constexpr = True,
                           PDL: tl.constexpr = False):
        """out[i, e] = W[ids[i], e] (GATHER; else W[i, e]) for e in this program's BLOCK columns, decoded from the
        raw GGUF block bytes (each value from the bytes that hold it; the ggml layouts of Q8_0 / Q4_0 / Q5_0 / Q4_K /
        Q5_K / Q6_K). An id outside 0..n_rows-1 (callers check them) reads the nearest row, never memory past the
        table."""
        pdl_enter(PDL)
        i = tl.program_id(0).to(tl.int64)
        e = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = e < DIM
        e = tl.where(ok, e, 0)
        row = i
        if GATHER:
            row = tl.minimum(tl.maximum(tl.load(ids_ptr + i).to(tl.int64), 0), n_rows - 1)
        blk = table_ptr + row * row_bytes + (e // BS).to(tl.int64) * NBYTES       # each value's block
        j = e % BS                                                                 # its place in the block
        if QTYPE == 0:      # Q8_0: d, 32 int8
            q = tl.load(blk + 2 + j).to(tl.int8, bitcast=True).to(tl.float32)
            y = q * _f16_at(blk)
        elif QTYPE == 1:    # Q4_0: d, 16 bytes: values 0-15 the low nibbles, 16-31 the high ones; minus 8
            b = tl.load(blk + 2 + j % 16).to(tl.int32)
            q = tl.where(j < 16, b & 15, b >> 4) - 8
            y = _f16_at(blk) * q.to(tl.float32)
        elif QTYPE == 2:    # Q5_0: d, 32 fifth bits (little-endian), nibbles as Q4_0; minus 16
            b = tl.load(blk + 6 + j % 16).to(tl.int32)
            h = (tl.load(blk + 2 + j // 8).to(tl.int32) >> (j % 8)) & 1
            q = (tl.where(j < 16, b & 15, b >> 4) | (h << 4)) - 16
            y = _f16_at(blk) * q.to(tl.float32)
        elif QTYPE == 3 or QTYPE == 4:   # Q4_K / Q5_K: d, dmin, 12 bytes of 6-bit scales / mins, [32 fifth bits,]
            s = j // 32                  # 4-bit codes: sub-block s of 32 values, low nibbles for even s
            sc_s = tl.load(blk + 4 + s).to(tl.int32)
            sc_s4 = tl.load(blk + 8 + s).to(tl.int32)
            sc_lo = tl.load(blk + 4 + s % 4).to(tl.int32)
            sc = tl.where(s < 4, sc_s & 63, (sc_s4 & 15) | ((sc_lo >> 6) << 4))
            mn = tl.where(s < 4, sc_s4 & 63, (sc_s4 >> 4) | ((sc_s >> 6) << 4))
            QS: tl.constexpr = 16 if QTYPE == 3 else 48
            b = tl.load(blk + QS + 32 * (s // 2) + j % 32).to(tl.int32)
            q = tl.where(s % 2 == 0, b & 15, b >> 4)
            if QTYPE == 4:
                q = q | (((tl.load(blk + 16 + j % 32).to(tl.int32) >> s) & 1) << 4)
            ds = _f16_at(blk) * sc.to(tl.float32)
            dm = _f16_at(blk + 2) * mn.to(tl.float32)
            y = ds * q.to(tl.float32) - dm
        else:               # Q6_K: 128 bytes of low nibbles, 64 of 2-bit highs, 16 int8 scales, d; minus 32
            r = j // 32      # run of 32 values: half n = r // 4, w = r % 4 (w // 2: high nibble, w % 2: second 32)
            n = r // 4
            w = r % 4
            lo = tl.load(blk + 64 * n + 32 * (w % 2) + j % 32).to(tl.int32)
            lo = tl.where(w < 2, lo & 15, lo >> 4)
            hi = (tl.load(blk + 128 + 32 * n + j % 32).to(tl.int32) >> (2 * w)) & 3
            sc = tl.load(blk + 192 + j // 16).to(tl.int8, bitcast=True).to(tl.float32)
            ds = _f16_at(blk + 208) * sc
            y = ds * ((lo | (hi << 4)) - 32).to(tl.float32)
        tl.store(out_ptr + i * DIM + e, y.to(out_ptr.dtype.element_ty), mask=ok)


def supports(qtype) -> bool:
    return HAVE_TRITON and QT(int(qtype)) in _CODE


def embed_rows(table: torch.Tensor, ids: torch.Tensor | None, qtype, dim: int, out_dtype: torch.dtype
               ) -> torch.Tensor:
    """(len(ids), dim) in out_dtype: rows `ids` of a raw GGUF table (rows, row_bytes) uint8 of a type in TYPES,
    ids on the table's device (None: every row of the table, in order). One kernel launch (CUDA-graph
    capturable)."""
    if not HAVE_TRITON:
        raise RuntimeError("embed_rows needs triton (the PyTorch path: formats.dequantize of the gathered rows)")
    bt = block_type(qtype)
    qt = bt.qtype
    if qt not in _CODE:
        raise ValueError(f"embed_rows: no kernel for {qt.name} (types: {', '.join(t.name for t in TYPES)})")
    if table.dtype != torch.uint8 or table.dim() != 2 or table.shape[1] != dim // bt.block * bt.nbytes \
            or dim % bt.block or not table.is_contiguous():
        raise ValueError(f"embed_rows: expected a contiguous ({table.shape[0]}, {dim // bt.block * bt.nbytes}) uint8 "
                         f"{qt.name} table, got {tuple(table.shape)} {table.dtype}")
    n = table.shape[0] if ids is None else ids.numel()
    out = torch.empty((n, dim), dtype=out_dtype, device=table.device)
    if n:
        block = min(1024, triton.next_power_of_2(dim))
        _embed_rows_kernel[(n, triton.cdiv(dim, block))](
            table, table if ids is None else ids.reshape(-1), out, table.shape[0], table.shape[1], dim,
            QTYPE=_CODE[qt], BS=bt.block, NBYTES=bt.nbytes, BLOCK=block, GATHER=ids is not None, num_warps=4,
            enable_fp_fusion=False, **launch_options(table.device, _embed_rows_kernel))
    return out
