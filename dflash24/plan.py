"""The memory planner: every device buffer of an engine configuration, from metadata alone.

`plan(target, draft, ctx, ...)` reads only GGUF / config.json metadata (no tensor data, no GPU) and
returns a `Plan`: line items (name, bytes, note with the formula), their total, and whether they fit in
`gpu_mem_bytes`. The weight items follow the engine's loading rules exactly (quant/linear.py, models/):

  - 2-D weights of a type with a Triton kernel (quant/packed.PACKED_TYPES) and >= DENSE_BELOW elements are
    repacked: `packed_nbytes` (Q4_K/Q5_K widen the 6-bit scales: +4 B per 256 weights);
  - other 2-D weights (F32/F16/BF16, or below DENSE_BELOW elements) are dense in the activation dtype (bf16);
  - 1-D tensors (norms, biases, ssm_a, ssm_dt) and ssm_conv1d are fp32; a linear's bias is fp32 next to a
    packed weight and bf16 next to a dense one;
  - token_embd keeps its raw GGUF rows (device, or pinned host memory); a file without `output.weight`
    multiplies by token_embd through a second, repacked copy (tied LM head);
  - MTP layers (qwen35 `nextn_predict_layers`) are not loaded.

Caches are exact (the same shapes `new_cache` allocates); activations, CUDA graph pools, the CUDA context
and allocator headroom are estimates, and their notes say so. `max_context` binary-searches the largest
context that fits; `format_plan` renders the table; `fit_main` is `dflash24 fit`.
"""
from __future__ import annotations

import json
import math
import os
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from gguf import GGMLQuantizationType as QT

from .cache.kvquant import QUANT_TYPES, check_type
from .config import ConfigError, EngineConfig
from .gguf.reader import GGUFFile
from .kernels.deltanet import tree_states_needed
from .quant.formats import block_type, row_bytes
from .quant.linear import DENSE_BELOW
from .quant.packed import PACKED_TYPES, packed_nbytes

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

# CUDA context + cuBLAS workspace + the loaded kernel modules (Triton's, flash-linear-attention's): the device memory
# outside torch's allocator measured at the end of a 27B run on an H200 (bench_long_context.py, 2026-12-02: 0.749 GiB)
CUDA_CONTEXT_BYTES = 768 * MiB
HEADROOM_PCT = 3.0                   # allocator rounding (2 MiB segments) and fragmentation
MAX_SPEC_TOKENS = 64                 # qwen35 new_cache / TargetRunner max_step_tokens defaults
ACT_BYTES = 2                        # bf16 activations on CUDA

# KV cache element cost per type: (bytes, per elements)
KV_TYPES: dict[str, tuple[int, int]] = {
    "bf16": (2, 1), "f16": (2, 1), "f32": (4, 1),
    "q8_0": (34, 32), "q4_0": (18, 32), "tq3": (14, 32),
}
KV_ORDER = ("f32", "bf16", "f16", "q8_0", "q4_0", "tq3")


class PlanError(ConfigError):
    """A configuration the planner cannot evaluate (unknown type, missing drafter, ...)."""


# ------------------------------------------------------------------------------------------------
# shapes
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorShape:
    name: str
    qtype: QT
    shape: tuple[int, ...]            # PyTorch order: (out, in) for a weight

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    def file_bytes(self) -> int:
        rows = math.prod(self.shape[:-1]) if len(self.shape) > 1 else 1
        return rows * row_bytes(self.qtype, self.shape[-1])


@dataclass(frozen=True)
class ModelShape:
    """What the planner needs of a target: dimensions and the tensor table (names, GGML types, shapes)."""
    name: str
    arch: str
    n_layers: int
    dim: int
    ffn_dim: int
    vocab_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rope_dim: int
    context_length: int
    n_attn_layers: int                # layers with a KV cache
    tensors: tuple[TensorShape, ...]
    gated_q: bool = False             # qwen35: attn_q produces q and a gate per head
    n_delta_layers: int = 0           # Gated DeltaNet layers (qwen35)
    ssm_k_heads: int = 0
    ssm_k_dim: int = 0
    ssm_v_heads: int = 0
    ssm_v_dim: int = 0
    conv_kernel: int = 0

    @property
    def conv_dim(self) -> int:
        return 2 * self.ssm_k_heads * self.ssm_k_dim + self.ssm_v_heads * self.ssm_v_dim

    @classmethod
    def from_gguf(cls, gf: GGUFFile) -> "ModelShape":
        """From the metadata and tensor infos of a target GGUF (no tensor data is read)."""
        if gf.arch == "qwen35":
            from .models.qwen35 import Qwen35Config
            c = Qwen35Config.from_gguf(gf)
            skip = tuple(f"blk.{i}." for i in range(c.n_layers, c.n_layers + c.n_nextn))
            tensors = tuple(TensorShape(t.name, t.qtype, tuple(t.shape)) for t in gf.tensors.values()
                            if not (skip and t.name.startswith(skip)))
            return cls._qwen35(c, tensors, os.path.basename(gf.path))
        from .models.dense import ARCHS, DenseConfig
        if gf.arch not in ARCHS:
            raise PlanError(f"{gf.path}: architecture {gf.arch!r} is not supported (qwen35, {', '.join(ARCHS)})")
        c = DenseConfig.from_gguf(gf)
        tensors = tuple(TensorShape(t.name, t.qtype, tuple(t.shape)) for t in gf.tensors.values())
        return cls(name=os.path.basename(gf.path), arch=c.arch, n_layers=c.n_layers, dim=c.dim, ffn_dim=c.ffn_dim,
                   vocab_size=c.vocab_size, n_heads=c.n_heads, n_kv_heads=c.n_kv_heads, head_dim=c.head_dim,
                   rope_dim=c.rope_dim, context_length=c.context_length, n_attn_layers=c.n_layers, tensors=tensors)

    @classmethod
    def from_qwen35(cls, cfg, layout: str = "q4_k_m", name: str | None = None) -> "ModelShape":
        """A qwen35 shape without a file: the tensor table of `cfg` (e.g. `synth.QWEN35_27B`) with the GGML
        types llama.cpp's Q4_K_M picks (`synth.q4_k_m_types`)."""
        from .synth import q4_k_m_types, qwen35_tensor_shapes
        if layout != "q4_k_m":
            raise PlanError(f"layout {layout!r}: only q4_k_m is known")
        shapes = qwen35_tensor_shapes(cfg)
        types = q4_k_m_types(shapes)
        tensors = tuple(TensorShape(n, types[n], tuple(s)) for n, s in shapes)
        return cls._qwen35(cfg, tensors, name or f"qwen35 {cfg.n_layers}L/{cfg.dim} ({layout})")

    @classmethod
    def _qwen35(cls, c, tensors, name) -> "ModelShape":
        n_attn = len(c.attention_layers)
        return cls(name=name, arch="qwen35", n_layers=c.n_layers, dim=c.dim, ffn_dim=c.ffn_dim,
                   vocab_size=c.vocab_size, n_heads=c.n_heads, n_kv_heads=c.n_kv_heads, head_dim=c.head_dim,
                   rope_dim=c.rope_dim, context_length=c.context_length, n_attn_layers=n_attn, tensors=tensors,
                   gated_q=True, n_delta_layers=c.n_layers - n_attn, ssm_k_heads=c.ssm_k_heads,
                   ssm_k_dim=c.ssm_k_dim, ssm_v_heads=c.ssm_v_heads, ssm_v_dim=c.ssm_v_dim,
                   conv_kernel=c.conv_kernel)


@dataclass(frozen=True)
class DraftShape:
    """A DFlash drafter: its config and how its weights are held. fmt 'safetensors' (z-lab directory: every
    matrix in the activation dtype, vectors fp32) or 'gguf' (`tensors` with their GGML types)."""
    cfg: object                       # models.drafter.DFlashConfig
    fmt: str
    source: str
    tensors: tuple[TensorShape, ...] = ()

    @classmethod
    def from_path(cls, path, n_target_layers: int | None = None) -> "DraftShape":
        from .models.drafter import DFlashConfig, DrafterError
        p = Path(path)
        if p.is_dir():
            cj = p / "config.json"
            if not cj.is_file():
                raise DrafterError(f"{p}: config.json not found (expected z-lab's DFlash drafter layout)")
            return cls(DFlashConfig.from_file(cj), "safetensors", str(p))
        if p.is_file():
            gf = GGUFFile(p)
            cfg = DFlashConfig.from_gguf(gf, n_target_layers)
            return cls(cfg, "gguf", str(p), tuple(TensorShape(t.name, t.qtype, tuple(t.shape))
                                                  for t in gf.tensors.values()))
        raise DrafterError(f"{path}: no such drafter (a directory with config.json + model.safetensors, or a GGUF)")

    @classmethod
    def from_config(cls, cfg, qtype: str = "BF16", source: str | None = None) -> "DraftShape":
        """A drafter without a file: BF16 = z-lab safetensors; F16/Q8_0/Q4_0/Q4_K/... = a GGUF whose
        matrices have that type (norms F32, as Luce's converter writes them)."""
        from .models.drafter import _gguf_names, tensor_shapes, hf_name
        q = qtype.upper()
        if q == "BF16":
            return cls(cfg, "safetensors", source or "bf16 safetensors")
        try:
            qt = QT[q]
            block_type(qt)
        except (KeyError, ValueError):
            raise PlanError(f"drafter type {qtype!r} is not supported") from None
        shapes = tensor_shapes(cfg)
        tensors = []
        for g in _gguf_names(cfg):
            s = shapes[hf_name(g)]
            t = QT.F32 if len(s) == 1 else qt
            if len(s) == 2 and s[1] % block_type(t).block:     # as save_gguf: K-quant -> Q8_0 -> F16
                t = QT.Q8_0 if s[1] % 32 == 0 else QT.F16
            tensors.append(TensorShape(g, t, tuple(s)))
        return cls(cfg, "gguf", source or f"{q} GGUF", tuple(tensors))

    def n_params(self) -> int:
        from .models.drafter import tensor_shapes
        return sum(math.prod(s) for s in tensor_shapes(self.cfg).values())


def zlab_27b_drafter_config():
    """The z-lab Qwen3.6-27B DFlash drafter (FACTS.md section 3): 5 layers, hidden 5120, FFN 17408, block 16,
    target layers [1,16,31,46,61], layers 0-3 sliding 2048, 32 / 8 heads of 128 (1.73 B parameters)."""
    from .models.drafter import FULL, SLIDING, DFlashConfig
    types = (SLIDING,) * 4 + (FULL,)
    return DFlashConfig(n_layers=5, dim=5120, ffn_dim=17408, n_heads=32, n_kv_heads=8, head_dim=128,
                        norm_eps=1e-6, rope_theta=1e7, max_positions=262144, vocab_size=248320,
                        target_layer_ids=(1, 16, 31, 46, 61), block_size=16, mask_token_id=248070,
                        layer_types=types, sliding_window=2048, causal=tuple(t == SLIDING for t in types),
                        n_target_layers=64)


TARGET_PRESETS = ("qwen35-27b", "qwen35-9b", "qwen35-tiny")
DRAFT_PRESETS = {"dflash-27b": zlab_27b_drafter_config}


# ------------------------------------------------------------------------------------------------
# the plan
# ------------------------------------------------------------------------------------------------
@dataclass
class Item:
    name: str
    bytes: int
    note: str
    group: str                        # weights | cache | scratch | activations | overhead


@dataclass
class Plan:
    items: list[Item]
    gpu_mem_bytes: int
    ctx: int
    settings: dict
    load_peak_bytes: int = 0          # weights + the largest load-time transient (before any cache exists)
    host_bytes: int = 0               # pinned host memory (token_embd on host)
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(i.bytes for i in self.items)

    @property
    def free(self) -> int:
        return self.gpu_mem_bytes - self.total

    @property
    def fits(self) -> bool:
        return self.free >= 0 and self.load_peak_bytes <= self.gpu_mem_bytes

    def item(self, name: str) -> Item:
        for i in self.items:
            if i.name == name:
                return i
        raise KeyError(name)

    def group_bytes(self, group: str) -> int:
        return sum(i.bytes for i in self.items if i.group == group)

    def biggest(self, n: int = 3) -> list[Item]:
        return sorted(self.items, key=lambda i: -i.bytes)[:n]

    def as_dict(self) -> dict:
        return {"ctx": self.ctx, "settings": self.settings, "gpu_mem_bytes": self.gpu_mem_bytes,
                "total_bytes": self.total, "free_bytes": self.free, "fits": self.fits,
                "load_peak_bytes": self.load_peak_bytes, "host_bytes": self.host_bytes,
                "items": [{"name": i.name, "bytes": i.bytes, "gib": round(i.bytes / GiB, 4), "group": i.group,
                           "note": i.note} for i in self.items],
                "notes": self.notes}


def kv_nbytes(n_layers: int, capacity: int, n_kv_heads: int, head_dim: int, type_k: str, type_v: str) -> int:
    """Bytes of K + V for n_layers x capacity rows of n_kv_heads x head_dim values (blocks of 32 for the
    quantized types, one block set per row of a head)."""
    out = 0
    for t in (type_k, type_v):
        b, per = _kv_cost(t)
        if t in QUANT_TYPES:
            try:
                check_type(t, head_dim)                    # e.g. tq3 needs head dims of 128 values
            except ConfigError as e:
                raise PlanError(str(e)) from None
        out += n_layers * capacity * n_kv_heads * (-(-head_dim // per) * b if per > 1 else head_dim * b)
    return out


def _kv_cost(t: str) -> tuple[int, int]:
    try:
        return KV_TYPES[t]
    except KeyError:
        raise PlanError(f"KV cache type {t!r} is unknown (known: {', '.join(KV_TYPES)})") from None


def kv_supported(type_k: str, type_v: str) -> bool:
    """Whether this build's EngineConfig accepts the pair (a quantized cache may be planned before it exists)."""
    try:
        EngineConfig(cache_type_k=type_k, cache_type_v=type_v, device="cuda").kv_types()
        return True
    except ConfigError:
        return False


class _Weights:
    """Accumulates device bytes per (role, kind) following QuantLinear / Loader rules."""

    def __init__(self, who: str, packed: bool, act_bytes: int):
        self.who, self.packed, self.act = who, packed, act_bytes
        self.groups: dict[str, list] = {}          # label -> [bytes, count, formula]
        self.max_transient = 0

    def add(self, label: str, nbytes: int, formula: str):
        g = self.groups.setdefault(label, [0, 0, formula])
        g[0] += nbytes
        g[1] += 1

    def linear(self, t: TensorShape, bias: TensorShape | None = None):
        try:
            block_type(t.qtype)
        except ValueError as e:
            raise PlanError(f"{self.who} tensor {t.name}: {e}") from None
        if len(t.shape) != 2:
            raise PlanError(f"{self.who} tensor {t.name}: a weight matrix needs 2 dimensions, got {t.shape}")
        n, k = t.shape
        raw = t.file_bytes()
        if self.packed and t.qtype in PACKED_TYPES and n * k >= DENSE_BELOW:
            extra = "(row_bytes + K/256 x 4)" if t.qtype in (QT.Q4_K, QT.Q5_K) else "row_bytes"
            self.add(f"{t.qtype.name} packed", packed_nbytes(t.qtype, n, k),
                     f"packed_nbytes = rows x {extra}")
            self.max_transient = max(self.max_transient, raw)               # raw rows on device while packing
            if bias is not None:
                self.add("fp32 vectors", 4 * bias.elements, "elements x 4")
        else:
            why = "float weight" if t.qtype in (QT.F32, QT.F16, QT.BF16) else f"< {DENSE_BELOW} elements" \
                if t.qtype in PACKED_TYPES else "no kernel for the type"
            self.add(f"dense bf16 ({t.qtype.name})", self.act * n * k, f"elements x {self.act} ({why})")
            self.max_transient = max(self.max_transient, raw + 4 * n * k)   # raw + fp32 dequant
            if bias is not None:
                self.add(f"dense bf16 ({t.qtype.name})", self.act * bias.elements, "bias in the activation dtype")

    def vector(self, t: TensorShape):
        try:
            block_type(t.qtype)
        except ValueError as e:
            raise PlanError(f"{self.who} tensor {t.name}: {e}") from None
        self.add("fp32 vectors", 4 * t.elements, "norms, biases, ssm_a/dt, conv: elements x 4")

    def items(self, group: str = "weights") -> list[Item]:
        out = []
        for label, (b, count, formula) in sorted(self.groups.items(), key=lambda kv: -kv[1][0]):
            out.append(Item(f"{self.who} {label}", b, f"{count} tensors; {formula}", group))
        return out


def target_weight_items(shape: ModelShape, embed_on_host: bool, packed: bool = True,
                        act_bytes: int = ACT_BYTES) -> tuple[list[Item], int, int]:
    """(items, largest load transient, host bytes) for the target's tensors as the engine holds them."""
    w = _Weights("target", packed, act_bytes)
    by_name = {t.name: t for t in shape.tensors}
    emb = by_name.get("token_embd.weight")
    if emb is None:
        raise PlanError(f"{shape.name}: tensor token_embd.weight is missing")
    items, host = [], 0
    for t in shape.tensors:
        if t.name == "token_embd.weight":
            continue
        if t.name.endswith(".bias") and t.name[:-5] + ".weight" in by_name \
                and len(by_name[t.name[:-5] + ".weight"].shape) == 2:
            continue                                         # counted with its linear
        if len(t.shape) == 1 or t.name.endswith("ssm_conv1d.weight"):
            w.vector(t)
        else:
            w.linear(t, by_name.get(t.name[:-7] + ".bias") if t.name.endswith(".weight") else None)
    if "output.weight" not in by_name:
        w.linear(replace(emb, name="output.weight (tied: a repacked copy of token_embd)"))
    items = w.items()
    raw = emb.file_bytes()
    try:
        block_type(emb.qtype)
    except ValueError as e:
        raise PlanError(f"target tensor token_embd.weight: {e}") from None
    if embed_on_host:
        host = raw
        items.append(Item(f"target token_embd ({emb.qtype.name}, pinned host)", 0,
                          f"{raw / MiB:.0f} MiB of raw rows stay in pinned host memory; rows gathered over PCIe",
                          "weights"))
    else:
        items.append(Item(f"target token_embd ({emb.qtype.name})", raw,
                          f"raw GGUF rows {emb.shape[0]} x row_bytes (only gathered, never multiplied)", "weights"))
    return items, w.max_transient, host


def draft_weight_items(d: DraftShape, act_bytes: int = ACT_BYTES, packed: bool = True) -> tuple[list[Item], int]:
    if d.fmt == "safetensors":
        from .models.drafter import tensor_shapes
        mats = vecs = 0
        biggest = 0
        for s in tensor_shapes(d.cfg).values():
            if len(s) == 2:
                mats += math.prod(s)
                biggest = max(biggest, math.prod(s))
            else:
                vecs += math.prod(s)
        return [Item("draft weights (bf16)", act_bytes * mats,
                     f"{d.source}: {mats / 1e9:.3f} B matrix elements x {act_bytes}", "weights"),
                Item("draft fp32 vectors", 4 * vecs, "norms: elements x 4", "weights")], 4 * biggest
    w = _Weights("draft", packed, act_bytes)
    for t in d.tensors:
        if len(t.shape) == 1:
            w.vector(t)
        else:
            w.linear(t)
    return w.items(), w.max_transient


# ---- activation estimates (bytes; a = activation dtype bytes) ---------------------------------------
ATTENTION_MODES = ("math", "fused")


def prefill_row_bytes(dim: int, ffn_dim: int, a: int = ACT_BYTES) -> int:
    """Activation bytes the plan holds for each row of a prefill chunk, at least: `_layer_peak` is the residual
    stream's share plus the largest of the MLP's, attention's and DeltaNet's shares, and this is the residual
    stream's plus the MLP's. A chunk of fewer rows than planned leaves (planned - actual) times this unused
    whichever share is the largest; the large-M matmul's scratch takes it (`quant.kernels.scratch_plan`)."""
    return dim * (2 * a + 2 * 4) + ffn_dim * (3 * a + 4)


def _layer_peak(shape: ModelShape, T: int, S: int, a: int, attention: str = "fused",
                quant_sides: int = 0) -> tuple[int, str]:
    """Peak transient bytes inside one decoder layer for T tokens reading S cache rows.

    attention 'fused': the engine's Triton attention over the cache (no mask, no score matrix, no K/V
    expansion; split-KV partials are small); 'math': SDPA with a bool mask and enable_gqa, which CUDA runs on
    the math backend (mask [T, S], scores [H, T, S] in fp32 + softmax, K/V expanded to every query head) --
    the path without Triton, or with DFLASH24_TRITON_ATTENTION=0. quant_sides: how many of K / V are quantized
    (a fused prefill chunk then decodes them a segment of rows at a time into a dense scratch, and keeps fp32
    partials of the chunk's output: kernels/attention.py)."""
    res = T * shape.dim * (2 * a + 2 * 4)                                # x, h + fp32 norm temporaries
    ffn = T * shape.ffn_dim * (3 * a + 4)                                # gate, up, silu*up + fp32 kernel out
    parts = {"ffn": ffn}
    if shape.n_attn_layers:
        qd = shape.n_heads * shape.head_dim * (2 if shape.gated_q else 1)
        kvd = shape.n_kv_heads * shape.head_dim
        attn = T * (qd + 2 * kvd) * (4 + a) + T * shape.n_heads * shape.head_dim * (4 + 2 * a)
        if attention == "math":
            attn += T * S                                                # bool mask
            attn += 2 * 4 * shape.n_heads * T * S                        # scores + softmax fp32
        if attention == "math" and shape.n_heads != shape.n_kv_heads:
            attn += 2 * shape.n_heads * S * shape.head_dim * a           # GQA: K/V expanded to every q head
        if attention == "fused" and quant_sides:
            from .kernels.attention import segment_scratch_bytes
            attn += segment_scratch_bytes(T, S, shape.n_heads, shape.n_kv_heads, shape.head_dim, a, quant_sides)
        parts["attention"] = attn
    if shape.n_delta_layers:
        C, V = shape.conv_dim, shape.ssm_v_heads * shape.ssm_v_dim
        delta = T * (C * (4 + a) + 2 * 4 * C + 4 * 4 * V)
        delta += -(-T // 64) * shape.ssm_v_heads * shape.ssm_k_dim * shape.ssm_v_dim * 4   # chunk states
        parts["deltanet"] = delta
    worst = max(parts, key=parts.get)
    return res + parts[worst], worst


def _draft_as_shape(cfg) -> ModelShape:
    return ModelShape(name="draft", arch="dflash", n_layers=cfg.n_layers, dim=cfg.dim, ffn_dim=cfg.ffn_dim,
                      vocab_size=cfg.vocab_size, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads,
                      head_dim=cfg.head_dim, rope_dim=cfg.head_dim, context_length=cfg.max_positions,
                      n_attn_layers=cfg.n_layers, tensors=())


def _buckets(capacity: int, smallest: int = 256) -> int:
    """Number of distinct kv_bucket values (runner.kv_bucket) up to `capacity`."""
    n, b = 1, smallest
    while b < capacity:
        b *= 2
        n += 1
    return n


def _fmt(n: int) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def _coerce_target(target) -> ModelShape:
    if isinstance(target, ModelShape):
        return target
    if isinstance(target, GGUFFile):
        return ModelShape.from_gguf(target)
    if isinstance(target, (str, os.PathLike)):
        return ModelShape.from_gguf(GGUFFile(target))
    raise PlanError(f"target must be a GGUF file, a path or a ModelShape, got {type(target).__name__}")


def _coerce_draft(draft, shape: ModelShape) -> DraftShape | None:
    if draft is None or isinstance(draft, DraftShape):
        return draft
    if isinstance(draft, (str, os.PathLike)):
        return DraftShape.from_path(draft, shape.n_layers)
    raise PlanError(f"draft must be a path or a DraftShape, got {type(draft).__name__}")


# Prompt tokens per prefill forward on CUDA when --prefill-chunk is not given: the largest of these whose plan
# fits. The large-M matmul dequantizes every weight once per chunk, so bigger chunks amortize it (27B shape on
# an H200, 4,096-token prompt: 2,163 / 3,848 / 6,882 / 8,333 tok/s at 512 / 1024 / 2048 / 4096; BENCHMARKS.md).
PREFILL_CHUNKS = (4096, 2048, 1024, 512)
CPU_PREFILL_CHUNK = 512


def plan(target, draft=None, ctx: int = 4096, cache_type_k: str = "bf16", cache_type_v: str = "bf16",
         gpu_mem_bytes: int = 24 * GiB, ddtree_budget: int = 22, spec: str | None = None,
         embed_on_host: bool = False, prefill_chunk: int | None = None, cuda_graphs: bool = True,
         context_bytes: int = CUDA_CONTEXT_BYTES, headroom_pct: float = HEADROOM_PCT,
         max_spec_tokens: int = MAX_SPEC_TOKENS, act_bytes: int = ACT_BYTES, packed: bool = True,
         attention: str = "fused", prefix_cache_mb: float = 0) -> Plan:
    """The device memory of an engine on CUDA with this configuration (see the module docstring).

    target: GGUFFile, path or ModelShape; draft: None, a drafter path (z-lab dir or GGUF) or a DraftShape.
    spec None = the engine's default (tree with a drafter, else ar). prefill_chunk None = auto: the largest of
    PREFILL_CHUNKS (capped at ctx) whose plan fits, else the smallest. context_bytes: the CUDA context (0 when
    gpu_mem_bytes is the free memory measured after the context exists)."""
    kw = dict(ctx=ctx, cache_type_k=cache_type_k, cache_type_v=cache_type_v, gpu_mem_bytes=gpu_mem_bytes,
              ddtree_budget=ddtree_budget, spec=spec, embed_on_host=embed_on_host, cuda_graphs=cuda_graphs,
              context_bytes=context_bytes, headroom_pct=headroom_pct, max_spec_tokens=max_spec_tokens,
              act_bytes=act_bytes, packed=packed, attention=attention, prefix_cache_mb=prefix_cache_mb)
    if prefill_chunk is not None:
        return _plan(target, draft, prefill_chunk=prefill_chunk, **kw)
    shape = _coerce_target(target)
    d = _coerce_draft(draft, shape)
    for c in sorted({min(c, ctx) for c in PREFILL_CHUNKS}, reverse=True):     # ends with the smallest
        p = _plan(shape, d, prefill_chunk=c, **kw)
        if p.fits:
            break
    p.settings["prefill_chunk_auto"] = True
    return p


def _plan(target, draft, ctx: int, cache_type_k: str, cache_type_v: str, gpu_mem_bytes: int, ddtree_budget: int,
          spec: str | None, embed_on_host: bool, prefill_chunk: int, cuda_graphs: bool, context_bytes: int,
          headroom_pct: float, max_spec_tokens: int, act_bytes: int, packed: bool, attention: str,
          prefix_cache_mb: float) -> Plan:
    shape = _coerce_target(target)
    d = _coerce_draft(draft, shape)
    spec = spec or ("tree" if d is not None else "ar")            # the engine's default
    if spec not in ("ar", "chain", "tree"):
        raise PlanError(f"spec must be ar, chain or tree, got {spec!r}")
    if spec != "ar" and d is None:
        raise PlanError(f"--spec {spec} needs a DFlash drafter (--draft)")
    if ctx < 16:
        raise PlanError(f"ctx must be at least 16, got {ctx}")
    if attention not in ATTENTION_MODES:
        raise PlanError(f"attention must be one of {', '.join(ATTENTION_MODES)}, got {attention!r}")
    if prefill_chunk < 1 or ddtree_budget < 1:
        raise PlanError("prefill_chunk and ddtree_budget must be positive")
    a = act_bytes
    items: list[Item] = []
    notes: list[str] = []

    # ---- weights
    w_items, transient, host = target_weight_items(shape, embed_on_host, packed, a)
    items += w_items
    if d is not None:
        if d.cfg.dim != shape.dim:
            raise PlanError(f"drafter hidden size {d.cfg.dim} does not match the target's {shape.dim}")
        dw, dt = draft_weight_items(d, a, packed)
        items += dw
        transient = max(transient, dt)
    weights = sum(i.bytes for i in items)
    rope = 2 * ctx * (shape.rope_dim // 2) * 4
    rope_note = f"target cos+sin: 2 x ctx x {shape.rope_dim // 2} x 4"
    if d is not None:
        dpos = ctx + 64
        rope += 2 * dpos * (d.cfg.head_dim // 2) * 4
        rope_note += f"; draft: 2 x (ctx+64) x {d.cfg.head_dim // 2} x 4"
    items.append(Item("rope tables (fp32)", rope, rope_note, "weights"))

    # ---- caches
    supported = kv_supported(cache_type_k, cache_type_v)
    planned = "" if supported else "; planned, not yet supported by the engine"
    per_tok = kv_nbytes(shape.n_attn_layers, 1, shape.n_kv_heads, shape.head_dim, cache_type_k, cache_type_v)
    items.append(Item(f"KV cache ({cache_type_k}/{cache_type_v})",
                      kv_nbytes(shape.n_attn_layers, ctx, shape.n_kv_heads, shape.head_dim, cache_type_k, cache_type_v),
                      f"{shape.n_attn_layers} attention layers x ctx {ctx} x {shape.n_kv_heads} heads x "
                      f"{shape.head_dim} x (K {_cost_str(cache_type_k)} + V {_cost_str(cache_type_v)}) = "
                      f"{_fmt(per_tok)}/token{planned}", "cache"))
    if d is not None:
        from .models.drafter import ring_rows
        c = d.cfg
        cap = ctx + c.block_size
        dper = kv_nbytes(1, 1, c.n_kv_heads, c.head_dim, cache_type_k, cache_type_v)
        ring = ring_rows(c.sliding_window, cap)
        n_ring = sum(c.window(i) is not None for i in range(c.n_layers)) if ring else 0
        rows = (c.n_layers - n_ring) * cap + n_ring * ring
        note = f"({c.n_layers - n_ring} full layers x (ctx + block {c.block_size})"
        if n_ring:
            note += f" + {n_ring} sliding layers x a ring of {ring}, window {c.sliding_window}"
        items.append(Item("draft KV cache", rows * dper,
                          f"{note}) rows x {c.n_kv_heads} x {c.head_dim} x K+V, {_fmt(dper)} a row{planned}",
                          "cache"))
    if shape.n_delta_layers:
        L, Hv, Dk, Dv, C = shape.n_delta_layers, shape.ssm_v_heads, shape.ssm_k_dim, shape.ssm_v_dim, shape.conv_dim
        items.append(Item("DeltaNet state (fp32)", 4 * L * Hv * Dk * Dv,
                          f"{L} layers x {Hv} v-heads x {Dk} x {Dv} x 4", "cache"))
        items.append(Item("DeltaNet conv window (fp32)", 4 * L * (shape.conv_kernel - 1) * C,
                          f"{L} layers x (kernel-1 = {shape.conv_kernel - 1}) x {C} x 4", "cache"))
        per_token = C + shape.ssm_k_heads * Dk + Hv * Dv + 2 * Hv
        nodes = ddtree_budget + 1 if spec == "tree" and tree_states_needed(ddtree_budget + 1) else 0
        scratch = 4 * (L * max_spec_tokens * per_token + nodes * Hv * Dk * Dv)
        note = (f"recorded commit inputs: {L} layers x {max_spec_tokens} step tokens x (raw {C} + k "
                f"{shape.ssm_k_heads * Dk} + v {Hv * Dv} + g,beta {2 * Hv}) x 4")
        if nodes:
            note += f" + tree node states {nodes} x {Hv} x {Dk} x {Dv} x 4"
        items.append(Item("speculative scratch (fp32)", scratch, note, "scratch"))
        snap = 4 * L * (Hv * Dk * Dv + (shape.conv_kernel - 1) * C)
        slots = int(prefix_cache_mb * 2**20) // snap
        if slots:
            items.append(Item("prefix-cache snapshots (fp32)", slots * snap,
                              f"{slots} DeltaNet state + conv snapshots of {_fmt(snap)} "
                              f"(--prefix-cache-mb {prefix_cache_mb:g})", "cache"))

    # ---- activations
    V = shape.vocab_size
    F = len(d.cfg.target_layer_ids) * shape.dim if d is not None else 0
    T_pre = min(prefill_chunk, ctx)
    quant_sides = sum(t in QUANT_TYPES for t in (cache_type_k, cache_type_v))
    lp, worst = _layer_peak(shape, T_pre, ctx, a, attention, quant_sides)
    prefill = lp + 2 * V * 4 + T_pre * shape.dim * a * 2
    phase = f"prefill chunk {T_pre} at {ctx} rows: layer peak {_fmt(lp)} ({worst}, {attention} attention)"
    if d is not None:                     # the drafter reads each chunk's features as the chunk finishes
        feats = T_pre * F * a
        c = d.cfg
        add_ctx = T_pre * (F * a + c.dim * (4 + a) + 2 * 4 * c.dim + c.dim * a + 2 * c.n_kv_heads * c.head_dim * (4 + a) * 2)
        phase += (f" + chunk features {T_pre} x {F} x {a} and the drafter's context update of one chunk "
                  f"{_fmt(add_ctx)}")
        prefill = max(prefill + feats, feats + add_ctx)
    items.append(Item("activations: prefill (eager)", prefill, f"estimate: {phase}", "activations"))

    T_ver = {"ar": 1, "chain": d.cfg.block_size if d else 1, "tree": ddtree_budget + 1}[spec]
    nb = _buckets(ctx)
    step_peak = 0
    retained = 0
    for T in sorted({1, T_ver}):
        lpT, _ = _layer_peak(shape, T, ctx, a, attention)
        step_peak = max(step_peak, lpT + T * V * (4 + 4) + T * F * a)      # fp32 logits + fp32 probs
        retained += nb * T * (V * 4 + F * a)
    graph_note = (f"estimate: largest captured step (T = {T_ver} tokens at {ctx} rows: layer peak + logits T x {V} x "
                  f"(fp32 + fp32)) + outputs kept by {nb} kv-row buckets x "
                  f"{'decode + verify' if T_ver > 1 else 'decode'} graphs")
    if not cuda_graphs:
        graph_note = "estimate: steps run eagerly (no CUDA graphs): largest step"
        retained = 0
    items.append(Item("activations: target steps (CUDA graph pool)", step_peak + retained, graph_note,
                      "activations"))
    if d is not None and spec != "ar":
        c = d.cfg
        ds = _draft_as_shape(c)
        dl, _ = _layer_peak(ds, c.block_size, ctx + c.block_size, a, attention)
        masks = c.block_size * (ctx + c.block_size) if attention == "math" else 0     # SDPA's bool masks
        draft_step = dl + c.block_size * c.dim * (a + 4) + (c.block_size - 1) * V * (4 + a) + masks
        items.append(Item("activations: draft step (CUDA graph pool)", draft_step,
                          f"estimate: draft layer peak (block {c.block_size} at ctx+block rows) + block embedding + "
                          f"logits {c.block_size - 1} x {V} (fp32 + bf16)" + (", masks" if masks else ""), "activations"))

    from .quant import kernels as quant_kernels
    if quant_kernels.BATCH_INVARIANT and attention == "fused" and shape.n_attn_layers:
        from .kernels.attention import MAX_SPLITS
        T_inv = min(quant_kernels.SMALL_M, max(T_ver, prefill_chunk))
        parts = MAX_SPLITS * T_inv * shape.n_heads * (shape.head_dim + 2) * 4
        items.append(Item("activations: attention split partials", parts,
                          f"DFLASH24_BATCH_INVARIANT=1: every step <= {quant_kernels.SMALL_M} tokens merges up to {MAX_SPLITS} "
                          f"fixed-size splits: {MAX_SPLITS} x {T_inv} tokens x {shape.n_heads} heads x "
                          f"(head_dim + 2) x 4", "activations"))

    # ---- overhead
    items.append(Item("CUDA context", context_bytes,
                      "typical constant: driver context, cuBLAS workspace, kernel modules" if context_bytes else
                      "already excluded: gpu_mem is the free memory measured after the context exists", "overhead"))
    dev = sum(i.bytes for i in items if i.group != "overhead")
    items.append(Item(f"allocator headroom ({headroom_pct:g}%)", int(dev * headroom_pct / 100),
                      f"{headroom_pct:g}% of the device items above: 2 MiB segment rounding + fragmentation "
                      "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lowers it)", "overhead"))

    if not supported:
        notes.append(f"KV type {cache_type_k}/{cache_type_v} is planned, not yet supported by the engine "
                     "(this build runs bf16, f16, f32 with equal K and V types)")
    if cache_type_k in ("q4_0", "tq3") and any(t.name.endswith("attn_k.bias") for t in shape.tensors):
        notes.append(f"K cache {cache_type_k}: this model adds a k_proj bias to its keys (Qwen2 / Qwen2.5); "
                     "large bias channels set the quantization blocks' scales and low-bit K loses the keys' content "
                     "(Qwen2.5-Coder-1.5B, 2,048 tokens: top-1 agreement 0.14 with q4_0 K, 0.02 with tq3, 0.99 with "
                     "q8_0): prefer --cache-type-k q8_0 (the engine measures each layer's loss on the first prompt "
                     "and warns)")
    if embed_on_host:
        notes.append(f"token_embd on host: {_fmt(host)} of pinned host memory (--embed-on-host)")
    if attention == "math" and shape.n_attn_layers:
        notes.append("attention activations assume SDPA's math backend (the path without Triton: fp32 scores "
                     "[heads, T, rows] and K/V expanded per query head); the default, fused, plans the engine's "
                     "Triton attention kernel")
    if not packed:
        notes.append("Triton unavailable: every weight is planned dense in bf16")
    load_peak = weights + transient + context_bytes
    settings = {"target": shape.name, "arch": shape.arch, "draft": d.source if d else None,
                "draft_format": d.fmt if d else None, "spec": spec, "ctx": ctx, "cache_type_k": cache_type_k,
                "cache_type_v": cache_type_v, "ddtree_budget": ddtree_budget, "prefill_chunk": prefill_chunk,
                "prefill_chunk_auto": False, "embed_on_host": embed_on_host, "cuda_graphs": cuda_graphs,
                "kv_supported": supported, "attention": attention}
    return Plan(items, int(gpu_mem_bytes), ctx, settings, load_peak, host, notes)


def _cost_str(t: str) -> str:
    b, per = _kv_cost(t)
    return f"{b} B" if per == 1 else f"{b} B/{per}"


def max_context(target, draft=None, cache_type_k: str = "bf16", cache_type_v: str | None = None,
                step: int = 256, upper: int | None = None, **kw) -> int:
    """The largest ctx (a multiple of `step`, at most `upper`, default the model's native context) whose plan
    fits; 0 when not even `step` tokens fit. kw: the other `plan` arguments."""
    shape = _coerce_target(target)
    d = _coerce_draft(draft, shape)
    cache_type_v = cache_type_v or cache_type_k
    upper = upper or shape.context_length
    hi = upper // step

    def ok(n: int) -> bool:
        return plan(shape, d, ctx=n * step, cache_type_k=cache_type_k, cache_type_v=cache_type_v, **kw).fits

    if hi < 1 or not ok(1):
        return 0
    lo = 1                                   # invariant: ok(lo); every item grows with ctx, so fits is monotone
    if ok(hi):
        return hi * step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo * step


def max_context_table(target, draft=None, types=KV_ORDER, **kw) -> dict[str, int | None]:
    """The largest context per KV type (K = V); None for a type this model cannot use (`kv_type_error`)."""
    shape = _coerce_target(target)
    d = _coerce_draft(draft, shape)
    kw.pop("ctx", None)
    kw.pop("cache_type_k", None)
    kw.pop("cache_type_v", None)
    return {t: None if kv_type_error(shape, d, t) else max_context(shape, d, t, t, **kw) for t in types}


def kv_type_error(target, draft, t: str) -> str | None:
    """Why KV type t cannot hold this target's (or drafter's) rows, or None (e.g. tq3 needs head dims of 128)."""
    shape = _coerce_target(target)
    d = _coerce_draft(draft, shape)
    if t not in QUANT_TYPES:
        return None
    for head_dim in (shape.head_dim, *((d.cfg.head_dim,) if d is not None else ())):
        try:
            check_type(t, head_dim)
        except ConfigError as e:
            return str(e)
    return None


def format_plan(p: Plan) -> str:
    """The plan as an aligned table (item, GiB, note) and a verdict line."""
    s = p.settings
    head = (f"memory plan: {s['target']} ({s['arch']}), ctx {p.ctx}, KV {s['cache_type_k']}/{s['cache_type_v']}, "
            f"spec {s['spec']}" + (f", draft {s['draft']} ({s['draft_format']})" if s["draft"] else "")
            + f", prefill chunk {s['prefill_chunk']}{' (auto)' if s['prefill_chunk_auto'] else ''}"
            + f", GPU {p.gpu_mem_bytes / GiB:.2f} GiB")
    w = max(len(i.name) for i in p.items)
    lines = [head, "", f"{'item':<{w}}  {'GiB':>7}  note", f"{'-' * w}  {'-' * 7}  {'-' * 4}"]
    for i in p.items:
        lines.append(f"{i.name:<{w}}  {i.bytes / GiB:>7.3f}  {i.note}")
    lines.append(f"{'-' * w}  {'-' * 7}")
    lines.append(f"{'total':<{w}}  {p.total / GiB:>7.3f}")
    lines.append(f"{'GPU memory':<{w}}  {p.gpu_mem_bytes / GiB:>7.3f}")
    lines.append(f"{'free':<{w}}  {p.free / GiB:>7.3f}")
    lines.append(f"load-time peak (weights + largest load transient + context): {p.load_peak_bytes / GiB:.3f} GiB")
    for n in p.notes:
        lines.append(f"note: {n}")
    if p.fits:
        lines.append(f"verdict: FITS with {p.free / GiB:.2f} GiB to spare")
    else:
        big = ", ".join(f"{i.name} {i.bytes / GiB:.2f} GiB" for i in p.biggest(3))
        short = max(-p.free, p.load_peak_bytes - p.gpu_mem_bytes)
        lines.append(f"verdict: DOES NOT FIT: {short / GiB:.2f} GiB short; biggest items: {big}")
    return "\n".join(lines)


def advice(p: Plan, target, draft=None, **kw) -> list[str]:
    """What to change when `p` does not fit: smaller ctx, a quantized KV type, a smaller drafter format."""
    if p.fits:
        return []
    shape = _coerce_target(target)
    d = _coerce_draft(draft, shape)
    s = p.settings
    base = dict(kw, ddtree_budget=s["ddtree_budget"], spec=s["spec"], embed_on_host=s["embed_on_host"],
                attention=s["attention"],
                prefill_chunk=None if s["prefill_chunk_auto"] else s["prefill_chunk"], cuda_graphs=s["cuda_graphs"],
                gpu_mem_bytes=p.gpu_mem_bytes)
    out = []
    n = max_context(shape, d, s["cache_type_k"], s["cache_type_v"], **base)
    if n:
        out.append(f"lower --ctx to {n} (the largest that fits with KV {s['cache_type_k']}/{s['cache_type_v']})")
    else:
        out.append("no context fits with these weights: shrink the weights (below) or use a larger GPU")
    for t in ("q8_0", "q4_0", "tq3"):
        if KV_TYPES[t][0] / KV_TYPES[t][1] >= min(KV_TYPES[s["cache_type_k"]][0] / KV_TYPES[s["cache_type_k"]][1], 2):
            continue
        if kv_type_error(shape, d, t):
            continue
        q = plan(shape, d, ctx=p.ctx, cache_type_k=t, cache_type_v=t, **base)
        if q.fits:
            tag = "" if kv_supported(t, t) else " (planned, not yet supported by the engine)"
            out.append(f"--cache-type-k {t} --cache-type-v {t} fits ctx {p.ctx} with {q.free / GiB:.2f} GiB free{tag}")
            break
    if d is not None and d.fmt == "safetensors":
        for qt in ("Q8_0", "Q6_K", "Q4_K"):
            q = plan(shape, DraftShape.from_config(d.cfg, qt), ctx=p.ctx, cache_type_k=s["cache_type_k"],
                     cache_type_v=s["cache_type_v"], **base)
            saved = p.total - q.total
            out.append(f"a {qt} GGUF drafter (dflash24 quantize-draft) saves {saved / GiB:.2f} GiB"
                       + (" and fits" if q.fits else ", still not enough alone"))
            if q.fits:
                break
    if not s["embed_on_host"]:
        q = plan(shape, d, ctx=p.ctx, cache_type_k=s["cache_type_k"], cache_type_v=s["cache_type_v"],
                 **dict(base, embed_on_host=True))
        out.append(f"--embed-on-host (token_embd in pinned host memory) saves {(p.total - q.total) / GiB:.2f} GiB"
                   + (" and fits" if q.fits else ""))
    return out


# ------------------------------------------------------------------------------------------------
# sizes, CLI, engine check
# ------------------------------------------------------------------------------------------------
_UNITS = {"": 1, "b": 1, "k": KiB, "kb": 1000, "kib": KiB, "m": MiB, "mb": 1000 ** 2, "mib": MiB,
          "g": GiB, "gb": 1000 ** 3, "gib": GiB, "t": 1 << 40, "tb": 1000 ** 4, "tib": 1 << 40}


def parse_size(text) -> int:
    """'24GiB', '24GB', '23.4GiB', '24000MiB', '24G' (binary), or a plain byte count -> bytes."""
    if isinstance(text, (int, float)):
        return int(text)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise PlanError(f"cannot read the size {text!r} (examples: 24GiB, 24GB, 23.4GiB, 24000MiB)")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value <= 0:
        raise PlanError(f"size {text!r} must be positive")
    return int(value)


def add_fit_args(p):
    """`dflash24 fit` flags (cli.build_parser calls this)."""
    env = lambda k, d=None: os.environ.get("DFLASH24_" + k, d)          # noqa: E731
    p.add_argument("--target", "--model", dest="target", default=env("MODEL"),
                   help="target GGUF (default: the embedded default model)")
    p.add_argument("--target-preset", choices=TARGET_PRESETS, default=None,
                   help="plan a synthetic shape (Q4_K_M layout) instead of a file, e.g. qwen35-27b")
    p.add_argument("--draft", default=env("DRAFT"), help="drafter: z-lab directory or GGUF")
    p.add_argument("--draft-preset", choices=sorted(DRAFT_PRESETS), default=None,
                   help="plan a known drafter shape without its files (dflash-27b: z-lab Qwen3.6-27B drafter)")
    p.add_argument("--draft-type", default="BF16", help="with --draft-preset: BF16 (safetensors), Q8_0, Q4_K, ...")
    p.add_argument("--gpu-mem", default=env("GPU_MEM", "24GiB"), help="GPU memory, e.g. 24GiB, 24GB, 24000MiB")
    p.add_argument("--ctx", type=int, default=int(env("CTX", "4096")))
    p.add_argument("--cache-type-k", default=env("CACHE_TYPE_K", "bf16"), choices=sorted(KV_TYPES))
    p.add_argument("--cache-type-v", default=env("CACHE_TYPE_V", "bf16"), choices=sorted(KV_TYPES))
    p.add_argument("--ddtree-budget", type=int, default=int(env("DDTREE_BUDGET", "22")))
    p.add_argument("--spec", choices=["ar", "chain", "tree"], default=env("SPEC"))
    p.add_argument("--prefill-chunk", type=int, default=None,
                   help="prompt tokens per prefill forward (default: the largest of 4096 / 2048 / 1024 / 512 that fits)")
    p.add_argument("--embed-on-host", action="store_true", help="token_embd in pinned host memory")
    p.add_argument("--attention", choices=ATTENTION_MODES, default="fused",
                   help="attention activations: fused (the engine's Triton kernel on CUDA) or math (SDPA without Triton)")
    p.add_argument("--headroom", type=float, default=HEADROOM_PCT, help="allocator headroom in percent")
    p.add_argument("--json", action="store_true")


def _fit_inputs(args):
    if args.target_preset:
        from .synth import PRESETS, tiny_vocab_size
        cfg = PRESETS[args.target_preset]
        if not cfg.vocab_size:
            cfg = replace(cfg, vocab_size=tiny_vocab_size())
        shape = ModelShape.from_qwen35(cfg, name=f"{args.target_preset} (synthetic, Q4_K_M)")
    else:
        path = args.target
        if path is None:
            from .default_model import default_model_path
            path = default_model_path()
        shape = ModelShape.from_gguf(GGUFFile(path))
    if args.draft_preset:
        draft = DraftShape.from_config(DRAFT_PRESETS[args.draft_preset](), args.draft_type,
                                       f"{args.draft_preset} ({args.draft_type.upper()})")
    elif args.draft:
        draft = DraftShape.from_path(args.draft, shape.n_layers)
    else:
        draft = None
    return shape, draft


def fit_main(args) -> int:
    """`dflash24 fit`: print the plan, the largest context per KV type and, when it does not fit, what to
    change. Returns 0 when the configuration fits, 1 when it does not."""
    shape, draft = _fit_inputs(args)
    kw = dict(gpu_mem_bytes=parse_size(args.gpu_mem), ddtree_budget=args.ddtree_budget, spec=args.spec,
              embed_on_host=args.embed_on_host, prefill_chunk=args.prefill_chunk, headroom_pct=args.headroom,
              attention=args.attention)
    p = plan(shape, draft, ctx=args.ctx, cache_type_k=args.cache_type_k, cache_type_v=args.cache_type_v, **kw)
    table = max_context_table(shape, draft, **kw)
    tips = advice(p, shape, draft, headroom_pct=args.headroom)
    if args.json:
        print(json.dumps({"plan": p.as_dict(), "max_context": table, "native_context": shape.context_length,
                          "advice": tips}, indent=1))
    else:
        print(format_plan(p))
        print()
        print(f"largest context per KV type (multiples of 256; native context {shape.context_length}):")
        for t, n in table.items():
            if n is None:
                print(f"  {t:<5} {'-':>8}   ({kv_type_error(shape, draft, t)})")
                continue
            tag = "" if kv_supported(t, t) else "   (planned, not yet supported by the engine)"
            cap = " (native limit)" if n == shape.context_length else ""
            print(f"  {t:<5} {n:>8}{cap}{tag}")
        if tips:
            print()
            print("to make it fit:")
            for t in tips:
                print(f"  - {t}")
    if not p.fits:
        big = ", ".join(f"{i.name} ({i.bytes / GiB:.2f} GiB)" for i in p.biggest(3))
        print(f"dflash24 fit: does not fit in {p.gpu_mem_bytes / GiB:.2f} GiB ({-p.free / GiB:.2f} GiB over); "
              f"biggest items: {big}", file=sys.stderr)
        return 1
    return 0


def fused_attention_available() -> bool:
    from .models import layers
    return layers._fused_attn is not None


def cuda_budget(device) -> int:
    """Device bytes the engine may still use: the driver's free memory, capped by torch's per-process memory
    fraction (`torch.cuda.set_per_process_memory_fraction`, e.g. a 24 GiB card emulated on a larger one: torch's
    allocator may reserve at most fraction x total) less what the allocator already holds."""
    import torch
    free, total = torch.cuda.mem_get_info(device)
    get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if get_fraction is not None and torch.cuda.is_initialized():
        device = torch.device(device)
        if device.index is None:                   # "cuda": the current device (the fraction getter needs an index)
            device = torch.device("cuda", torch.cuda.current_device())
        fraction = get_fraction(device)
        if fraction < 1.0:
            free = min(free, int(fraction * total) - torch.cuda.memory_reserved(device))
    return max(0, free)


def check_engine(config: EngineConfig, gf: GGUFFile, device) -> Plan | None:
    """Engine start-up check on CUDA: plan against the device's free memory; raise ConfigError with the table
    when it does not fit. Skipped on CPU and when DFLASH24_SKIP_FIT_CHECK=1."""
    if device.type != "cuda" or os.environ.get("DFLASH24_SKIP_FIT_CHECK", "") in ("1", "true", "yes"):
        return None
    free = cuda_budget(device)
    p = plan(gf, config.draft, ctx=config.ctx, cache_type_k=config.cache_type_k, cache_type_v=config.cache_type_v,
             gpu_mem_bytes=free, ddtree_budget=config.ddtree_budget, spec=config.spec,
             prefill_chunk=config.prefill_chunk, cuda_graphs=config.cuda_graphs, context_bytes=0,
             embed_on_host=config.embed_on_host,
             attention="fused" if fused_attention_available() else "math",
             prefix_cache_mb=0 if config.prefix_cache_host else config.prefix_cache_bytes() / 2**20)
    if not p.fits:
        raise ConfigError("this configuration does not fit in the GPU's free memory "
                          f"({free / GiB:.2f} GiB); see `dflash24 fit`, or set DFLASH24_SKIP_FIT_CHECK=1 to try "
                          f"anyway\n{format_plan(p)}")
    return p
