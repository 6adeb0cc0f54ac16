"""qwen35 hybrid target: parity with transformers' Qwen3_5ForCausalLM (from HF safetensors and from a GGUF
in llama.cpp's conversion layout), chunked prefill + decode == one long prefill, engine round trip."""
from __future__ import annotations


import pytest
import torch

from dflash24.gguf.reader import GGUFFile
from dflash24.models.layers import Step
from dflash24.models.qwen35 import Qwen35Config, Qwen35Model, grouped_to_tiled
from dflash24.synth import tiny_vocab_size, write_qwen35_from_hf

transformers = pytest.importorskip("transformers")
from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig  # noqa: E402

from conftest import spread_qwen35_hf_params  # noqa: E402

PROMPT, NEW = 200, 32


def _hf_config(**kw):
    c = dict(vocab_size=tiny_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=6,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_conv_kernel_dim=4,
             linear_key_head_dim=16, linear_num_key_heads=2, linear_value_head_dim=16, linear_num_value_heads=6,
             max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=False,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
             layer_types=["linear_attention", "full_attention"] * 3)
    c.update(kw)
    cfg = Qwen3_5TextConfig(**c)
    cfg._attn_implementation = "eager"
    return cfg


@pytest.fixture(scope="module")
def hf_model():
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(_hf_config()).eval()
    spread_qwen35_hf_params(model)
    return model


@pytest.fixture(scope="module")
def tokens():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, tiny_vocab_size(), (PROMPT,), generator=g)


def _hf_logits(model, ids):
    with torch.no_grad():
        return model(ids.unsqueeze(0), use_cache=False).logits[0].float()


def _prefill_all_logits(model, ids, chunk, cache=None):
    cache = cache or model.new_cache(512, torch.float32, "cpu")
    out = []
    for s in range(0, ids.shape[0], chunk):
        h, _ = model(ids[s:s + chunk], Step.sequential(s, min(chunk, ids.shape[0] - s)), cache)
        out.append(model.logits(h))
    return torch.cat(out), cache


def _greedy(model, ids, n, chunk=64):
    logits, cache = _prefill_all_logits(model, ids, chunk)
    tok, gen, step_logits = logits[-1].argmax(), [], []
    for j in range(n):
        gen.append(int(tok))
        h, _ = model(tok.view(1), Step.sequential(ids.shape[0] + j, 1), cache)
        step_logits.append(model.logits(h)[0])
        tok = step_logits[-1].argmax()
    return logits, torch.tensor(gen), torch.stack(step_logits)


def _check_parity(ours, hf_model, tokens, atol):
    ref = _hf_logits(hf_model, tokens)
    logits, gen, step_logits = _greedy(ours, tokens, NEW)
    assert ref.std() > 0.5                                            # logits are far from flat
    torch.testing.assert_close(logits, ref, rtol=0, atol=atol)
    # greedy: HF, teacher-forced on our tokens, picks each of them
    full = torch.cat([tokens, gen])
    ref_full = _hf_logits(hf_model, full)
    assert torch.equal(ref_full[PROMPT - 1:PROMPT - 1 + NEW].argmax(-1), gen)
    torch.testing.assert_close(step_logits[:-1], ref_full[PROMPT:PROMPT + NEW - 1], rtol=0, atol=atol)
    assert len(set(gen.tolist())) > 3                                 # not a degenerate repetition


def test_grouped_to_tiled_order():
    # 2 key heads, 3 value heads per key head, head dim 1: grouped [g0v0 g0v1 g0v2 g1v0 g1v1 g1v2]
    t = torch.arange(6)
    assert grouped_to_tiled(t, 0, 2, 1).tolist() == [0, 3, 1, 4, 2, 5]   # tiled: head h reads key h % 2


def test_config_from_hf(hf_model):
    cfg = Qwen35Config.from_hf(hf_model.config)
    assert (cfg.attn_interval, cfg.rope_dim, cfg.ssm_v_heads, cfg.conv_dim) == (2, 8, 6, 2 * 2 * 16 + 6 * 16)
    assert cfg.attention_layers == [1, 3, 5]


def test_parity_from_hf_safetensors(hf_model, tokens, tmp_path):
    hf_model.save_pretrained(tmp_path / "hf")
    ours = Qwen35Model.from_hf(str(tmp_path / "hf"), max_positions=1024)
    _check_parity(ours, hf_model, tokens, atol=2e-4)


@pytest.fixture(scope="module")
def f32_gguf(hf_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("q35") / "tiny-qwen35-f32.gguf"
    return write_qwen35_from_hf(str(path), hf_model.state_dict(), Qwen35Config.from_hf(hf_model.config))


def test_parity_from_gguf_f32(hf_model, tokens, f32_gguf):
    gf = GGUFFile(f32_gguf)
    assert gf.tensor("blk.0.ssm_conv1d.weight").shape == (2 * 2 * 16 + 6 * 16, 4)
    assert float(gf.tensors["blk.0.ssm_a"].data.view("float32").max()) < 0             # -exp(A_log)
    ours = Qwen35Model.from_gguf(gf, max_positions=1024)
    _check_parity(ours, hf_model, tokens, atol=2e-4)


def test_gguf_q8_0_close(hf_model, tokens, tmp_path):
    path = write_qwen35_from_hf(str(tmp_path / "q8.gguf"), hf_model.state_dict(),
                                Qwen35Config.from_hf(hf_model.config), qtype="Q8_0")
    ours = Qwen35Model.from_gguf(GGUFFile(path), max_positions=1024)
    ref = _hf_logits(hf_model, tokens)
    logits, _ = _prefill_all_logits(ours, tokens, 64)
    err = (logits - ref).abs().mean() / ref.std()
    agree = (logits.argmax(-1) == ref.argmax(-1)).float().mean()
    assert err < 0.08, f"Q8_0 logits deviate by {err:.3f} logit std on average"
    assert agree > 0.85, f"Q8_0 top-1 agreement {agree:.2f}"


@pytest.mark.parametrize("chunk", [7, 16, 64])
def test_chunked_prefill_and_decode_equal_one_prefill(f32_gguf, tokens, chunk):
    ours = Qwen35Model.from_gguf(GGUFFile(f32_gguf), max_positions=1024)
    n, extra = 150, 5
    ids = tokens[:n + extra]
    whole, c_whole = _prefill_all_logits(ours, ids, n + extra)
    part, c_part = _prefill_all_logits(ours, ids[:n], chunk)
    dec = []
    for j in range(extra):
        h, _ = ours(ids[n + j:n + j + 1], Step.sequential(n + j, 1), c_part)
        dec.append(ours.logits(h))
    torch.testing.assert_close(torch.cat([part] + dec), whole, rtol=0, atol=1e-4)
    torch.testing.assert_close(c_part.ssm, c_whole.ssm, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(c_part.conv, c_whole.conv, rtol=1e-4, atol=1e-5)
    assert c_whole.ssm.abs().sum() > 0


def test_capture_features(f32_gguf, tokens):
    ours = Qwen35Model.from_gguf(GGUFFile(f32_gguf), max_positions=1024)
    cache = ours.new_cache(64, torch.float32, "cpu")
    h, feats = ours(tokens[:10], Step.sequential(0, 10), cache, capture=(0, 3))
    assert feats.shape == (10, 2 * 64) and h.shape == (10, 64)
    cache.reset()
    h2, none = ours(tokens[:10], Step.sequential(0, 10), cache)
    assert none is None and torch.equal(h, h2)                        # reset really starts over


def test_parity_with_the_triton_paths(hf_model, tokens, f32_gguf, monkeypatch):
    """The CUDA-only fused paths, run here by Triton's interpreter: every norm of the model (hidden, q/k on
    strided rows, the gated DeltaNet norm, output; the residual adds inside them), the rotary embedding,
    silu * up, the DeltaNet gate / beta and conv + SiLU + q/k l2 norms: same parity bound as the reference
    path."""
    from dflash24.kernels import deltanet as dn
    from dflash24.kernels import norm as fused
    from dflash24.models import layers
    from dflash24.models import qwen35 as q35
    if not fused.HAVE_TRITON or layers._fused_norm is None or dn.triton is None:
        pytest.skip("triton is not installed")
    calls, convs, kernel, conv = [], [], fused.rms_norm, dn.conv_qk

    def run(x, weight, eps, gate=None, out_dtype=None, int8=False, pairs=False):
        y = kernel(x, weight, eps, gate, out_dtype, int8=int8, pairs=pairs)
        calls.append((gate is not None, y is not None))
        return y

    def run_conv(*a, **kw):
        y = conv(*a, **kw)
        convs.append(y is not None)
        return y

    monkeypatch.setattr(layers, "_use_fused_norm", lambda x, w, g: fused.supports(x, g))
    monkeypatch.setattr(layers._fused_norm, "rms_norm", run)
    monkeypatch.setattr(layers, "_use_fused_rope", lambda x: True)
    monkeypatch.setattr(layers, "_use_fused_act", lambda g, u: True)
    monkeypatch.setattr(q35, "use_fused_conv", lambda x: True)
    monkeypatch.setattr(q35, "conv_qk", run_conv)
    ours = Qwen35Model.from_gguf(GGUFFile(f32_gguf), max_positions=1024)
    with torch.no_grad():
        _check_parity(ours, hf_model, tokens, atol=2e-4)
    assert all(ran for _, ran in calls) and convs and all(convs)    # no layout fell back to the reference
    assert {gated for gated, _ in calls} == {True, False}
