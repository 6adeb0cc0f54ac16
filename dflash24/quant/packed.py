"""Load-time repacking of GGUF blocks into a structure-of-arrays layout for the Triton kernels.

The GGUF array of blocks (one struct of d / scales / bits per 32 or 256 weights) is split into one
array per field, each (N, per-row) and contiguous. The bits are the same (`unpack` gives back the
original bytes exactly); only their order inside a block changes, and the 12-byte 6-bit Q4_K/Q5_K
scale field is widened to one byte per scale and per min (4 bytes more per 256 weights).

Code order ("planar" blocks). A scale block of BS weights (BS = 32; 16 for Q6_K, one int8 scale per
16) is stored as WPB = BS / FPW int32 words of FPW fields each (FPW = 8 nibbles, or 4 bytes for
Q8_0): field f of word w holds the code of weight  BS*b + WPB*f + w  of block b. So one shift + mask
gives field f of every word of a tile at once, and the weights it decodes are WPB consecutive K
positions per block: x is loaded for them with a plain contiguous load, no shuffle in registers.
The 5th bit (Q5_0/Q5_K) sits in one byte per word with the same (b, w) index: bit f belongs to field f.
The 2 high bits of Q6_K sit in one int32 per 16-block, in the order `_q6k_shift` describes.

Layout (N rows, K weights per row; all arrays row-major):

| type | arrays                                                                        | bytes / 256 (GGUF) |
|------|-------------------------------------------------------------------------------|--------------------|
| Q8_0 | qs int32 (N,K/4) 4 int8 codes per word; d f16 (N,K/32)                        | 272 (272)          |
| Q4_0 | qs int32 (N,K/8) nibble codes q (y = d*(q-8)); d f16 (N,K/32)                 | 144 (144)          |
| Q5_0 | qs int32 (N,K/8) low nibbles; qh u8 (N,K/8) 5th bits; d f16 (N,K/32)          | 176 (176)          |
| Q4_K | qs int32 (N,K/8); sc u8, mn u8 (N,K/32) 6-bit values; d, dmin f16 (N,K/256)   | 148 (144)          |
| Q5_K | as Q4_K + qh u8 (N,K/8)                                                       | 180 (176)          |
| Q6_K | qs int32 (N,K/8) low nibbles; qh int32 (N,K/16) high 2 bits; sc int8 (N,K/16); d f16 (N,K/256) | 210 (210) |
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from gguf import GGMLQuantizationType as QT

from .formats import block_type, k_scale_min, row_bytes

PACKED_TYPES = (QT.Q8_0, QT.Q4_0, QT.Q5_0, QT.Q4_K, QT.Q5_K, QT.Q6_K)

# (BS weights per scale block, FPW fields per int32 word); WPB = BS // FPW words per block.
GEOMETRY = {QT.Q8_0: (32, 4), QT.Q4_0: (32, 8), QT.Q5_0: (32, 8), QT.Q4_K: (32, 8), QT.Q5_K: (32, 8),
            QT.Q6_K: (16, 8)}
_ROW_CHUNK = 2048          # rows repacked at a time (bounds the temporaries of vocab-sized tables)


@dataclass
class PackedWeight:
    qtype: QT
    n: int                                   # rows (out features)
    k: int                                   # weights per row (in features)
    arrays: dict[str, torch.Tensor] = field(default_factory=dict)   # qs, qh, sc, mn, d, dmin

    def __post_init__(self):
        # The kernels read the f16 scale arrays as the int32 words holding them (cp.async needs 4-byte loads):
        # each needs a 4-byte aligned start, and an odd element count a 2-byte tail to read past its end.
        for name in ("d", "dmin"):
            t = self.arrays.get(name)
            if t is not None and (t.numel() % 2 or t.data_ptr() % 4):
                self.arrays[name] = _word_padded(t)

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


def _word_padded(t: torch.Tensor) -> torch.Tensor:
    """A copy of t (2-byte elements) in a fresh allocation one element longer: the last element's int32 word is
    inside the allocation."""
    buf = torch.zeros(t.numel() + 1, dtype=t.dtype, device=t.device)
    out = buf[: t.numel()].view(t.shape)
    out.copy_(t)
    return out


def _f16(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).squeeze(-1)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """(..., n) uint8 -> (..., 2n): low nibbles, then high nibbles (ggml's order inside a run)."""
    return torch.cat((qs & 0x0F, qs >> 4), dim=-1)


def _codes(blk: torch.Tensor, qtype) -> torch.Tensor:
    """GGUF blocks (n, nb, bytes) -> unsigned codes (n, nb * block) uint8 in weight order
    (Q8_0: the int8 bits; Q5: 5-bit; Q6_K: 6-bit)."""
    n, nb = blk.shape[:2]
    if qtype == QT.Q8_0:
        return blk[..., 2:].reshape(n, nb * 32)
    if qtype == QT.Q4_0:
        return _nibbles(blk[..., 2:]).reshape(n, nb * 32)
    if qtype == QT.Q5_0:
        qh = blk[..., 2:6]                                                   # (n, nb, 4) little-endian bits
        bits = (qh.unsqueeze(-1) >> torch.arange(8, device=blk.device, dtype=torch.uint8)) & 1   # (n, nb, 4, 8)
        return (_nibbles(blk[..., 6:]) | (bits.reshape(n, nb, 32) << 4)).reshape(n, nb * 32)
    if qtype == QT.Q4_K:
        return _nibbles(blk[..., 16:].reshape(n, nb, 4, 32)).reshape(n, nb * 256)
    if qtype == QT.Q5_K:
        qh = blk[..., 16:48].reshape(n, nb, 1, 32)
        hb = (qh >> torch.arange(8, device=blk.device, dtype=torch.uint8).view(8, 1)) & 1     # (n, nb, 8, 32)
        lo = _nibbles(blk[..., 48:].reshape(n, nb, 4, 32)).reshape(n, nb, 8, 32)
        return (lo | (hb << 4)).reshape(n, nb * 256)
    # Q6_K: ql runs of 128 weights (64 bytes: low then high nibbles); qh byte h*32+i, bits 2s: weight 128h+32s+i
    lo = _nibbles(blk[..., 0:128].reshape(n, nb, 2, 64))                     # (n, nb, 2, 128)
    qh = blk[..., 128:192].reshape(n, nb, 2, 1, 32)
    hi = (qh >> torch.arange(0, 8, 2, device=blk.device, dtype=torch.uint8).view(4, 1)) & 3   # (n, nb, 2, 4, 32)
    return (lo | (hi.reshape(n, nb, 2, 128) << 4)).reshape(n, nb * 256)


def _encode(c: torch.Tensor, qtype, nb: int) -> list[torch.Tensor]:
    """Inverse of `_codes` for the code bytes of a GGUF block: codes (n, K) -> list of (n, nb, bytes)."""
    n = c.shape[0]
    if qtype == QT.Q8_0:
        return [c.reshape(n, nb, 32)]
    if qtype in (QT.Q4_0, QT.Q5_0):
        c = c.reshape(n, nb, 2, 16)
        qs = (c[..., 0, :] & 15) | ((c[..., 1, :] & 15) << 4)
        if qtype == QT.Q4_0:
            return [qs]
        hb = ((c.reshape(n, nb, 4, 8) >> 4) & 1) << torch.arange(8, device=c.device, dtype=torch.uint8)
        return [hb.sum(-1, dtype=torch.uint8), qs]
    if qtype in (QT.Q4_K, QT.Q5_K):
        c = c.reshape(n, nb, 4, 2, 32)
        qs = ((c[..., 0, :] & 15) | ((c[..., 1, :] & 15) << 4)).reshape(n, nb, 128)
        if qtype == QT.Q4_K:
            return [qs]
        hb = ((c.reshape(n, nb, 8, 32) >> 4) & 1) << torch.arange(8, device=c.device, dtype=torch.uint8).view(8, 1)
        return [hb.sum(-2, dtype=torch.uint8), qs]
    c = c.reshape(n, nb, 2, 2, 64)                                           # Q6_K
    ql = ((c[..., 0, :] & 15) | ((c[..., 1, :] & 15) << 4)).reshape(n, nb, 128)
    hi = ((c.reshape(n, nb, 2, 4, 32) >> 4) & 3) << torch.arange(0, 8, 2, device=c.device, dtype=torch.uint8).view(4, 1)
    return [ql, hi.sum(-2, dtype=torch.uint8).reshape(n, nb, 64)]


def _planar(c: torch.Tensor, qtype) -> dict[str, torch.Tensor]:
    """Codes (n, K) uint8 in weight order -> qs (and qh) in the planar word layout."""
    n, k = c.shape
    bs, fpw = GEOMETRY[qtype]
    wpb = bs // fpw
    t = c.reshape(n, k // bs, fpw, wpb).transpose(-1, -2)                    # (n, blocks, WPB, FPW)
    out = {}
    if fpw == 4:                                                             # Q8_0: the 4 fields are the bytes
        out["qs"] = t.contiguous().view(torch.int32).reshape(n, k // 4)
        return out
    lo = t & 15
    out["qs"] = (lo[..., 0::2] | (lo[..., 1::2] << 4)).contiguous().view(torch.int32).reshape(n, k // 8)
    if qtype in (QT.Q5_0, QT.Q5_K):
        hb = ((t >> 4) & 1) << torch.arange(8, device=c.device, dtype=torch.uint8)
        out["qh"] = hb.sum(-1, dtype=torch.uint8).reshape(n, k // 8)
    elif qtype == QT.Q6_K:      # one int32 per 16-block: field f of word w at bits Q6K_HI_SHIFT[w][f]
        hi = ((t >> 4) & 3).to(torch.int64) << _q6k_shift(c.device)            # (n, blocks, 2, 8)
        v = hi.sum((-1, -2))                                                    # < 2^32, bits disjoint
        out["qh"] = torch.where(v >= 1 << 31, v - (1 << 32), v).to(torch.int32)
    return out


def _q6k_shift(device) -> torch.Tensor:
    """Bit position of the 2 high bits of field f of word w in a Q6_K block's int32: 8(f//2) + 4(f%2) + 2w.
    Byte i then holds fields 2i (bits 0-3 of the byte, words 0 and 1) and 2i+1 (bits 4-7): shifted right by
    2w, `& 0x03030303` gives word w's even fields and `>> 4 & 0x03030303` its odd fields, one per byte,
    as the int8-activation GEMV consumes them; field f alone sits at 8(f//2) + 4(f%2) after that shift."""
    f = torch.arange(8, device=device)
    w = torch.arange(2, device=device).view(2, 1)
    return 8 * (f // 2) + 4 * (f % 2) + 2 * w


def _unplanar(p: "PackedWeight", r0: int, r1: int) -> torch.Tensor:
    """Rows r0:r1 of the planar qs/qh -> codes (rows, K) uint8 in weight order."""
    n, k, a = r1 - r0, p.k, p.arrays
    bs, fpw = GEOMETRY[p.qtype]
    wpb = bs // fpw
    b = a["qs"][r0:r1].contiguous().view(torch.uint8).reshape(n, k // bs, wpb, 4)
    if fpw == 4:
        t = b
    else:
        t = torch.stack((b & 15, b >> 4), dim=-1).reshape(n, k // bs, wpb, 8)
        if p.qtype in (QT.Q5_0, QT.Q5_K):
            h = a["qh"][r0:r1].reshape(n, k // bs, wpb, 1)
            t = t | (((h >> torch.arange(8, device=h.device, dtype=torch.uint8)) & 1) << 4)
        elif p.qtype == QT.Q6_K:
            h = a["qh"][r0:r1].to(torch.int64).reshape(n, k // bs, 1, 1) & 0xFFFFFFFF
            h = ((h >> _q6k_shift(h.device)) & 3).to(torch.uint8)                  # (n, blocks, 2, 8)
            t = t | (h << 4)
    return t.transpose(-1, -2).reshape(n, k)


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
    parts = [_planar(_codes(blk[r0:r0 + _ROW_CHUNK], qtype), qtype) for r0 in range(0, n, _ROW_CHUNK)]
    for name in parts[0]:
        a[name] = torch.cat([q[name] for q in parts]) if len(parts) > 1 else parts[0][name]
    del parts
    if qtype in (QT.Q8_0, QT.Q4_0, QT.Q5_0):
        a["d"] = _f16(blk[..., 0:2])
    elif qtype in (QT.Q4_K, QT.Q5_K):
        a["d"] = _f16(blk[..., 0:2])
        a["dmin"] = _f16(blk[..., 2:4])
        sc, mn = k_scale_min(blk[..., 4:16])                                  # (N, blocks, 8) each
        a["sc"] = sc.reshape(n, k // 32).contiguous()
        a["mn"] = mn.reshape(n, k // 32).contiguous()
    else:   # Q6_K
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

    codes = torch.cat([_unplanar(p, r0, min(n, r0 + _ROW_CHUNK)) for r0 in range(0, n, _ROW_CHUNK)])
    enc = _encode(codes, p.qtype, nb)
    if p.qtype in (QT.Q8_0, QT.Q4_0, QT.Q5_0):
        parts = [f16b(a["d"])] + enc
    elif p.qtype in (QT.Q4_K, QT.Q5_K):
        sc = a["sc"].reshape(n, nb, 8)
        mn = a["mn"].reshape(n, nb, 8)
        scales = torch.cat((
            sc[..., :4] | ((sc[..., 4:] >> 4) << 6),
            mn[..., :4] | ((mn[..., 4:] >> 4) << 6),
            (sc[..., 4:] & 0x0F) | ((mn[..., 4:] & 0x0F) << 4),
        ), dim=-1)                                                            # (N, blocks, 12)
        parts = [f16b(a["d"]), f16b(a["dmin"]), scales] + enc
    else:  # Q6_K
        parts = enc + [a["sc"].view(torch.uint8).reshape(n, nb, 16), f16b(a["d"])]
    return torch.cat(parts, dim=-1).reshape(n, nb * bt.nbytes)
