"""Prefix cache: a request that shares a prefix with the previous one reuses the caches and still produces
exactly the tokens a cold start produces (dense and hybrid targets; AR, chain and tree; greedy and seeded
sampling); the snapshot budget evicts least recently used first; stats report what was reused."""
from __future__ import annotations

import pytest
import torch

from dflash24.cache.prefix import PrefixCache, common_prefix
from dflash24.config import EngineConfig, SamplingParams
from dflash24.engine import Engine
from dflash24.models.drafter import make_random_drafter_dir

GREEDY = SamplingParams(max_tokens=4)


@pytest.fixture(scope="module", params=["qwen2", "qwen35"])
def model(request, tmp_path_factory):
    """(target path, random drafter dir) for a tiny dense and a tiny hybrid target."""
    path = tmp_path_factory.mktemp("t") / f"{request.param}.gguf"
    if request.param == "qwen2":
        from conftest import write_tiny_qwen2_gguf
        path = str(write_tiny_qwen2_gguf(path, n_layers=4, seed=3))
    else:
        from dflash24.synth import write_preset
        path = write_preset("qwen35-tiny", str(path), seed=3)
    from dflash24.gguf.reader import GGUFFile
    from dflash24.models import load_target
    cfg = load_target(GGUFFile(path), "cpu", torch.float32, 64).cfg
    draft = make_random_drafter_dir(tmp_path_factory.mktemp("d") / "draft", cfg, 2, dtype=torch.float32,
                                    target_layer_ids=(0, 2))
    return request.param, path, str(draft)


def engine(model, mode: str, on: bool, **kw) -> Engine:
    _, path, draft = model
    return Engine(EngineConfig(model=path, device="cpu", ctx=256, spec=mode, draft=None if mode == "ar" else draft,
                               prefix_cache=on, **kw))


def run(e: Engine, ids: list[int], params: SamplingParams = GREEDY):
    events = list(e.generate(ids, params))
    return [t for ev in events for t in ev.token_ids], events[-1].stats


def conversation(e: Engine):
    """Three turns through the chat template, then a request that diverges inside turn 2's user message.
    Yields (prompt ids, output tokens, stats) per request; the assistant turns are e's own answers."""
    messages = []
    for i, text in enumerate(["hello there", "the cat sat on the mat", "and then what", "the cat sat on the hat"]):
        if i == 3:
            messages = messages[:2]
        messages = messages + [{"role": "user", "content": text}]
        ids = e.encode_chat(messages)
        out, stats = run(e, ids)
        yield ids, out, stats
        messages = messages + [{"role": "assistant", "content": e.tokenizer.decode(out)}]


@pytest.fixture(scope="module")
def cold_conversation(model):
    """The cold-start reference: plain AR decoding, prefix cache off (speculation is lossless, so it is the
    reference for every mode)."""
    cold = engine(model, "ar", False)
    ref = list(conversation(cold))
    assert all(stats.reused_tokens == 0 and stats.prefill_tokens == len(ids) for ids, _, stats in ref)
    return ref


@pytest.mark.parametrize("mode", ["ar", "chain", "tree"])
def test_multi_turn_and_divergence_match_cold_start(model, cold_conversation, mode):
    warm = engine(model, mode, True)
    reused = []
    for i, ((ids, got, stats), (ref_ids, want, _)) in enumerate(zip(conversation(warm), cold_conversation)):
        assert ids == ref_ids and got == want, f"request {i}: a cache hit changed the output"
        assert stats.reused_tokens + stats.prefill_tokens == stats.prompt_tokens == len(ids)
        assert stats.prefill_tokens >= 1
        reused.append(stats.reused_tokens)
    assert len(reused) == 4 and reused[0] == 0
    assert all(r > 0 for r in reused[1:]), reused
    assert reused[2] > reused[1]                 # turn 3 reuses turns 1 and 2
    assert reused[3] < reused[2]                 # the divergence cuts the reuse back


def test_continuation_reuses_every_processed_token(model):
    """The caches hold the prompt and all generated tokens but the last (not yet processed by the target)."""
    arch = model[0]
    warm, cold = engine(model, "ar", True), engine(model, "ar", False)
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    prompt = warm.encode_chat([{"role": "user", "content": "count with me"}])
    out, _ = run(warm, prompt, params)
    assert len(out) == 5
    follow = prompt + out + warm.encode_raw(" and more")
    got, stats = run(warm, follow, params)
    assert got == run(cold, follow, params)[0]
    processed = len(prompt) + len(out) - 1
    assert stats.reused_tokens == processed, (arch, stats.reused_tokens, processed)
    # the identical request again: a dense target reuses all but the last token; a hybrid one the last
    # snapshot point before it (the end of the previous prompt, or a turn start inside it)
    again, stats = run(warm, follow, params)
    assert again == got
    if arch == "qwen35":
        assert 0 < stats.reused_tokens < len(follow) and stats.reused_tokens in (len(prompt), processed)
    else:
        assert stats.reused_tokens == len(follow) - 1
    d = stats.as_dict()
    assert d["reused_tokens"] == stats.reused_tokens and d["prefill_tokens"] == len(follow) - stats.reused_tokens


def test_seeded_sampling_with_penalties_matches_cold_start(model):
    if model[0] != "qwen2":
        pytest.skip("the sampler's history does not depend on the target; the dense one is faster")
    warm, cold = engine(model, "chain", True), engine(model, "chain", False)
    params = SamplingParams(max_tokens=5, temperature=0.9, top_p=0.95, seed=7, repetition_penalty=1.3,
                            frequency_penalty=0.5, presence_penalty=0.3)
    messages = [{"role": "user", "content": "tell me a story"}]
    for turn in range(2):
        ids = warm.encode_chat(messages)
        got, stats = run(warm, ids, params)
        assert got == run(cold, ids, params)[0]
        assert (stats.reused_tokens > 0) == (turn > 0)
        messages += [{"role": "assistant", "content": warm.tokenizer.decode(got)},
                     {"role": "user", "content": "again"}]


def test_zero_budget_misses_on_hybrid_and_stays_correct(model):
    if model[0] != "qwen35":
        pytest.skip("a dense target needs no snapshots")
    warm, cold = engine(model, "ar", True, prefix_cache_mb=0), engine(model, "ar", False)
    messages = [{"role": "user", "content": "hi"}]
    for turn in range(2):
        ids = warm.encode_chat(messages)
        got, stats = run(warm, ids, SamplingParams(max_tokens=2))
        assert got == run(cold, ids, SamplingParams(max_tokens=2))[0]
        assert stats.reused_tokens == 0 and not warm.prefix.snaps
        messages += [{"role": "assistant", "content": warm.tokenizer.decode(got)}, {"role": "user", "content": "ok"}]


class _FakeHybrid:
    def __init__(self):
        self.ssm, self.conv = torch.zeros(2, 4, 8), torch.zeros(2, 3, 8)

    def restore(self, snap):
        self.ssm.copy_(snap[0])
        self.conv.copy_(snap[1])


def test_lru_eviction_within_budget():
    cache = _FakeHybrid()
    one = cache.ssm.nbytes + cache.conv.nbytes
    pc = PrefixCache(cache, budget_bytes=2 * one + one // 2)          # room for two snapshots
    for n in (3, 5):
        cache.ssm.fill_(n)
        pc._snapshot(n)
    pc._snapshot(3)                              # 3 is now the most recently used
    cache.ssm.fill_(9)
    pc._snapshot(9)
    assert list(pc.snaps) == [3, 9] and pc.evictions == 1 and pc.snapshot_bytes <= pc.budget
    pc.held = list(range(20))
    assert pc._reuse(list(range(12)) + [99], use_draft=False) == 9     # longest snapshot <= common prefix
    assert float(cache.ssm[0, 0, 0]) == 9
    assert pc._reuse(list(range(7)) + [99, 98], use_draft=False) == 3  # 9 > common 7: dropped, 3 restored
    assert list(pc.snaps) == [3] and float(cache.ssm[0, 0, 0]) == 3
    with pytest.raises(ValueError, match="budget"):
        PrefixCache(cache, budget_bytes=-1)


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([], [1]) == 0 and common_prefix([1, 2], [1, 2]) == 2


def test_metrics_count_hits_and_saved_prefill():
    from dflash24.engine import Stats
    from dflash24.server.metrics import Metrics
    m = Metrics()
    m.observe_generation(Stats(prompt_tokens=30, reused_tokens=0, prefill_tokens=30), "stop", 0.1, 0.2, 0.0)
    m.observe_generation(Stats(prompt_tokens=50, reused_tokens=40, prefill_tokens=10), "stop", 0.1, 0.2, 0.0)
    text = m.render()
    assert "dflash24_prefix_cache_hits_total 1\n" in text
    assert "dflash24_prefix_cache_reused_tokens_total 40\n" in text
    assert "dflash24_prefill_tokens_total 40\n" in text


def test_planner_accounts_for_the_snapshot_budget():
    from dflash24 import plan as P
    from dflash24 import synth
    shape = P.ModelShape.from_qwen35(synth.QWEN35_27B)
    base = P.plan(shape, ctx=8192, gpu_mem_bytes=141 * P.GiB)
    with_cache = P.plan(shape, ctx=8192, gpu_mem_bytes=141 * P.GiB, prefix_cache_mb=512)
    item = with_cache.item("prefix-cache snapshots (fp32)")
    L = shape.n_delta_layers
    snap = 4 * L * (shape.ssm_v_heads * shape.ssm_k_dim * shape.ssm_v_dim + (shape.conv_kernel - 1) * shape.conv_dim)
    assert item.bytes == (512 << 20) // snap * snap and 0 < item.bytes <= 512 << 20
    assert with_cache.group_bytes("cache") == base.group_bytes("cache") + item.bytes
    assert with_cache.total >= base.total + item.bytes         # (+ the allocator headroom on it)


def test_chat_reuses_its_history(model):
    import io
    import re

    from dflash24.chat import run_chat
    if model[0] != "qwen2":
        pytest.skip("the chat loop does not depend on the target")
    e = engine(model, "chain", True)
    lines = iter(["hello", "and again", "/exit"])
    out = io.StringIO()
    run_chat(e, SamplingParams(max_tokens=6, ignore_eos=True), input_fn=lambda _: next(lines), output=out)
    cached = [int(n) for n in re.findall(r"prefill \d+ tokens \((\d+) cached\)", out.getvalue())]
    assert len(cached) == 1 and cached[0] > 0            # the second turn reuses the first exchange


def test_hybrid_regenerate_restores_the_turn_start_snapshot(model):
    """The same chat prompt again: the hybrid target cannot reuse the end-of-prompt snapshot (one token must
    be prefilled), so it restores the one taken at the generation prompt's `<|im_start|>`."""
    if model[0] != "qwen35":
        pytest.skip("a dense target reuses any prefix")
    warm, cold = engine(model, "ar", True), engine(model, "ar", False)
    ids = warm.encode_chat([{"role": "user", "content": "hi"}])
    params = SamplingParams(max_tokens=2)
    first, _ = run(warm, ids, params)
    again, stats = run(warm, ids, params)
    assert first == again == run(cold, ids, params)[0]
    im_start = warm.tokenizer.token_to_id("<|im_start|>")
    assert stats.reused_tokens == max(i for i, t in enumerate(ids) if t == im_start)


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_generation_to_the_end_of_the_context_keeps_draft_rows_honest(model, mode):
    """Near the end of the context the speculative loops finish with plain steps, which do not feed the
    drafter: its rows then cover only the prompt, and a continuation reuses no more than that."""
    if model[0] != "qwen2":
        pytest.skip("dense target: the draft-row bound is the same for both")
    _, path, draft = model
    mk = lambda on: Engine(EngineConfig(model=path, device="cpu", ctx=64, spec=mode, draft=draft,  # noqa: E731
                                        prefix_cache=on))
    warm, cold = mk(True), mk(False)
    params = SamplingParams(max_tokens=64, ignore_eos=True)
    prompt = warm.encode_chat([{"role": "user", "content": "go on"}])
    out, _ = run(warm, prompt, params)
    assert len(prompt) + len(out) == 64                   # ran to the end of the context
    follow = prompt + out[:20] + warm.encode_raw(" stop")
    got, stats = run(warm, follow, params)
    assert got == run(cold, follow, params)[0]
    assert stats.reused_tokens == len(prompt)


@pytest.mark.parametrize("mode", ["ar", "tree"])
def test_warmup_leaves_no_state_behind(model, mode):
    """Engine.warmup (run at load on CUDA) pushes dummy tokens through the target: afterwards the same requests
    give the same tokens as on a fresh engine, and nothing counts as reusable."""
    fresh, warmed = engine(model, mode, True), engine(model, mode, True)
    prompt = fresh.encode_chat([{"role": "user", "content": "the cat sat on the mat"}])
    want, _ = run(fresh, prompt)
    warmed.warmup()
    got, stats = run(warmed, prompt)
    assert got == want and stats.reused_tokens == 0
    warmed.warmup()                                      # after a request too: the next one starts cold
    again, stats = run(warmed, prompt)
    assert again == want and stats.reused_tokens == 0 and stats.prefill_tokens == len(prompt)


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_draft_rings_match_full_rows_and_refuse_stale_reuse(model, mode, tmp_path, monkeypatch):
    """A drafter with a sliding layer keeps it in a ring (128 rows here, a 256-token context): long prompts
    and generations wrap it, yet every request drafts exactly as with full-length rows (the same tokens and the
    same acceptance), and a continuation reuses as much. A request that goes back further than the ring
    still holds reuses nothing and stays right."""
    from dflash24.cache.kv import WindowedKVCache
    from dflash24.gguf.reader import GGUFFile
    from dflash24.models import drafter as drafter_mod, load_target
    from dflash24.models.drafter import FULL, SLIDING
    arch, path, _ = model
    cfg = load_target(GGUFFile(path), "cpu", torch.float32, 64).cfg
    draft = make_random_drafter_dir(tmp_path / "win", cfg, 2, dtype=torch.float32, target_layer_ids=(0, 2),
                                    layer_types=(SLIDING, FULL), sliding_window=8)

    def mk(margin: int, on: bool = True) -> Engine:
        monkeypatch.setattr(drafter_mod, "RING_MARGIN", margin)
        return Engine(EngineConfig(model=path, device="cpu", ctx=256, spec=mode, draft=str(draft), prefix_cache=on))

    ring, full, cold = mk(120), mk(10**6), mk(10**6, on=False)
    assert isinstance(ring.draft_runner.cache, WindowedKVCache) and ring.draft_runner.cache.ring == 128
    assert not isinstance(full.draft_runner.cache, WindowedKVCache)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    text = " ".join(f"item {i} is {i * 7 % 13}" for i in range(12))
    prompt = ring.encode_chat([{"role": "user", "content": text}])
    assert 150 < len(prompt) < 200
    follow = lambda out: prompt + out + ring.encode_raw(" and then")           # noqa: E731
    back = prompt[:12] + ring.encode_raw(" something else entirely")
    stats = {}
    for name, e in (("ring", ring), ("full", full), ("cold", cold)):
        out, s1 = run(e, prompt, params)
        out2, s2 = run(e, follow(out), SamplingParams(max_tokens=8, ignore_eos=True))
        out3, s3 = run(e, back, SamplingParams(max_tokens=8, ignore_eos=True))
        stats[name] = (out, out2, out3, s1, s2, s3)
    r, f, c = stats["ring"], stats["full"], stats["cold"]
    assert r[:3] == f[:3] == c[:3]
    for a, b in zip(r[3:5], f[3:5]):
        assert a.accept_hist == b.accept_hist and a.reused_tokens == b.reused_tokens
    assert r[4].reused_tokens > len(prompt)              # the continuation reuses the first request's tokens
    if arch == "qwen2":                                  # a hybrid target has no snapshot there: it reuses none
        assert f[5].reused_tokens == 12
    assert r[5].reused_tokens == 0 and r[5].accept_hist == c[5].accept_hist
