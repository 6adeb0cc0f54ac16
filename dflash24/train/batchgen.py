"""Batched response generation for drafter training data: many prompts decoded together on one GPU.

Single-sequence decoding of a 0.5B target is bound by reading the weights once per token (~430 tok/s on an
H200); decoding B sequences per step reads them once for all B. The sequences share one KV cache of B regions
of `max_len` rows: each prompt is prefilled through its own region (`KVCache.region`, the usual causal step),
and every decode step feeds one token per live sequence as a `region` step: token b attends over rows
b*max_len .. b*max_len + position_b only (its own block, not the whole cache). Dense targets only: a
recurrent (qwen35) target keeps one state per sequence, which this packing does not have.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.layers import Step


@dataclass
class BatchOutput:
    tokens: list[int]                   # the response, without the end token
    finish: str                         # "stop" (an end token) or "length"


def supports(model) -> bool:
    """Whether `model` can be decoded in packed batches (a plain attention stack, no recurrent state)."""
    from ..models.dense import DenseModel
    return isinstance(model, DenseModel)


@torch.inference_mode()
def generate_batch(model, prompts: list[list[int]], max_new_tokens: list[int], eos_ids: set[int], *,
                   region: int, dtype, device, temperature: float = 0.0, seed: int = 0) -> list[BatchOutput]:
    """Decode every prompt until an end token or its budget; prompt b + its response must fit `region` rows.
    Greedy (temperature 0) gives the tokens single-sequence greedy decoding gives, up to the rounding
    differences of a different batch size (none on the CPU)."""
    if not supports(model):
        raise ValueError(f"batched generation needs a dense target; {model.__class__.__name__} keeps recurrent "
                         f"state per sequence (generate one sequence at a time)")
    B = len(prompts)
    for b, (p, n) in enumerate(zip(prompts, max_new_tokens)):
        if not p or len(p) + n > region:
            raise ValueError(f"prompt {b}: {len(p)} tokens + {n} new do not fit a {region}-row region")
    cache = model.new_cache(B * region, dtype, device)
    gen = torch.Generator(device=device).manual_seed(seed) if temperature > 0 else None

    def pick(logits: torch.Tensor) -> torch.Tensor:
        if temperature <= 0:
            return logits.argmax(-1)
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        return torch.multinomial(probs, 1, generator=gen).squeeze(-1)

    nxt = torch.empty(B, dtype=torch.long, device=device)
    for b, p in enumerate(prompts):                          # prefill: one region, the usual causal step
        ids = torch.tensor(p, dtype=torch.long, device=device)
        h, _ = model(ids, Step.sequential(0, len(p), device=device), cache.region(b * region, region))
        nxt[b] = pick(model.logits(h[-1:]))[0]
    pos = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=device)   # where nxt goes
    out: list[list[int]] = [[] for _ in range(B)]
    finish = [""] * B
    live = list(range(B))
    while live:
        still, chosen = [], nxt.tolist()                    # one device sync per step
        for b in live:                                       # record this step's choices, retire the finished
            t = chosen[b]
            if t in eos_ids:
                finish[b] = "stop"
            else:
                out[b].append(t)
                if len(out[b]) >= max_new_tokens[b]:
                    finish[b] = "length"
                else:
                    still.append(b)
        live = still
        if not live:
            break
        idx = torch.tensor(live, dtype=torch.long, device=device)
        slots = idx * region + pos[idx]
        h, _ = model(nxt[idx], Step(pos[idx], slots, (max(live) + 1) * region, region=region), cache)
        nxt[idx] = pick(model.logits(h))
        pos[idx] += 1
    return [BatchOutput(o, f) for o, f in zip(out, finish)]
