"""Decode loops. Each is a generator that yields the token ids committed by one target step.

The caller (Engine.generate) owns output, stop conditions and budgets, and simply stops iterating.
Every token a loop yields is the TARGET's choice (argmax, or a sample of its processed distribution), so
speculation never changes what is generated, only how many tokens one target forward commits.
"""
from __future__ import annotations

import time
from typing import Iterator

import torch

from .ddtree import accept
from .sampling import Sampler


class StepTimer:
    """Draft / verify time per step without host syncs: CUDA events are read once, at the end."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list = []

    def mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append(ev)
        else:
            self.marks.append(time.perf_counter())

    def spans(self, every: int) -> list[float]:
        """Seconds between consecutive marks, grouped per step of `every` spans: [sum of span k, ...]."""
        if len(self.marks) < 2:
            return [0.0] * every
        if self.cuda:
            self.marks[-1].synchronize()
            d = [a.elapsed_time(b) / 1e3 for a, b in zip(self.marks, self.marks[1:])]
        else:
            d = [b - a for a, b in zip(self.marks, self.marks[1:])]
        return [sum(d[k::every + 1]) for k in range(every)]


def ar_steps(target, first: torch.Tensor, pos: int, sampler: Sampler) -> Iterator[list[int]]:
    """Plain decoding: one target forward per token. `first` [1] is the token at `pos` (already yielded)."""
    token = first
    while pos < target.capacity:
        logits, _ = target.decode(token, pos)
        sampler.commit(token)
        token = sampler.choose(logits)
        pos += 1
        yield [int(token)]                    # the one host sync per step


def chain_steps(target, draft, cache, first: torch.Tensor, pos: int, sampler: Sampler,
                stats, timer: StepTimer, rule: str = "match") -> Iterator[list[int]]:
    """DFlash chain speculation: the drafter guesses B-1 tokens after the last committed one, the target
    verifies the block [last, guesses] in one forward, and the longest prefix of guesses that equals the
    target's own choices is committed, plus the target's next token (the bonus).

    `first` [1] is the token at `pos` (already yielded); its features are not in the draft cache yet.
    rule "residual" (when sampling): the drafter samples its guesses from its processed distribution q and
    the speculative-sampling rule accepts them (Sampler.chain_verify); "match": greedy guesses.
    """
    residual = rule == "residual" and not sampler.params.greedy
    B = draft.drafter.block_size
    draft_rows = torch.arange(B, device=first.device)
    last = first
    while True:
        if pos + B > target.capacity:            # no room for a whole block: finish with plain steps
            yield from ar_steps(target, last, pos, sampler)
            return
        timer.mark()
        guess, q = draft.draft_sampled(last, pos, sampler) if residual else (draft.draft(last, pos), None)
        timer.mark()
        block = torch.cat([last.view(1), guess])                          # [B] at positions pos..pos+B-1
        logits, feats = target.forward_fixed(block, pos, speculative=True)
        accepted, chosen = sampler.chain_verify(block, logits, q)        # chosen[:n] = guesses, [n] = next
        result = torch.cat([accepted.view(1).to(chosen.dtype), chosen]).tolist()   # the one host sync
        timer.mark()
        n, chosen_host = result[0], result[1:]
        # commit block[0..n]: the last token and the n guesses the target agreed with
        cache.commit(target.verify_step(B, pos), torch.arange(n + 1, device=block.device), pos)
        sampler.commit(block[:n + 1])
        draft.add_committed(feats, draft_rows, pos)
        pos += n + 1
        last = chosen[n:n + 1]
        stats.steps += 1
        stats.accept_hist[n + 1] = stats.accept_hist.get(n + 1, 0) + 1
        yield chosen_host[: n + 1]


def tree_steps(target, draft, cache, first: torch.Tensor, pos: int, sampler: Sampler,
               stats, timer: StepTimer, budget: int) -> Iterator[list[int]]:
    """DDTree speculation: the drafter's top-k per position become a tree of `budget` nodes under the last
    committed token; the target verifies every node in one forward; the path that follows the target's own
    choices from the root is committed, plus the target's token after its deepest node."""
    N = budget + 1
    last = first
    while True:
        if pos + max(N, draft.drafter.block_size) > target.capacity:
            yield from ar_steps(target, last, pos, sampler)
            return
        timer.mark()
        tree = draft.draft_tree(last, pos, budget)
        timer.mark()
        logits, feats = target.forward_tree(tree, pos)
        chosen = sampler.choose(logits, sampler.tree_history(tree.tokens, tree.ancestors))   # [N]: after each node
        deepest = accept(tree, chosen)
        result = torch.cat([deepest.view(1), tree.ancestors[deepest].long(), chosen, tree.tokens]).tolist()
        timer.mark()                                                      # ^ the one host sync
        d = result[0]
        on_path, chosen_host, tokens_host = result[1:1 + N], result[1 + N:1 + 2 * N], result[1 + 2 * N:]
        path = [n for n in range(N) if on_path[n]]                        # root first: nodes are depth-ordered
        path_dev = torch.tensor(path + [0] * (N - len(path)), device=chosen.device)    # padded to N
        cache.commit(target.tree_commit_step(N), path_dev[:len(path)], pos)
        sampler.commit(tree.tokens[path_dev[:len(path)]])
        draft.add_committed(feats, path_dev, pos)
        pos += len(path)
        last = chosen[d:d + 1]
        stats.steps += 1
        stats.accept_hist[len(path)] = stats.accept_hist.get(len(path), 0) + 1
        yield [tokens_host[n] for n in path[1:]] + [chosen_host[d]]
