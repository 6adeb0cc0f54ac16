"""qwen35 on CUDA (run with `pytest -m gpu`): Triton recurrent kernel at the real head shapes, the tiny
model in bf16 on the GPU against fp32 on the CPU, and CUDA-graph decode == eager decode."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_triton_kernel_real_shapes():
    from dflash24.kernels import deltanet as dn
    gen = torch.Generator().manual_seed(0)
    for T in (1, 16, 23):
        q = dn.l2norm(torch.randn(T, 16, 128, generator=gen)) * 128 ** -0.5
        k = dn.l2norm(torch.randn(T, 16, 128, generator=gen))
        v, g = torch.randn(T, 48, 128, generator=gen), -torch.rand(T, 48, generator=gen)
        beta, s0 = torch.rand(T, 48, generator=gen), torch.randn(48, 128, 128, generator=gen) * 0.1
        s_ref = s0.clone()
        o_ref = dn.recurrent_ref(q, k, v, g, beta, s_ref)
        s_gpu = s0.cuda()
        o = dn.recurrent_triton(q.cuda(), k.cuda(), v.cuda(), g.cuda(), beta.cuda(), s_gpu)
        torch.testing.assert_close(o.cpu(), o_ref, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(s_gpu.cpu(), s_ref, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from dflash24 import synth
    return synth.write_preset("qwen35-tiny", str(tmp_path_factory.mktemp("g") / "tiny.gguf"))


def test_bf16_gpu_matches_fp32_cpu_and_graph_decode(tiny):
    from dflash24.gguf.reader import GGUFFile
    from dflash24.models.qwen35 import Qwen35Model
    from dflash24.runner import TargetRunner
    gf = GGUFFile(tiny)
    ids = torch.randint(0, 256, (100,), generator=torch.Generator().manual_seed(0))
    cpu = Qwen35Model.from_gguf(gf, "cpu", torch.float32, 512)
    gpu = Qwen35Model.from_gguf(gf, "cuda", torch.bfloat16, 512)
    runs = {}
    for name, model, dev, graphs in (("cpu", cpu, "cpu", False), ("eager", gpu, "cuda", False), ("graph", gpu, "cuda", True)):
        cache = model.new_cache(512, torch.float32 if dev == "cpu" else torch.bfloat16, dev)
        r = TargetRunner(model, cache, torch.device(dev), graphs)
        logits = r.prefill(ids.to(dev), 0, 32)
        first = logits.float().cpu()
        toks, pos = [], ids.shape[0]
        tok = logits.argmax(-1).view(1)
        for _ in range(16):
            toks.append(int(tok))
            logits, _ = r.decode(tok, pos)
            tok = logits.argmax(-1).view(1)
            pos += 1
        runs[name] = (toks, cache, first)
    assert runs["graph"][0] == runs["eager"][0]                        # graph replay == eager, token for token
    torch.testing.assert_close(runs["graph"][1].ssm, runs["eager"][1].ssm, rtol=1e-3, atol=1e-3)
    cos = torch.nn.functional.cosine_similarity(runs["eager"][2], runs["cpu"][2]).item()
    assert cos > 0.99, f"bf16 GPU vs fp32 CPU last-token logits: cosine {cos:.4f}"


@pytest.mark.parametrize("tile", [("chain", 16), ("tree", 23)])
def test_tile_prefill_graphs_match_the_eager_prefill(tiny, tile):
    """Short prompts prefilled as CUDA-graph replays of the verify step (runner.TILE_PREFILL_MAX): the same next
    token and near-equal logits / DeltaNet state as the eager chunks, and a replay gives the bits of the first
    (eager, captured) run; a prompt that continues the sequence (the prefix cache's case) as well."""
    from dflash24.gguf.reader import GGUFFile
    from dflash24.models.qwen35 import Qwen35Model
    from dflash24.runner import TargetRunner
    model = Qwen35Model.from_gguf(GGUFFile(tiny), "cuda", torch.bfloat16, 256)
    ids = torch.randint(0, 256, (120,), generator=torch.Generator().manual_seed(5)).cuda()
    out = {}
    for tiles in (False, True):
        cache = model.new_cache(256, torch.bfloat16, "cuda", max_spec_tokens=32, max_tree_nodes=32)
        r = TargetRunner(model, cache, torch.device("cuda"), True)
        r.tile = tile if tiles else None
        assert bool(r.prefill_tile_count(100, 0)) == tiles
        runs = []
        for _ in range(2):                  # the first run captures the graphs, the second replays them
            a = r.prefill(ids[:100], 0, 64).float().clone()
            b = r.prefill(ids[100:120], 100, 64).float().clone()
            runs.append((torch.cat([a, b]), r.cache.ssm.clone()))
        assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
        out[tiles] = runs[1]
    (le, se), (lt, st) = out[False], out[True]
    assert torch.equal(lt.argmax(-1), le.argmax(-1))
    cos = torch.nn.functional.cosine_similarity(lt, le).min().item()
    assert cos > 0.999, f"tile prefill vs eager prefill logits: cosine {cos:.5f}"
    err = ((st - se).abs().max() / se.abs().max()).item()
    assert err < 2e-2, f"tile prefill vs eager prefill DeltaNet state: {err:.4f} of its max"


def test_norm_int8_rows_change_no_decode_bit(tiny, monkeypatch):
    """CUDA-graph decode whose norms and silu_mul hand the GEMVs their int8 activations (kernels/norm.py, the
    default) gives the same logits, bit for bit, as decode where every GEMV rounds its own x (DFLASH24_NORM_INT8=0):
    the tiny Q4_K_M file has Q6_K matrices too, so both word orders are read."""
    from dflash24.gguf.reader import GGUFFile
    from dflash24.kernels import norm
    from dflash24.models.qwen35 import Qwen35Model
    from dflash24.runner import TargetRunner
    model = Qwen35Model.from_gguf(GGUFFile(tiny), "cuda", torch.bfloat16, 256)
    ids = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(3)).cuda()
    runs = []
    for on in (True, False):
        monkeypatch.setattr(norm, "INT8", on)
        r = TargetRunner(model, model.new_cache(256, torch.bfloat16, "cuda"), torch.device("cuda"), True)
        logits = r.prefill(ids, 0, 32)
        out = []
        for pos in range(40, 48):
            logits, _ = r.decode(logits.argmax(-1).view(1), pos)
            out.append(logits.float().clone())             # the graph's output buffer is reused
        runs.append(torch.cat(out))
    assert torch.equal(runs[0], runs[1]), (runs[0] - runs[1]).abs().max().item()


def test_norm_pair_rows_change_no_verify_bit(tiny, monkeypatch):
    """Prefill chunks of <= 64 tokens and a chain verify whose norms and silu_mul hand the small-M matmuls x in
    their pair order (kernels/norm.py, the default) give the same logits, bit for bit, as with DFLASH24_NORM_PAIRS=0,
    where each dot kernel permutes x in registers: Q4_K, Q5_K and Q6_K matrices, both orientations as shipped."""
    from dflash24.gguf.reader import GGUFFile
    from dflash24.kernels import norm
    from dflash24.models.layers import Step
    from dflash24.models.qwen35 import Qwen35Model
    model = Qwen35Model.from_gguf(GGUFFile(tiny), "cuda", torch.bfloat16, 256)
    ids = torch.randint(0, 256, (71,), generator=torch.Generator().manual_seed(4)).cuda()
    runs = []
    for on in (True, False):                # steps of 48 and 23 tokens: both >= kernels.PAIRS_FROM_TOKENS
        monkeypatch.setattr(norm, "PAIRS", on)
        cache = model.new_cache(256, torch.bfloat16, "cuda", max_spec_tokens=32)
        with torch.no_grad():
            pre = model.logits(model(ids[:48], Step.sequential(0, 48, device="cuda"), cache)[0])
            pos = torch.arange(48, 71, device="cuda")
            ver = model.logits(model(ids[48:71], Step(pos, pos, 71, speculative=True), cache)[0])
        runs.append(torch.cat([pre, ver]))
    assert torch.equal(runs[0], runs[1]), (runs[0] - runs[1]).abs().max().item()
