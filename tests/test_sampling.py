"""Speculative sampling is lossless: with chain (match and residual rules) and tree verification the
generated tokens are distributed exactly as plain autoregressive sampling from the target.

The distribution test (`test_first_three_tokens_follow_the_target`):
  * target: the tiny random qwen2 (264-token vocabulary) with its LM head scaled up (SHARPEN), so the
    processed distributions keep a handful of tokens and the joint of three tokens has few likely outcomes;
  * reference: the EXACT joint distribution P(t1, t2, t3) of plain sampling, computed by enumerating every
    prefix in the support with the target and the processing under test;
  * samples: N_SAMPLES generations of max_tokens=3 with seeds 0..N-1 for each mode;
  * drafter: a noisy oracle -- the target's own logits for the true prefix plus fixed Gaussian noise -- so
    its guesses are sometimes the target's sample and sometimes not: acceptance, rejection, residual
    resampling and the tree's side branches are all exercised (checked through the acceptance histogram);
  * test: Pearson chi-square goodness of fit of the joint (t1, t2, t3) counts against the exact joint,
    cells with expected count >= 5, the rest pooled into one cell, rejected at significance ALPHA = 1e-3;
    an outcome the target gives probability 0 fails at once.
The joint of the three tokens (not per-position marginals) is tested because a speculative bug typically
breaks the dependence between positions (e.g. the token after a rejection); the joint sees that, marginals
may not. AR is tested against the same exact reference, which checks the reference itself.
Seeds are fixed, so the test is deterministic.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from dflash24.config import ConfigError, EngineConfig, SamplingParams
from dflash24.engine import Engine
from dflash24.models.drafter import make_random_drafter_dir
from dflash24.spec.sampling import Sampler

SHARPEN = 25.0           # LM head scale: top-p 0.9 keeps ~3-10 tokens per position
BLOCK = 4                # drafter block: 3 guesses per chain step (only 2 matter for 3 tokens)
BUDGET = 6               # tree nodes below the root
N_SAMPLES = 1000
ALPHA = 1e-3
PROMPT = "hello"


def sharpen_gguf(path, scale: float):
    """Scale output.weight of an F32 GGUF in place (a sharper, still random, target)."""
    import gguf
    reader = gguf.GGUFReader(str(path), "r+")
    (t,) = [t for t in reader.tensors if t.name == "output.weight"]
    t.data[...] *= scale
    del reader


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from conftest import write_tiny_qwen2_gguf
    from dflash24.gguf.reader import GGUFFile
    from dflash24.models.dense import DenseConfig
    target = write_tiny_qwen2_gguf(tmp_path_factory.mktemp("t") / "sharp.gguf", n_layers=2, seed=5)
    sharpen_gguf(target, SHARPEN)
    cfg = DenseConfig.from_gguf(GGUFFile(str(target)))
    draft = make_random_drafter_dir(tmp_path_factory.mktemp("d") / "draft", cfg, 1, dtype=torch.float32,
                                    block_size=BLOCK, target_layer_ids=(0, 1))
    return str(target), str(draft)


def make_engine(files, spec, chain_accept="match"):
    target, draft = files
    return Engine(EngineConfig(model=target, draft=None if spec == "ar" else draft, device="cpu", ctx=64,
                               spec=spec, chain_accept=chain_accept, ddtree_budget=BUDGET))


@pytest.fixture(scope="module")
def engines(files):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)           # the tiny model is overhead-bound; threads only contend on a busy CPU
    yield {"ar": make_engine(files, "ar"), "chain": make_engine(files, "chain"),
            "residual": make_engine(files, "chain", "residual"), "tree": make_engine(files, "tree")}
    torch.set_num_threads(threads)


def target_logits(engine, ids: list[int]) -> torch.Tensor:
    """The target's logits [V] after the token sequence ids (a fresh prefill)."""
    return engine.runner.prefill(torch.tensor(ids), 0, 512)[0]


def next_probs(engine, prompt: list[int], generated: list[int], params: SamplingParams) -> torch.Tensor:
    """Plain decoding's distribution of the token after prompt + generated (penalties included)."""
    sampler = Sampler(params, torch.tensor(prompt), engine.model.cfg.vocab_size)
    if generated:
        sampler.commit(torch.tensor(generated))
    return sampler.probs(target_logits(engine, prompt + generated).view(1, -1))[0]


def exact_joint(engine, prompt: list[int], params: SamplingParams, depth: int = 3) -> dict[tuple, float]:
    """Every (t1..t_depth) with probability > 0 under plain sampling -> its probability."""
    out = {(): 1.0}
    for _ in range(depth):
        nxt = {}
        for prefix, pr in out.items():
            p = next_probs(engine, prompt, list(prefix), params)
            for t in torch.nonzero(p).flatten().tolist():
                nxt[prefix + (t,)] = pr * p[t].item()
        out = nxt
    return out


class NoisyOracle(torch.nn.Module):
    """A drafter whose logits are the target's own logits for the true prefix (and its own top guesses
    after it) plus fixed Gaussian noise of scale `noise`; positions deeper than `exact_depth` get noise
    only. The caller keeps `generated` up to date with the committed tokens (from the events)."""

    def __init__(self, real, target_engine, prompt: list[int], noise: float, exact_depth: int = 2):
        super().__init__()
        self.real, self.target_engine, self.prompt = real, target_engine, prompt
        self.vocab = target_engine.model.cfg.vocab_size
        self.noise, self.exact_depth = noise, exact_depth
        self.generated: list[int] = []
        self.memo: dict[tuple, torch.Tensor] = {}

    def __getattr__(self, name):
        if name == "real":
            return super().__getattr__(name)
        return getattr(self.real, name)

    def add_context(self, features, positions, cache):
        return self.real.add_context(features, positions, cache)

    def _logits(self, prefix: tuple, depth: int) -> torch.Tensor:
        key = (prefix, depth)
        if key not in self.memo:
            g = torch.Generator().manual_seed(hash(key) % (2**62))
            noise = torch.randn(self.vocab, generator=g) * self.noise
            base = target_logits(self.target_engine, self.prompt + list(prefix)) if depth <= self.exact_depth \
                else torch.zeros(self.vocab)
            self.memo[key] = base + noise
        return self.memo[key]

    def draft(self, last_token, start_pos, cache, embed, lm_head, kv_rows=None):
        pos = int(start_pos)
        prefix = tuple(self.generated)
        assert len(self.prompt) + len(prefix) == pos + 1 and prefix[-1] == int(last_token), \
            "the oracle lost track of the committed tokens"
        rows = []
        for j in range(1, self.real.block_size):
            rows.append(self._logits(prefix, j))
            prefix = prefix + (int(rows[-1].argmax()),)
        return torch.stack(rows)


def run(engine, ids, params, oracle=None):
    """Generate, keeping the oracle's view of the committed tokens current. -> (tokens, stats)."""
    out = []
    if oracle is not None:
        oracle.generated = out
    for ev in engine.generate(ids, params):
        out.extend(ev.token_ids)
    return out, ev.stats


def chi_square_p(counts: dict[tuple, int], exact: dict[tuple, float], n: int) -> tuple[float, int]:
    """Pearson goodness of fit. -> (p-value, degrees of freedom)."""
    impossible = [k for k in counts if k not in exact]
    assert not impossible, f"outcomes the target never produces: {impossible[:5]}"
    big = [k for k, p in exact.items() if n * p >= 5]
    rest_p = 1.0 - sum(exact[k] for k in big)
    obs = [counts.get(k, 0) for k in big]
    exp = [n * exact[k] for k in big]
    if n * rest_p >= 1:                                   # pooled small cells (dropped when ~empty)
        obs.append(n - sum(obs))
        exp.append(n * rest_p)
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    df = len(obs) - 1
    p = torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                torch.tensor(stat / 2, dtype=torch.float64)).item()
    return p, df


SETTINGS = {
    "t0.7": SamplingParams(max_tokens=3, temperature=0.7, top_p=0.9, ignore_eos=True),
    "t1.0": SamplingParams(max_tokens=3, temperature=1.0, top_p=0.9, ignore_eos=True),
    "penalties": SamplingParams(max_tokens=3, temperature=1.0, top_p=0.95, min_p=0.02, repetition_penalty=1.5,
                                frequency_penalty=1.0, presence_penalty=0.5, ignore_eos=True),
}


CASES = [(s, m) for s in ("t0.7", "t1.0") for m in ("ar", "chain", "residual", "tree")] + \
        [("penalties", m) for m in ("chain", "residual", "tree")]     # the reference is exact: no AR run needed


@pytest.fixture(scope="module")
def exact_joints(engines):
    ids = engines["ar"].encode_raw(PROMPT)
    return {name: exact_joint(engines["ar"], ids, params) for name, params in SETTINGS.items()}


@pytest.mark.parametrize("setting,mode", CASES)
def test_first_three_tokens_follow_the_target(engines, exact_joints, setting, mode):
    base, engine, ar = SETTINGS[setting], engines[mode], engines["ar"]
    ids = ar.encode_raw(PROMPT)
    exact = exact_joints[setting]
    assert abs(sum(exact.values()) - 1) < 1e-4
    assert len(exact) >= 8, "the test needs a spread-out joint"
    oracle = None
    if mode != "ar":
        oracle = NoisyOracle(engine.draft_runner.drafter, ar, ids, noise=1.5)
        engine.draft_runner.drafter = oracle
    counts, hist = {}, {}
    try:
        for seed in range(N_SAMPLES):
            toks, stats = run(engine, ids, dataclasses.replace(base, seed=seed), oracle)
            counts[tuple(toks)] = counts.get(tuple(toks), 0) + 1
            for k, v in stats.accept_hist.items():
                hist[k] = hist.get(k, 0) + v
    finally:
        if oracle is not None:
            engine.draft_runner.drafter = oracle.real
    p, df = chi_square_p(counts, exact, N_SAMPLES)
    assert p > ALPHA, f"{mode}: chi-square p = {p:.2e} (df {df}) -- not the target's distribution"
    if mode != "ar":    # steps that rejected the first guess and steps that accepted guesses
        assert 1 in hist and any(k > 1 for k in hist), f"{mode}: acceptance histogram {hist}"


@pytest.mark.parametrize("mode", ["ar", "chain", "residual", "tree"])
def test_same_seed_same_text(engines, mode):
    engine = engines[mode]
    ids = engine.encode_raw("the cat")
    params = SamplingParams(max_tokens=24, temperature=0.9, top_p=0.95, min_p=0.01, repetition_penalty=1.2,
                            frequency_penalty=0.3, presence_penalty=0.2, seed=11, ignore_eos=True)
    a, b = run(engine, ids, params)[0], run(engine, ids, params)[0]
    c = run(engine, ids, dataclasses.replace(params, seed=12))[0]
    assert a == b and len(a) == 24
    assert c != a


def test_greedy_with_penalties_is_lossless(engines):
    """Temperature 0 with penalties: argmax of the penalised logits, identical in every mode."""
    ids = engines["ar"].encode_raw("the cat sat")
    params = SamplingParams(max_tokens=30, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.5,
                            ignore_eos=True)
    ref = run(engines["ar"], ids, params)[0]
    plain = run(engines["ar"], ids, SamplingParams(max_tokens=30, ignore_eos=True))[0]
    assert ref != plain                      # the penalties change the greedy text of this model
    for mode in ("chain", "residual", "tree"):
        assert run(engines[mode], ids, params)[0] == ref, mode


# -- processing, unit level ---------------------------------------------------------------------------
def test_penalties_follow_their_definitions():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    prompt = torch.tensor([1])
    params = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.25, presence_penalty=0.5)
    s = Sampler(params, prompt, 4)
    s.commit(torch.tensor([0, 0, 3]))
    got = s._logits(logits, None)[0]
    # token 0: generated twice, 2/2 - 0.25*2 - 0.5; token 1: prompt only, -1*2; token 2: unseen; token 3: once
    want = torch.tensor([1.0 - 0.5 - 0.5, -2.0, 0.5, 1.5 - 0.25 - 0.5])
    assert torch.allclose(got, want)
    # the in-step path of a chain block: row i also counts block[:i+1]
    hist = s.chain_history(torch.tensor([2, 2]))
    rows = s._logits(logits.expand(2, 4), hist)
    assert torch.allclose(rows[0, 2], torch.tensor(0.25 - 0.25 - 0.5))
    assert torch.allclose(rows[1, 2], torch.tensor(0.25 - 0.5 - 0.5))


def test_tree_history_counts_each_nodes_path():
    s = Sampler(SamplingParams(frequency_penalty=1.0), torch.tensor([0]), 5)
    tokens = torch.tensor([4, 1, 2, 1])                  # root 4; 1 and 2 under it; 1 under node 1
    anc = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    h = s.tree_history(tokens, anc)
    assert h[3].tolist() == [0, 2, 0, 0, 1] and h[2].tolist() == [0, 0, 1, 0, 1]


def test_min_p_top_k_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    probs = Sampler(SamplingParams(temperature=1.0, min_p=0.2), torch.tensor([0]), 4).probs(logits)[0]
    assert probs[3] == 0 and probs[2] > 0                # 0.05 < 0.2 * 0.5 <= 0.15
    probs = Sampler(SamplingParams(temperature=1.0, top_p=0.8), torch.tensor([0]), 4).probs(logits)[0]
    assert (probs > 0).tolist() == [True, True, False, False]
    probs = Sampler(SamplingParams(temperature=1.0, top_k=1), torch.tensor([0]), 4).probs(logits)[0]
    assert probs.tolist() == [1.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("rule", ["match", "residual"])
def test_chain_verify_samples_the_target_for_one_guess(rule):
    """Sampler.chain_verify on a block [last, guess] of a 6-token vocabulary, repeated many times: the
    committed token after `last` (the guess when accepted, else the replacement) must follow p; both
    branches are taken. Chi-square at ALPHA with 5 degrees of freedom."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 6, generator=g) * 2
    draft_logits = torch.randn(1, 6, generator=g) * 2
    draft_logits[0, 2] = -float("inf")                  # q misses a token p has
    params = SamplingParams(temperature=1.0, seed=1)
    s = Sampler(params, torch.tensor([0]), 6)
    p = s.probs(logits)[0]
    counts, accepted, n = torch.zeros(6), 0, 6000
    for _ in range(n):
        if rule == "residual":
            guess, q = s.draft_sample(draft_logits, torch.tensor([0]))
        else:
            guess, q = draft_logits.argmax(-1), None
        k, out = s.chain_verify(torch.cat([torch.tensor([0]), guess]), logits, q)
        counts[out[0]] += 1
        accepted += int(k)
    assert 0 < accepted < n
    exp = n * p
    stat = ((counts - exp) ** 2 / exp).sum().item()
    pval = torch.special.gammaincc(torch.tensor(2.5, dtype=torch.float64), torch.tensor(stat / 2)).item()
    assert pval > ALPHA, (counts / n, p)


@pytest.mark.parametrize("kw", [dict(temperature=float("nan")), dict(temperature=float("inf")),
                                dict(min_p=-0.1), dict(min_p=1.5), dict(repetition_penalty=0.0),
                                dict(frequency_penalty=2.5), dict(presence_penalty=-3.0)])
def test_bad_parameters_are_refused(kw):
    with pytest.raises(ConfigError, match=next(iter(kw))):
        SamplingParams(**kw)


def test_bad_chain_rule_is_refused():
    with pytest.raises(ConfigError, match="chain-accept"):
        EngineConfig(chain_accept="maybe")


def test_server_and_cli_pass_the_parameters_through(engines, monkeypatch):
    from fastapi.testclient import TestClient

    from dflash24.cli import build_parser, engine_config, sampling_params
    from dflash24.server import create_app
    engine, seen = engines["ar"], []
    real = engine.generate

    def spy(ids, params, *a, **kw):
        seen.append(params)
        return real(ids, params, *a, **kw)
    monkeypatch.setattr(engine, "generate", spy)
    body = {"prompt": "hello", "max_tokens": 3, "temperature": 0.5, "top_k": 7, "seed": 3, "min_p": 0.1,
            "repetition_penalty": 1.1, "frequency_penalty": 0.4, "presence_penalty": -0.3}
    with TestClient(create_app(engine)) as client:
        assert client.post("/v1/completions", json=body).status_code == 200
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                       "max_tokens": 2, "frequency_penalty": 3.0})
        assert r.status_code == 400 and "frequency_penalty" in r.text
    p = seen[0]
    assert (p.temperature, p.top_k, p.seed, p.min_p, p.repetition_penalty, p.frequency_penalty,
            p.presence_penalty) == (0.5, 7, 3, 0.1, 1.1, 0.4, -0.3)
    args = build_parser().parse_args(["run", "x", "--min-p", "0.05", "--repetition-penalty", "1.2",
                                      "--frequency-penalty", "0.5", "--presence-penalty", "0.25",
                                      "--chain-accept", "residual"])
    p = sampling_params(args)
    assert (p.min_p, p.repetition_penalty, p.frequency_penalty, p.presence_penalty) == (0.05, 1.2, 0.5, 0.25)
    assert engine_config(args).chain_accept == "residual"
