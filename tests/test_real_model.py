"""The embedded default (Qwen2.5-Coder-0.5B-Instruct Q4_K_M from PyPI) generates exactly what HF transformers
generates when it loads the same GGUF (`from_pretrained(..., gguf_file=...)`): 64 greedy tokens, 5 prompts,
one of them through the chat template."""
from __future__ import annotations

import os

import pytest
import torch

from dflash24.config import EngineConfig, SamplingParams
from dflash24.engine import Engine

transformers = pytest.importorskip("transformers")

PROMPTS = [
    "def fibonacci(n):\n",
    "The capital of France is",
    "Question: A farmer has 17 sheep and buys 5 more. How many sheep does he have?\nAnswer: ",
    "// Binary search in C\nint bsearch(const int *a, int n, int key) {",
]
CHAT = [{"role": "user", "content": "Write a haiku about GPUs."}]
N_NEW = 64


@pytest.fixture(scope="module")
def hf_model(default_gguf_path):
    pytest.importorskip("accelerate")
    d, f = os.path.split(default_gguf_path)
    return transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def engine(default_gguf_path):
    return Engine(EngineConfig(model=default_gguf_path, device="cpu", ctx=512))


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                             pad_token_id=0, min_new_tokens=n)
    return out[0, len(ids):].tolist()


def test_greedy_equals_transformers(engine, hf_model):
    params = SamplingParams(max_tokens=N_NEW, ignore_eos=True)
    cases = [engine.encode_raw(p) for p in PROMPTS] + [engine.encode_chat(CHAT)]
    for ids in cases:
        ours = [t for ev in engine.generate(ids, params) for t in ev.token_ids]
        ref = hf_greedy(hf_model, ids, N_NEW)
        assert len(ours) == N_NEW
        assert ours == ref, f"prompt {engine.tokenizer.decode(ids)!r}:\nours {engine.tokenizer.decode(ours)!r}\n" \
                            f"hf   {engine.tokenizer.decode(ref)!r}"


def test_chat_answer_is_sensible_and_stops(engine):
    ids = engine.encode_chat([{"role": "user", "content": "What is 2+2? Answer with one number."}])
    events = list(engine.generate(ids, SamplingParams(max_tokens=32)))
    text = "".join(e.text for e in events)
    assert "4" in text
    assert events[-1].finish_reason == "stop"          # <|im_end|> ends the turn
    assert events[-1].stats.completion_tokens < 32
