"""Token choice from target logits, on the device, without host syncs.

Processing of one row of logits (each stage only when its parameter is set):
    penalties on the raw logits -> temperature -> top-k -> top-p -> min-p -> softmax.
Penalties follow OpenAI / vLLM: frequency (logit -= f * count) and presence (logit -= p * [count > 0]) count
the GENERATED tokens; the repetition penalty (CTRL: a positive logit is divided by r, a negative one
multiplied) applies to every token seen in the prompt or the generated text.

The history a penalty needs is a device-side count vector of the committed generated tokens (updated at
commit, no sync) plus, inside a verify step, a per-position correction for the drafted tokens on the
position's own path: chain position i has seen block[:i+1] (a cumulative one-hot), tree node n its ancestors
and itself (ancestors @ one-hot). So every verified position is processed exactly as plain decoding would
process it after committing that path, and speculation stays lossless with penalties.

Greedy without penalties is a bare argmax (the fast path). Greedy with penalties is the argmax of the
penalised logits.
"""
from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from ..config import SamplingParams

CHAIN_RULES = ("match", "residual")


def penalise(x: torch.Tensor, params: SamplingParams, counts: torch.Tensor, in_prompt: torch.Tensor) -> torch.Tensor:
    """x [T, V] float logits; counts [T, V] generated-token counts of each row's history; in_prompt [V] bool."""
    if params.repetition_penalty != 1.0:
        r = params.repetition_penalty
        seen = (counts > 0) | in_prompt
        x = torch.where(seen, torch.where(x > 0, x / r, x * r), x)
    if params.frequency_penalty:
        x = x - params.frequency_penalty * counts
    if params.presence_penalty:
        x = x - params.presence_penalty * (counts > 0).to(x.dtype)
    return x


def truncate(x: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, top-k, top-p, min-p on float logits x [T, V] (params.temperature > 0) -> logits with
    the removed tokens at -inf. The most likely token always stays."""
    x = x / params.temperature
    if params.top_k:
        kth = torch.topk(x, min(params.top_k, x.shape[-1]), dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        p = sorted_x.softmax(-1)
        # drop a token when the mass before it already reaches top_p (the first token always stays)
        drop_sorted = (p.cumsum(-1) - p) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    if params.min_p > 0:
        # p_i < min_p * p_max  <=>  x_i < x_max + log(min_p)
        x = x.masked_fill(x < x.amax(-1, keepdim=True) + math.log(params.min_p), float("-inf"))
    return x


def processed_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[T, V] logits -> [T, V] probabilities after temperature, top-k, top-p and min-p (no penalties;
    params.temperature > 0)."""
    return truncate(logits.float(), params).softmax(-1)


def choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """[T, V] -> [T] int64 token ids without penalties: argmax when greedy, else a sample."""
    if params.greedy:
        return logits.argmax(-1)
    return torch.multinomial(processed_probs(logits, params), 1, generator=generator).squeeze(-1)


class Sampler:
    """One request's sampling state: the parameters, the seeded generator and, with penalties, the history
    (which tokens the prompt holds; how often each token has been generated and committed).

    `history` arguments are [T, V] counts of the tokens on each row's own path in the current step that
    are not committed yet (None: none). Nothing here syncs with the host."""

    def __init__(self, params: SamplingParams, prompt_ids: torch.Tensor, vocab: int):
        self.params = params
        self.vocab = vocab
        device = prompt_ids.device
        self.gen = None
        if not params.greedy:
            self.gen = torch.Generator(device=device)
            self.gen.manual_seed(params.seed if params.seed is not None else int(time.time_ns() % (2**63)))
        self.counts = self.in_prompt = None
        if params.penalized:
            self.counts = torch.zeros(vocab, dtype=torch.float32, device=device)
            self.in_prompt = torch.zeros(vocab, dtype=torch.bool, device=device)
            self.in_prompt[prompt_ids] = True

    @property
    def plain_greedy(self) -> bool:
        return self.params.greedy and self.counts is None

    # -- history -------------------------------------------------------------------------------------
    def commit(self, tokens: torch.Tensor):
        """Generated tokens [n] (device) join the committed history."""
        if self.counts is not None:
            t = tokens.reshape(-1)
            self.counts.index_add_(0, t, torch.ones(t.shape[0], dtype=self.counts.dtype, device=t.device))

    def chain_history(self, block: torch.Tensor) -> torch.Tensor | None:
        """block [B] uncommitted tokens -> [B, V]: row i counts block[:i+1]."""
        if self.counts is None:
            return None
        return F.one_hot(block, self.vocab).to(self.counts.dtype).cumsum(0)

    def tree_history(self, tokens: torch.Tensor, ancestors: torch.Tensor) -> torch.Tensor | None:
        """Tree nodes tokens [N], ancestors [N, N] bool (incl. self) -> [N, V]: row n counts n's path."""
        if self.counts is None:
            return None
        return ancestors.to(self.counts.dtype) @ F.one_hot(tokens, self.vocab).to(self.counts.dtype)

    # -- choice --------------------------------------------------------------------------------------
    def _logits(self, logits: torch.Tensor, history: torch.Tensor | None) -> torch.Tensor:
        x = logits.float()
        if self.counts is not None:
            counts = self.counts.expand_as(x) if history is None else self.counts + history
            x = penalise(x, self.params, counts, self.in_prompt)
        return x

    def probs(self, logits: torch.Tensor, history: torch.Tensor | None = None) -> torch.Tensor:
        """[T, V] -> processed probabilities [T, V] (temperature > 0)."""
        return truncate(self._logits(logits, history), self.params).softmax(-1)

    def choose(self, logits: torch.Tensor, history: torch.Tensor | None = None) -> torch.Tensor:
        """[T, V] -> [T] int64: the target's token after each row."""
        if self.plain_greedy:
            return logits.argmax(-1)
        if self.params.greedy:
            return self._logits(logits, history).argmax(-1)
        return torch.multinomial(self.probs(logits, history), 1, generator=self.gen).squeeze(-1)

    # -- drafting and chain verification -------------------------------------------------------------
    def draft_sample(self, logits: torch.Tensor, last: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The drafter's logits [B-1, V] for the positions after `last` -> (guesses [B-1] sampled from
        q, q [B-1, V]): q is processed like the target (penalties count the committed history and `last`;
        the drafter guesses all positions at once, so not its own earlier guesses -- any q is exact as
        long as the guesses are drawn from it)."""
        history = self.chain_history(last.reshape(1))
        q = self.probs(logits, history)
        return torch.multinomial(q, 1, generator=self.gen).squeeze(-1), q

    def chain_verify(self, block: torch.Tensor, logits: torch.Tensor, q: torch.Tensor | None = None):
        """block [B] = [last, guesses]; logits [B, V] of the target after each block token.

        q None (match rule): the target samples every position; a guess is accepted while it equals the
        target's token at its parent. q [B-1, V] (residual rule; guesses drawn from q): guess i is
        accepted with probability min(1, p_i(g) / q_i(g)); at the first rejection the token is drawn from
        normalise(max(0, p_i - q_i)); with every guess accepted the bonus is drawn from p_{B-1}.

        Returns (n: [] device int64, accepted guesses; out [B]: out[:n] = guesses, out[n] = next token)."""
        history = self.chain_history(block)
        guess = block[1:]
        if q is None:
            chosen = self.choose(logits, history)
            return (guess == chosen[:-1]).to(torch.int64).cumprod(0).sum(), chosen
        if self.params.greedy:
            raise ValueError("the residual rule needs temperature > 0 (greedy drafts use the match rule)")
        p = self.probs(logits, history)                                         # [B, V]
        pg = p[:-1].gather(1, guess.view(-1, 1)).squeeze(1)
        qg = q.gather(1, guess.view(-1, 1)).squeeze(1)
        u = torch.rand(guess.shape[0], generator=self.gen, device=p.device)
        n = (u * qg < pg).to(torch.int64).cumprod(0).sum()                     # u < p/q, without dividing
        resid = (p[:-1] - q.float()).clamp(min=0)
        # p_i == q_i leaves no residual, but then rejection has probability 0: any distribution will do
        resid = torch.where(resid.sum(-1, keepdim=True) > 0, resid, p[:-1])
        fix = torch.multinomial(torch.cat([resid, p[-1:]]), 1, generator=self.gen).squeeze(-1)   # [B]
        out = torch.cat([guess, fix[-1:]]).scatter(0, n.view(1), fix.gather(0, n.view(1)))
        return n, out
