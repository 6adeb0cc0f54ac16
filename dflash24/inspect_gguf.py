"""`dflash24 inspect FILE.gguf`: what a GGUF file holds (architecture, shape, tokenizer, tensor types)."""
from __future__ import annotations

import os
from typing import Any

from .gguf.reader import GGUFFile

# GGUF `general.file_type` (llama.cpp's llama_ftype) -> name, for the common ones.
_FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
               12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
               19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
               26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
               36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4"}


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def inspect(path: str | os.PathLike) -> dict[str, Any]:
    """A summary of a GGUF file as plain data (JSON-serialisable). Raises GGUFError for a bad file."""
    gf = GGUFFile(path)
    g = gf.get
    heads = g("attention.head_count")
    emb = g("embedding_length")
    head_dim = g("attention.key_length") or (emb // heads if isinstance(emb, int) and isinstance(heads, int) and heads else None)
    tokens = g("tokenizer.ggml.tokens")
    vocab = len(tokens) if isinstance(tokens, list) else None
    if vocab is None and "token_embd.weight" in gf.tensors:
        vocab = gf.tensors["token_embd.weight"].shape[0]
    by_type: dict[str, dict[str, int]] = {}
    n_elements = 0
    for t in gf.tensors.values():
        e = by_type.setdefault(t.qtype.name, {"count": 0, "bytes": 0, "elements": 0})
        e["count"] += 1
        e["bytes"] += t.n_bytes
        e["elements"] += t.n_elements
        n_elements += t.n_elements
    weight_bytes = gf.weight_bytes()
    file_type = g("general.file_type")
    prefix = gf.arch + "."
    hyper = {k[len(prefix):]: v for k, v in gf.metadata.items()
             if k.startswith(prefix) and not isinstance(v, list)}
    return {
        "path": gf.path,
        "file_bytes": gf.file_size,
        "gguf_version": gf.version,
        "architecture": gf.arch,
        "name": g("general.name"),
        "size_label": g("general.size_label"),
        "file_type": _FILE_TYPES.get(file_type, file_type),
        "layers": g("block_count"),
        "embedding_length": emb,
        "feed_forward_length": g("feed_forward_length"),
        "head_count": heads,
        "head_count_kv": g("attention.head_count_kv"),
        "head_dim": head_dim,
        "context_length": g("context_length"),
        "rope_freq_base": g("rope.freq_base"),
        "vocab_size": vocab,
        "tokenizer": g("tokenizer.ggml.model"),
        "pre_tokenizer": g("tokenizer.ggml.pre"),
        "eos_token_id": g("tokenizer.ggml.eos_token_id"),
        "chat_template": bool(g("tokenizer.chat_template")),
        "tensor_count": len(gf.tensors),
        "parameters": n_elements,
        "weight_bytes": weight_bytes,
        "bits_per_weight": round(weight_bytes * 8 / n_elements, 3) if n_elements else None,
        "tensor_types": dict(sorted(by_type.items(), key=lambda kv: -kv[1]["bytes"])),
        "hyperparameters": hyper,
    }


def format_inspect(d: dict[str, Any]) -> str:
    """The summary from `inspect` as an aligned, readable table."""
    def show(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:g}"
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10_000:
            return f"{v:,}"
        return str(v)

    rows = [
        ("file", f"{d['path']} ({_bytes(d['file_bytes'])}, GGUF v{d['gguf_version']})"),
        ("architecture", d["architecture"]),
        ("name", d["name"]),
        ("file type", d["file_type"]),
        ("layers", d["layers"]),
        ("hidden / FFN", f"{show(d['embedding_length'])} / {show(d['feed_forward_length'])}"),
        ("heads (q / kv) x dim", f"{show(d['head_count'])} / {show(d['head_count_kv'])} x {show(d['head_dim'])}"),
        ("context length", d["context_length"]),
        ("rope base", d["rope_freq_base"]),
        ("vocabulary", f"{show(d['vocab_size'])} ({show(d['tokenizer'])}, pre {show(d['pre_tokenizer'])}, eos {d['eos_token_id'] if d['eos_token_id'] is not None else '-'})"),
        ("chat template", "yes" if d["chat_template"] else "no"),
        ("parameters", f"{d['parameters'] / 1e9:.3f} B" if d["parameters"] else "-"),
        ("weights", f"{_bytes(d['weight_bytes'])} in {d['tensor_count']} tensors, {show(d['bits_per_weight'])} bits/weight"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {show(v)}" for k, v in rows]
    if d["tensor_types"]:
        lines.append("")
        lines.append(f"{'type':<8} {'tensors':>8} {'bytes':>12} {'share':>7}")
        total = d["weight_bytes"] or 1
        for name, e in d["tensor_types"].items():
            lines.append(f"{name:<8} {e['count']:>8} {_bytes(e['bytes']):>12} {100 * e['bytes'] / total:>6.1f}%")
    extra = {k: v for k, v in d["hyperparameters"].items()
             if k not in ("block_count", "embedding_length", "feed_forward_length", "attention.head_count",
                          "attention.head_count_kv", "context_length", "rope.freq_base")}
    if extra:
        lines.append("")
        lines.append("other hyperparameters:")
        w = max(len(k) for k in extra)
        lines.extend(f"  {k:<{w}}  {show(v)}" for k, v in sorted(extra.items()))
    return "\n".join(lines)
