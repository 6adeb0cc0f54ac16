"""DFlash block-diffusion draft model (z-lab `dflash` package, `dflash/model.py`; FACTS.md section 3).

Qwen3-style layers that predict a whole block of tokens in one pass, conditioned on target features:
  features [T, n_capture*dim] = outputs of target layers `target_layer_ids` (after their residual)
    -> hidden_norm(fc(.)) -> every draft layer's k_norm(k_proj(.)) + RoPE and v_proj(.) -> the draft
    KV cache, row = position (`add_context`, once per committed token; never layer-normed: z-lab
    projects the fused features straight through k_proj/v_proj)
  block [last committed token, MASK x (B-1)] -> TARGET embedding -> layers (queries from the block;
    keys = cached context + the block's own) -> norm -> TARGET lm_head at block positions 1..B-1 (`draft`)

Attention mask, exactly as z-lab's `_attention_mask` (key/query "positions" there are indices into
[context; block], which equal token positions because the context starts at 0):
  a layer is causal iff config `is_causal` says so, else iff it is a `sliding_attention` layer
  (z-lab's default: the Qwen3.6-27B drafter has 4 causal sliding layers + 1 non-causal full layer);
  causal: key <= query; sliding window W: query - key < W (and key - query < W when non-causal).
  The window applies only when the HF config has `use_sliding_window: true` -- transformers' Qwen3Config
  sets `sliding_window = None` otherwise, and the reference inherits that.

Module attributes carry the GGUF tensor names that Luce DFlash's `convert_dflash_to_gguf.py` writes
(arch `qwen35-dflash-draft`): dflash.fc, dflash.hidden_norm, output_norm, blk.{i}.attn_norm / attn_q /
attn_k / attn_v / attn_output / attn_q_norm / attn_k_norm / ffn_norm / ffn_gate / ffn_up / ffn_down.
`HF_NAMES` maps them to z-lab's safetensors names.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from ..cache.kv import KVCache, WindowedKVCache
from ..gguf.reader import GGUFError, GGUFFile
from .layers import Rotary, Step, add_rms_norm, cache_attention, feeds, rms_norm, silu_mul
from .loading import Loader

GGUF_ARCH = "qwen35-dflash-draft"
SLIDING, FULL = "sliding_attention", "full_attention"

# GGUF name (without ".weight") -> z-lab safetensors name; per-layer entries are under blk.{i} / layers.{i}.
HF_NAMES = {"dflash.fc": "fc", "dflash.hidden_norm": "hidden_norm", "output_norm": "norm"}
HF_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


# Rows a sliding layer's ring holds beyond its window (cache/kv.py WindowedKVCache): a step's block and the rows
# written ahead of the committed context (a context update of up to 64 tokens, padding included) must never
# overwrite a visible row; the rest lets a later request reuse a prefix that ends up to about this many
# positions before the furthest one written (cache/prefix.py).
RING_MARGIN = 1024


def ring_rows(window: int | None, capacity: int) -> int:
    """Rows of a sliding layer's ring in a draft cache of `capacity` positions (a multiple of 64); 0 when the
    layer has no window or a full-length layer would be no larger."""
    if not window:
        return 0
    rows = -(-(window + RING_MARGIN) // 64) * 64
    return rows if rows < capacity else 0


class DrafterError(ValueError):
    """A drafter checkpoint or config that cannot be used, with the reason in the message."""


def hf_name(gguf_name: str) -> str:
    """`blk.3.attn_q.weight` -> `layers.3.self_attn.q_proj.weight` (z-lab's names)."""
    stem, suffix = gguf_name.rsplit(".", 1)
    if stem in HF_NAMES:
        return f"{HF_NAMES[stem]}.{suffix}"
    _, i, rest = stem.split(".", 2)                                        # blk, i, attn_q
    return f"layers.{i}.{HF_LAYER_NAMES[rest]}.{suffix}"


def default_target_layer_ids(n_target_layers: int, n_draft_layers: int) -> tuple[int, ...]:
    """z-lab's `build_target_layer_ids`: round(1 + i*(L-4)/(n-1)), Python (half-to-even) rounding."""
    if n_draft_layers == 1:
        return (n_target_layers // 2,)
    span = n_target_layers - 4
    return tuple(round(1 + i * span / (n_draft_layers - 1)) for i in range(n_draft_layers))


@dataclass(frozen=True)
class DFlashConfig:
    n_layers: int
    dim: int                          # draft hidden size == target hidden size (fc input is n_capture*dim)
    ffn_dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    norm_eps: float
    rope_theta: float                 # plain NeoX RoPE over the whole head (rope_type "default" only)
    max_positions: int
    vocab_size: int
    target_layer_ids: tuple[int, ...]
    block_size: int
    mask_token_id: int
    layer_types: tuple[str, ...]      # per layer: "sliding_attention" | "full_attention"
    sliding_window: int | None        # window of the sliding layers; None = no window anywhere
    causal: tuple[bool, ...]          # per layer: causal inside the block
    n_target_layers: int | None = None  # layers of the target it was trained for, when recorded
    target_name: str | None = None
    embed_scale: float = 1.0          # dflash_config.input_embedding_scale
    logit_scale: float = 1.0          # dflash_config.output_multiplier
    logit_softcap: float | None = None  # dflash_config.final_logit_softcapping

    def window(self, i: int) -> int | None:
        return self.sliding_window if self.layer_types[i] == SLIDING else None

    @classmethod
    def from_file(cls, config_json) -> "DFlashConfig":
        """From a z-lab config.json; unreadable JSON, or a value of the wrong type, is a DrafterError naming it."""
        try:
            c = json.loads(Path(config_json).read_text())
        except (OSError, ValueError) as e:                      # UnicodeDecodeError and JSONDecodeError included
            raise DrafterError(f"{config_json}: not a readable JSON file ({e})") from None
        if not isinstance(c, dict):
            raise DrafterError(f"{config_json}: holds a JSON {type(c).__name__}, expected an object")
        try:
            return cls.from_hf(c, str(config_json))
        except DrafterError:
            raise
        except (TypeError, ValueError, AttributeError) as e:    # e.g. "num_attention_heads": "x", "rope_parameters": 3
            raise DrafterError(f"{config_json}: a value has the wrong type ({e})") from None

    @classmethod
    def from_hf(cls, c: dict, source: str = "config.json") -> "DFlashConfig":
        """From z-lab's config.json (transformers 5 `rope_parameters` or older `rope_theta`/`rope_scaling`)."""
        dc = c.get("dflash_config") or {}

        def draft_value(name, default=None):                           # z-lab's `_draft_value`
            return dc.get(name, c.get(name, default))

        def need(name):
            if c.get(name) is None:
                raise DrafterError(f"{source}: key {name!r} is missing")
            return c[name]

        if "DFlash2DraftModel" in (c.get("architectures") or []) or "conv_kernel_size" in dc:
            raise DrafterError(f"{source}: DFlash2 drafters (dynamic conv + candidate selector) are not supported")
        if c.get("attention_bias"):
            raise DrafterError(f"{source}: attention_bias=true is not supported (z-lab drafters have no biases)")
        if c.get("hidden_act", "silu") != "silu":
            raise DrafterError(f"{source}: hidden_act {c['hidden_act']!r} is not supported (silu only)")
        rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise DrafterError(f"{source}: rope_type {rope_type!r} is not supported (default only)")
        n_layers, heads = int(need("num_hidden_layers")), int(need("num_attention_heads"))
        # transformers' Qwen3Config: no window unless use_sliding_window; layer_types default by max_window_layers.
        window = int(c.get("sliding_window") or 4096) if c.get("use_sliding_window", False) else None
        types = c.get("layer_types") or [
            SLIDING if window is not None and i >= c.get("max_window_layers", 28) else FULL for i in range(n_layers)]
        if len(types) != n_layers or any(t not in (SLIDING, FULL) for t in types):
            raise DrafterError(f"{source}: layer_types {types} must list {n_layers} of {SLIDING!r} / {FULL!r}")
        is_causal = c.get("is_causal")
        n_target = c.get("num_target_layers")
        ids = draft_value("target_layer_ids")
        if ids is None:
            if n_target is None:
                raise DrafterError(f"{source}: neither dflash_config.target_layer_ids nor num_target_layers is given")
            ids = default_target_layer_ids(int(n_target), n_layers)
        mask_id = draft_value("mask_token_id")
        if mask_id is None:
            raise DrafterError(f"{source}: dflash_config.mask_token_id is missing")
        softcap = draft_value("final_logit_softcapping")
        return cls(
            n_layers=n_layers, dim=int(need("hidden_size")), ffn_dim=int(need("intermediate_size")),
            n_heads=heads, n_kv_heads=int(c.get("num_key_value_heads") or heads),
            head_dim=int(c.get("head_dim") or 128),                   # Qwen3Config's default, as the reference
            norm_eps=float(c.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", c.get("rope_theta", 10000.0))),
            max_positions=int(c.get("max_position_embeddings", 32768)), vocab_size=int(need("vocab_size")),
            target_layer_ids=tuple(int(i) for i in ids), block_size=int(draft_value("block_size", 16)),
            mask_token_id=int(mask_id), layer_types=tuple(types), sliding_window=window,
            causal=tuple((t == SLIDING) if is_causal is None else bool(is_causal) for t in types),
            n_target_layers=None if n_target is None else int(n_target),
            target_name=next((str(v) for k in ("target_model", "target_model_name_or_path", "base_model")
                              if (v := draft_value(k)) is not None), None),
            embed_scale=float(draft_value("input_embedding_scale", 1.0)),
            logit_scale=float(draft_value("output_multiplier", 1.0)),
            logit_softcap=float(softcap) if softcap is not None and float(softcap) > 0 else None).checked(source)

    def checked(self, source: str) -> "DFlashConfig":
        """self, once its sizes can make a drafter; else a DrafterError naming `source` and the bad field."""
        def bad(what):
            raise DrafterError(f"{source}: {what}")

        for name in ("n_layers", "dim", "ffn_dim", "n_heads", "n_kv_heads", "head_dim", "max_positions", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                bad(f"{name} is {value!r}, expected a positive integer")
        if self.n_heads % self.n_kv_heads:
            bad(f"{self.n_heads} attention heads are not a multiple of {self.n_kv_heads} KV heads")
        if self.head_dim % 2:
            bad(f"head_dim {self.head_dim} is odd (RoPE rotates pairs)")
        for name in ("norm_eps", "rope_theta"):
            if not 0 < getattr(self, name) < float("inf"):
                bad(f"{name} is {getattr(self, name)!r}, expected a finite positive number")
        if not 2 <= self.block_size <= self.max_positions:
            bad(f"block_size {self.block_size} is outside 2..{self.max_positions} (a block holds the last token and "
                f"the drafted ones, within the drafter's positions)")
        if not 0 <= self.mask_token_id < self.vocab_size:
            bad(f"mask_token_id {self.mask_token_id} is outside the vocabulary (0..{self.vocab_size - 1})")
        if not self.target_layer_ids or any(
                not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in self.target_layer_ids):
            bad(f"target_layer_ids {self.target_layer_ids} must be non-negative layer indices")
        if self.sliding_window is not None and self.sliding_window < 1:
            bad(f"sliding_window {self.sliding_window} must be at least 1")
        return self

    def to_hf(self) -> dict:
        """config.json in z-lab's layout (transformers 5 style); `from_hf(to_hf())` round-trips."""
        default_causal = tuple(t == SLIDING for t in self.layer_types)
        c = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_act": "silu",
             "attention_bias": False, "tie_word_embeddings": False, "hidden_size": self.dim,
             "intermediate_size": self.ffn_dim, "num_hidden_layers": self.n_layers,
             "num_attention_heads": self.n_heads, "num_key_value_heads": self.n_kv_heads,
             "head_dim": self.head_dim, "rms_norm_eps": self.norm_eps, "vocab_size": self.vocab_size,
             "max_position_embeddings": self.max_positions,
             "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
             "layer_types": list(self.layer_types), "use_sliding_window": self.sliding_window is not None,
             "sliding_window": self.sliding_window, "block_size": self.block_size,
             "dflash_config": {"block_size": self.block_size, "mask_token_id": self.mask_token_id,
                               "target_layer_ids": list(self.target_layer_ids)}}
        if self.causal != default_causal:
            if len(set(self.causal)) != 1:
                raise DrafterError(f"per-layer causal flags {self.causal} cannot be expressed by is_causal")
            c["is_causal"] = self.causal[0]
        if self.n_target_layers is not None:
            c["num_target_layers"] = self.n_target_layers
        for key, value, default in (("input_embedding_scale", self.embed_scale, 1.0),
                                    ("output_multiplier", self.logit_scale, 1.0),
                                    ("final_logit_softcapping", self.logit_softcap, None),
                                    ("target_model", self.target_name, None)):
            if value != default:
                c["dflash_config"][key] = value
        return c

    @classmethod
    def from_gguf(cls, gf: GGUFFile, n_target_layers: int | None = None) -> "DFlashConfig":
        """From Luce DFlash's GGUF metadata. `dflash.n_target_layers` there is the number of CAPTURED
        layers (fc input / hidden); the target's own layer count is only needed when the file lacks
        `dflash.target_layer_ids` (older converters) -- pass it as `n_target_layers`."""
        if not gf.arch.endswith("dflash-draft"):
            raise GGUFError(f"{gf.path}: architecture {gf.arch!r} is not a DFlash drafter ({GGUF_ARCH!r})")
        n_layers, dim = gf.int_value("block_count"), gf.int_value("embedding_length")
        gf.check_block_count(n_layers)
        heads = gf.int_value("attention.head_count")
        n_capture = gf.int_value("dflash.n_target_layers")
        ids = gf.get("dflash.target_layer_ids")
        if ids is None:
            if n_target_layers is None:
                raise GGUFError(f"{gf.path}: no {gf.arch}.dflash.target_layer_ids; pass n_target_layers "
                                f"(the target's layer count) to use z-lab's default layer choice")
            ids = default_target_layer_ids(n_target_layers, n_capture)
        if not isinstance(ids, (list, tuple)) or len(ids) != n_capture:
            raise GGUFError(f"{gf.path}: target_layer_ids {str(ids)[:60]} do not list dflash.n_target_layers="
                            f"{n_capture} layers")
        pattern = gf.get("attention.sliding_window_pattern") or [False] * n_layers
        if not isinstance(pattern, list) or len(pattern) != n_layers:
            raise GGUFError(f"{gf.path}: sliding_window_pattern {str(pattern)[:60]} does not list {n_layers} layers")
        types = tuple(SLIDING if p else FULL for p in pattern)
        is_causal = gf.get("dflash.is_causal")                             # dflash24 extension, optional
        window = gf.int_value("attention.sliding_window", 0, minimum=0)
        return cls(
            n_layers=n_layers, dim=dim, ffn_dim=gf.int_value("feed_forward_length"), n_heads=heads,
            n_kv_heads=gf.int_value("attention.head_count_kv", heads),
            head_dim=gf.int_value("attention.key_length", dim // heads),
            norm_eps=gf.float_value("attention.layer_norm_rms_epsilon", 1e-6),
            rope_theta=gf.float_value("rope.freq_base", 10000.0),
            max_positions=gf.int_value("context_length", 32768), vocab_size=gf.int_value("vocab_size"),
            target_layer_ids=tuple(ids), block_size=gf.int_value("dflash.block_size"),
            mask_token_id=gf.int_value("dflash.mask_token_id", minimum=0), layer_types=types,
            sliding_window=window or None,
            causal=tuple((t == SLIDING) if is_causal is None else bool(is_causal) for t in types),
            n_target_layers=n_target_layers, target_name=gf.get("general.name")).checked(gf.path)


class _Dense(torch.nn.Module):
    """y = x W^T for a float weight [out, in] (safetensors drafters; GGUF ones use QuantLinear)."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


@contextlib.contextmanager
def _readable(path):
    """safetensors' and the OS's errors reading `path` as one DrafterError naming the file."""
    from safetensors import SafetensorError
    try:
        yield
    except (SafetensorError, OSError) as e:
        raise DrafterError(f"{path}: not a readable safetensors file ({e})") from e


def load_safetensors(path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file (on the CPU); a damaged or unreadable file is a DrafterError."""
    from safetensors.torch import load_file
    with _readable(path):
        return load_file(str(path))


class _HFSource:
    """Strict tensor source over z-lab names, asked for by GGUF name (the Loader interface)."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], load: Callable[[str], torch.Tensor], origin: str,
                 device, dtype):
        self.shapes, self.load, self.origin = shapes, load, origin
        self.device, self.dtype, self.used = torch.device(device), dtype, set()

    def _get(self, gguf_name: str, shape: tuple[int, ...], dtype) -> torch.Tensor:
        name = hf_name(gguf_name)
        if name not in self.shapes:
            raise DrafterError(f"{self.origin}: tensor {name!r} is missing")
        if tuple(self.shapes[name]) != tuple(shape):
            raise DrafterError(f"{self.origin}: tensor {name!r} has shape {tuple(self.shapes[name])}, "
                               f"expected {tuple(shape)}")
        self.used.add(name)
        return self.load(name).to(device=self.device, dtype=dtype)

    def linear(self, prefix: str, n_in: int, n_out: int) -> _Dense:
        return _Dense(self._get(prefix + ".weight", (n_out, n_in), self.dtype))

    def vector(self, name: str, n: int) -> torch.Tensor:
        return self._get(name, (n,), torch.float32)

    def finish(self):
        unused = sorted(set(self.shapes) - self.used)
        if unused:
            more = f" (+{len(unused) - 8} more)" if len(unused) > 8 else ""
            raise DrafterError(f"{self.origin}: unexpected tensors for a DFlash drafter: {', '.join(unused[:8])}{more}")


# The drafter's norms and silu_mul also write their output the way the packed matmuls after them read it (the int8
# rows of a one-token context update, the small-M kernels' pair order for a block): a quantized drafter's matmuls, and
# the target's packed LM head, then take x as it is, with no permuting copy before each (a Q4_K drafter's step on an
# H100, 2026-12-06 `part150`: 36 such copies, 101 of its 1,296 us of kernel time). Off: every matmul permutes x.
FEED_PACKED = True


def _feeds(linear, tokens: int) -> dict:
    """The norm / silu_mul arguments for output that `linear` multiplies in rows of `tokens` (layers.feeds) where it
    is packed; a dense weight reads the plain rows, so nothing more is written."""
    return feeds(tokens) if FEED_PACKED and getattr(linear, "packed", None) is not None else {}


class DraftBlock(torch.nn.Module):
    def __init__(self, cfg: DFlashConfig, src, i: int):
        super().__init__()
        p, D, H, Hk = f"blk.{i}.", cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
        self.cfg, self.index = cfg, i
        self.attn_norm = src.vector(p + "attn_norm.weight", cfg.dim)
        self.attn_q = src.linear(p + "attn_q", cfg.dim, H * D)
        self.attn_k = src.linear(p + "attn_k", cfg.dim, Hk * D)
        self.attn_v = src.linear(p + "attn_v", cfg.dim, Hk * D)
        self.attn_q_norm = src.vector(p + "attn_q_norm.weight", D)
        self.attn_k_norm = src.vector(p + "attn_k_norm.weight", D)
        self.attn_output = src.linear(p + "attn_output", H * D, cfg.dim)
        self.ffn_norm = src.vector(p + "ffn_norm.weight", cfg.dim)
        self.ffn_gate = src.linear(p + "ffn_gate", cfg.dim, cfg.ffn_dim)
        self.ffn_up = src.linear(p + "ffn_up", cfg.dim, cfg.ffn_dim)
        self.ffn_down = src.linear(p + "ffn_down", cfg.ffn_dim, cfg.dim)

    def context_kv(self, h: torch.Tensor, positions: torch.Tensor, rope: Rotary):
        """h: fused features [T, dim] -> (k [T, Hk, D] normed + rotated, v [T, Hk, D])."""
        T, c = h.shape[0], self.cfg
        k = rms_norm(self.attn_k(h).view(T, c.n_kv_heads, c.head_dim), self.attn_k_norm, c.norm_eps)
        return rope(k, positions), self.attn_v(h).view(T, c.n_kv_heads, c.head_dim)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, rope: Rotary,
                step: Step) -> torch.Tensor:
        """x: block [B, dim]; step: this layer kind's visibility over cache rows 0..step.kv_rows-1."""
        c, B = self.cfg, x.shape[0]
        h = rms_norm(x, self.attn_norm, c.norm_eps, **_feeds(self.attn_q, B))
        q = rms_norm(self.attn_q(h).view(B, c.n_heads, c.head_dim), self.attn_q_norm, c.norm_eps)
        k, v = self.context_kv(h, positions, rope)
        # The block's K/V go to the scratch rows right after the committed context; `add_context`
        # overwrites them with the real context later; the step's slots hide rows past the block.
        cache.write(self.index, positions, k, v)
        k_all, v_all = cache.layer(self.index)
        o = cache_attention(rope(q, positions), k_all, v_all, step, c.head_dim ** -0.5)
        x, h = add_rms_norm(x, self.attn_output(o.reshape(B, c.n_heads * c.head_dim)), self.ffn_norm, c.norm_eps,
                            **_feeds(self.ffn_gate, B))
        return x + self.ffn_down(silu_mul(self.ffn_gate(h), self.ffn_up(h), **_feeds(self.ffn_down, B)))


class DFlashDrafter(torch.nn.Module):
    """The DFlash draft model. Uses the target's embedding and lm_head (passed per call, never copied).

    Shapes: B = block_size, dim = hidden size, S = kv_rows (cache rows attention reads).
      new_cache(capacity, dtype, device) -> KVCache [n_layers, capacity, Hk, D], or a WindowedKVCache whose
          sliding layers keep a ring of `ring_rows` rows; capacity (positions) must be at least the longest
          committed context + B (the block uses B scratch rows after the context).
      add_context(features [T, n_capture*dim], positions [T] int64, cache): writes rows `positions`.
      draft(last_token [1] int64, start_pos int | [1] int64 tensor, cache, embed, lm_head, kv_rows=None)
          -> logits [B-1, vocab] for positions start_pos+1 .. start_pos+B-1; context = rows [0, start_pos).
    """

    def __init__(self, cfg: DFlashConfig, src, device, dtype, max_positions: int | None = None):
        super().__init__()
        self.cfg, self.dtype = cfg, dtype
        self.fc = src.linear("dflash.fc", len(cfg.target_layer_ids) * cfg.dim, cfg.dim)
        self.hidden_norm = src.vector("dflash.hidden_norm.weight", cfg.dim)
        self.blk = torch.nn.ModuleList(DraftBlock(cfg, src, i) for i in range(cfg.n_layers))
        self.output_norm = src.vector("output_norm.weight", cfg.dim)
        src.finish()
        self.rope = Rotary(cfg.head_dim, cfg.rope_theta, max_positions or cfg.max_positions, True, device)
        self.register_buffer("offsets", torch.arange(cfg.block_size, device=device), persistent=False)
        self.register_buffer("mask_ids", torch.full((cfg.block_size - 1,), cfg.mask_token_id, dtype=torch.long,
                                                    device=device), persistent=False)

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path, device="cpu", dtype=torch.float32, max_positions: int | None = None):
        """z-lab layout: `path`/config.json + `path`/model.safetensors (strict: names and shapes)."""
        from safetensors import safe_open
        path = Path(path)
        for f in ("config.json", "model.safetensors"):
            if not (path / f).is_file():
                raise DrafterError(f"{path}: {f} not found (expected z-lab's DFlash drafter layout)")
        cfg = DFlashConfig.from_file(path / "config.json")
        weights = path / "model.safetensors"
        with _readable(weights), safe_open(str(weights), framework="pt", device="cpu") as st:
            shapes = {k: tuple(st.get_slice(k).get_shape()) for k in st.keys()}
            return cls(cfg, _HFSource(shapes, st.get_tensor, str(weights), device, dtype), device, dtype, max_positions)

    @classmethod
    def from_state_dict(cls, cfg: DFlashConfig, sd: dict[str, torch.Tensor], device="cpu", dtype=torch.float32,
                        max_positions: int | None = None):
        src = _HFSource({k: tuple(v.shape) for k, v in sd.items()}, sd.__getitem__, "state dict", device, dtype)
        return cls(cfg, src, device, dtype, max_positions)

    @classmethod
    def from_gguf(cls, path, device="cpu", dtype=torch.float32, max_positions: int | None = None,
                  n_target_layers: int | None = None):
        """Luce DFlash layout (F32/F16/BF16/Q8_0 weights; QuantLinear keeps quantized blocks)."""
        gf = path if isinstance(path, GGUFFile) else GGUFFile(path)
        cfg = DFlashConfig.from_gguf(gf, n_target_layers)
        return cls(cfg, _GGUFSource(Loader(gf, device, dtype)), device, dtype, max_positions)

    # -- the API the speculative loop uses -----------------------------------------------------
    @property
    def target_layer_ids(self) -> tuple[int, ...]:
        return self.cfg.target_layer_ids

    @property
    def block_size(self) -> int:
        return self.cfg.block_size

    @property
    def mask_token_id(self) -> int:
        return self.cfg.mask_token_id

    def new_cache(self, capacity: int, dtype, device) -> KVCache | WindowedKVCache:
        c = self.cfg
        ring = ring_rows(c.sliding_window, capacity)
        sliding = tuple(c.window(i) is not None for i in range(c.n_layers))
        if ring and any(sliding):
            return WindowedKVCache(sliding, capacity, ring, c.n_kv_heads, c.head_dim, dtype, device)
        return KVCache(c.n_layers, capacity, c.n_kv_heads, c.head_dim, dtype, device)

    def add_context(self, features: torch.Tensor, positions: torch.Tensor, cache: KVCache):
        """Project committed tokens' target features into every layer's K/V at rows `positions`."""
        c = self.cfg
        if features.shape[-1] != len(c.target_layer_ids) * c.dim:
            raise ValueError(f"features have width {features.shape[-1]}, expected "
                             f"{len(c.target_layer_ids)} x {c.dim} (target layers {c.target_layer_ids})")
        h = rms_norm(self.fc(features.to(self.dtype)), self.hidden_norm, c.norm_eps,
                     **_feeds(self.blk[0].attn_k, features.shape[0]))                  # [T, dim]
        for blk in self.blk:
            k, v = blk.context_kv(h, positions, self.rope)
            cache.write(blk.index, positions, k, v)

    def visibility(self, positions: torch.Tensor, kv_rows: int, ring: int = 0
                   ) -> dict[tuple[bool, int | None], Step]:
        """One Step per (causal, window) kind of layer; row r of the cache holds position r. A query at
        position q sees row r iff r <= last (context + block; later rows are stale), r <= q when causal, and
        |q - r| < window when the layer slides. As slots (upper bound per query) + window (lower bound), so
        on CUDA the Triton attention kernel reads only the visible rows and no [B, S] mask exists. ring: the
        rows of the sliding layers' rings (a WindowedKVCache), where position r lives at row r % ring."""
        last = positions[-1:].expand_as(positions)
        out = {}
        for i, causal in enumerate(self.cfg.causal):
            key = (causal, self.cfg.window(i))
            if key in out:
                continue
            upper = positions if causal else last
            if key[1] is not None and not causal:
                upper = torch.minimum(positions + (key[1] - 1), last)
            out[key] = Step(positions, upper.contiguous(), kv_rows, window=key[1] or 0,
                            ring=ring if key[1] is not None else 0)
        return out

    def draft(self, last_token: torch.Tensor, start_pos, cache: KVCache, embed: Callable, lm_head: Callable,
              kv_rows: int | None = None) -> torch.Tensor:
        """One block: returns logits [B-1, vocab] (lm_head's dtype) for positions start_pos+1..+B-1.

        kv_rows (the S attention reads, a Python int) picks the shape: default start_pos + B for an int
        start_pos, cache.capacity for a tensor one. With a tensor start_pos and a fixed kv_rows the step
        has fixed shapes and no host sync (CUDA-graph capturable). Needs start_pos + B <= kv_rows.
        """
        c, B = self.cfg, self.cfg.block_size
        if kv_rows is None:
            kv_rows = cache.capacity if isinstance(start_pos, torch.Tensor) else start_pos + B
        if kv_rows > cache.capacity or (not isinstance(start_pos, torch.Tensor) and start_pos + B > kv_rows):
            raise ValueError(f"draft at start_pos {start_pos} needs {B} scratch rows: kv_rows {kv_rows}, "
                             f"cache capacity {cache.capacity}")
        ids = torch.cat([last_token.reshape(1).to(torch.long), self.mask_ids])          # [B]
        positions = self.offsets + start_pos                                            # [B] int64
        x = embed(ids).to(self.dtype)
        if c.embed_scale != 1.0:
            x = x * c.embed_scale
        steps = self.visibility(positions, kv_rows, getattr(cache, "ring", 0))
        for i, blk in enumerate(self.blk):
            x = blk(x, positions, cache, self.rope, steps[(c.causal[i], c.window(i))])
        logits = lm_head(rms_norm(x[1:], self.output_norm, c.norm_eps, **_feeds(lm_head, B - 1)))  # [B-1, vocab]
        if c.logit_scale != 1.0:
            logits = logits * c.logit_scale
        if c.logit_softcap is not None:
            logits = torch.tanh(logits / c.logit_softcap) * c.logit_softcap
        return logits


class _GGUFSource:
    """The GGUF Loader with the drafter's two-method interface."""

    def __init__(self, ld: Loader):
        self.ld = ld

    def linear(self, prefix: str, n_in: int, n_out: int):
        return self.ld.linear(prefix, n_in, n_out)

    def vector(self, name: str, n: int) -> torch.Tensor:
        return self.ld.vector(name, n)

    def finish(self):
        self.ld.finish()


# -- random drafters and GGUF export (tests, benchmarks, `quantize-draft`) --------------------------
def tensor_shapes(cfg: DFlashConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of a drafter by z-lab name -> shape ([out, in] for weights)."""
    D, H, Hk = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    out = {"fc.weight": (cfg.dim, len(cfg.target_layer_ids) * cfg.dim), "hidden_norm.weight": (cfg.dim,),
           "norm.weight": (cfg.dim,)}
    per_layer = {"attn_norm": (cfg.dim,), "ffn_norm": (cfg.dim,), "attn_q": (H * D, cfg.dim),
                 "attn_k": (Hk * D, cfg.dim), "attn_v": (Hk * D, cfg.dim), "attn_output": (cfg.dim, H * D),
                 "attn_q_norm": (D,), "attn_k_norm": (D,), "ffn_gate": (cfg.ffn_dim, cfg.dim),
                 "ffn_up": (cfg.ffn_dim, cfg.dim), "ffn_down": (cfg.dim, cfg.ffn_dim)}
    for i in range(cfg.n_layers):
        for name, shape in per_layer.items():
            out[hf_name(f"blk.{i}.{name}.weight")] = shape
    return out


def random_state_dict(cfg: DFlashConfig, seed: int = 0, dtype=torch.float32, device="cpu") -> dict[str, torch.Tensor]:
    """Random weights: matrices N(0, 1/in), norm weights 1 + N(0, 0.1^2) (so norms are not trivial)."""
    g = torch.Generator(device=device).manual_seed(seed)
    sd = {}
    for name, shape in tensor_shapes(cfg).items():
        w = torch.randn(shape, generator=g, device=device, dtype=torch.float32)
        sd[name] = (w * shape[1] ** -0.5 if len(shape) == 2 else 1 + 0.1 * w).to(dtype)
    return sd


def make_random_drafter_dir(path, target_cfg, n_layers: int, *, ffn_dim: int | None = None,
                            n_heads: int | None = None, n_kv_heads: int | None = None, head_dim: int | None = None,
                            block_size: int = 16, mask_token_id: int | None = None,
                            target_layer_ids: tuple[int, ...] | None = None, layer_types: tuple[str, ...] | None = None,
                            sliding_window: int | None = None, is_causal: bool | None = None,
                            rope_theta: float = 1e7, max_positions: int = 32768, seed: int = 0,
                            dtype=torch.bfloat16) -> Path:
    """Write config.json + model.safetensors of a random drafter for `target_cfg` (anything with .dim,
    .n_layers, .vocab_size; .ffn_dim/.n_heads/.n_kv_heads/.head_dim are used as defaults). The default
    layer_types are all full attention; mask_token_id defaults to vocab_size - 1. Returns `path`."""
    types = tuple(layer_types or (FULL,) * n_layers)
    cfg = DFlashConfig(
        n_layers=n_layers, dim=target_cfg.dim, ffn_dim=ffn_dim or target_cfg.ffn_dim,
        n_heads=n_heads or target_cfg.n_heads, n_kv_heads=n_kv_heads or target_cfg.n_kv_heads,
        head_dim=head_dim or target_cfg.head_dim, norm_eps=1e-6, rope_theta=rope_theta,
        max_positions=max_positions, vocab_size=target_cfg.vocab_size,
        target_layer_ids=tuple(target_layer_ids or default_target_layer_ids(target_cfg.n_layers, n_layers)),
        block_size=block_size, mask_token_id=target_cfg.vocab_size - 1 if mask_token_id is None else mask_token_id,
        layer_types=types, sliding_window=sliding_window,
        causal=tuple((t == SLIDING) if is_causal is None else is_causal for t in types),
        n_target_layers=target_cfg.n_layers)
    return save_dir(cfg, random_state_dict(cfg, seed, dtype), path)


def save_dir(cfg: DFlashConfig, sd: dict[str, torch.Tensor], path) -> Path:
    """Write a drafter in z-lab's layout: `path`/config.json + `path`/model.safetensors. Returns `path`."""
    from safetensors.torch import save_file
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2))
    save_file(sd, str(path / "model.safetensors"))
    return path


def save_gguf(cfg: DFlashConfig, sd: dict[str, torch.Tensor], path, qtype: str = "F16",
              quant_device: str | torch.device | None = None) -> Path:
    """Write a drafter in Luce DFlash's GGUF layout. qtype for the weight matrices (fc and every layer's
    attn_q/k/v/output, ffn_gate/up/down): F32, F16, BF16, Q8_0, Q6_K or Q4_K (quant/quantize.py). Norms
    (1-D) are always F32, as Luce writes them. K-quants need rows (input dims) that are multiples of 256;
    a matrix whose rows are not falls back to Q8_0 (rows % 32), else F16. quant_device: where the K-quant
    search runs (default: the CPU; "cuda" takes seconds for a 27B-size drafter, where the CPU takes minutes;
    the two may round a few weights differently). Returns `path`."""
    import gguf
    import numpy as np
    from ..quant.quantize import quantize as quantize_blocks
    QT = gguf.GGMLQuantizationType
    qt = {"F32": QT.F32, "F16": QT.F16, "BF16": QT.BF16, "Q8_0": QT.Q8_0, "Q6_K": QT.Q6_K,
          "Q4_K": QT.Q4_K}.get(qtype)
    if qt is None:
        raise ValueError(f"qtype must be F32, F16, BF16, Q8_0, Q6_K or Q4_K, got {qtype!r}")
    w = gguf.GGUFWriter(os.fspath(path), GGUF_ARCH)
    a = GGUF_ARCH
    w.add_string("general.name", cfg.target_name or f"DFlash-Draft-{cfg.dim}h-{cfg.n_layers}L")
    for key, value in (("context_length", cfg.max_positions), ("embedding_length", cfg.dim),
                       ("block_count", cfg.n_layers), ("feed_forward_length", cfg.ffn_dim),
                       ("attention.head_count", cfg.n_heads), ("attention.head_count_kv", cfg.n_kv_heads),
                       ("attention.key_length", cfg.head_dim), ("attention.value_length", cfg.head_dim),
                       ("vocab_size", cfg.vocab_size), ("dflash.n_target_layers", len(cfg.target_layer_ids)),
                       ("dflash.block_size", cfg.block_size), ("dflash.mask_token_id", cfg.mask_token_id)):
        w.add_uint32(f"{a}.{key}", value)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", cfg.norm_eps)
    w.add_float32(f"{a}.rope.freq_base", cfg.rope_theta)
    w.add_array(f"{a}.dflash.target_layer_ids", list(cfg.target_layer_ids))
    if cfg.sliding_window is not None:
        w.add_uint32(f"{a}.attention.sliding_window", cfg.sliding_window)
    w.add_array(f"{a}.attention.sliding_window_pattern", [t == SLIDING for t in cfg.layer_types])
    if cfg.causal != tuple(t == SLIDING for t in cfg.layer_types):
        w.add_bool(f"{a}.dflash.is_causal", cfg.causal[0])
    by_hf = {hf_name(g): g for g in _gguf_names(cfg)}
    for name in sorted(by_hf, key=lambda n: by_hf[n]):
        src = sd[name].detach()
        tq = qt
        if src.dim() == 2 and qt in (QT.Q6_K, QT.Q4_K) and src.shape[1] % 256:
            tq = QT.Q8_0
        if src.dim() == 2 and tq == QT.Q8_0 and src.shape[1] % 32:
            tq = QT.F16
        if src.dim() == 2 and tq in (QT.Q8_0, QT.Q6_K, QT.Q4_K):     # block types: quantized where asked
            src = src.to(quant_device if quant_device is not None else "cpu")
            w.add_tensor(by_hf[name], quantize_blocks(src, tq).cpu().numpy(), raw_dtype=tq)
            continue
        t = src.float().cpu().numpy()
        if t.ndim == 1 or qt == QT.F32:
            w.add_tensor(by_hf[name], t.astype(np.float32))
        elif qt == QT.BF16:
            w.add_tensor(by_hf[name], gguf.quants.quantize(t, qt), raw_dtype=qt)
        else:                                                               # F16, asked or as the fallback
            w.add_tensor(by_hf[name], t.astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def _gguf_names(cfg: DFlashConfig) -> list[str]:
    names = [f"{n}.weight" for n in HF_NAMES]
    return names + [f"blk.{i}.{n}.weight" for i in range(cfg.n_layers) for n in HF_LAYER_NAMES]


def _warn_if_other_target(drafter_dir: Path, target_path) -> None:
    """logging.warning when config.json records a target sha256 (dflash_config.target_sha256, written by
    `dflash24 train-draft`) that differs from the target file's (hashed once, cached; see train.fingerprint)."""
    try:
        c = json.loads((drafter_dir / "config.json").read_text())
    except (OSError, ValueError):
        return                                          # from_file says what is wrong with it
    dc = c.get("dflash_config") if isinstance(c, dict) else None
    want = dc.get("target_sha256") if isinstance(dc, dict) else None
    if not want or target_path is None:
        return
    from ..train.fingerprint import target_sha256
    try:
        have = target_sha256(target_path)
    except OSError:
        return
    if have != want:
        logging.getLogger("dflash24").warning(
            "%s: drafter was trained for %s (sha256 %s...), but the target %s has sha256 %s...; acceptance "
            "will be poor unless the targets are the same model", drafter_dir, dc.get("target_model", "?"),
            want[:12], Path(target_path).name, have[:12])


def load_drafter(path, device, dtype, max_positions: int, target, target_path=None) -> DFlashDrafter:
    """A drafter from a z-lab directory or a GGUF file, checked against the target it will serve
    (target_path: the target's GGUF, to compare with the sha256 a trained drafter records)."""
    p = Path(path)
    if p.is_dir():
        _warn_if_other_target(p, target_path)
        drafter = DFlashDrafter.from_pretrained(p, device, dtype, max_positions + 64)
    elif p.is_file():
        drafter = DFlashDrafter.from_gguf(p, device, dtype, max_positions + 64, target.cfg.n_layers)
    else:
        raise DrafterError(f"{path}: no such drafter (a directory with config.json + model.safetensors, or a GGUF)")
    c, t = drafter.cfg, target.cfg
    if c.dim != t.dim:
        raise DrafterError(f"{path}: drafter hidden size {c.dim} does not match the target's {t.dim}")
    if max(c.target_layer_ids) >= t.n_layers:
        raise DrafterError(f"{path}: drafter reads target layers {c.target_layer_ids} but the target has {t.n_layers}")
    if c.mask_token_id >= t.vocab_size:
        raise DrafterError(f"{path}: mask token {c.mask_token_id} is outside the target vocabulary ({t.vocab_size})")
    return drafter
