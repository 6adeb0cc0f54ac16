"""Load-time repacking of GGUF blocks into a structure-of-arrays layout for the Triton kernels.

The GGUF array of blocks (one struct of d / scales / bits per 32 or 256 weights) is split into one
array per field, each (N, per-row) and contiguous, so a kernel tile of rows x K loads every field
with plain strided loads and the 4-bit codes stream as wide coalesced loads. The bits are the same
(`unpack` gives back the original bytes exactly); only the 12-byte 6-bit Q4_K/Q5_K scale field is
widened to one byte per scale and per min, which costs 4 bytes per 256 weights.

Layout (N rows, K weights per row; all arrays row-major):

| type | arrays                                                            | bytes per 256 weights (GGUF) |
|------|-------------------------------------------------------------------|------------------------------|
| Q8_0 | qs int8 (N,K); d f16 (N,K/32)                                     | 272 (272)                    |
| Q4_0 | qs u8 (N,K/2) GGUF nibble order; d f16 (N,K/32)                   | 144 (144)                    |
| Q5_0 | qs u8 (N,K/2); qh int32 (N,K/32) bit j = 5th bit of weight j; d   | 176 (176)                    |
| Q4_K | qs u8 (N,K/2); sc u8, mn u8 (N,K/32) 6-bit values; d, dmin f16 (N,K/256) | 148 (144)             |
| Q5_K | as Q4_K + qh u8 (N,K/8) GGUF order                                | 180 (176)                    |
| Q6_K | qs=ql u8 (N,K/2); qh u8 (N,K/4); sc int8 (N,K/16); d f16 (N,K/256) | 210 (210)                   |

Nibble order inside qs is GGUF's: in each run of R weights (R = 32 for Q4_0/Q5_0, 64 for Q4_K/Q5_K,
128 for Q6_K) byte i holds weight i in its low nibble and weight i + R/2 in its high nibble.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from gguf import GGMLQuantizationType as QT

from .formats import block_type, k_scale_min, row_bytes

PACKED_TYPES = (QT.Q8_0, QT.Q4_0, QT.Q5_0, QT.Q4_K, QT.Q5_K, QT.Q6_K)


@dataclass
class PackedWeight:
    qtype: QT
    n: int                                   # rows (out features)
    k: int                                   # weights per row (in features)
    arrays: dict[str, torch.Tensor] = field(default_factory=dict)   # qs, qh, sc, mn, d, dmin

    @property
    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() for a in self.arrays.values())

    @property
    def device(self) -> torch.device:
        return self.arrays["qs"].device

    def to(self, device) -> "PackedWeight":
        return PackedWeight(self.qtype, self.n, self.k, {k: v.to(device) for k, v in self.arrays.items()})


def packed_nbytes(qtype, n: int, k: int) -> int:
    """Device bytes of the packed layout, without building it (for the memory planner)."""
    qtype = QT(int(qtype))
    extra = {QT.Q4_K: 4, QT.Q5_K: 4}.get(qtype, 0)        # widened 6-bit scales, per 256 weights
    return n * (row_bytes(qtype, k) + k // 256 * extra)


def _f16(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).squeeze(-1)


def pack(raw: torch.Tensor, qtype, k: int) -> PackedWeight:
    """Raw GGUF rows (N, row_bytes) uint8 (on any device) -> PackedWeight on the same device."""
    bt = block_type(qtype)
    qtype = bt.qtype
    if qtype not in PACKED_TYPES:
        raise ValueError(f"GGML type {qtype.name} has no packed kernel layout (use a dense weight)")
    if raw.dtype != torch.uint8 or raw.dim() != 2 or raw.shape[1] != row_bytes(qtype, k):
        raise ValueError(f"{qtype.name}: expected ({raw.shape[0]}, {row_bytes(qtype, k)}) uint8 rows, got {tuple(raw.shape)} {raw.dtype}")
    n = raw.shape[0]
    nb = k // bt.block
    blk = raw.reshape(n, nb, bt.nbytes)                                       # (N, blocks, block bytes)
    a: dict[str, torch.Tensor] = {}
    if qtype == QT.Q8_0:
        a["qs"] = blk[..., 2:].contiguous().view(torch.int8).reshape(n, k)
        a["d"] = _f16(blk[..., 0:2])
    elif qtype == QT.Q4_0:
        a["qs"] = blk[..., 2:].reshape(n, k // 2).contiguous()
        a["d"] = _f16(blk[..., 0:2])
    elif qtype == QT.Q5_0:
        a["qs"] = blk[..., 6:].reshape(n, k // 2).contiguous()
        a["qh"] = blk[..., 2:6].contiguous().view(torch.int32).squeeze(-1)   # (N, K/32), little-endian
        a["d"] = _f16(blk[..., 0:2])
    elif qtype in (QT.Q4_K, QT.Q5_K):
        a["d"] = _f16(blk[..., 0:2])
        a["dmin"] = _f16(blk[..., 2:4])
        sc, mn = k_scale_min(blk[..., 4:16])                                  # (N, blocks, 8) each
        a["sc"] = sc.reshape(n, k // 32).contiguous()
        a["mn"] = mn.reshape(n, k // 32).contiguous()
        if qtype == QT.Q4_K:
            a["qs"] = blk[..., 16:].reshape(n, k // 2).contiguous()
        else:
            a["qh"] = blk[..., 16:48].reshape(n, k // 8).contiguous()
            a["qs"] = blk[..., 48:].reshape(n, k // 2).contiguous()
    elif qtype == QT.Q6_K:
        a["qs"] = blk[..., 0:128].reshape(n, k // 2).contiguous()
        a["qh"] = blk[..., 128:192].reshape(n, k // 4).contiguous()
        a["sc"] = blk[..., 192:208].contiguous().view(torch.int8).reshape(n, k // 16)
        a["d"] = _f16(blk[..., 208:210])
    return PackedWeight(qtype, n, k, a)


def unpack(p: PackedWeight) -> torch.Tensor:
    """Inverse of `pack`: the original GGUF bytes (N, row_bytes) uint8 (proves the layout is lossless)."""
    n, k, a = p.n, p.k, p.arrays
    bt = block_type(p.qtype)
    nb = k // bt.block

    def f16b(t):                                                              # (N, blocks) f16 -> (N, blocks, 2) u8
        return t.contiguous().view(torch.uint8).reshape(n, nb, 2)

    if p.qtype == QT.Q8_0:
        parts = [f16b(a["d"]), a["qs"].view(torch.uint8).reshape(n, nb, 32)]
    elif p.qtype == QT.Q4_0:
        parts = [f16b(a["d"]), a["qs"].reshape(n, nb, 16)]
    elif p.qtype == QT.Q5_0:
        parts = [f16b(a["d"]), a["qh"].contiguous().view(torch.uint8).reshape(n, nb, 4), a["qs"].reshape(n, nb, 16)]
    elif p.qtype in (QT.Q4_K, QT.Q5_K):
        sc = a["sc"].reshape(n, nb, 8)
        mn = a["mn"].reshape(n, nb, 8)
        scales = torch.cat((
            sc[..., :4] | ((sc[..., 4:] >> 4) << 6),
            mn[..., :4] | ((mn[..., 4:] >> 4) << 6),
            (sc[..., 4:] & 0x0F) | ((mn[..., 4:] & 0x0F) << 4),
        ), dim=-1)                                                            # (N, blocks, 12)
        parts = [f16b(a["d"]), f16b(a["dmin"]), scales]
        if p.qtype == QT.Q5_K:
            parts.append(a["qh"].reshape(n, nb, 32))
        parts.append(a["qs"].reshape(n, nb, 128))
    else:  # Q6_K
        parts = [a["qs"].reshape(n, nb, 128), a["qh"].reshape(n, nb, 64),
                 a["sc"].view(torch.uint8).reshape(n, nb, 16), f16b(a["d"])]
    return torch.cat(parts, dim=-1).reshape(n, nb * bt.nbytes)
