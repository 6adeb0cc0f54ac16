"""On a GPU: a real GGUF generates, greedily, what HF transformers generates from the same file on the same GPU.

The engine runs with fp32 activations and one-token matmuls on the tl.dot path (no int8 activation rounding);
HF runs in fp32. The two still round differently (block kernels vs dequantized cuBLAS, Triton attention vs
SDPA), so the check is: every prompt's 64 tokens are identical, or the first token where they part is a
near-tie of the reference (its top-two logits within NEAR_TIE). The model: DFLASH24_TEST_GGUF (e.g. the 1.5B
carried to the device machine), else the embedded 0.5B. `python -m pytest -m gpu tests/test_real_model_gpu.py -s`
prints one JSON line for BENCHMARKS.md.
"""
from __future__ import annotations

import json
import os

import pytest
import torch

from test_real_model import CHAT, N_NEW, PROMPTS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
transformers = pytest.importorskip("transformers")
NEAR_TIE = 0.1


@pytest.fixture(scope="module")
def path():
    p = os.environ.get("DFLASH24_TEST_GGUF")
    if p:
        return p
    from dflash24.default_model import DefaultModelError, default_model_path
    try:
        return str(default_model_path())
    except DefaultModelError as e:
        pytest.skip(str(e))


def test_greedy_equals_transformers_on_gpu(path, monkeypatch):
    from dflash24.config import EngineConfig, SamplingParams
    from dflash24.engine import Engine
    from dflash24.quant import kernels
    monkeypatch.setattr(kernels, "DECODE_MATMUL", "dot")
    eng = Engine(EngineConfig(model=path, device="cuda", ctx=512, dtype="float32"))
    d, f = os.path.split(path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).cuda().eval()
    params = SamplingParams(max_tokens=N_NEW, ignore_eos=True)
    report = {"model": f, "prompts": 0, "identical": 0, "parted_at": [], "reference_margin_there": []}
    for ids in [eng.encode_raw(p) for p in PROMPTS] + [eng.encode_chat(CHAT)]:
        ours = [t for ev in eng.generate(ids, params) for t in ev.token_ids]
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids], device="cuda"), max_new_tokens=N_NEW, do_sample=False,
                              eos_token_id=None, pad_token_id=0, min_new_tokens=N_NEW)
        ref = out[0, len(ids):].tolist()
        report["prompts"] += 1
        i = next((j for j, (a, b) in enumerate(zip(ours, ref)) if a != b), None)
        if i is None:
            report["identical"] += 1
            continue
        with torch.no_grad():                           # the reference's own logits where the two parted
            logits = hf(torch.tensor([ids + ref[:i]], device="cuda")).logits[0, -1].float()
        top2 = logits.topk(2).values
        margin = float(top2[0] - top2[1])
        report["parted_at"].append(i)
        report["reference_margin_there"].append(round(margin, 4))
        assert margin < NEAR_TIE, (f"parted at token {i} where the reference's margin is {margin:.3f}: "
                                   f"ours {eng.tokenizer.decode(ours[i:i + 8])!r}, hf {eng.tokenizer.decode(ref[i:i + 8])!r}")
    print(json.dumps(report))
