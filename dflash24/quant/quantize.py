"""Our own GGUF quantizers: float rows -> raw Q8_0 / Q6_K / Q4_K blocks (gguf-py has no K-quant quantizer).

    raw = quantize(w, "Q6_K")          # w: (rows, cols) float, cols % 256 == 0 -> (rows, row_bytes) uint8

Method (per 256-weight super-block; all vectorised in float32 torch, on CPU or GPU):
- Q6_K (16 sub-blocks of 16, y = d * sc * (q - 32), sc int8, q - 32 in [-32, 31]):
  for each sub-block, 19 candidate scales s = xm / (32 + 0.1 k), k = -9..9, where xm is the sub-block's
  element of largest magnitude WITH its sign (so that element lands on the extra level -32); each candidate
  rounds L = clamp(round(x / s), -32, 31) and is re-fitted by least squares (s* = <x,L> / <L,L>); the
  candidate with the smallest squared error sum((x - s* L)^2) wins. Then d = max|s*| / 127 (fp16) and
  sc = round(s* / d) in int8; finally L is re-rounded against the QUANTIZED scale d * sc.
- Q4_K (8 sub-blocks of 32, y = d * sc * q - dmin * m, sc, m 6-bit unsigned, q in [0, 15]):
  for each sub-block, affine fit x ~ a L + b with b <= 0 (the offset is stored as a non-negative min m);
  21 candidate scales a = (max - min) / (15 + 0.1 k), k = -10..10 (min = min(x, 0)); each candidate rounds
  L = clamp(round((x - min) / a), 0, 15) and re-fits (a, b) by 2x2 least squares (b clamped to <= 0, then
  a re-fitted); smallest squared error wins. d = max(a) / 63, dmin = max(-b) / 63 (fp16), sc / m = the
  6-bit roundings, and L is re-rounded against the quantized d * sc and dmin * m.
- Q8_0: gguf-py's reference quantizer (d = amax / 127, round to nearest).
Packing follows FACTS.md section 2 / ggml-common.h; `formats.dequantize` (bit-exact with gguf-py) reads it
back, and the tests check gguf-py's dequantizer agrees exactly.

Error (tests/test_quantize.py, Gaussian rows): relative RMSE about 0.4 % (Q8_0), 1 % (Q6_K), 4 % (Q4_K).
"""
from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT

from .formats import QK_K, row_bytes

QUANT_TYPES = ("Q8_0", "Q6_K", "Q4_K")
_CHUNK = 4096                 # super-blocks per vectorised step (bounds the candidate tensors' memory)


def _qtype(qtype) -> QT:
    if isinstance(qtype, str):
        try:
            qtype = QT[qtype.upper()]
        except KeyError:
            raise ValueError(f"unknown quantization type {qtype!r} (supported: {', '.join(QUANT_TYPES)})") from None
    qtype = QT(int(qtype))
    if qtype.name not in QUANT_TYPES:
        raise ValueError(f"no quantizer for {qtype.name} (supported: {', '.join(QUANT_TYPES)})")
    return qtype


def _fp16_bytes(x: torch.Tensor) -> torch.Tensor:
    """(...,) float -> (..., 2) uint8 little-endian half."""
    return x.to(torch.float16).contiguous().view(torch.uint8).reshape(*x.shape, 2)


def _q6_k(x: torch.Tensor) -> torch.Tensor:
    """(nb, 256) float32 -> (nb, 210) uint8."""
    nb = x.shape[0]
    xs = x.reshape(nb, 16, 16)
    idx = xs.abs().argmax(-1, keepdim=True)
    xm = xs.gather(-1, idx)                                             # signed max-magnitude element
    k = torch.arange(-9, 10, dtype=x.dtype, device=x.device) * 0.1
    cand = (xm / (32 + k)).unsqueeze(-1)                                # (nb, 16, 19, 1)
    safe = torch.where(cand == 0, torch.ones_like(cand), cand)
    xc = xs.unsqueeze(-2)                                               # (nb, 16, 1, 16)
    L = torch.clamp(torch.round(xc / safe), -32, 31)
    sxl, sll = (xc * L).sum(-1), (L * L).sum(-1)
    s = torch.where(sll > 0, sxl / sll.clamp_min(1e-30), torch.zeros_like(sxl))
    err = ((xc - s.unsqueeze(-1) * L) ** 2).sum(-1)                      # (nb, 16, 19)
    best = err.argmin(-1, keepdim=True)
    s = s.gather(-1, best).squeeze(-1)                                  # (nb, 16) best sub-block scales
    d = (s.abs().amax(-1) / 127).to(torch.float16).float()             # (nb,)
    dsafe = torch.where(d > 0, d, torch.ones_like(d))
    sc = torch.clamp(torch.round(s / dsafe.unsqueeze(-1)), -128, 127)
    sc = torch.where(d.unsqueeze(-1) > 0, sc, torch.zeros_like(sc))
    eff = (d.unsqueeze(-1) * sc).unsqueeze(-1)                          # (nb, 16, 1)
    eff_safe = torch.where(eff == 0, torch.ones_like(eff), eff)
    L = torch.where(eff == 0, torch.zeros_like(xs), torch.clamp(torch.round(xs / eff_safe), -32, 31))
    q = (L + 32).to(torch.uint8).reshape(nb, 2, 4, 32)                  # half, 32-group, lane
    lo, hi = q & 0x0F, q >> 4
    # ql[h][j]: low nibble = weight j of the half, high nibble = weight 64 + j
    ql = lo[:, :, 0:2].reshape(nb, 2, 64) | (lo[:, :, 2:4].reshape(nb, 2, 64) << 4)
    # qh[h][l]: bits 2g..2g+1 = high 2 bits of weight 32 g + l
    qh = hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)
    scb = sc.to(torch.int8).view(torch.uint8)
    return torch.cat((ql.reshape(nb, 128), qh.reshape(nb, 64), scb, _fp16_bytes(d)), dim=-1)


def _q4_k(x: torch.Tensor) -> torch.Tensor:
    """(nb, 256) float32 -> (nb, 144) uint8."""
    nb = x.shape[0]
    xs = x.reshape(nb, 8, 32)
    lo = xs.amin(-1, keepdim=True).clamp_max(0)
    rng = (xs.amax(-1, keepdim=True) - lo)
    k = torch.arange(-10, 11, dtype=x.dtype, device=x.device) * 0.1
    a0 = (rng / (15 + k)).unsqueeze(-1)                                # (nb, 8, 21, 1)
    a0 = torch.where(a0 > 0, a0, torch.ones_like(a0))
    xc = xs.unsqueeze(-2)                                               # (nb, 8, 1, 32)
    L = torch.clamp(torch.round((xc - lo.unsqueeze(-1)) / a0), 0, 15)
    n = 32.0
    sl, sll = L.sum(-1), (L * L).sum(-1)
    sx, sxl = xc.sum(-1), (xc * L).sum(-1)
    det = n * sll - sl * sl
    a = torch.where(det > 0, (n * sxl - sx * sl) / det.clamp_min(1e-30), torch.zeros_like(det))
    b = torch.where(det > 0, (sx - a * sl) / n, sx / n)
    pos = b > 0                                                         # offset must be <= 0: refit a alone
    a = torch.where(pos, sxl / sll.clamp_min(1e-30), a)
    b = torch.where(pos, torch.zeros_like(b), b)
    neg_a = a < 0                                                       # scale must be >= 0
    a = torch.where(neg_a, torch.zeros_like(a), a)
    b = torch.where(neg_a, torch.minimum(sx / n, torch.zeros_like(b)), b)
    err = ((xc - (a.unsqueeze(-1) * L + b.unsqueeze(-1))) ** 2).sum(-1)  # (nb, 8, 21)
    best = err.argmin(-1, keepdim=True)
    a = a.gather(-1, best).squeeze(-1)                                  # (nb, 8)
    m = (-b.gather(-1, best).squeeze(-1)).clamp_min(0)
    d = (a.amax(-1) / 63).to(torch.float16).float()
    dmin = (m.amax(-1) / 63).to(torch.float16).float()
    dsafe = torch.where(d > 0, d, torch.ones_like(d)).unsqueeze(-1)
    msafe = torch.where(dmin > 0, dmin, torch.ones_like(dmin)).unsqueeze(-1)
    sc = torch.where(d.unsqueeze(-1) > 0, torch.clamp(torch.round(a / dsafe), 0, 63), torch.zeros_like(a))
    mn = torch.where(dmin.unsqueeze(-1) > 0, torch.clamp(torch.round(m / msafe), 0, 63), torch.zeros_like(m))
    eff = (d.unsqueeze(-1) * sc).unsqueeze(-1)                          # (nb, 8, 1)
    off = (dmin.unsqueeze(-1) * mn).unsqueeze(-1)
    eff_safe = torch.where(eff == 0, torch.ones_like(eff), eff)
    L = torch.where(eff == 0, torch.zeros_like(xs), torch.clamp(torch.round((xs + off) / eff_safe), 0, 15))
    q = L.to(torch.uint8).reshape(nb, 4, 2, 32)                         # run, low/high nibble, lane
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(nb, 128)
    sc, mn = sc.to(torch.uint8), mn.to(torch.uint8)
    scales = torch.cat((
        (sc[:, 0:4] & 0x3F) | ((sc[:, 4:8] >> 4) << 6),
        (mn[:, 0:4] & 0x3F) | ((mn[:, 4:8] >> 4) << 6),
        (sc[:, 4:8] & 0x0F) | ((mn[:, 4:8] & 0x0F) << 4)), dim=-1)
    return torch.cat((_fp16_bytes(d), _fp16_bytes(dmin), scales, qs), dim=-1)


def quantize(w, qtype) -> torch.Tensor:
    """(rows, cols) float (torch or numpy) -> (rows, row_bytes) uint8 raw GGUF blocks of `qtype`
    (Q8_0, Q6_K or Q4_K). cols must be a multiple of the block size (32 / 256); non-finite weights are
    rejected."""
    qtype = _qtype(qtype)
    x = torch.as_tensor(np.asarray(w) if not isinstance(w, torch.Tensor) else w).detach()
    if x.dim() != 2:
        raise ValueError(f"{qtype.name}: expected a 2-D weight (rows, cols), got shape {tuple(x.shape)}")
    rows, cols = x.shape
    nbytes = row_bytes(qtype, cols)                   # raises if cols is not a multiple of the block
    x = x.float()
    if not torch.isfinite(x).all():
        raise ValueError(f"{qtype.name}: weight holds non-finite values")
    if qtype == QT.Q8_0:
        from gguf.quants import quantize as gq
        return torch.from_numpy(np.ascontiguousarray(gq(x.cpu().numpy(), QT.Q8_0))).to(x.device).reshape(rows, nbytes)
    fn = _q6_k if qtype == QT.Q6_K else _q4_k
    blocks = x.reshape(-1, QK_K)
    out = torch.cat([fn(blocks[i:i + _CHUNK]) for i in range(0, blocks.shape[0], _CHUNK)]) if blocks.shape[0] \
        else torch.empty(0, nbytes // max(cols // QK_K, 1), dtype=torch.uint8)
    return out.reshape(rows, nbytes)


# -- quantize-draft ---------------------------------------------------------------------------------
DRAFT_TYPES = {"q8_0": "Q8_0", "q6_k": "Q6_K", "q4_k": "Q4_K", "f16": "F16", "bf16": "BF16", "f32": "F32"}


def read_drafter(path, n_target_layers: int | None = None):
    """(DFlashConfig, float32 state dict by z-lab name) of a z-lab directory or a Luce-layout GGUF drafter
    (quantized GGUF tensors are dequantized with the reference dequantizer)."""
    from pathlib import Path

    from ..gguf.reader import GGUFFile
    from ..models.drafter import DFlashConfig, DrafterError, _gguf_names, hf_name, load_safetensors, tensor_shapes
    from .formats import dequantize
    p = Path(path)
    if p.is_dir():
        for f in ("config.json", "model.safetensors"):
            if not (p / f).is_file():
                raise DrafterError(f"{p}: {f} not found (expected z-lab's DFlash drafter layout)")
        cfg = DFlashConfig.from_file(p / "config.json")
        sd = load_safetensors(p / "model.safetensors")
    elif p.is_file():
        gf = GGUFFile(p)
        cfg = DFlashConfig.from_gguf(gf, n_target_layers)
        sd = {}
        for g in _gguf_names(cfg):
            info = gf.tensor(g)
            raw = torch.from_numpy(np.ascontiguousarray(info.data))
            cols = info.shape[-1]
            sd[hf_name(g)] = dequantize(raw.reshape(-1, raw.shape[-1]), info.qtype, cols).reshape(info.shape)
    else:
        raise DrafterError(f"{path}: no such drafter (a directory with config.json + model.safetensors, or a GGUF)")
    shapes = tensor_shapes(cfg)
    for name, shape in shapes.items():
        if name not in sd:
            raise DrafterError(f"{path}: tensor {name} is missing")
        if tuple(sd[name].shape) != shape:
            raise DrafterError(f"{path}: tensor {name} has shape {tuple(sd[name].shape)}, expected {shape}")
    return cfg, {k: sd[k].float() for k in shapes}


def quantize_draft(src, dst, qtype: str, n_target_layers: int | None = None) -> dict:
    """Write the drafter `src` (z-lab dir or GGUF) as a Luce-layout GGUF drafter `dst` whose matrices are
    `qtype` (q8_0 / q6_k / q4_k / f16 / bf16 / f32; see models.drafter.save_gguf for the fallbacks).
    Returns a summary: bytes per GGML type in the output, total bytes, the BF16 size of the same drafter
    (matrices 2 B/weight, norms F32, as z-lab ships it) and the ratio."""
    from ..gguf.reader import GGUFFile
    from ..models.drafter import save_gguf
    name = DRAFT_TYPES.get(str(qtype).lower())
    if name is None:
        raise ValueError(f"--type must be one of {', '.join(DRAFT_TYPES)}, got {qtype!r}")
    cfg, sd = read_drafter(src, n_target_layers)
    save_gguf(cfg, sd, dst, name)
    gf = GGUFFile(dst)
    by_type: dict[str, int] = {}
    for t in gf.tensors.values():
        by_type[t.qtype.name] = by_type.get(t.qtype.name, 0) + t.n_bytes
    total = sum(by_type.values())
    bf16 = sum(v.numel() * (2 if v.dim() == 2 else 4) for v in sd.values())
    return {"type": name, "bytes_by_type": by_type, "bytes": total, "bf16_bytes": bf16, "ratio_vs_bf16": total / bf16}


def format_summary(s: dict, dst) -> str:
    lines = [f"wrote {dst}: {s['type']} drafter, {s['bytes'] / 2**20:.2f} MiB of tensors "
             f"({s['ratio_vs_bf16']:.3f} x BF16 = {s['bf16_bytes'] / 2**20:.2f} MiB)"]
    for t, n in sorted(s["bytes_by_type"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  {t:5s} {n / 2**20:10.2f} MiB")
    return "\n".join(lines)
