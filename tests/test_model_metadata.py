"""Broken or hostile model metadata: every field a model is sized by is checked when its config is read, and a
bad one is a GGUFError / DrafterError naming the key and the value, never a Python error from deep inside
the loader or an allocation sized by a huge count."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from dflash24 import cli, synth
from dflash24.gguf.reader import GGUFError, GGUFFile
from dflash24.gguf.writer import write_gguf
from dflash24.models.dense import DenseConfig
from dflash24.models.drafter import DFlashConfig, DFlashDrafter, DrafterError, make_random_drafter_dir
from dflash24.models.qwen35 import Qwen35Config


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("metadata")
    return {p: synth.write_preset(p, str(d / f"{p}.gguf")) for p in ("qwen2-tiny", "qwen35-tiny")}


CONFIGS = {"qwen2-tiny": DenseConfig, "qwen35-tiny": Qwen35Config}

BAD = [
    ("qwen2-tiny", "attention.head_count", 0, r"'qwen2\.attention\.head_count' is 0, expected at least 1"),
    ("qwen2-tiny", "block_count", "x", r"'qwen2\.block_count' is 'x' \(str\), expected an integer"),
    ("qwen2-tiny", "context_length", True, r"'qwen2\.context_length' is True \(bool\), expected an integer"),
    ("qwen2-tiny", "block_count", 1 << 40, r"'qwen2\.block_count' says 1099511627776 layers but the file has "
                                           r"tensors for 2"),
    ("qwen2-tiny", "feed_forward_length", -1, r"'qwen2\.feed_forward_length' is -1, expected at least 1"),
    ("qwen2-tiny", "rope.freq_base", float("nan"), r"'qwen2\.rope\.freq_base' is nan \(float\), expected a finite"),
    ("qwen2-tiny", "attention.layer_norm_rms_epsilon", "x", r"layer_norm_rms_epsilon' is 'x' \(str\)"),
    ("qwen2-tiny", "attention.head_count_kv", 3, r"'qwen2\.attention\.head_count' = 4 is not a multiple of "
                                                 r"'qwen2\.attention\.head_count_kv' = 3"),
    ("qwen2-tiny", "rope.dimension_count", 65, r"'qwen2\.rope\.dimension_count' = 65 must be even"),
    ("qwen2-tiny", "rope.dimension_count", 128, r"= 128 must be even and at most the head dimension 64"),
    ("qwen35-tiny", "block_count", 1 << 40, r"says 1099511627776 layers but the file has tensors for 8"),
    ("qwen35-tiny", "nextn_predict_layers", 8, r"8 MTP layers .* of 8 blocks leave no decoder"),
    ("qwen35-tiny", "full_attention_interval", 0, r"'qwen35\.full_attention_interval' is 0, expected at least 1"),
    ("qwen35-tiny", "ssm.group_count", 4, r"time_step_rank 6 \(value heads\) is not a multiple of "
                                          r"ssm\.group_count 4"),
    ("qwen35-tiny", "ssm.conv_kernel", [1.5], r"'qwen35\.ssm\.conv_kernel' is \[1\.5\] \(list\), expected an int"),
    ("qwen35-tiny", "rope.freq_base", float("inf"), r"'qwen35\.rope\.freq_base' is inf"),
    ("qwen35-tiny", "attention.head_count_kv", [0, 0, 0, 3], r"head_count' = 4 is not a multiple of .* = 3"),
]


@pytest.mark.parametrize("preset,key,value,match", BAD, ids=[f"{p}-{k}-{v!r}"[:60] for p, k, v, _ in BAD])
def test_bad_field_is_named(models, preset, key, value, match):
    gf = GGUFFile(models[preset])
    gf.metadata[gf.full_key(key)] = value
    with pytest.raises(GGUFError, match=match):
        CONFIGS[preset].from_gguf(gf)


def test_good_files_and_per_layer_counts(models):
    """The checks pass what real files hold: per-layer head counts (0 on DeltaNet layers) give the largest."""
    gf = GGUFFile(models["qwen35-tiny"])
    base = Qwen35Config.from_gguf(gf)
    gf.metadata["qwen35.attention.head_count_kv"] = [0, 0, 0, 2] * 2
    assert Qwen35Config.from_gguf(gf) == base
    assert DenseConfig.from_gguf(GGUFFile(models["qwen2-tiny"])).n_layers == 2


def _rewritten(path, out, **changes):
    gf = GGUFFile(path)
    metadata = dict(gf.metadata)
    metadata.update({gf.full_key(k): v for k, v in changes.items()})
    tensors = [(t.name, np.asarray(t.data), t.qtype, t.shape) for t in gf.tensors.values()]
    return write_gguf(out, metadata, tensors)


@pytest.mark.parametrize("command", ["fit", "run"])
def test_cli_refuses_with_the_reason(models, tmp_path, capsys, command):
    """A file whose head count is 0 stops `fit` and `run` with exit status 2 and one line saying why."""
    bad = _rewritten(models["qwen35-tiny"], tmp_path / "bad.gguf", **{"attention.head_count": 0})
    argv = ["fit", "--target", bad] if command == "fit" else ["run", "--model", bad, "--max-tokens", "2", "hi"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "dflash24: error:" in err and "'qwen35.attention.head_count' is 0, expected at least 1" in err
    assert "Traceback" not in err


def test_tokenizer_larger_than_the_embedding(models, tmp_path, capsys):
    """Token ids the embedding has no row for are refused when the model is opened, not at the first prompt that
    holds one (an index error on the CPU, a device-side assert that ends the process on CUDA)."""
    gf = GGUFFile(models["qwen2-tiny"])
    tokens, types = gf.metadata["tokenizer.ggml.tokens"], gf.metadata["tokenizer.ggml.token_type"]
    bad = _rewritten(models["qwen2-tiny"], tmp_path / "bad.gguf", **{"tokenizer.ggml.tokens": tokens + ["<|x|>"],
                                                                     "tokenizer.ggml.token_type": types + [3]})
    assert cli.main(["run", "--model", bad, "--max-tokens", "2", "--raw", "hi <|x|>"]) == 2
    err = capsys.readouterr().err
    assert f"the tokenizer has {len(tokens) + 1} tokens but token_embd.weight has {len(tokens)} rows" in err


TARGET = SimpleNamespace(dim=64, n_layers=12, vocab_size=300, ffn_dim=160, n_heads=4, n_kv_heads=2, head_dim=32)


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory):
    return make_random_drafter_dir(tmp_path_factory.mktemp("drafter") / "d", TARGET, 2)


@pytest.mark.parametrize("change,match", [
    ({"num_attention_heads": 0}, r"n_heads is 0, expected a positive integer"),
    ({"num_attention_heads": "x"}, r"a value has the wrong type"),
    ({"num_key_value_heads": 3}, r"4 attention heads are not a multiple of 3 KV heads"),
    ({"rms_norm_eps": -1.0}, r"norm_eps is -1\.0, expected a finite positive number"),
    ({"block_size": 1, "dflash_config": {"block_size": 1, "mask_token_id": 299, "target_layer_ids": [1, 5]}},
     r"block_size 1 is outside 2\.\.32768"),
    ({"dflash_config": {"mask_token_id": 300, "target_layer_ids": [1, 5]}}, r"mask_token_id 300 is outside"),
    ({"dflash_config": {"mask_token_id": 299, "target_layer_ids": [-1, 5]}}, r"target_layer_ids \(-1, 5\)"),
    ({"rope_parameters": 3}, r"a value has the wrong type"),
])
def test_drafter_config_fields(drafter_dir, tmp_path, change, match):
    c = json.loads((drafter_dir / "config.json").read_text())
    c.update(change)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(c))
    with pytest.raises(DrafterError, match=match):
        DFlashConfig.from_file(path)


@pytest.mark.parametrize("text,match", [("{", "not a readable JSON file"), ("[1, 2]", "holds a JSON list"),
                                        (b"\xff\xfe", "not a readable JSON file")])
def test_drafter_config_not_json(drafter_dir, tmp_path, text, match):
    d = tmp_path / "d"
    d.mkdir()
    (d / "model.safetensors").write_bytes((drafter_dir / "model.safetensors").read_bytes())
    (d / "config.json").write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(DrafterError, match=match):
        DFlashDrafter.from_pretrained(d)


def test_drafter_gguf_fields(drafter_dir, tmp_path):
    from dflash24.models.drafter import random_state_dict, save_gguf
    cfg = DFlashConfig.from_file(drafter_dir / "config.json")
    path = save_gguf(cfg, random_state_dict(cfg), tmp_path / "d.gguf")
    for key, value, match in [("block_count", 1 << 40, "says 1099511627776 layers"),
                              ("dflash.block_size", "16", r"'16' \(str\), expected an integer"),
                              ("dflash.mask_token_id", -1, "is -1, expected at least 0"),
                              ("dflash.block_size", 1 << 40, "block_size 1099511627776 is outside 2..32768"),
                              ("attention.sliding_window_pattern", 7, "does not list 2 layers")]:
        gf = GGUFFile(path)
        gf.metadata[gf.full_key(key)] = value
        with pytest.raises((GGUFError, DrafterError), match=match):       # the CLI reports either in one line
            DFlashConfig.from_gguf(gf)


def _damaged(good: bytes) -> dict[str, bytes]:
    import struct
    return {"truncated": good[:len(good) // 2], "empty": b"", "header length 2^40": struct.pack("<Q", 1 << 40) + good[8:],
            "header not JSON": good[:8] + b"{\"x\":" + good[13:]}


@pytest.mark.parametrize("damage", ["truncated", "empty", "header length 2^40", "header not JSON"])
def test_damaged_drafter_weights(drafter_dir, tmp_path, capsys, damage):
    """A drafter directory whose model.safetensors is cut short or garbled stops `run` and `quantize-draft` with
    one line naming the file (it was a SafetensorError traceback)."""
    from dflash24.quant.quantize import read_drafter
    d = tmp_path / "d"
    d.mkdir()
    (d / "config.json").write_bytes((drafter_dir / "config.json").read_bytes())
    (d / "model.safetensors").write_bytes(_damaged((drafter_dir / "model.safetensors").read_bytes())[damage])
    with pytest.raises(DrafterError, match=r"model\.safetensors: not a readable safetensors file"):
        DFlashDrafter.from_pretrained(d)
    with pytest.raises(DrafterError, match=r"model\.safetensors: not a readable safetensors file"):
        read_drafter(d)
    assert cli.main(["quantize-draft", str(d), str(tmp_path / "q.gguf"), "--type", "q8_0"]) == 2
    err = capsys.readouterr().err
    assert "model.safetensors: not a readable safetensors file" in err and "Traceback" not in err


def test_a_closed_stdout_stops_run_quietly(models, monkeypatch, capsys):
    """`dflash24 run ... | head`: when the reader goes away the command stops with status 141 (as a shell reports
    SIGPIPE) instead of a BrokenPipeError traceback."""
    import sys

    class ClosedPipe:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

        def fileno(self):
            raise ValueError("no descriptor")

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert cli.main(["run", "--model", models["qwen2-tiny"], "--raw", "--max-tokens", "4", "hello"]) == 141
    assert "Traceback" not in capsys.readouterr().err
