"""Chain speculative decoding is lossless: it emits exactly the tokens plain decoding emits.

Drafters: a real random DFlash drafter (mostly wrong guesses), and oracle drafters that know the plain
decoding output and are right for exactly k tokens of every block (k = 0..15), so every acceptance length
and every commit path is exercised.
"""
from __future__ import annotations

import pytest
import torch

from dflash24.config import EngineConfig, SamplingParams
from dflash24.engine import Engine
from dflash24.models.drafter import make_random_drafter_dir
from dflash24.spec.ddtree import accept, build_tree

N_LAYERS = 4


@pytest.fixture(scope="module", params=["qwen2", "llama", "qwen35"])
def target(request, tmp_path_factory):
    """Tiny dense targets (qwen2 with biases, llama with interleaved rotary) and a tiny hybrid
    (Gated DeltaNet + attention) qwen35 target."""
    path = tmp_path_factory.mktemp("t") / f"{request.param}.gguf"
    if request.param in ("qwen2", "llama"):
        from conftest import write_tiny_qwen2_gguf
        return str(write_tiny_qwen2_gguf(path, n_layers=N_LAYERS, seed=3, arch=request.param))
    from dflash24.synth import write_preset
    return write_preset("qwen35-tiny", str(path), seed=3)


@pytest.fixture(scope="module")
def drafter_dir(target, tmp_path_factory):
    from dflash24.gguf.reader import GGUFFile
    from dflash24.models import load_target
    cfg = load_target(GGUFFile(target), "cpu", torch.float32, 64).cfg
    return str(make_random_drafter_dir(tmp_path_factory.mktemp("d") / "draft", cfg, 2, dtype=torch.float32,
                                       target_layer_ids=(0, 2)))


def tokens_of(engine, ids, params):
    events = list(engine.generate(ids, params))
    return [t for e in events for t in e.token_ids], events[-1]


class OracleDrafter(torch.nn.Module):
    """Guesses the known plain-decoding continuation, right for `k` tokens of each block, then wrong."""

    def __init__(self, real, reference: list[int], prompt_len: int, k: int, vocab: int):
        super().__init__()
        self.real, self.reference, self.prompt_len, self.k, self.vocab = real, reference, prompt_len, k, vocab

    def __getattr__(self, name):
        if name in ("real", "reference", "prompt_len", "k", "vocab"):
            return super().__getattr__(name)
        return getattr(self.real, name)

    def add_context(self, features, positions, cache):
        return self.real.add_context(features, positions, cache)

    def draft(self, last_token, start_pos, cache, embed, lm_head, kv_rows=None):
        B = self.real.block_size
        pos = int(start_pos)                       # the block's first token sits at position pos
        guesses = []
        for j in range(1, B):
            idx = pos + j - self.prompt_len        # index in the generated output
            right = self.reference[idx] if 0 <= idx < len(self.reference) else 0
            guesses.append(right if j <= self.k else (right + 1) % self.vocab)
        logits = torch.full((B - 1, self.vocab), -10.0)
        logits[torch.arange(B - 1), torch.tensor(guesses)] = 10.0
        return logits


PROMPTS = ["hello there", "the cat sat on the mat and then", "x"]


@pytest.mark.parametrize("mode", ["chain", "tree"])
@pytest.mark.parametrize("max_tokens", [1, 7, 40])
def test_random_drafter_is_lossless(target, drafter_dir, max_tokens, mode):
    ar = Engine(EngineConfig(model=target, device="cpu", ctx=256, spec="ar"))
    spec = Engine(EngineConfig(model=target, draft=drafter_dir, device="cpu", ctx=256, spec=mode))
    assert spec.spec_mode == mode
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    for p in PROMPTS:
        ids = ar.encode_raw(p)
        ref, _ = tokens_of(ar, ids, params)
        out, last = tokens_of(spec, ids, params)
        assert out == ref
        st = last.stats
        assert st.completion_tokens == max_tokens
        assert sum(k * v for k, v in st.accept_hist.items()) <= max_tokens   # commits counted per step


def test_oracle_drafters_every_acceptance_length(target, drafter_dir):
    ar = Engine(EngineConfig(model=target, device="cpu", ctx=256, spec="ar"))
    spec = Engine(EngineConfig(model=target, draft=drafter_dir, device="cpu", ctx=256, spec="chain"))
    ids = ar.encode_raw("the cat sat")
    n = 60
    params = SamplingParams(max_tokens=n, ignore_eos=True)
    ref, _ = tokens_of(ar, ids, params)
    real = spec.draft_runner.drafter
    B = real.block_size
    for k in range(B):
        spec.draft_runner.drafter = OracleDrafter(real, ref, len(ids), k, spec.model.cfg.vocab_size)
        out, last = tokens_of(spec, ids, params)
        assert out == ref, f"k={k}"
        hist = last.stats.accept_hist
        # every full step commits exactly k guesses + the bonus token
        assert max(hist, key=hist.get) == k + 1, f"k={k}: {hist}"
    spec.draft_runner.drafter = real


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_stop_token_inside_an_accepted_block(target, drafter_dir, mode):
    ar = Engine(EngineConfig(model=target, device="cpu", ctx=256, spec="ar"))
    spec = Engine(EngineConfig(model=target, draft=drafter_dir, device="cpu", ctx=256, spec=mode))
    ids = ar.encode_raw("hello there")
    ref, _ = tokens_of(ar, ids, SamplingParams(max_tokens=40, ignore_eos=True))
    stop = ref[9]                                     # a token in the middle of a 16-token block
    first = ref.index(stop)
    real = spec.draft_runner.drafter
    spec.draft_runner.drafter = OracleDrafter(real, ref, len(ids), 15, spec.model.cfg.vocab_size)
    params = SamplingParams(max_tokens=40, ignore_eos=True, stop_token_ids=(stop,))
    out, last = tokens_of(spec, ids, params)
    ar_out, ar_last = tokens_of(ar, ids, params)
    assert out == ar_out == ref[:first]
    assert last.finish_reason == ar_last.finish_reason == "stop"
    spec.draft_runner.drafter = real


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_context_end_falls_back_to_plain_steps(target, drafter_dir, mode):
    ar = Engine(EngineConfig(model=target, device="cpu", ctx=48, spec="ar"))
    spec = Engine(EngineConfig(model=target, draft=drafter_dir, device="cpu", ctx=48, spec=mode))
    ids = ar.encode_raw("hello there")
    params = SamplingParams(max_tokens=100, ignore_eos=True)
    ref, ref_last = tokens_of(ar, ids, params)
    out, last = tokens_of(spec, ids, params)
    assert out == ref and len(out) == 48 - len(ids)
    assert last.finish_reason == ref_last.finish_reason == "length"


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_sampling_with_speculation_is_reproducible(target, drafter_dir, mode):
    spec = Engine(EngineConfig(model=target, draft=drafter_dir, device="cpu", ctx=256, spec=mode))
    ids = spec.encode_raw("hello")
    params = SamplingParams(max_tokens=30, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True)
    a, _ = tokens_of(spec, ids, params)
    b, _ = tokens_of(spec, ids, params)
    assert a == b and len(a) == 30


def test_spec_without_drafter_is_refused_clearly(target):
    from dflash24.config import ConfigError
    with pytest.raises(ConfigError, match="drafter"):
        Engine(EngineConfig(model=target, device="cpu", ctx=64, spec="chain"))


class BranchOracle(OracleDrafter):
    """Puts the right token at rank 1 (a near tie with a wrong rank 0) at depth `branch`, rank 0 elsewhere:
    the verified path must leave the top-1 chain at that depth."""

    def __init__(self, real, reference, prompt_len, branch, vocab):
        super().__init__(real, reference, prompt_len, 15, vocab)
        self.branch = branch

    def draft(self, last_token, start_pos, cache, embed, lm_head, kv_rows=None):
        B, pos = self.real.block_size, int(start_pos)
        logits = torch.full((B - 1, self.vocab), -20.0)
        for j in range(1, B):
            idx = pos + j - self.prompt_len
            right = self.reference[idx] if 0 <= idx < len(self.reference) else 0
            if j - 1 == self.branch:
                logits[j - 1, (right + 1) % self.vocab] = 10.0
                logits[j - 1, right] = 9.99
            else:
                logits[j - 1, right] = 10.0
        return logits


@pytest.mark.parametrize("branch", range(15))
def test_tree_takes_branches_at_every_depth(target, drafter_dir, branch):
    ar = Engine(EngineConfig(model=target, device="cpu", ctx=256, spec="ar"))
    spec = Engine(EngineConfig(model=target, draft=drafter_dir, device="cpu", ctx=256, spec="tree"))
    ids = ar.encode_raw("the cat sat")
    params = SamplingParams(max_tokens=60, ignore_eos=True)
    ref, _ = tokens_of(ar, ids, params)
    real = spec.draft_runner.drafter
    spec.draft_runner.drafter = BranchOracle(real, ref, len(ids), branch, spec.model.cfg.vocab_size)
    out, last = tokens_of(spec, ids, params)
    spec.draft_runner.drafter = real
    assert out == ref
    hist = last.stats.accept_hist
    # the top-1 chain alone would commit branch + 1 tokens per step; the tree follows the rank-1 sibling
    # (7 non-chain nodes at budget 22: the sibling and up to 6 of its descendants)
    assert max(hist, key=hist.get) == min(branch + 8, 16), hist


def _heap_tree(logp, tok, budget):
    """Reference best-first construction with a heap (pop a node; push its next sibling and first child)."""
    import heapq
    D, K = logp.shape
    heap, got = [(-logp[0, 0].item(), (0,))], []
    while heap and len(got) < budget:
        s, r = heapq.heappop(heap)
        got.append(r)
        d = len(r) - 1
        if r[-1] + 1 < K:
            heapq.heappush(heap, (s + logp[d, r[-1]].item() - logp[d, r[-1] + 1].item(), r[:-1] + (r[-1] + 1,)))
        if d + 1 < D:
            heapq.heappush(heap, (s - logp[d + 1, 0].item(), r + (0,)))
    return {tuple(tok[j, x].item() for j, x in enumerate(r)) for r in got}


def _paths(tree):
    out = set()
    for n in range(1, tree.tokens.shape[0]):
        path, m = [], n
        while m > 0:
            path.append(tree.tokens[m].item())
            m = tree.parents[m].item()
        out.add(tuple(reversed(path)))
    return out


@pytest.mark.parametrize("budget", [1, 5, 22, 40])
def test_build_tree_equals_best_first_heap(budget):
    g = torch.Generator().manual_seed(budget)
    for _ in range(20):
        logp, tok = (torch.randn(15, 500, generator=g) * 3).log_softmax(-1).topk(8, -1)
        tree = build_tree(torch.tensor([7]), logp, tok, budget, chain_seed=False)
        assert _paths(tree) == _heap_tree(logp, tok, budget)
        assert (tree.depth[1:] >= tree.depth[tree.parents[1:]] + 1).all()          # parents come first
        seeded = build_tree(torch.tensor([7]), logp, tok, budget, chain_seed=True)
        chain = tuple(tok[:min(budget, 15), 0].tolist())
        assert all(chain[:d] in _paths(seeded) for d in range(1, len(chain) + 1))


def test_accept_follows_the_target_through_the_tree():
    logp, tok = (torch.randn(15, 100, generator=torch.Generator().manual_seed(0)) * 3).log_softmax(-1).topk(8, -1)
    tree = build_tree(torch.tensor([1]), logp, tok, 22)
    paths = sorted(_paths(tree), key=len)
    target_path = max((p for p in paths if p[0] != tok[0, 0].item()), key=len, default=paths[-1])
    # the target's choice after each node: the next token of target_path where the node lies on it
    chosen = torch.full((23,), -1)
    for n in range(23):
        path, m = [], n
        while m > 0:
            path.append(tree.tokens[m].item())
            m = tree.parents[m].item()
        path = tuple(reversed(path))
        if path == target_path[:len(path)] and len(path) < len(target_path):
            chosen[n] = target_path[len(path)]
    d = accept(tree, chosen)
    path, m = [], int(d)
    while m > 0:
        path.append(tree.tokens[m].item())
        m = tree.parents[m].item()
    assert tuple(reversed(path)) == target_path
