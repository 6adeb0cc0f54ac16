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
