"""Shared test fixtures.

`tiny_qwen2_gguf` is a real, loadable GGUF of a tiny random dense qwen2 model, written once per test
session, so any test can build a real `Engine` on CPU in well under a second:

    def test_x(tiny_qwen2_gguf):
        engine = Engine(EngineConfig(model=str(tiny_qwen2_gguf), ctx=256, device="cpu"))

For other shapes, tensor types or vocabularies call `write_tiny_qwen2_gguf(path, ...)` directly.
"""
from __future__ import annotations

import math
import os
import re
import sys
import warnings
from pathlib import Path


def _row_invariant_blas() -> None:
    """The CPU tests check batch invariance bit for bit (a token's row is the same alone or in a 16-token step), and
    under Triton's interpreter tl.dot is numpy's matmul. OpenBLAS picks its sgemm kernels per CPU (or as
    OPENBLAS_CORETYPE says: this project's CPU machines set Haswell); with its Haswell and Zen kernels a row's result
    depends on where the row sits in the matrix (10 of 16 positions differ in the last bit for a 16x64 @ 64x64
    product), which no GPU kernel here does. Its Sandybridge (AVX) and SkylakeX kernels are row- and
    column-invariant on every tile shape the kernels use (16-256 rows, columns and K). OpenBLAS reads the variable
    once, when numpy loads: so it is set here, before numpy is imported (pytest imports none before this file), on
    x86 CPUs with AVX (Sandybridge's kernels run on any of them)."""
    if os.environ.get("OPENBLAS_CORETYPE", "").lower() in ("sandybridge", "skylakex"):
        return
    try:
        cpu = Path("/proc/cpuinfo").read_text()
    except OSError:
        return
    if re.search(r"^flags\s*:.*\bavx\b", cpu, re.M):
        if "numpy" in sys.modules:       # too late for this process: the bit-for-bit tests may fail, say why
            warnings.warn("numpy was imported before tests/conftest.py could set OPENBLAS_CORETYPE: the batch-"
                          "invariance tests need OPENBLAS_CORETYPE=Sandybridge in the environment on this CPU")
            return
        os.environ["OPENBLAS_CORETYPE"] = "Sandybridge"


_row_invariant_blas()

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

# Without a GPU, Triton kernels run in its interpreter. Triton reads this once, at its first import, so it is
# set here, before any test module imports a kernel.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# ChatML, as in Qwen2.5 instruct files (system message only when given; no default system prompt).
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Merges (in the GPT-2 byte alphabet, where 'Ġ' is the space byte), best first. The merged tokens follow
# the 256 byte tokens in the vocabulary; the special tokens come last.
TINY_MERGES = ("Ġ t", "h e", "i n", "Ġt he", "Ġ a", "e r", "o n", "Ġ s")
TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def byte_level_symbols() -> list[str]:
    """The 256 byte-level tokens in byte order, spelled in GPT-2's printable byte alphabet."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    out, extra = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def tiny_vocab() -> tuple[list[str], list[str], list[int]]:
    """(tokens, merges, token types) of the tiny byte-level BPE vocabulary: 256 bytes (type 1, normal),
    one token per merge (normal), then `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` (type 3, control)."""
    tokens = byte_level_symbols() + [m.replace(" ", "") for m in TINY_MERGES] + list(TINY_SPECIAL_TOKENS)
    types = [1] * (len(tokens) - len(TINY_SPECIAL_TOKENS)) + [3] * len(TINY_SPECIAL_TOKENS)
    return tokens, list(TINY_MERGES), types


def write_tiny_qwen2_gguf(path, *, n_layers: int = 2, dim: int = 64, n_heads: int = 4, n_kv_heads: int = 2,
                          ffn_dim: int = 128, context_length: int = 2048, qtype: str = "F32", seed: int = 0,
                          chat_template: str | None = CHATML_TEMPLATE, tied_output: bool = False,
                          arch: str = "qwen2") -> Path:
    """Write a random qwen2 (q/k/v biases) or llama (no biases, interleaved rotary) model with llama.cpp's
    tensor names and tokenizer metadata to `path`.

    qtype: 'F32', 'F16' or 'Q8_0' for the 2-D weight matrices (norms and biases stay F32, as llama.cpp
    writes them). Weights are N(0, 0.02) (norm weights 1), so logits are small and sampling is spread out.
    eos is `<|im_end|>`; `<|endoftext|>` is also an end token (control type). Returns the path.
    """
    import gguf

    path = Path(path)
    rng = np.random.default_rng(seed)
    tokens, merges, types = tiny_vocab()
    vocab, head_dim = len(tokens), dim // n_heads
    qt = {"F32": gguf.GGMLQuantizationType.F32, "F16": gguf.GGMLQuantizationType.F16,
          "Q8_0": gguf.GGMLQuantizationType.Q8_0}.get(qtype)
    if qt is None:
        raise ValueError(f"qtype must be F32, F16 or Q8_0, got {qtype!r}")

    if arch not in ("qwen2", "llama"):
        raise ValueError(f"arch must be qwen2 or llama, got {arch!r}")
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-random-{arch}")
    w.add_block_count(n_layers)
    w.add_context_length(context_length)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn_dim)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv_heads)
    w.add_rope_freq_base(1_000_000.0 if arch == "qwen2" else 10_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(int({"F32": 0, "F16": 1, "Q8_0": 7}[qtype]))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    if chat_template is not None:
        w.add_chat_template(chat_template)

    def matrix(name, rows, cols):
        a = (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)
        if qt == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, a)
        elif qt == gguf.GGMLQuantizationType.F16:
            w.add_tensor(name, a.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(a, qt), raw_dtype=qt)

    def vector(name, n, ones=False):
        v = np.ones(n, np.float32) if ones else (rng.standard_normal(n) * 0.02).astype(np.float32)
        w.add_tensor(name, v)

    matrix("token_embd.weight", vocab, dim)
    for i in range(n_layers):
        p = f"blk.{i}."
        vector(p + "attn_norm.weight", dim, ones=True)
        matrix(p + "attn_q.weight", n_heads * head_dim, dim)
        if arch == "qwen2":
            vector(p + "attn_q.bias", n_heads * head_dim)
        matrix(p + "attn_k.weight", n_kv_heads * head_dim, dim)
        if arch == "qwen2":
            vector(p + "attn_k.bias", n_kv_heads * head_dim)
        matrix(p + "attn_v.weight", n_kv_heads * head_dim, dim)
        if arch == "qwen2":
            vector(p + "attn_v.bias", n_kv_heads * head_dim)
        matrix(p + "attn_output.weight", dim, n_heads * head_dim)
        vector(p + "ffn_norm.weight", dim, ones=True)
        matrix(p + "ffn_gate.weight", ffn_dim, dim)
        matrix(p + "ffn_up.weight", ffn_dim, dim)
        matrix(p + "ffn_down.weight", dim, ffn_dim)
    vector("output_norm.weight", dim, ones=True)
    if not tied_output:
        matrix("output.weight", vocab, dim)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="session")
def tiny_qwen2_gguf(tmp_path_factory) -> Path:
    """Path of a tiny random qwen2 GGUF (2 layers, dim 64, 4 heads, 2 kv heads, ffn 128, F32 weights,
    264-token byte-level BPE vocabulary with ChatML specials, eos `<|im_end|>`, ChatML chat template)."""
    return write_tiny_qwen2_gguf(tmp_path_factory.mktemp("tiny") / "tiny-qwen2-f32.gguf")


@pytest.fixture(scope="session")
def tiny_qwen2_q8_gguf(tmp_path_factory) -> Path:
    """The same tiny model with Q8_0 weight matrices."""
    return write_tiny_qwen2_gguf(tmp_path_factory.mktemp("tiny") / "tiny-qwen2-q8_0.gguf", qtype="Q8_0")


def spread_qwen35_hf_params(model: torch.nn.Module) -> None:
    """Give every parameter of a random transformers Qwen3.5 model a distinct spread, so that no convention
    (HF's 1 + w norms vs the plain DeltaNet output norm, A_log, dt_bias, conv) can hide in a parity test."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))               # plain weight (init 1)
            elif "norm" in name:
                p.normal_(0, 0.2)                                    # zero-centred: HF uses 1 + w
            elif name.endswith("A_log"):
                p.uniform_(-1.0, 1.0)
            elif name.endswith("dt_bias"):
                p.normal_(0, 0.5)
            elif "conv1d" in name:
                p.normal_(0, 0.4)
            elif "embed_tokens" in name:
                p.normal_(0, 1.0)
            else:
                p.normal_(0, 1.0 / math.sqrt(p.shape[-1]))


@pytest.fixture(scope="module")
def default_gguf_path():
    """The embedded default model's GGUF (skips where it is not installed and cannot be fetched)."""
    from dflash24.default_model import DefaultModelError, default_model_path
    try:
        return default_model_path()
    except DefaultModelError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def hf_default_tokenizer(default_gguf_path):
    """transformers' tokenizer read from the same GGUF, the reference for ours."""
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(os.path.dirname(default_gguf_path),
                                                      gguf_file=os.path.basename(default_gguf_path))
