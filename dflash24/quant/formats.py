"""GGUF block formats: the type table and a plain PyTorch reference dequantizer.

Block layouts follow ggml `ggml-common.h` (summarised in FACTS.md section 2). The arithmetic repeats
gguf-py's numpy dequantizers operation by operation in float32 (same products, same order, no fused
multiply-add) so the result is bit-identical to `gguf.quants.dequantize`; tests check that with
`torch.equal`. Written in torch ops only, so it runs on CUDA too (gathered embedding rows).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from gguf import GGMLQuantizationType as QT


@dataclass(frozen=True)
class BlockType:
    qtype: QT
    block: int          # weights per block
    nbytes: int         # bytes per block in the GGUF file


BLOCK_TYPES: dict[QT, BlockType] = {t.qtype: t for t in (
    BlockType(QT.F32, 1, 4),
    BlockType(QT.F16, 1, 2),
    BlockType(QT.BF16, 1, 2),
    BlockType(QT.Q8_0, 32, 34),
    BlockType(QT.Q4_0, 32, 18),
    BlockType(QT.Q5_0, 32, 22),
    BlockType(QT.Q4_K, 256, 144),
    BlockType(QT.Q5_K, 256, 176),
    BlockType(QT.Q6_K, 256, 210),
)}

QK_K = 256


def block_type(qtype) -> BlockType:
    """The table entry of `qtype`; a ValueError naming the type if dflash24 cannot run it."""
    try:
        qtype = QT(int(qtype))
    except ValueError:
        raise ValueError(f"unknown GGML type id {int(qtype)}") from None
    bt = BLOCK_TYPES.get(qtype)
    if bt is None:
        supported = ", ".join(t.name for t in BLOCK_TYPES)
        raise ValueError(f"GGML type {qtype.name} is not supported (supported: {supported})")
    return bt


def row_bytes(qtype, cols: int) -> int:
    bt = block_type(qtype)
    if cols % bt.block:
        raise ValueError(f"{QT(int(qtype)).name}: row of {cols} is not a multiple of the block size {bt.block}")
    return cols // bt.block * bt.nbytes


def _f16(b: torch.Tensor) -> torch.Tensor:
    """(..., 2) uint8 little-endian half floats -> (...,) float32."""
    return b.contiguous().view(torch.float16).squeeze(-1).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """(..., n) uint8 -> (..., 2, n): low nibbles first, then high nibbles (the ggml order of a run)."""
    return torch.stack((qs & 0x0F, qs >> 4), dim=-2)


def k_scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K packed 6-bit scales (..., 12) uint8 -> (sc, m), each (..., 8) uint8.

    Bytes 0-3: sc0-3 (low 6 bits) with the top 2 bits of sc4-7; bytes 4-7: m0-3 with the top bits of
    m4-7; bytes 8-11: low 4 bits of sc4-7 (low nibble) and m4-7 (high nibble).
    """
    d, m, md = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = torch.cat((d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)), dim=-1)
    mn = torch.cat((m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)), dim=-1)
    return sc, mn


def dequantize(raw: torch.Tensor, qtype, cols: int) -> torch.Tensor:
    """Raw GGUF rows (rows, row_bytes) uint8 -> (rows, cols) float32, bit-exact with gguf-py."""
    bt = block_type(qtype)
    qtype = bt.qtype
    if raw.dtype != torch.uint8 or raw.dim() != 2:
        raise ValueError(f"{qtype.name}: expected a 2-D uint8 tensor of raw rows, got {tuple(raw.shape)} {raw.dtype}")
    rows = raw.shape[0]
    if raw.shape[1] != row_bytes(qtype, cols):
        raise ValueError(f"{qtype.name}: row of {cols} weights needs {row_bytes(qtype, cols)} bytes, got {raw.shape[1]}")
    raw = raw.contiguous()
    if qtype == QT.F32:
        return raw.view(torch.float32).clone()
    if qtype == QT.F16:
        return raw.view(torch.float16).float()
    if qtype == QT.BF16:
        return raw.view(torch.bfloat16).float()

    nb = cols // bt.block
    blk = raw.view(rows, nb, bt.nbytes)                                   # (rows, nb, block bytes)
    if qtype == QT.Q8_0:
        d = _f16(blk[..., 0:2]).unsqueeze(-1)                              # (rows, nb, 1)
        q = blk[..., 2:].contiguous().view(torch.int8).float()             # (rows, nb, 32)
        y = q * d
    elif qtype == QT.Q4_0:
        d = _f16(blk[..., 0:2]).unsqueeze(-1)
        q = _nibbles(blk[..., 2:]).reshape(rows, nb, 32).to(torch.int8) - 8
        y = d * q.float()
    elif qtype == QT.Q5_0:
        d = _f16(blk[..., 0:2]).unsqueeze(-1)
        qh = blk[..., 2:6].to(torch.int64)                                 # 32 high bits, little-endian
        qh = qh[..., 0] | (qh[..., 1] << 8) | (qh[..., 2] << 16) | (qh[..., 3] << 24)
        bits = (qh.unsqueeze(-1) >> torch.arange(32, device=raw.device)) & 1   # (rows, nb, 32)
        ql = _nibbles(blk[..., 6:]).reshape(rows, nb, 32)
        q = (ql | (bits.to(torch.uint8) << 4)).to(torch.int8) - 16
        y = d * q.float()
    elif qtype in (QT.Q4_K, QT.Q5_K):
        d = _f16(blk[..., 0:2])
        dmin = _f16(blk[..., 2:4])
        sc, mn = k_scale_min(blk[..., 4:16])
        ds = (d.unsqueeze(-1) * sc.float()).unsqueeze(-1)                  # (rows, nb, 8, 1)
        dm = (dmin.unsqueeze(-1) * mn.float()).unsqueeze(-1)
        if qtype == QT.Q4_K:
            qs = blk[..., 16:].reshape(rows, nb, 4, 32)                    # 4 runs of 64 weights
            q = _nibbles(qs).reshape(rows, nb, 8, 32)
        else:
            qh = blk[..., 16:48].reshape(rows, nb, 1, 32)
            qs = blk[..., 48:].reshape(rows, nb, 4, 32)
            hb = (qh >> torch.arange(8, device=raw.device, dtype=torch.uint8).view(8, 1)) & 1  # (rows, nb, 8, 32)
            q = _nibbles(qs).reshape(rows, nb, 8, 32) | (hb << 4)
        y = ds * q.float() - dm
    elif qtype == QT.Q6_K:
        ql = blk[..., 0:128].reshape(rows, nb, 2, 64)
        qh = blk[..., 128:192].reshape(rows, nb, 2, 1, 32)
        sc = blk[..., 192:208].contiguous().view(torch.int8).float()       # (rows, nb, 16)
        d = _f16(blk[..., 208:210]).unsqueeze(-1)
        ds = (d * sc).unsqueeze(-1)                                        # (rows, nb, 16, 1)
        lo = _nibbles(ql).reshape(rows, nb, 8, 32)
        # arange, not torch.tensor([...]): no host->device copy, so this stays CUDA-graph capturable
        shifts = torch.arange(0, 8, 2, device=raw.device, dtype=torch.uint8).view(4, 1)
        hi = ((qh >> shifts) & 3).reshape(rows, nb, 8, 32)
        q = (lo | (hi << 4)).to(torch.int8) - 32
        y = ds * q.reshape(rows, nb, 16, 16).float()
    else:  # pragma: no cover - the table and this function list the same types
        raise ValueError(f"GGML type {qtype.name} is not supported")
    return y.reshape(rows, cols)


# Byte offsets of the fp16 scale fields inside one block, per type (for random test/benchmark data).
_F16_FIELDS = {QT.Q8_0: (0,), QT.Q4_0: (0,), QT.Q5_0: (0,), QT.Q4_K: (0, 2), QT.Q5_K: (0, 2), QT.Q6_K: (208,)}


def random_raw(qtype, rows: int, cols: int, generator: torch.Generator | None = None,
               d_scale: float | None = None, device="cpu") -> torch.Tensor:
    """Random raw rows (rows, row_bytes) uint8 of `qtype` whose float fields are finite.

    Quantised bits are uniformly random. With `d_scale=None` the fp16 block scales are random finite
    bit patterns (covers subnormals and large values: for bit-exactness tests); with a number they are
    uniform in [0, d_scale) (for kernel tests and benchmarks, so products stay in range).
    Without a generator the data is drawn directly on `device` (fast for benchmark-sized weights).
    """
    gen_device = "cpu" if generator is not None else device
    bt = block_type(qtype)
    qtype = bt.qtype
    nbytes = row_bytes(qtype, cols)
    raw = torch.randint(0, 256, (rows, nbytes), dtype=torch.uint8, generator=generator, device=gen_device)
    if qtype == QT.F32:
        vals = torch.randn(rows, cols, generator=generator, device=gen_device) * (1.0 if d_scale is None else d_scale)
        return vals.view(torch.uint8).reshape(rows, nbytes).to(device)
    if qtype in (QT.F16, QT.BF16):
        dt = torch.float16 if qtype == QT.F16 else torch.bfloat16
        vals = (torch.randn(rows, cols, generator=generator, device=gen_device) * (1.0 if d_scale is None else d_scale)).to(dt)
        return vals.view(torch.uint8).reshape(rows, nbytes).to(device)
    blk = raw.view(rows, cols // bt.block, bt.nbytes)                     # (rows, nb, block bytes)
    for off in _F16_FIELDS[qtype]:
        if d_scale is None:
            blk[..., off + 1] &= 0x7B       # exponent < 31: never inf/nan
        else:
            d = (torch.rand(blk.shape[:2], generator=generator, device=gen_device) * d_scale).to(torch.float16)
            blk[..., off:off + 2] = d.view(torch.uint8).view(*blk.shape[:2], 2)
    return raw.to(device)
