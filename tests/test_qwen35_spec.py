"""qwen35 speculative verification: a speculative step (chain or tree) gives every token the logits of
sequential decoding along its path and leaves the committed DeltaNet state alone; `cache.commit(path)`
leaves the cache exactly as sequential decoding of the accepted tokens would (state, conv window, KV rows,
next-token logits). Tolerances: logits atol 2e-4 (fp32 model, logit std ~1-3; T-token matmuls vs 1-token
ones differ at the 1e-6 level and grow through the layers), DeltaNet states / conv windows rtol 1e-4
atol 1e-5, KV rows (values ~1, written after up to 7 layers) rtol 1e-4 atol 1e-4."""
from __future__ import annotations

import copy

import pytest
import torch

from dflash24.models.layers import Step
from dflash24.models.qwen35 import Qwen35Model

transformers = pytest.importorskip("transformers")
from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig  # noqa: E402

from conftest import spread_qwen35_hf_params  # noqa: E402

VOCAB, CAP = 300, 256
LOGIT_ATOL = 2e-4
STATE_TOL = dict(rtol=1e-4, atol=1e-4)      # fp32; on CUDA (TF32-free but reordered sums) ~1.4e-5 seen
KV_TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def model():
    cfg = Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, linear_conv_kernel_dim=4, linear_key_head_dim=16,
        linear_num_key_heads=2, linear_value_head_dim=16, linear_num_value_heads=6, max_position_embeddings=1024,
        rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 2)
    torch.manual_seed(0)
    hf = Qwen3_5ForCausalLM(cfg).eval()
    spread_qwen35_hf_params(hf)
    m = Qwen35Model.from_hf(hf.state_dict(), config=cfg, max_positions=1024)
    assert m.n_delta_layers == 6 and m.n_attn_layers == 2
    return m


def _prefill(model, prompt):
    cache = model.new_cache(CAP, torch.float32, "cpu", max_spec_tokens=32)
    with torch.no_grad():
        h, _ = model(prompt, Step.sequential(0, prompt.shape[0]), cache)
    return cache, model.logits(h)[-1]


def _decode(model, cache, tokens, start):
    """Sequential decoding, one token per forward: logits [n, V] and (ssm, conv) after each token."""
    logits, states = [], []
    with torch.no_grad():
        for j, tok in enumerate(tokens.tolist()):
            h, _ = model(torch.tensor([tok]), Step.sequential(start + j, 1), cache)
            logits.append(model.logits(h)[0])
            states.append(cache.snapshot())
    return torch.stack(logits), states


def _kv_rows(cache, lo, hi):
    return cache.kv.k[:, lo:hi].clone(), cache.kv.v[:, lo:hi].clone()


def _assert_same_cache(c, ref, lo, hi):
    torch.testing.assert_close(c.ssm, ref.ssm, **STATE_TOL)
    torch.testing.assert_close(c.conv, ref.conv, **STATE_TOL)
    for a, b in zip(_kv_rows(c, lo, hi), _kv_rows(ref, lo, hi)):
        torch.testing.assert_close(a, b, **KV_TOL)


def _next_logits(model, cache, tok, pos):
    with torch.no_grad():
        h, _ = model(torch.tensor([tok]), Step.sequential(pos, 1), cache)
    return model.logits(h)[0]


@pytest.mark.parametrize("seed,T,right", [(0, 16, 5), (1, 8, 0), (2, 12, 12), (3, 16, 15)])
def test_chain_verify_and_commit(model, seed, T, right):
    gen = torch.Generator().manual_seed(seed)
    P = int(torch.randint(5, 40, (1,), generator=gen))
    prompt = torch.randint(0, VOCAB, (P,), generator=gen)
    cache, last = _prefill(model, prompt)
    # the block: the greedy continuation for `right` tokens, then random (mostly wrong) guesses
    block, g_cache, nxt = [], copy.deepcopy(cache), last
    for j in range(T):
        tok = int(nxt.argmax()) if j < right else int(torch.randint(0, VOCAB, (1,), generator=gen))
        block.append(tok)
        nxt = _next_logits(model, g_cache, tok, P + j)
    block = torch.tensor(block)
    ref_cache = copy.deepcopy(cache)
    ref_logits, ref_states = _decode(model, ref_cache, block, P)

    spec = copy.deepcopy(cache)
    ssm0, conv0 = cache.snapshot()
    step = Step(torch.arange(P, P + T), torch.arange(P, P + T), P + T, speculative=True)
    with torch.no_grad():
        h, _ = model(block, step, spec)
    logits = model.logits(h)
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=LOGIT_ATOL)
    assert torch.equal(spec.ssm, ssm0) and torch.equal(spec.conv, conv0)        # committed state untouched
    assert logits[:max(right - 1, 0)].argmax(-1).tolist() == block[1:right].tolist()   # right guesses are greedy

    extra = int(torch.randint(0, VOCAB, (1,), generator=gen))
    for n in range(1, T + 1):
        c = copy.deepcopy(spec)
        c.commit(step, torch.arange(n), P)
        ref = copy.deepcopy(cache)
        _decode(model, ref, block[:n], P)
        torch.testing.assert_close(c.ssm, ref_states[n - 1][0], **STATE_TOL)
        torch.testing.assert_close(c.conv, ref_states[n - 1][1], **STATE_TOL)
        _assert_same_cache(c, ref, P, P + n)
        # fixed-shape form: path padded to T, n as a tensor -> the same cache (identity tokens are exact)
        c_pad = copy.deepcopy(spec)
        c_pad.commit(step, torch.arange(T), P, n=torch.tensor(n))
        assert torch.equal(c_pad.ssm, c.ssm) and torch.equal(c_pad.conv, c.conv)
        torch.testing.assert_close(_next_logits(model, c, extra, P + n), _next_logits(model, ref, extra, P + n),
                                   rtol=0, atol=LOGIT_ATOL)


# parents of a 12-node tree: root children 0 and 6; node 0 has children 1 and 3; node 2 has 4 and 8
TREE = [-1, 0, 1, 0, 2, 3, -1, 4, 2, 6, 7, 5]


def _path(parents, t):
    out = []
    while t >= 0:
        out.append(t)
        t = parents[t]
    return out[::-1]


def _tree_step(parents, base):
    T = len(parents)
    depth = [len(_path(parents, t)) - 1 for t in range(T)]
    mask = torch.zeros(T, base + T, dtype=torch.bool)
    mask[:, :base] = True
    for t in range(T):
        mask[t, [base + a for a in _path(parents, t)]] = True           # ancestors and itself
    return Step(base + torch.tensor(depth), base + torch.arange(T), base + T, mask=mask, speculative=True,
                parents=torch.tensor(parents))


def _random_tree(T, gen):
    return [int(torch.randint(-1, t, (1,), generator=gen)) for t in range(T)]


@pytest.mark.parametrize("seed,parents", [(0, TREE), (1, None), (2, None)])
def test_tree_verify_and_commit(model, seed, parents):
    gen = torch.Generator().manual_seed(seed)
    parents = parents or _random_tree(10, gen)
    T = len(parents)
    P = int(torch.randint(5, 30, (1,), generator=gen))
    prompt = torch.randint(0, VOCAB, (P,), generator=gen)
    cache, _ = _prefill(model, prompt)
    tokens = torch.randint(0, VOCAB, (T,), generator=gen)
    step = _tree_step(parents, P)
    spec = copy.deepcopy(cache)
    with torch.no_grad():
        h, _ = model(tokens, step, spec)
    logits = model.logits(h)
    assert torch.equal(spec.ssm, cache.ssm) and torch.equal(spec.conv, cache.conv)

    extra = int(torch.randint(0, VOCAB, (1,), generator=gen))
    deep_non_first = False
    for t in range(T):
        path = _path(parents, t)
        ref = copy.deepcopy(cache)
        ref_logits, _ = _decode(model, ref, tokens[path], P)
        torch.testing.assert_close(logits[t], ref_logits[-1], rtol=0, atol=LOGIT_ATOL)
        # commit along the node's path: the cache becomes the sequential one
        c = copy.deepcopy(spec)
        c.commit(step, torch.tensor(path), P)
        n = len(path)
        _assert_same_cache(c, ref, P, P + n)
        # fixed-shape form: padded path (repeats of its last node), n as a tensor -> the same cache
        c_pad = copy.deepcopy(spec)
        c_pad.commit(step, torch.tensor(path + [path[-1]] * (T - n)), P, n=torch.tensor(n))
        assert torch.equal(c_pad.ssm, c.ssm) and torch.equal(c_pad.conv, c.conv)
        assert torch.equal(c_pad.kv.k[:, :P + n], c.kv.k[:, :P + n])
        torch.testing.assert_close(_next_logits(model, c, extra, P + n), _next_logits(model, ref, extra, P + n),
                                   rtol=0, atol=LOGIT_ATOL)
        first_children = {parents.index(p) for p in set(parents)}
        deep_non_first |= n >= 4 and any(j not in first_children for j in path)
    if parents is TREE:
        assert deep_non_first                                              # e.g. node 11: 0 -> 3 -> 5 -> 11


def test_commit_errors(model):
    cache, _ = _prefill(model, torch.arange(6))
    step = Step(torch.arange(6, 10), torch.arange(6, 10), 10, speculative=True)
    with torch.no_grad():
        model(torch.arange(4), step, cache)
    with pytest.raises(ValueError, match="prefix"):
        cache.commit(step, torch.tensor([0, 2]), 6)
    with pytest.raises(ValueError, match="path of 5"):
        cache.commit(step, torch.arange(5), 6)
    cache.commit(step, torch.arange(2), 6)
    tree = _tree_step([-1, 0, -1, 2], 8)
    with torch.no_grad():
        model(torch.arange(4), tree, cache)
    with pytest.raises(ValueError, match="root-to-node"):
        cache.commit(tree, torch.tensor([0, 3]), 8)
    with pytest.raises(ValueError, match="max_spec_tokens"):
        model(torch.arange(40), Step(torch.arange(6, 46), torch.arange(6, 46), 46, speculative=True), cache)
    with pytest.raises(ValueError, match="speculative"):
        model(torch.arange(4), Step(torch.arange(6, 10), torch.arange(6, 10), 10, parents=torch.tensor([-1, 0, 1, 2])),
              cache)
