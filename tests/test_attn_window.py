"""--attn-window N: the target's full-attention layers see only the last N positions.

It changes the model's output once the context is longer than N (and only then), and speculative decoding
stays lossless against AR decoding with the same window (chain and tree, dense and hybrid targets).
"""
from __future__ import annotations

import pytest
import torch

from dflash24.cli import build_parser, engine_config
from dflash24.config import ConfigError, EngineConfig, SamplingParams
from dflash24.engine import Engine
from dflash24.gguf.reader import GGUFFile
from dflash24.models import load_target
from dflash24.models.drafter import make_random_drafter_dir
from dflash24.models.layers import Step

PROMPT = "the cat sat on the mat and then the dog ran after it, " * 2


@pytest.fixture(scope="module", params=["qwen2", "qwen35"])
def target(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("w") / f"{request.param}.gguf"
    if request.param == "qwen2":
        from conftest import write_tiny_qwen2_gguf
        return str(write_tiny_qwen2_gguf(path, n_layers=4, seed=5))
    from dflash24.synth import write_preset
    return write_preset("qwen35-tiny", str(path), seed=5)


def test_flag_and_validation():
    assert engine_config(build_parser().parse_args(["run", "--attn-window", "64", "hi"])).attn_window == 64
    assert engine_config(build_parser().parse_args(["run", "hi"])).attn_window == 0
    with pytest.raises(ConfigError, match="--attn-window must be 0 .off. or at least 32"):
        EngineConfig(attn_window=8)
    with pytest.raises(ConfigError, match="deeper than a DDTree"):
        EngineConfig(attn_window=40, ddtree_budget=60)


def test_window_changes_only_tokens_beyond_it(target):
    """Prefill logits of 70 tokens: equal to full attention for the first N positions, different after."""
    model = load_target(GGUFFile(target), "cpu", torch.float32, 256)
    ids = torch.randint(0, model.cfg.vocab_size, (70,), generator=torch.Generator().manual_seed(1))

    def logits(window):
        model.attn_window = window
        cache = model.new_cache(128, torch.float32, "cpu")
        h, _ = model(ids, Step.sequential(0, 70), cache)
        return model.logits(h)

    full, win = logits(0), logits(32)
    torch.testing.assert_close(win[:32], full[:32], rtol=0, atol=1e-5)
    assert (win[32:] - full[32:]).abs().amax(-1).min() > 1e-4      # every later position sees fewer keys
    torch.testing.assert_close(logits(70), full, rtol=0, atol=1e-5)  # a window covering everything cuts nothing


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_speculation_stays_lossless_with_a_window(target, mode, tmp_path_factory):
    cfg = load_target(GGUFFile(target), "cpu", torch.float32, 64).cfg
    draft = str(make_random_drafter_dir(tmp_path_factory.mktemp("d") / "draft", cfg, 2, dtype=torch.float32,
                                        target_layer_ids=(0, 2)))
    params = SamplingParams(max_tokens=40, temperature=0.0)

    def run(**kw):
        e = Engine(EngineConfig(model=target, device="cpu", ctx=256, attn_window=32, **kw))
        ids = e.encode_raw(PROMPT)
        assert len(ids) > 32                          # the window cuts from the first generated token on
        return [t for ev in e.generate(ids, params) for t in ev.token_ids]

    ar = run(spec="ar")
    assert len(ar) >= 5
    assert run(spec=mode, draft=draft) == ar
