"""DFlash drafter: parity with z-lab's `dflash` package (DFlashDraftModel on transformers' Qwen3 layers),
strict loading, GGUF round trip in Luce DFlash's layout, config parsing.

The reference is run without a cache on the whole context ([context features; block] in one call,
positions 0..C+B-1); ours adds the context in chunks to the static cache and drafts from it, so the test
also covers incremental context, scratch rows, stale rows and the mask.
"""
from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from dflash24.models.drafter import (
    FULL, SLIDING, DFlashConfig, DFlashDrafter, DrafterError, default_target_layer_ids,
    make_random_drafter_dir, random_state_dict, save_gguf)

dflash_model = pytest.importorskip("dflash.model", reason="z-lab's `dflash` package is the reference")

TARGET = SimpleNamespace(dim=64, n_layers=12, vocab_size=300, ffn_dim=160, n_heads=4, n_kv_heads=2, head_dim=32)
BLOCK = 16


def make_dir(tmp_path, name="draft", **kw):
    args = dict(layer_types=(SLIDING, FULL, SLIDING), sliding_window=12, rope_theta=10000.0,
                dtype=torch.float32, seed=1)
    args.update(kw)
    return make_random_drafter_dir(tmp_path / name, TARGET, 3, **args)


def target_io(seed=2):
    """A shared random embedding and lm_head (the target's), fed to both implementations."""
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(TARGET.vocab_size, TARGET.dim, generator=g)
    head = torch.randn(TARGET.vocab_size, TARGET.dim, generator=g) * TARGET.dim ** -0.5
    return (lambda ids: emb[ids]), (lambda h: h @ head.T)


def reference_logits(path, features, last_token, embed, lm_head):
    """z-lab's DFlashDraftModel on [all context; block] in one cache-free call: logits [B-1, vocab]."""
    ref = dflash_model.DFlashDraftModel.from_pretrained(str(path), dtype=torch.float32).eval()
    C, B = features.shape[0], ref.block_size
    ids = torch.cat([last_token.view(1), torch.full((B - 1,), ref.mask_token_id)])
    with torch.no_grad():
        h = ref(position_ids=torch.arange(C + B)[None], noise_embedding=embed(ids)[None],
                target_hidden=features[None])
        return ref.compute_logits(h[0, 1:], lm_head), ref


def check_close(ours, ref, cos_min=0.9999):
    assert ours.shape == ref.shape
    cos = torch.nn.functional.cosine_similarity(ours.double(), ref.double(), dim=-1)
    assert cos.min() >= cos_min, f"per-position cosine {cos.tolist()}"
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


@pytest.mark.parametrize("ctx_len", [23, 47])
@pytest.mark.parametrize("is_causal", [None, False])
def test_parity_with_dflash_package(tmp_path, ctx_len, is_causal):
    path = make_dir(tmp_path, is_causal=is_causal)
    drafter = DFlashDrafter.from_pretrained(path)
    cfg = drafter.cfg
    assert cfg.causal == ((True, False, True) if is_causal is None else (False,) * 3)
    embed, lm_head = target_io()
    g = torch.Generator().manual_seed(ctx_len)
    features = torch.randn(ctx_len, len(cfg.target_layer_ids) * cfg.dim, generator=g)
    last = torch.tensor([7])
    want, ref = reference_logits(path, features, last, embed, lm_head)
    assert tuple(ref.target_layer_ids) == cfg.target_layer_ids and ref.block_size == BLOCK
    assert [layer.self_attn.is_causal for layer in ref.layers] == list(cfg.causal)
    assert [layer.self_attn.sliding_window for layer in ref.layers] == [12, None, 12]

    cache = drafter.new_cache(ctx_len + BLOCK + 9, torch.float32, "cpu")
    cache.k.normal_()                              # stale garbage everywhere: the mask must hide it
    cache.v.normal_()
    split = ctx_len // 3
    with torch.no_grad():
        drafter.add_context(features[:split], torch.arange(split), cache)
        drafter.draft(last, split, cache, embed, lm_head)          # an earlier draft leaves scratch rows
        drafter.add_context(features[split:], torch.arange(split, ctx_len), cache)
        got = drafter.draft(last, ctx_len, cache, embed, lm_head)
        # a larger kv_rows bucket and a tensor start_pos (the CUDA-graph form) give the same logits
        got_bucket = drafter.draft(last, torch.tensor([ctx_len]), cache, embed, lm_head, kv_rows=cache.capacity)
    assert got.shape == (BLOCK - 1, TARGET.vocab_size)
    check_close(got, want)
    torch.testing.assert_close(got_bucket, got, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("is_causal", [None, False])
def test_attention_kernel_path_matches_reference(tmp_path, is_causal, monkeypatch):
    """On CUDA the drafter's attention runs the Triton kernel (rows bounded by slots, sliding window by
    positions: no [B, S] mask). Forced on here through the interpreter, for both layer mixes (causal sliding +
    non-causal full; non-causal sliding), with stale rows past the block: the reference path's logits."""
    pytest.importorskip("triton")
    from dflash24.models import layers
    if layers._fused_attn is None:
        pytest.skip("Triton attention unavailable")
    drafter = DFlashDrafter.from_pretrained(make_dir(tmp_path, is_causal=is_causal, head_dim=64))  # a kernel size
    embed, lm_head = target_io()
    ctx_len = 29
    feats = torch.randn(ctx_len, len(drafter.target_layer_ids) * TARGET.dim, generator=torch.Generator().manual_seed(4))
    cache = drafter.new_cache(ctx_len + BLOCK + 11, torch.float32, "cpu")
    cache.k.normal_()
    cache.v.normal_()
    with torch.no_grad():
        drafter.add_context(feats, torch.arange(ctx_len), cache)
        want = drafter.draft(torch.tensor([5]), ctx_len, cache, embed, lm_head, kv_rows=cache.capacity)
        launched = []
        real = layers._fused_attn.attention
        monkeypatch.setattr(layers._fused_attn, "attention", lambda *a, **kw: launched.append(kw) or real(*a, **kw))
        monkeypatch.setattr(layers.Step, "fused", lambda self: self.mask is None or self.tree is not None)
        got = drafter.draft(torch.tensor([5]), ctx_len, cache, embed, lm_head, kv_rows=cache.capacity)
    assert len(launched) == drafter.cfg.n_layers
    assert any(kw.get("window") == 12 for kw in launched)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def _ring_walk(drafter, caches, embed, lm_head, steps=(1, 16, 3, 64, 9, 40, 2, 16), prompt=150, seed=6):
    """The engine's use of a draft cache, on every cache in `caches` alike: a prompt chunk longer than a ring,
    then draft steps, each followed by a context update of 64 rows of which only the accepted ones are
    committed (the rest is padding ahead of the context). Returns each cache's logits per draft."""
    g = torch.Generator().manual_seed(seed)
    width = len(drafter.target_layer_ids) * drafter.cfg.dim
    feats = torch.randn(prompt, width, generator=g)
    out = [[] for _ in caches]
    with torch.no_grad():
        for c in caches:
            drafter.add_context(feats, torch.arange(prompt), c)
        pos, last = prompt, torch.tensor([5])
        for accepted in steps:
            for i, c in enumerate(caches):
                out[i].append(drafter.draft(last, pos, c, embed, lm_head, kv_rows=c.capacity))
            update = torch.randn(64, width, generator=g)
            for c in caches:
                drafter.add_context(update, torch.arange(pos, pos + 64), c)
            pos, last = pos + accepted, torch.tensor([accepted % 7])
    return out


@pytest.mark.parametrize("is_causal", [None, False])
def test_ring_cache_drafts_as_the_full_cache(tmp_path, is_causal, monkeypatch):
    """Sliding layers in rings (position p at row p % ring) give the logits of a full-length cache: a prompt
    chunk longer than the ring, context updates wrapping it several times, padding rows written ahead, stale
    rows everywhere; causal and non-causal sliding layers."""
    from dflash24.cache.kv import KVCache, WindowedKVCache
    from dflash24.models import drafter as drafter_mod
    monkeypatch.setattr(drafter_mod, "RING_MARGIN", 100)
    drafter = DFlashDrafter.from_pretrained(make_dir(tmp_path, is_causal=is_causal))
    embed, lm_head = target_io()
    capacity = 600
    ring = drafter.new_cache(capacity, torch.float32, "cpu")
    assert isinstance(ring, WindowedKVCache) and ring.ring == 128 and ring.capacity == capacity
    assert ring.rings.k.shape[:2] == (2, 128) and ring.full.k.shape[:2] == (1, capacity)
    full = KVCache(drafter.cfg.n_layers, capacity, drafter.cfg.n_kv_heads, drafter.cfg.head_dim, torch.float32)
    assert ring.nbytes == full.nbytes * (128 * 2 + capacity) // (3 * capacity)
    for t in (ring.rings.k, ring.rings.v, ring.full.k, ring.full.v, full.k, full.v):
        t.normal_()                                 # stale garbage: nothing of it may be read
    got, want = _ring_walk(drafter, [ring, full], embed, lm_head)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_ring_cache_on_the_attention_kernel(tmp_path, monkeypatch):
    """The same through the Triton attention kernel (CPU interpreter): its ring rows are read as position % ring."""
    pytest.importorskip("triton")
    from dflash24.cache.kv import KVCache
    from dflash24.models import drafter as drafter_mod, layers
    if layers._fused_attn is None:
        pytest.skip("Triton attention unavailable")
    monkeypatch.setattr(drafter_mod, "RING_MARGIN", 100)
    drafter = DFlashDrafter.from_pretrained(make_dir(tmp_path, head_dim=64))                   # a kernel size
    embed, lm_head = target_io()
    ring = drafter.new_cache(400, torch.float32, "cpu")
    full = KVCache(drafter.cfg.n_layers, 400, drafter.cfg.n_kv_heads, drafter.cfg.head_dim, torch.float32)
    for t in (ring.rings.k, ring.rings.v, full.k, full.v):
        t.normal_()
    want = _ring_walk(drafter, [full], embed, lm_head, steps=(1, 64, 33))[0]
    launched = []
    real = layers._fused_attn.attention
    monkeypatch.setattr(layers._fused_attn, "attention", lambda *a, **kw: launched.append(kw) or real(*a, **kw))
    monkeypatch.setattr(layers.Step, "fused", lambda self: self.mask is None or self.tree is not None)
    got = _ring_walk(drafter, [ring], embed, lm_head, steps=(1, 64, 33))[0]
    assert any(kw.get("ring") == 128 for kw in launched) and any(not kw.get("ring") for kw in launched)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_ring_rows():
    from dflash24.models.drafter import RING_MARGIN, ring_rows
    assert ring_rows(2048, 131088) == 2048 + RING_MARGIN and ring_rows(None, 131088) == 0
    assert ring_rows(2048, 2048 + RING_MARGIN) == 0          # no smaller than a full-length layer: none
    assert ring_rows(12, 10**6) % 64 == 0 and ring_rows(12, 10**6) >= 12 + RING_MARGIN


def test_context_rows_are_unchanged_by_draft(tmp_path):
    drafter = DFlashDrafter.from_pretrained(make_dir(tmp_path))
    embed, lm_head = target_io()
    cache = drafter.new_cache(64, torch.float32, "cpu")
    feats = torch.randn(30, len(drafter.target_layer_ids) * TARGET.dim)
    with torch.no_grad():
        drafter.add_context(feats, torch.arange(30), cache)
        k0, v0 = cache.k[:, :30].clone(), cache.v[:, :30].clone()
        drafter.draft(torch.tensor([3]), 30, cache, embed, lm_head)
    assert torch.equal(cache.k[:, :30], k0) and torch.equal(cache.v[:, :30], v0)


def test_default_target_layer_ids_match_reference():
    for n_target, n_draft in [(64, 5), (36, 5), (28, 1), (40, 3), (12, 3), (48, 8)]:
        want = dflash_model.build_target_layer_ids(n_target, n_draft)
        assert list(default_target_layer_ids(n_target, n_draft)) == want
    assert default_target_layer_ids(64, 5) == (1, 16, 31, 46, 61)      # FACTS.md: the Qwen3.6-27B drafter


def test_config_from_zlab_style_json():
    """The published Qwen3.6-27B-DFlash geometry (as reported by public re-implementations)."""
    c = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 5120,
         "intermediate_size": 17408, "num_hidden_layers": 5, "num_attention_heads": 32, "num_key_value_heads": 8,
         "head_dim": 128, "vocab_size": 248320, "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
         "rope_theta": 10000000, "block_size": 16, "num_target_layers": 64, "sliding_window": 2048,
         "use_sliding_window": True, "layer_types": [SLIDING] * 4 + [FULL],
         "dflash_config": {"mask_token_id": 248070, "target_layer_ids": [1, 16, 31, 46, 61]}}
    cfg = DFlashConfig.from_hf(c)
    assert cfg.rope_theta == 1e7 and cfg.block_size == 16 and cfg.mask_token_id == 248070
    assert cfg.causal == (True,) * 4 + (False,) and [cfg.window(i) for i in range(5)] == [2048] * 4 + [None]
    assert DFlashConfig.from_hf(cfg.to_hf()) == cfg
    # transformers' Qwen3Config drops the window unless use_sliding_window is set; the reference follows
    del c["use_sliding_window"]
    assert DFlashConfig.from_hf(c).sliding_window is None
    c["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0}
    with pytest.raises(DrafterError, match="yarn"):
        DFlashConfig.from_hf(c)


def test_strict_loading_errors(tmp_path):
    from safetensors.torch import load_file, save_file
    path = make_dir(tmp_path)
    st = path / "model.safetensors"
    sd = load_file(str(st))
    missing = dict(sd)
    del missing["layers.1.self_attn.k_norm.weight"]
    save_file(missing, str(st))
    with pytest.raises(DrafterError, match=r"'layers\.1\.self_attn\.k_norm\.weight' is missing"):
        DFlashDrafter.from_pretrained(path)
    wrong = dict(sd)
    wrong["fc.weight"] = torch.zeros(64, 100)
    save_file(wrong, str(st))
    with pytest.raises(DrafterError, match=r"'fc\.weight' has shape \(64, 100\), expected \(64, 192\)"):
        DFlashDrafter.from_pretrained(path)
    extra = dict(sd)
    extra["embed_tokens.weight"] = torch.zeros(3, 64)
    save_file(extra, str(st))
    with pytest.raises(DrafterError, match=r"unexpected tensors.*embed_tokens\.weight"):
        DFlashDrafter.from_pretrained(path)
    (path / "model.safetensors").unlink()
    with pytest.raises(DrafterError, match="model.safetensors not found"):
        DFlashDrafter.from_pretrained(path)
    cfg = json.loads((path / "config.json").read_text())
    del cfg["dflash_config"]["mask_token_id"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DrafterError, match="mask_token_id"):
        DFlashConfig.from_hf(cfg)


@pytest.mark.parametrize("qtype,cos_min", [("F16", 0.99999), ("BF16", 0.9999), ("Q8_0", 0.999)])
def test_gguf_round_trip(tmp_path, qtype, cos_min):
    """Luce layout vs the fp32 safetensors drafter, per block position: F16 cos >= 0.99999 and the same
    tokens; BF16 cos >= 0.9999 and >= 80% same tokens; Q8_0 cos >= 0.999 and >= 80% same tokens
    (random logits have close runners-up, so a rounding-level change may flip a few argmaxes)."""
    from dflash24.gguf.reader import GGUFFile
    path = make_dir(tmp_path, is_causal=False)
    base = DFlashDrafter.from_pretrained(path)
    from safetensors.torch import load_file
    gpath = save_gguf(base.cfg, load_file(str(path / "model.safetensors")), tmp_path / f"d-{qtype}.gguf", qtype)
    gf = GGUFFile(gpath)
    assert gf.arch == "qwen35-dflash-draft"
    assert "dflash.fc.weight" in gf.tensors and "blk.2.attn_k_norm.weight" in gf.tensors
    assert gf.tensors["blk.0.attn_norm.weight"].qtype.name == "F32"
    assert gf.tensors["blk.0.ffn_up.weight"].qtype.name == qtype
    drafter = DFlashDrafter.from_gguf(gf)
    assert drafter.cfg.norm_eps == pytest.approx(base.cfg.norm_eps)      # stored as float32
    assert drafter.cfg == replace(base.cfg, n_target_layers=None, target_name=drafter.cfg.target_name,
                                  norm_eps=drafter.cfg.norm_eps)
    embed, lm_head = target_io()
    feats = torch.randn(40, len(base.target_layer_ids) * TARGET.dim, generator=torch.Generator().manual_seed(5))
    outs = []
    for d in (base, drafter):
        cache = d.new_cache(64, torch.float32, "cpu")
        with torch.no_grad():
            d.add_context(feats, torch.arange(40), cache)
            outs.append(d.draft(torch.tensor([11]), 40, cache, embed, lm_head))
    cos = torch.nn.functional.cosine_similarity(outs[0].double(), outs[1].double(), dim=-1)
    assert cos.min() >= cos_min, cos.tolist()
    assert (outs[0].argmax(-1) == outs[1].argmax(-1)).float().mean() >= (1.0 if qtype == "F16" else 0.8)


def test_bf16_compute_matches_fp32(tmp_path):
    """The production dtype: bf16 weights, activations and draft cache vs fp32 (cos >= 0.999)."""
    path = make_dir(tmp_path)
    embed, lm_head = target_io()
    feats = torch.randn(35, 3 * TARGET.dim, generator=torch.Generator().manual_seed(9))
    outs = []
    for dt in (torch.float32, torch.bfloat16):
        d = DFlashDrafter.from_pretrained(path, dtype=dt)
        cache = d.new_cache(35 + BLOCK, dt, "cpu")
        with torch.no_grad():
            d.add_context(feats, torch.arange(35), cache)
            outs.append(d.draft(torch.tensor([1]), 35, cache, embed, lambda h: lm_head(h.float())))
    cos = torch.nn.functional.cosine_similarity(outs[0].double(), outs[1].double(), dim=-1)
    assert cos.min() >= 0.999, cos.tolist()


def test_gguf_loading_errors(tmp_path):
    """Strict GGUF loading: a wrong shape, a missing and an unexpected tensor are errors naming them."""
    from dflash24.gguf.reader import GGUFError, GGUFFile
    cfg = DFlashDrafter.from_pretrained(make_dir(tmp_path)).cfg
    gpath = save_gguf(cfg, random_state_dict(cfg), tmp_path / "d.gguf")
    gf = GGUFFile(gpath)
    gf.metadata["qwen35-dflash-draft.feed_forward_length"] = 96          # disagrees with the tensors
    with pytest.raises(GGUFError, match=r"'blk\.0\.ffn_gate\.weight' has shape \(160, 64\), expected \(96, 64\)"):
        DFlashDrafter.from_gguf(gf)
    gf = GGUFFile(gpath)
    del gf.tensors["blk.2.ffn_down.weight"]
    with pytest.raises(GGUFError, match=r"'blk\.2\.ffn_down\.weight' is missing"):
        DFlashDrafter.from_gguf(gf)
    gf = GGUFFile(gpath)
    gf.tensors["token_embd.weight"] = gf.tensors["dflash.fc.weight"]
    with pytest.raises(GGUFError, match=r"unexpected tensors.*token_embd\.weight"):
        DFlashDrafter.from_gguf(gf)
    gf = GGUFFile(gpath)
    del gf.metadata["qwen35-dflash-draft.dflash.target_layer_ids"]
    with pytest.raises(GGUFError, match="n_target_layers"):
        DFlashDrafter.from_gguf(gf)
    assert DFlashDrafter.from_gguf(gf, n_target_layers=12).target_layer_ids == default_target_layer_ids(12, 3)


def test_bench_draft_smoke():
    """benchmarks/bench_draft.py's timing loop on a tiny shape on CPU (the lead runs it on CUDA)."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location(
        "bench_draft", Path(__file__).resolve().parents[1] / "benchmarks" / "bench_draft.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cfg = replace(bench.qwen36_27b_draft_config(5, 256), dim=64, ffn_dim=96, n_heads=4, n_kv_heads=2,
                  head_dim=16, vocab_size=200, mask_token_id=199, sliding_window=40)
    out = bench.run(cfg, [48, 100], iters=2, device="cpu", dtype=torch.float32)
    assert [r["logits_shape"] for r in out["results"]] == [[15, 200]] * 2
    assert out["drafter_weight_bytes"] == 4 * (64 * 320 + 5 * (64 * 64 * 2 + 2 * 32 * 64 + 3 * 64 * 96))
    # the same random weights through a Q8_0 GGUF drafter: logits close to the float ones, not equal to them
    out8 = bench.run(cfg, [48], iters=2, device="cpu", dtype=torch.float32, fmt="q8_0")
    assert out8["format"] == "q8_0" and not torch.equal(out8["first_logits"], out["first_logits"])
    agree = bench.agreement(out8["first_logits"], out["first_logits"])
    assert agree["cosine"] > 0.999 and agree["top1_agreement"] >= 0.8, agree


def test_drafter_on_dense_target(tmp_path, tiny_qwen2_gguf):
    """The spec loop's wiring: target features captured at target_layer_ids feed add_context; the draft
    uses the target's own embedding and lm_head (no copies)."""
    from dflash24.gguf.reader import GGUFFile
    from dflash24.models.dense import DenseModel
    from dflash24.models.layers import Step
    target = DenseModel.from_gguf(GGUFFile(tiny_qwen2_gguf), max_positions=256)
    path = make_random_drafter_dir(tmp_path / "d", target.cfg, 2, target_layer_ids=(0, 1), dtype=torch.float32)
    drafter = DFlashDrafter.from_pretrained(path)
    ids = torch.tensor([5, 17, 99, 3, 250, 8, 41])
    tcache = target.new_cache(64, torch.float32, "cpu")
    with torch.no_grad():
        h, feats = target(ids, Step.sequential(0, len(ids)), tcache, capture=drafter.target_layer_ids)
        dcache = drafter.new_cache(64, torch.float32, "cpu")
        drafter.add_context(feats, torch.arange(len(ids)), dcache)
        last = target.logits(h[-1:]).argmax(-1)
        logits = drafter.draft(last, len(ids), dcache, target.token_embd, target.logits)
    assert feats.shape == (len(ids), 2 * target.cfg.dim)
    assert logits.shape == (BLOCK - 1, target.cfg.vocab_size) and torch.isfinite(logits).all()
