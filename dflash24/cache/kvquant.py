"""Quantized KV cache formats: q8_0, q4_0 (GGML block semantics) and tq3 (TurboQuant-style, 3 bits + scale).

Plain PyTorch encode/decode (the reference; also what `KVCache.write` runs on every device). A cache row
of one KV head, D values, is stored as `row_bytes(fmt, D)` uint8 bytes; buffers are [..., Hk, row_bytes].
Every 32 values form one block with its own fp16 scale, so a row (and a tile of rows) decodes without neighbours:

  q8_0  34 bytes / 32 values: fp16 d, 32 x int8 q;        x = d * q,  d = max|x| / 127, q = roundf(x / d)
  q4_0  18 bytes / 32 values: fp16 d, 16 bytes nibbles;   x = d * (q - 8), d = m / -8 where m is the value
        of largest magnitude (sign kept), q = min(15, trunc(x / d + 8.5)); byte j holds element j in its low
        nibble and element j + 16 in its high nibble (GGML's block, bit-compatible with gguf-py).
  tq3   14 bytes / 32 values (3.5 bits): groups of 128 values (FACTS.md section 5). u = x / ||x|| is rotated,
        y = R u with R = D2 * H128 * D1 (H128 = Walsh-Hadamard / sqrt(128), D1/D2 = fixed +-1 diagonals,
        `_signs`), so the coordinates of y follow the distribution of a random unit vector's coordinate
        in dim 128 (~N(0, 1/128)); each is snapped to the nearest of the 8 Lloyd-Max centroids for that
        distribution, `TQ3_CENTROIDS` (+-0.021460 ... +-0.190685; 0.0884 = 1/sqrt(128) times the N(0,1)
        Lloyd-Max levels +-0.245 ... +-2.152, so the scale matches). The stored scale is
        s = ||x|| / ||c|| (c = the centroid vector), so the reconstruction s * R^T c has exactly x's norm
        (up to the fp16 rounding of s). No QJL residual (it hurt top-1 agreement, FACTS.md).
        Block of 32 = fp16 s (the group's scale, repeated for each of its 4 blocks: block-local decode and
        the documented 14 bytes / 32 values), 8 bytes of the codes' low 2 bits (element j: byte j // 4,
        bits 2 * (j % 4)), 4 bytes of their high bit (element j: byte 8 + j // 8, bit j % 8).
        The code indexes the centroids in ascending order (0 = -0.190685 ... 7 = +0.190685).
        tq3 needs a head dim that is a multiple of 128 (64 is refused: the centroids are for dim 128).

A row is not its blocks one after the other: it holds the blocks' fp16 scales first (D / 32 of them), then
their payloads in block order (q8_0: the int8 values; q4_0: the nibble bytes; tq3: every block's 8 bytes of
low bits, then every block's 4 bytes of high bits). The payloads then start 4-byte aligned (D a multiple of 64)
and 16-byte aligned for D = 256, so the attention kernel reads them as 32-bit words (and a row's scales as one
word for every two blocks). `ggml_blocks` gives a row's blocks in GGML's order (scale, payload);
`rows_from_ggml_blocks` is its inverse.

Attention over tq3 never un-rotates K: <q, R^T s c> = <R q, s c>, so the query is rotated once instead; V
rows are summed in the rotated domain and the output rotated back once (sum_j p_j R^T v_j = R^T sum_j p_j v_j).
`decode(..., rotated=True)` gives the rotated-domain values (what the kernel reads); the default undoes R.
"""
from __future__ import annotations

import torch

from ..config import ConfigError

QUANT_TYPES = ("q8_0", "q4_0", "tq3")
DENSE_TYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
FORMAT_CODE = {"dense": 0, "q8_0": 1, "q4_0": 2, "tq3": 3}       # constexpr code for the Triton kernel
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "tq3": 14}                  # per 32 values
QK = 32
TQ3_GROUP = 128
TQ3_CENTROIDS = (-0.190685, -0.117832, -0.065717, -0.021460, 0.021460, 0.065717, 0.117832, 0.190685)
# Seeds of the two sign vectors (xorshift32, `_signs`): fixed forever, a cache written with other signs
# would decode to garbage.
TQ3_SEED_D1, TQ3_SEED_D2 = 0x7D1A5EED, 0x2D2B5EED


def check_type(fmt: str, head_dim: int):
    """Raise ConfigError unless a cache of type `fmt` can hold heads of `head_dim` values."""
    if fmt in DENSE_TYPES:
        return
    if fmt not in QUANT_TYPES:
        raise ConfigError(f"unknown KV cache type {fmt!r} (known: {', '.join((*DENSE_TYPES, *QUANT_TYPES))})")
    if fmt == "tq3" and head_dim % TQ3_GROUP:
        raise ConfigError(f"KV cache type tq3 needs a head dim that is a multiple of {TQ3_GROUP} "
                          f"(its groups of {TQ3_GROUP} values are rotated and quantized for dim {TQ3_GROUP}); "
                          f"this model's head dim is {head_dim}: use q8_0 or q4_0")
    if head_dim % QK:
        raise ConfigError(f"KV cache type {fmt} needs a head dim that is a multiple of {QK}, got {head_dim}")


def row_bytes(fmt: str, head_dim: int) -> int:
    check_type(fmt, head_dim)
    return head_dim // QK * BLOCK_BYTES[fmt]


# ---------------------------------------------------------------------------------------------------
# tq3 rotation
# ---------------------------------------------------------------------------------------------------
def _signs(seed: int, n: int = TQ3_GROUP) -> torch.Tensor:
    """n fixed +-1 values from xorshift32(seed): bit 0 of each successive state (set -> -1)."""
    s, out = seed & 0xFFFFFFFF, []
    for _ in range(n):
        s ^= (s << 13) & 0xFFFFFFFF
        s ^= s >> 17
        s ^= (s << 5) & 0xFFFFFFFF
        out.append(-1.0 if s & 1 else 1.0)
    return torch.tensor(out, dtype=torch.float64)


def _hadamard(n: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / n ** 0.5


_ROT: dict = {}


def _device(device) -> torch.device:
    """A canonical device (cuda -> cuda:<current>) so cached constants are found under one key."""
    d = torch.device(device) if device is not None else torch.device("cpu")
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return d


def rotation(device=None, dtype=torch.float32) -> torch.Tensor:
    """R = D2 H128 D1 [128, 128] (orthogonal): y = R u rotates a group, u = R^T y undoes it."""
    device = _device(device)
    key = (device, dtype)
    if key not in _ROT:
        r = _signs(TQ3_SEED_D2)[:, None] * _hadamard(TQ3_GROUP) * _signs(TQ3_SEED_D1)[None, :]
        _ROT[key] = r.to(device=device, dtype=dtype)
    return _ROT[key]


_SIGNS: dict = {}


def rotation_signs(device=None) -> torch.Tensor:
    """R's two sign vectors as one fp32 [2, 128] tensor on `device` (row 0: D1's, row 1: D2's; R = D2 H128 D1),
    built once: what a kernel needs to apply R as signs around a fast Walsh-Hadamard transform."""
    key = device = _device(device)
    if key not in _SIGNS:
        _SIGNS[key] = torch.stack([_signs(TQ3_SEED_D1), _signs(TQ3_SEED_D2)]).to(device=device, dtype=torch.float32)
    return _SIGNS[key]


_CENT: dict = {}


def centroids(device=None) -> torch.Tensor:
    """TQ3_CENTROIDS as an fp32 tensor on `device`, built once (a CUDA graph capturing a write or a
    decode must not copy them from the host)."""
    key = device = _device(device)
    if key not in _CENT:
        _CENT[key] = torch.tensor(TQ3_CENTROIDS, dtype=torch.float32, device=device)
    return _CENT[key]


def rotate(x: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Apply R (or R^T) to every 128-group of the last dim of x (fp32 math, x's dtype out)."""
    D = x.shape[-1]
    g = x.float().reshape(*x.shape[:-1], D // TQ3_GROUP, TQ3_GROUP)
    r = rotation(x.device)
    y = g @ r if inverse else g @ r.T                  # row vectors: (R u)^T = u^T R^T
    return y.reshape(x.shape).to(x.dtype)


# ---------------------------------------------------------------------------------------------------
# encode / decode
# ---------------------------------------------------------------------------------------------------
def _fp16_bytes(d: torch.Tensor) -> torch.Tensor:
    """[..., 1] float -> [..., 2] uint8 (little-endian fp16)."""
    return d.to(torch.float16).contiguous().view(torch.uint8)


def _fp16_from(b: torch.Tensor) -> torch.Tensor:
    """[..., 2] uint8 -> [..., 1] float32."""
    return b.contiguous().view(torch.float16).float()


def encode(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """x [..., D] (any float dtype) -> [..., row_bytes(fmt, D)] uint8."""
    D = x.shape[-1]
    check_type(fmt, D)
    lead = x.shape[:-1]
    xb = x.float().reshape(*lead, D // QK, QK)                                       # [..., nb, 32]
    if fmt == "q8_0":
        d = xb.abs().amax(-1, keepdim=True) / 127
        inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
        v = xb * inv
        q = torch.sign(v) * torch.floor(v.abs() + 0.5)                               # C roundf: ties away
        blocks = torch.cat([_fp16_bytes(d), q.to(torch.int8).view(torch.uint8)], -1)
    elif fmt == "q4_0":
        i = xb.abs().argmax(-1, keepdim=True)
        d = xb.gather(-1, i) / -8
        inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
        q = torch.trunc(xb * inv + 8.5).clamp(0, 15).to(torch.uint8)                # [..., nb, 32]
        blocks = torch.cat([_fp16_bytes(d), q[..., :16] | (q[..., 16:] << 4)], -1)
    elif fmt == "tq3":
        codes, scale = tq3_codes(x)                                                  # [..., D], [..., D/128]
        c = codes.reshape(*lead, D // QK, QK)
        low = (c & 3).reshape(*lead, D // QK, 8, 4)
        low = low[..., 0] | (low[..., 1] << 2) | (low[..., 2] << 4) | (low[..., 3] << 6)
        high = ((c >> 2) & 1).reshape(*lead, D // QK, 4, 8)
        high = sum(high[..., j] << j for j in range(8))
        s = scale.repeat_interleave(TQ3_GROUP // QK, dim=-1).unsqueeze(-1)          # [..., nb, 1]
        blocks = torch.cat([_fp16_bytes(s), low.to(torch.uint8), high.to(torch.uint8)], -1)
    return rows_from_ggml_blocks(blocks, fmt)


def _block_parts(fmt: str) -> tuple[int, ...]:
    """Byte sizes of a GGML block's parts, in order: the fp16 scale, then the payload (tq3: low bits, high bits).
    A row holds each part of all its blocks together, part after part."""
    return (2, 8, 4) if fmt == "tq3" else (2, BLOCK_BYTES[fmt] - 2)


def rows_from_ggml_blocks(blocks: torch.Tensor, fmt: str) -> torch.Tensor:
    """[..., nb, BLOCK_BYTES] GGML-ordered blocks -> [..., row_bytes] rows (the scales, then the payloads)."""
    lead = blocks.shape[:-2]
    return torch.cat([p.reshape(*lead, -1) for p in blocks.split(_block_parts(fmt), -1)], -1)


def ggml_blocks(b: torch.Tensor, fmt: str) -> torch.Tensor:
    """[..., row_bytes] rows -> [..., nb, BLOCK_BYTES] blocks in GGML's order (fp16 scale, then the payload)."""
    nb = b.shape[-1] // BLOCK_BYTES[fmt]
    if b.shape[-1] != nb * BLOCK_BYTES[fmt]:
        raise ValueError(f"{fmt} rows are whole blocks of {BLOCK_BYTES[fmt]} bytes, got {b.shape[-1]} bytes")
    sizes = _block_parts(fmt)
    parts = b.split([nb * size for size in sizes], -1)
    return torch.cat([p.reshape(*b.shape[:-1], nb, size) for p, size in zip(parts, sizes)], -1)


def tq3_codes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> (codes [..., D] uint8 in 0..7 (rotated domain), scale [..., D/128] fp32 = ||x||/||c||)."""
    D = x.shape[-1]
    g = x.float().reshape(*x.shape[:-1], D // TQ3_GROUP, TQ3_GROUP)
    norm = g.norm(dim=-1, keepdim=True)
    u = g / torch.where(norm > 0, norm, torch.ones_like(norm))
    y = u @ rotation(x.device).T
    cent = centroids(x.device)
    codes = torch.bucketize(y, (cent[1:] + cent[:-1]) / 2)                         # nearest centroid
    rn = cent[codes].norm(dim=-1, keepdim=True)                                     # > 0: no zero centroid
    scale = (norm / rn).squeeze(-1)
    return codes.to(torch.uint8).reshape(x.shape), scale


def decode(b: torch.Tensor, fmt: str, head_dim: int, dtype=torch.float32, rotated: bool = False) -> torch.Tensor:
    """[..., row_bytes] uint8 -> [..., head_dim] values in `dtype`. tq3: rotated=True keeps R's domain."""
    D = head_dim
    lead = b.shape[:-1]
    if b.shape[-1] != row_bytes(fmt, D):
        raise ValueError(f"{fmt} rows of head dim {D} have {row_bytes(fmt, D)} bytes, got {b.shape[-1]}")
    blk = ggml_blocks(b, fmt)                                                         # [..., nb, bytes]
    d = _fp16_from(blk[..., :2])                                                     # [..., nb, 1]
    if fmt == "q8_0":
        x = blk[..., 2:].contiguous().view(torch.int8).float() * d
    elif fmt == "q4_0":
        qs = blk[..., 2:]
        q = torch.cat([qs & 15, qs >> 4], -1).float() - 8
        x = q * d
    elif fmt == "tq3":
        low, high = blk[..., 2:10], blk[..., 10:14]
        lo = torch.stack([(low >> (2 * i)) & 3 for i in range(4)], -1).reshape(*lead, D // QK, QK)
        hi = torch.stack([(high >> i) & 1 for i in range(8)], -1).reshape(*lead, D // QK, QK)
        cent = centroids(b.device)
        x = cent[(lo | (hi << 2)).long()] * d
        if not rotated:
            x = rotate(x.reshape(*lead, D), inverse=True)
    else:
        raise ConfigError(f"{fmt!r} is not a quantized KV type ({', '.join(QUANT_TYPES)})")
    return x.reshape(*lead, D).to(dtype)


class PackedKV:
    """A quantized K or V cache of one layer: `data` [capacity, Hk, row_bytes] uint8 in format `fmt`.
    What `KVCache.layer` hands to attention instead of a dense [capacity, Hk, D] tensor."""

    def __init__(self, data: torch.Tensor, fmt: str, head_dim: int):
        self.data, self.fmt, self.head_dim = data, fmt, head_dim

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.data.shape[0], self.data.shape[1], self.head_dim)

    @property
    def device(self):
        return self.data.device

    def dequantize(self, rows: int, dtype=torch.float32, rotated: bool = False) -> torch.Tensor:
        """Rows 0..rows-1 as dense [rows, Hk, D]."""
        return decode(self.data[:rows], self.fmt, self.head_dim, dtype, rotated)


def content_error(x: torch.Tensor, fmt: str) -> float:
    """How much of the rows' content a format loses: ||decode(encode(x)) - x|| / ||x - mean over rows||, for
    x [T, Hk, D] (T >= 2 rows of one chunk). Centring removes what every row shares (e.g. a k_proj bias, which
    sets a block's scale but adds the same score to every key): on rows without such an offset the measure
    is the plain relative error (q8_0 ~0.01, q4_0 ~0.1-0.2, tq3 ~0.2-0.3); measured on the real
    Qwen2.5-Coder-1.5B, whose first layers' K biases reach 354, layer 0's K gives q8_0 0.34, q4_0 3.8, tq3 10.5
    (and top-1 agreement with an f32 cache 0.99, 0.14, 0.02 over 2,048 tokens)."""
    x = x.float()
    deq = decode(encode(x, fmt), fmt, x.shape[-1])
    content = (x - x.mean(0, keepdim=True)).norm()
    return float((deq - x).norm() / content.clamp_min(1e-30))
