"""Dense targets (qwen2, qwen3, llama) equal Hugging Face transformers built from the same random weights.

The HF model is written to GGUF in llama.cpp's conversion layout (for llama: Q/K rows permuted for the
interleaved rotary mode), loaded by dflash24, and compared on logits and greedy tokens.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from dflash24.cache.kv import KVCache
from dflash24.gguf.reader import GGUFError, GGUFFile
from dflash24.gguf.writer import write_gguf
from dflash24.models.dense import DenseModel
from dflash24.models.layers import Step

transformers = pytest.importorskip("transformers")


def _llama_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    # HF rotates halves; llama.cpp's llama converter reorders each head's rows into adjacent pairs.
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_dense_to_gguf(model, arch: str, path, qtype=Q.F32) -> str:
    cfg = model.config
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    meta = {
        "general.architecture": arch,
        f"{arch}.block_count": cfg.num_hidden_layers, f"{arch}.embedding_length": cfg.hidden_size,
        f"{arch}.feed_forward_length": cfg.intermediate_size, f"{arch}.attention.head_count": cfg.num_attention_heads,
        f"{arch}.attention.head_count_kv": cfg.num_key_value_heads, f"{arch}.attention.key_length": hd,
        f"{arch}.attention.value_length": hd, f"{arch}.rope.freq_base": float(cfg.rope_parameters["rope_theta"]),
        f"{arch}.attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps), f"{arch}.context_length": 512,
    }
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
    tensors = []

    def add(name, t, big=True):
        arr = t.numpy().astype(np.float32)
        tq = qtype if (big and arr.ndim == 2) else Q.F32
        if tq != Q.F32:
            from dflash24.gguf.writer import quantize_tensor
            arr = quantize_tensor(arr, tq)
        tensors.append((name, arr, tq, tuple(t.shape)))

    add("token_embd.weight", sd["model.embed_tokens.weight"])
    add("output_norm.weight", sd["model.norm.weight"], big=False)
    if "lm_head.weight" in sd and not cfg.tie_word_embeddings:
        add("output.weight", sd["lm_head.weight"])
    for i in range(cfg.num_hidden_layers):
        for hf, gg in names.items():
            for kind in ("weight", "bias"):
                key = f"model.layers.{i}.{hf}.{kind}"
                if key not in sd:
                    continue
                t = sd[key]
                if arch == "llama" and hf == "self_attn.q_proj":
                    t = _llama_permute(t, cfg.num_attention_heads)
                if arch == "llama" and hf == "self_attn.k_proj":
                    t = _llama_permute(t, cfg.num_key_value_heads)
                add(f"blk.{i}.{gg}.{kind}", t, big=kind == "weight")
    return write_gguf(path, meta, tensors)


def tiny_hf(arch: str, tied=False):
    common = dict(vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=tied)
    torch.manual_seed(0)
    if arch == "qwen2":
        cfg = transformers.Qwen2Config(**common, rope_theta=1e6)
        model = transformers.Qwen2ForCausalLM(cfg)
        with torch.no_grad():              # HF inits biases to zero: make them matter
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    elif arch == "qwen3":
        cfg = transformers.Qwen3Config(**common, head_dim=32, rope_theta=1e6)
        model = transformers.Qwen3ForCausalLM(cfg)
    else:
        cfg = transformers.LlamaConfig(**common, rope_theta=10000.0)
        model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():                  # HF inits norms to one: random norms catch a wrong norm convention
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model.eval()


def our_greedy(model: DenseModel, prompt: list[int], n: int, chunk: int = 1000):
    cache = KVCache(model.cfg.n_layers, 256, model.cfg.n_kv_heads, model.cfg.head_dim, torch.float32)
    ids = torch.tensor(prompt)
    with torch.no_grad():
        logits_all = []
        for s in range(0, len(prompt), chunk):
            h, _ = model(ids[s:s + chunk], Step.sequential(s, min(chunk, len(prompt) - s)), cache)
            logits_all.append(model.logits(h))
        out, pos = [], len(prompt)
        tok = logits_all[-1][-1].argmax()
        for _ in range(n):
            out.append(int(tok))
            h, _ = model(tok.view(1), Step.sequential(pos, 1), cache)
            pos += 1
            tok = model.logits(h)[-1].argmax()
    return torch.cat(logits_all), out


def hf_greedy(model, prompt: list[int], n: int):
    with torch.no_grad():
        full = model(torch.tensor([prompt])).logits[0]
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                             pad_token_id=0, min_new_tokens=n)
    return full, out[0, len(prompt):].tolist()


@pytest.mark.parametrize("arch,tied", [("qwen2", False), ("qwen3", False), ("llama", False), ("qwen2", True)])
def test_tiny_dense_matches_hf(tmp_path, arch, tied):
    hf = tiny_hf(arch, tied)
    path = hf_dense_to_gguf(hf, arch, tmp_path / f"{arch}.gguf")
    ours = DenseModel.from_gguf(GGUFFile(path), "cpu", torch.float32, max_positions=512)
    prompt = torch.randint(0, 320, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    ref_logits, ref_tokens = hf_greedy(hf, prompt, 24)
    # prefill in chunks of 16 so the cache path (not only one full forward) is compared
    logits, tokens = our_greedy(ours, prompt, 24, chunk=16)
    err = (logits - ref_logits).abs().max().item()
    assert err <= 1e-4 * ref_logits.abs().max().item(), f"{arch}: max logit error {err}"
    assert tokens == ref_tokens


def test_q8_0_weights_close_to_hf(tmp_path):
    hf = tiny_hf("qwen2")
    path = hf_dense_to_gguf(hf, "qwen2", tmp_path / "q8.gguf", qtype=Q.Q8_0)
    ours = DenseModel.from_gguf(GGUFFile(path), "cpu", torch.float32, max_positions=512)
    prompt = list(range(5, 45))
    ref_logits, _ = hf_greedy(hf, prompt, 1)
    logits, _ = our_greedy(ours, prompt, 1)
    cos = torch.nn.functional.cosine_similarity(logits, ref_logits, dim=-1)
    assert cos.min().item() > 0.999, cos.min()


def test_strict_loading_names_the_problem(tmp_path):
    hf = tiny_hf("qwen2")
    path = hf_dense_to_gguf(hf, "qwen2", tmp_path / "m.gguf")
    gf = GGUFFile(path)
    # an extra tensor the architecture does not use is an error that names it
    extra = [(n, np.asarray(t.data), t.qtype, t.shape) for n, t in gf.tensors.items()]
    meta = {k: v for k, v in gf.metadata.items()}
    extra.append(("blk.0.mystery.weight", np.zeros((4, 32), np.float32), Q.F32, (4, 32)))
    bad = write_gguf(tmp_path / "extra.gguf", meta, extra)
    with pytest.raises(GGUFError, match="blk.0.mystery.weight"):
        DenseModel.from_gguf(GGUFFile(bad), "cpu", torch.float32, 512)
    # a missing tensor is an error that names it
    missing = [t for t in extra if t[0] not in ("blk.1.ffn_up.weight", "blk.0.mystery.weight")]
    bad = write_gguf(tmp_path / "missing.gguf", meta, missing)
    with pytest.raises(GGUFError, match="blk.1.ffn_up.weight"):
        DenseModel.from_gguf(GGUFFile(bad), "cpu", torch.float32, 512)
    # an unknown architecture is rejected by the loader with the supported list
    from dflash24.models import load_target
    meta2 = dict(meta, **{"general.architecture": "mamba9"})
    bad = write_gguf(tmp_path / "arch.gguf", meta2, extra[:3])
    with pytest.raises(GGUFError, match="unknown architecture 'mamba9'"):
        load_target(GGUFFile(bad), "cpu", torch.float32, 512)
