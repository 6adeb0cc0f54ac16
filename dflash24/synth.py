"""Synthetic random-weight GGUF models of real shapes (benchmarks, tests), and the qwen35 HF -> GGUF writer.

    python -m dflash24.synth --preset qwen35-27b --out /root/m.gguf      # ~16.5 GB, Q4_K_M layout
    python -m dflash24.synth --check /root/m.gguf                        # short forward, finite logits?

Quantized tensors are not quantized from floats: their blocks are generated directly (random quant bits,
fixed sub-block scales / mins chosen so every block is zero-mean, random fp16 block scales around a value
that gives each weight a std of about `gain / sqrt(fan_in)`), streamed tensor by tensor to the file, so
the 27B file is written at disk speed. Norm weights are 1, `ssm_a` in [-2, -0.5], `ssm_dt` 1, so
activations stay finite through all layers.

Layout "q4_k_m" follows llama.cpp's `llama_tensor_get_type` for LLAMA_FTYPE_MOSTLY_Q4_K_M: Q4_K by
default; Q6_K for `output`; Q6_K for `attn_v` / `ffn_down` when `use_more_bits(i, n)` (i counts that kind
of tensor: i < n/8 or i >= 7n/8 or (i - n/8) % 3 == 2); Q5_K for every `attn_qkv`; 1-D tensors and
`ssm_conv1d` F32. A row length that is not a multiple of 256 falls back to Q8_0 (or F32).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass, replace
from typing import Callable, Iterable

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES

from .models.qwen35 import Qwen35Config

# ----------------------------------------------------------------------------------------------------
# presets
# ----------------------------------------------------------------------------------------------------
QWEN35_27B = Qwen35Config(
    n_layers=64, dim=5120, ffn_dim=17408, n_heads=24, n_kv_heads=4, head_dim=256, vocab_size=248320,
    rope_theta=1e7, rope_dim=64, norm_eps=1e-6, context_length=262144, attn_interval=4, conv_kernel=4,
    ssm_k_heads=16, ssm_k_dim=128, ssm_v_heads=48, ssm_v_dim=128)
# transformers' Qwen3_5TextConfig defaults, documented there as the Qwen3.5-9B configuration (32 layers,
# hidden 4096, FFN 12288, 16 heads / 4 KV heads of 256, DeltaNet 16 key / 32 value heads of 128).
QWEN35_9B = replace(QWEN35_27B, n_layers=32, dim=4096, ffn_dim=12288, n_heads=16, ssm_v_heads=32)
QWEN35_TINY = Qwen35Config(
    n_layers=8, dim=256, ffn_dim=512, n_heads=4, n_kv_heads=2, head_dim=64, vocab_size=0,
    rope_theta=1e7, rope_dim=16, norm_eps=1e-6, context_length=4096, attn_interval=4, conv_kernel=4,
    ssm_k_heads=2, ssm_k_dim=32, ssm_v_heads=6, ssm_v_dim=32)


@dataclass(frozen=True)
class DenseShape:
    """A dense qwen2 model shape (for the `qwen2-tiny` preset)."""
    n_layers: int = 2
    dim: int = 256
    ffn_dim: int = 512
    n_heads: int = 4
    n_kv_heads: int = 2
    vocab_size: int = 0
    context_length: int = 4096


# The shapes of the two real Qwen2.5-Coder GGUFs on PyPI (MODELS.md), for speed runs without the files.
QWEN2_15B = DenseShape(n_layers=28, dim=1536, ffn_dim=8960, n_heads=12, n_kv_heads=2, vocab_size=151936,
                       context_length=32768)
QWEN2_05B = DenseShape(n_layers=24, dim=896, ffn_dim=4864, n_heads=14, n_kv_heads=2, vocab_size=151936,
                       context_length=32768)

PRESETS = {"qwen35-27b": QWEN35_27B, "qwen35-9b": QWEN35_9B, "qwen35-tiny": QWEN35_TINY, "qwen2-tiny": DenseShape(),
           "qwen2-1.5b": QWEN2_15B, "qwen2-0.5b": QWEN2_05B}

# ----------------------------------------------------------------------------------------------------
# tokenizer metadata: a byte-level BPE vocabulary (256 bytes + a few merges + specials), padded
# ----------------------------------------------------------------------------------------------------
MERGES = ("Ġ t", "h e", "i n", "Ġt he", "Ġ a", "e r", "o n", "Ġ s", "r e", "Ġ w")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML = ("{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] "
          "+ '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
          "{%- endif %}")


def _byte_symbols() -> list[str]:
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    out, extra = [], 0
    for b in range(256):
        out.append(chr(b) if b in keep else chr(256 + extra))
        extra += b not in keep
    return out


def tokenizer_metadata(vocab_size: int = 0) -> dict:
    """tokenizer.ggml.* for a small byte-level BPE; `vocab_size` pads it with unreachable normal tokens
    (so the embedding has the real row count). Uses the real Qwen3.6 vocabulary when
    `dflash24.gguf.qwen36_vocab` provides one and vocab_size is its padded size."""
    if vocab_size >= 248_320:
        try:                              # the real vocabulary (module and package are optional)
            from .gguf.qwen36_vocab import PADDED_VOCAB, qwen36_tokenizer_metadata
            if vocab_size == PADDED_VOCAB:
                md = qwen36_tokenizer_metadata()
                md.setdefault("tokenizer.chat_template", CHATML)
                return md
        except Exception as e:  # noqa: BLE001 - missing module/package: fall back to the synthetic vocab
            print(f"dflash24.synth: real Qwen3.6 vocabulary unavailable ({e}); using a synthetic byte-level one",
                  file=sys.stderr)
    tokens = _byte_symbols() + [m.replace(" ", "") for m in MERGES]
    types = [1] * len(tokens)
    n_fill = max(0, vocab_size - len(tokens) - len(SPECIALS))
    tokens += [f"ĊĊ{n}" for n in range(n_fill)]                   # never produced by a merge
    types += [1] * n_fill
    tokens += list(SPECIALS)
    types += [3] * len(SPECIALS)
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": list(MERGES),
            "tokenizer.ggml.eos_token_id": tokens.index("<|im_end|>"),
            "tokenizer.ggml.padding_token_id": tokens.index("<|endoftext|>"),
            "tokenizer.ggml.bos_token_id": tokens.index("<|endoftext|>"),
            "tokenizer.ggml.add_bos_token": False, "tokenizer.chat_template": CHATML}


def tiny_vocab_size() -> int:
    return 256 + len(MERGES) + len(SPECIALS)


# ----------------------------------------------------------------------------------------------------
# streaming GGUF writer
# ----------------------------------------------------------------------------------------------------
def _add_kv(w: GGUFWriter, key: str, v) -> None:
    if isinstance(v, bool):
        w.add_key_value(key, v, GGUFValueType.BOOL)
    elif isinstance(v, int):
        w.add_key_value(key, v, GGUFValueType.UINT32 if 0 <= v < 2**32 else GGUFValueType.INT64)
    elif isinstance(v, float):
        w.add_key_value(key, v, GGUFValueType.FLOAT32)
    elif isinstance(v, str):
        w.add_key_value(key, v, GGUFValueType.STRING)
    elif isinstance(v, (list, tuple)):
        sub = (GGUFValueType.STRING if all(isinstance(x, str) for x in v) else
               GGUFValueType.INT32 if all(isinstance(x, int) for x in v) else GGUFValueType.FLOAT32)
        w.add_key_value(key, list(v), GGUFValueType.ARRAY, sub_type=sub)
    else:
        raise TypeError(f"metadata {key!r}: cannot store {type(v).__name__}")


@dataclass
class TensorSpec:
    name: str
    shape: tuple[int, ...]                  # PyTorch order (rows, cols)
    qtype: Q
    make: Callable[[int, int], np.ndarray]  # (row0, row1) -> raw uint8 [row1 - row0, row_bytes]

    @property
    def row_bytes(self) -> int:
        block, nbytes = GGML_QUANT_SIZES[self.qtype]
        return self.shape[-1] // block * nbytes

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[:-1])) if len(self.shape) > 1 else 1


def write_streaming(path: str, arch: str, metadata: dict, specs: list[TensorSpec], chunk_bytes: int = 256 << 20,
                    progress: bool = False) -> str:
    """Write a GGUF whose tensor data is produced row-chunk by row-chunk (constant memory)."""
    w = GGUFWriter(path, arch)
    for k, v in metadata.items():
        if k != "general.architecture":
            _add_kv(w, k, v)
    for s in specs:
        byte_shape = (*s.shape[:-1], s.row_bytes)
        w.add_tensor_info(s.name, byte_shape, np.dtype(np.uint8), s.rows * s.row_bytes, raw_dtype=s.qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fout = w.fout[0]
    t0, done = time.time(), 0
    for s in specs:
        # what GGUFWriter.write_tensor_data does, but in row chunks: align, data, (next tensor aligns)
        w.write_padding(fout, fout.tell())
        step = max(1, chunk_bytes // max(1, s.row_bytes))
        for r0 in range(0, s.rows, step):
            r1 = min(s.rows, r0 + step)
            raw = np.ascontiguousarray(s.make(r0, r1), dtype=np.uint8)
            if raw.size != (r1 - r0) * s.row_bytes:
                raise ValueError(f"{s.name}: producer gave {raw.size} bytes for rows {r0}:{r1} ({s.row_bytes} per row)")
            raw.tofile(fout)
        w.write_padding(fout, s.rows * s.row_bytes)
        w.tensors[0].pop(s.name)
        done += s.rows * s.row_bytes
        if progress:
            print(f"\r{done / 1e9:7.2f} GB  {time.time() - t0:6.1f}s  {s.name:<32}", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    w.close()
    return path


# ----------------------------------------------------------------------------------------------------
# random blocks with a chosen weight std
# ----------------------------------------------------------------------------------------------------
# Q4_K/Q5_K: every 6-bit sub-block scale and min = 32 -> bytes 0-7 = 32 | (32 >> 4) << 6 = 160, bytes 8-11 = 0.
_K_SCALES = np.array([160] * 8 + [0] * 4, np.uint8)
# weight = d * unit, unit = the quantised value's spread: std of unit for random bits
_UNIT_STD = {Q.Q8_0: math.sqrt((256 ** 2 - 1) / 12), Q.Q4_0: math.sqrt((16 ** 2 - 1) / 12),
             Q.Q4_K: 32 * math.sqrt((16 ** 2 - 1) / 12), Q.Q5_K: 32 * math.sqrt((32 ** 2 - 1) / 12),
             Q.Q6_K: 16 * math.sqrt((64 ** 2 - 1) / 12)}


class BlockMaker:
    def __init__(self, seed: int, device: str | None = None):
        self.rng = np.random.default_rng(seed)
        self.torch_gen = None
        if device and device.startswith("cuda"):
            import torch
            self.torch_gen = torch.Generator(device=device)
            self.torch_gen.manual_seed(seed)
            self.device = device

    def _bytes(self, n: int) -> np.ndarray:
        if self.torch_gen is not None:
            import torch
            return torch.randint(0, 256, (n,), dtype=torch.uint8, device=self.device, generator=self.torch_gen).cpu().numpy()
        return self.rng.integers(0, 256, size=n, dtype=np.uint8)

    def quant(self, qtype: Q, rows: int, cols: int, std: float) -> np.ndarray:
        """Raw blocks [rows, row_bytes] of random zero-mean weights with about this std."""
        block, nbytes = GGML_QUANT_SIZES[qtype]
        nb = rows * (cols // block)
        raw = self._bytes(nb * nbytes).reshape(nb, nbytes)
        d = (std / _UNIT_STD[qtype] * self.rng.uniform(0.8, 1.2, size=nb)).astype(np.float16)
        d8 = d.view(np.uint8).reshape(nb, 2)
        if qtype in (Q.Q8_0, Q.Q4_0):
            raw[:, 0:2] = d8
        elif qtype in (Q.Q4_K, Q.Q5_K):
            mid = 7.5 if qtype == Q.Q4_K else 15.5                 # dmin * 32 = d * 32 * mean(q): zero mean
            raw[:, 0:2] = d8
            raw[:, 2:4] = (d.astype(np.float32) * mid).astype(np.float16).view(np.uint8).reshape(nb, 2)
            raw[:, 4:16] = _K_SCALES
        elif qtype == Q.Q6_K:
            raw[:, 192:208] = 16                                    # int8 sub-block scales
            raw[:, 208:210] = d8
        else:
            raise ValueError(f"no random block generator for {qtype.name}")
        return raw.reshape(rows, -1)

    def floats(self, qtype: Q, rows: int, cols: int, std: float, mean: float = 0.0) -> np.ndarray:
        v = (self.rng.standard_normal((rows, cols), dtype=np.float32) * std + mean)
        return (v.astype(np.float16) if qtype == Q.F16 else v.astype(np.float32)).view(np.uint8).reshape(rows, -1)


def use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_m_types(names_shapes: list[tuple[str, tuple[int, ...]]]) -> dict[str, Q]:
    """llama.cpp's Q4_K_M choice per tensor (see the module docstring)."""
    n_v = sum(n.endswith("attn_v.weight") for n, _ in names_shapes)
    n_down = sum(n.endswith("ffn_down.weight") for n, _ in names_shapes)
    i_v = i_down = 0
    out = {}
    for name, shape in names_shapes:
        if len(shape) == 1 or name.endswith(("ssm_conv1d.weight", "norm.weight")):
            out[name] = Q.F32
            continue
        t = Q.Q4_K
        if name == "output.weight":
            t = Q.Q6_K
        elif name.endswith("attn_v.weight"):
            t = Q.Q6_K if use_more_bits(i_v, n_v) else Q.Q4_K
            i_v += 1
        elif name.endswith("ffn_down.weight"):
            t = Q.Q6_K if use_more_bits(i_down, n_down) else Q.Q4_K
            i_down += 1
        elif name.endswith("attn_qkv.weight"):
            t = Q.Q5_K
        if shape[-1] % 256:
            t = Q.Q8_0 if shape[-1] % 32 == 0 else Q.F32
        out[name] = t
    return out


# ----------------------------------------------------------------------------------------------------
# tensor lists
# ----------------------------------------------------------------------------------------------------
def qwen35_tensor_shapes(cfg: Qwen35Config) -> list[tuple[str, tuple[int, ...]]]:
    """(GGUF name, PyTorch shape) of every qwen35 tensor, in llama.cpp's file order."""
    D, hv, dv = cfg.head_dim, cfg.ssm_v_heads, cfg.ssm_v_dim
    out = [("token_embd.weight", (cfg.vocab_size, cfg.dim))]
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        out.append((p + "attn_norm.weight", (cfg.dim,)))
        if cfg.is_attention(i):
            out += [(p + "attn_q.weight", (2 * cfg.n_heads * D, cfg.dim)), (p + "attn_k.weight", (cfg.n_kv_heads * D, cfg.dim)),
                    (p + "attn_v.weight", (cfg.n_kv_heads * D, cfg.dim)), (p + "attn_output.weight", (cfg.dim, cfg.n_heads * D)),
                    (p + "attn_q_norm.weight", (D,)), (p + "attn_k_norm.weight", (D,))]
        else:
            out += [(p + "attn_qkv.weight", (cfg.conv_dim, cfg.dim)), (p + "attn_gate.weight", (hv * dv, cfg.dim)),
                    (p + "ssm_beta.weight", (hv, cfg.dim)), (p + "ssm_alpha.weight", (hv, cfg.dim)),
                    (p + "ssm_a", (hv,)), (p + "ssm_dt.bias", (hv,)), (p + "ssm_conv1d.weight", (cfg.conv_dim, cfg.conv_kernel)),
                    (p + "ssm_norm.weight", (dv,)), (p + "ssm_out.weight", (cfg.dim, hv * dv))]
        out += [(p + "post_attention_norm.weight", (cfg.dim,)), (p + "ffn_gate.weight", (cfg.ffn_dim, cfg.dim)),
                (p + "ffn_up.weight", (cfg.ffn_dim, cfg.dim)), (p + "ffn_down.weight", (cfg.dim, cfg.ffn_dim))]
    out += [("output_norm.weight", (cfg.dim,)), ("output.weight", (cfg.vocab_size, cfg.dim))]
    return out


def dense_tensor_shapes(s: DenseShape) -> list[tuple[str, tuple[int, ...]]]:
    hd = s.dim // s.n_heads
    out = [("token_embd.weight", (s.vocab_size, s.dim))]
    for i in range(s.n_layers):
        p = f"blk.{i}."
        out += [(p + "attn_norm.weight", (s.dim,)), (p + "attn_q.weight", (s.dim, s.dim)), (p + "attn_q.bias", (s.dim,)),
                (p + "attn_k.weight", (s.n_kv_heads * hd, s.dim)), (p + "attn_k.bias", (s.n_kv_heads * hd,)),
                (p + "attn_v.weight", (s.n_kv_heads * hd, s.dim)), (p + "attn_v.bias", (s.n_kv_heads * hd,)),
                (p + "attn_output.weight", (s.dim, s.dim)), (p + "ffn_norm.weight", (s.dim,)),
                (p + "ffn_gate.weight", (s.ffn_dim, s.dim)), (p + "ffn_up.weight", (s.ffn_dim, s.dim)),
                (p + "ffn_down.weight", (s.dim, s.ffn_dim))]
    out += [("output_norm.weight", (s.dim,)), ("output.weight", (s.vocab_size, s.dim))]
    return out


def _random_specs(shapes, types: dict[str, Q], maker: BlockMaker, gain: float) -> list[TensorSpec]:
    specs = []
    for name, shape in shapes:
        qt = types[name]
        rows, cols = (shape[0], shape[1]) if len(shape) == 2 else (1, shape[0])
        if name.endswith("norm.weight"):
            mean, std = 1.0, 0.0
        elif name.endswith("ssm_a"):
            mean, std = -1.25, 0.4                                  # -exp(A_log) in about [-2, -0.5]
        elif name.endswith("ssm_dt.bias"):
            mean, std = 1.0, 0.2
        elif name.endswith(".bias"):
            mean, std = 0.0, 0.02
        elif name.endswith("ssm_conv1d.weight"):
            mean, std = 0.0, 0.5
        elif name == "token_embd.weight":
            mean, std = 0.0, 1.0
        else:
            mean, std = 0.0, gain / math.sqrt(cols)

        def make(r0, r1, qt=qt, cols=cols, mean=mean, std=std):
            if qt in (Q.F32, Q.F16):
                return maker.floats(qt, r1 - r0, cols, std, mean)
            return maker.quant(qt, r1 - r0, cols, std)
        specs.append(TensorSpec(name, tuple(shape), qt, make))
    return specs


def synth_metadata(preset: str, cfg, vocab: int) -> dict:
    if isinstance(cfg, DenseShape):
        hd = cfg.dim // cfg.n_heads
        md = {"qwen2.block_count": cfg.n_layers, "qwen2.context_length": cfg.context_length,
              "qwen2.embedding_length": cfg.dim, "qwen2.feed_forward_length": cfg.ffn_dim,
              "qwen2.attention.head_count": cfg.n_heads, "qwen2.attention.head_count_kv": cfg.n_kv_heads,
              "qwen2.rope.freq_base": 1e6, "qwen2.attention.layer_norm_rms_epsilon": 1e-6,
              "qwen2.rope.dimension_count": hd}
    else:
        md = cfg.gguf_metadata()
    md.update({"general.name": f"dflash24-synthetic-{preset}", "general.file_type": 15})   # 15 = MOSTLY_Q4_K_M
    md.update(tokenizer_metadata(vocab))
    return md


def write_preset(preset: str, out: str, seed: int = 0, gain: float = 0.5, device: str | None = None,
                 progress: bool = False) -> str:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    cfg = PRESETS[preset]
    vocab = cfg.vocab_size or tiny_vocab_size()
    cfg = replace(cfg, vocab_size=vocab)
    shapes = qwen35_tensor_shapes(cfg) if isinstance(cfg, Qwen35Config) else dense_tensor_shapes(cfg)
    types = q4_k_m_types(shapes)
    specs = _random_specs(shapes, types, BlockMaker(seed, device), gain)
    arch = "qwen35" if isinstance(cfg, Qwen35Config) else "qwen2"
    return write_streaming(out, arch, synth_metadata(preset, cfg, vocab), specs, progress=progress)


# ----------------------------------------------------------------------------------------------------
# qwen35 HF tensors -> GGUF file (llama.cpp's conversion layout)
# ----------------------------------------------------------------------------------------------------
def write_qwen35_from_hf(path: str, state: dict, cfg: Qwen35Config, qtype: str = "F32",
                         vocab_metadata: dict | None = None) -> str:
    """Convert HF `Qwen3_5ForCausalLM` tensors (grouped value heads, A_log, zero-centred norms) to a qwen35
    GGUF as llama.cpp's converter lays it out. qtype: F32, F16 or Q8_0 for the 2-D weight matrices."""
    from gguf.quants import quantize

    from .models.qwen35 import hf_to_gguf_tensors
    qt = {"F32": Q.F32, "F16": Q.F16, "Q8_0": Q.Q8_0}[qtype]
    tensors = hf_to_gguf_tensors(state, cfg)
    specs = []
    for name, t in tensors.items():
        a = t.detach().float().cpu().numpy()
        a2 = a.reshape(1, -1) if a.ndim == 1 else a
        kind = Q.F32 if a.ndim == 1 or name.endswith(("ssm_conv1d.weight", "norm.weight")) else qt
        if kind == Q.Q8_0 and a2.shape[1] % 32:
            kind = Q.F32
        raw = (a2.view(np.uint8) if kind == Q.F32 else a2.astype(np.float16).view(np.uint8) if kind == Q.F16
               else quantize(a2, Q.Q8_0)).reshape(a2.shape[0], -1)
        specs.append(TensorSpec(name, tuple(a.shape), kind, lambda r0, r1, raw=raw: raw[r0:r1]))
    md = cfg.gguf_metadata()
    md["general.name"] = "hf-converted-qwen35"
    md.update(vocab_metadata if vocab_metadata is not None else tokenizer_metadata(cfg.vocab_size))
    return write_streaming(path, "qwen35", md, specs)


# ----------------------------------------------------------------------------------------------------
# check
# ----------------------------------------------------------------------------------------------------
def check(path: str, n_tokens: int = 8, device: str | None = None) -> dict:
    """Load FILE, prefill a few tokens, decode 2 more; report whether every logit is finite."""
    import torch

    from .gguf.reader import GGUFFile
    from .models import load_target
    from .models.layers import Step
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    gf = GGUFFile(path)
    t0 = time.time()
    model = load_target(gf, dev, dtype, max_positions=256)
    cache = model.new_cache(256, dtype, dev)
    load_s = time.time() - t0
    ids = torch.randint(0, 256, (n_tokens,), device=dev)
    with torch.inference_mode():
        h, _ = model(ids, Step.sequential(0, n_tokens, device=dev), cache)
        logits = [model.logits(h)]
        tok = logits[-1][-1:].argmax(-1)
        for j in range(2):
            h, _ = model(tok, Step.sequential(n_tokens + j, 1, device=dev), cache)
            logits.append(model.logits(h))
            tok = logits[-1].argmax(-1)
    allv = torch.cat(logits)
    return {"file": path, "arch": gf.arch, "device": str(dev), "load_s": round(load_s, 2),
            "finite": bool(torch.isfinite(allv).all()), "logit_std": float(allv.float().std()),
            "logit_absmax": float(allv.float().abs().max()), "argmax": allv.argmax(-1).tolist()}


def main(argv: Iterable[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dflash24.synth", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS))
    ap.add_argument("--out", help="output GGUF path")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gain", type=float, default=0.5, help="weight std = gain / sqrt(fan_in)")
    ap.add_argument("--device", default=None, help="generate random bytes on this torch device (e.g. cuda)")
    ap.add_argument("--check", metavar="FILE", help="run a short forward of FILE and report finite logits")
    args = ap.parse_args(list(argv) if argv is not None else None)
    if args.check:
        rep = check(args.check, device=args.device)
        print(json.dumps(rep))
        return 0 if rep["finite"] else 1
    if not args.preset or not args.out:
        ap.error("give --preset and --out (or --check FILE)")
    dev = args.device
    if dev is None:
        try:
            import torch
            dev = "cuda" if torch.cuda.is_available() else None
        except ImportError:
            dev = None
    t0 = time.time()
    write_preset(args.preset, args.out, args.seed, args.gain, dev, progress=True)
    print(json.dumps({"out": args.out, "bytes": os.path.getsize(args.out), "seconds": round(time.time() - t0, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
