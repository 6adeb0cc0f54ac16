"""`inspect` / `format_inspect` on a small written file (and the real default model when installed)."""
import json

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from dflash24.gguf.reader import GGUFError
from dflash24.gguf.writer import random_blocks, write_gguf
from dflash24.inspect_gguf import format_inspect, inspect


def test_inspect_small(tmp_path):
    meta = {"general.architecture": "qwen2", "general.name": "tiny", "general.file_type": 15,
            "qwen2.block_count": 1, "qwen2.embedding_length": 64, "qwen2.feed_forward_length": 128,
            "qwen2.attention.head_count": 4, "qwen2.attention.head_count_kv": 2, "qwen2.context_length": 4096,
            "qwen2.rope.freq_base": 1e6, "qwen2.attention.layer_norm_rms_epsilon": 1e-6,
            "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": ["a", "b", "c"],
            "tokenizer.ggml.eos_token_id": 2}
    rng = np.random.default_rng(0)
    tensors = [("token_embd.weight", random_blocks((3, 256), Q.Q4_K, rng), Q.Q4_K, (3, 256)),
               ("blk.0.ffn_down.weight", random_blocks((2, 256), Q.Q6_K, rng), Q.Q6_K, (2, 256)),
               ("output_norm.weight", np.ones(64, np.float32), Q.F32, (64,))]
    d = inspect(write_gguf(tmp_path / "t.gguf", meta, tensors))
    json.dumps(d)                                                   # plain data
    assert d["architecture"] == "qwen2" and d["layers"] == 1 and d["head_dim"] == 16
    assert d["file_type"] == "Q4_K_M" and d["vocab_size"] == 3 and d["eos_token_id"] == 2
    assert d["tensor_count"] == 3 and d["parameters"] == 3 * 256 + 2 * 256 + 64
    assert d["tensor_types"]["Q4_K"] == {"count": 1, "bytes": 3 * 144, "elements": 768}
    assert d["tensor_types"]["Q6_K"]["bytes"] == 2 * 210 and d["tensor_types"]["F32"]["bytes"] == 256
    assert d["weight_bytes"] == 3 * 144 + 2 * 210 + 256
    assert list(d["tensor_types"]) == ["Q4_K", "Q6_K", "F32"]        # largest first
    text = format_inspect(d)
    assert "qwen2" in text and "Q4_K_M" in text and "4 / 2 x 16" in text and "Q6_K" in text
    assert "attention.layer_norm_rms_epsilon" in text


def test_inspect_bad_file(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"nope")
    with pytest.raises(GGUFError, match="not a GGUF"):
        inspect(tmp_path / "x.gguf")


def test_inspect_default_model():
    from dflash24.default_model import DefaultModelError, default_model_path
    try:
        path = default_model_path()
    except DefaultModelError as e:
        pytest.skip(str(e))
    d = inspect(path)
    assert (d["layers"], d["embedding_length"], d["head_count"], d["head_count_kv"], d["vocab_size"]) == (24, 896, 14, 2, 151936)
    assert d["tensor_count"] == 291 and d["weight_bytes"] < d["file_bytes"]
    assert "Q5_0" in format_inspect(d)
