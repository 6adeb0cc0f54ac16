"""--embed-on-host: token_embd rows stay in pinned host memory (CUDA) and only looked-up rows cross PCIe.

CPU: the flag reaches the embedding loader from the command line and the engine, and generation is
unchanged (on CPU the table stays where it is). GPU (-m gpu): the table is in pinned host memory, holds no
device bytes, and greedy output equals the on-device table's.
"""
from __future__ import annotations

import pytest
import torch

from dflash24.cli import build_parser, engine_config
from dflash24.config import EngineConfig, SamplingParams
from dflash24.engine import Engine
from dflash24.quant import linear


def _greedy(engine: Engine, n: int = 12) -> list[int]:
    ids = engine.encode_raw("the quick brown fox")
    out = []
    for ev in engine.generate(ids, SamplingParams(max_tokens=n, temperature=0.0)):
        out += ev.token_ids
    return out


def test_flag_reaches_the_embedding(tiny_qwen2_gguf, monkeypatch):
    args = build_parser().parse_args(["run", "--model", str(tiny_qwen2_gguf), "--embed-on-host", "hi"])
    assert engine_config(args).embed_on_host is True
    assert engine_config(build_parser().parse_args(["run", "hi"])).embed_on_host is False

    seen = []
    real = linear.QuantEmbedding.from_gguf.__func__

    def spy(cls, info, device, compute_dtype=torch.float32, host=False):
        seen.append((info.name, host))
        return real(cls, info, device, compute_dtype, host)

    monkeypatch.setattr(linear.QuantEmbedding, "from_gguf", classmethod(spy))
    base = _greedy(Engine(EngineConfig(model=str(tiny_qwen2_gguf), ctx=128, device="cpu")))
    hosted = _greedy(Engine(EngineConfig(model=str(tiny_qwen2_gguf), ctx=128, device="cpu", embed_on_host=True)))
    assert seen == [("token_embd.weight", False), ("token_embd.weight", True)]
    assert hosted == base


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_host_table_on_cuda(tiny_qwen2_gguf):
    base = Engine(EngineConfig(model=str(tiny_qwen2_gguf), ctx=128, device="cuda"))
    hosted = Engine(EngineConfig(model=str(tiny_qwen2_gguf), ctx=128, device="cuda", embed_on_host=True))
    emb = hosted.model.token_embd
    assert emb.host and emb.table.is_pinned() and emb.nbytes == 0
    assert _greedy(hosted, 24) == _greedy(base, 24)
