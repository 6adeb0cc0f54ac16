"""Token choice from target logits, on the device, without host syncs."""
from __future__ import annotations

import torch

from ..config import SamplingParams


def processed_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[T, V] logits -> [T, V] probabilities after temperature, top-k and top-p (params.temperature > 0)."""
    x = logits.float() / params.temperature
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
    return x.softmax(-1)


def choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """[T, V] -> [T] int64 token ids: argmax when greedy, else a sample of the processed distribution."""
    if params.greedy:
        return logits.argmax(-1)
    probs = processed_probs(logits, params)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
