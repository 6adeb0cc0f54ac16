"""Why can chain / tree output differ from AR on a GPU? Compares, position by position, the target's logits from
single-token decode steps (the AR path: M = 1 matmuls, decode attention splits) with the logits of the same
tokens fed as 16-token chain verify steps that accept every token (the verify path: M = 16 tl.dot matmuls, verify
attention splits, the speculative DeltaNet recurrence and its commit). With DFLASH24_BATCH_INVARIANT=1 every
logit should be the same bits (max_logit_diff 0.0). Where the greedy
choices disagree it prints the AR top-1 - top-2 margin next to the largest logit difference: near-ties flipped by
rounding, or a real bug (a large difference at a clear margin).

    python benchmarks/diag_verify_numerics.py MODEL.gguf [--tokens 256] [--block 16,23] [--policies 'pass|K.X=...']

--policies: '|'-separated statements (as benchmarks/with_settings.py takes them, K / N / L / DN / QT in scope),
each run from the shipped settings on the verify side against the same AR logits.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main():
    from dflash24.bench.datasets import load_suite
    from dflash24.gguf.reader import GGUFFile
    from dflash24.gguf.tokenizer import Tokenizer
    from dflash24.models import load_target
    from dflash24.models.layers import Step
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--block", default="16", help="verify block size(s), comma-separated")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--policies", default="pass")
    a = ap.parse_args()
    import dflash24.kernels.deltanet as deltanet_kernels
    import dflash24.kernels.norm as norm_kernels
    import dflash24.models.layers as layers
    import dflash24.quant.kernels as quant_kernels
    from gguf import GGMLQuantizationType
    scope = {"K": quant_kernels, "N": norm_kernels, "L": layers, "DN": deltanet_kernels, "QT": GGMLQuantizationType}
    shipped = Settings(quant_kernels, norm_kernels, layers, deltanet_kernels)
    dev = torch.device(a.device)
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    gf = GGUFFile(a.model)
    tok = Tokenizer.from_gguf(gf)
    model = load_target(gf, dev, dt, max_positions=4096)
    for p in load_suite("gsm", a.prompts):
        ids = torch.tensor(tok.encode(p.text), device=dev)
        P, N, blocks = ids.shape[0], a.tokens, [int(b) for b in a.block.split(",")]
        with torch.no_grad():
            cache = model.new_cache(P + N, dt, dev)
            h, _ = model(ids, Step.sequential(0, P, device=dev), cache)
            nxt = model.logits(h[-1:]).argmax(-1)
            toks, ar_logits = [], []
            for i in range(N):                                  # AR: one token per step
                toks.append(int(nxt))
                h, _ = model(nxt, Step.sequential(P + i, 1, device=dev), cache)
                lg = model.logits(h)[0]
                ar_logits.append(lg)
                nxt = lg.argmax(-1, keepdim=True)
            ar = torch.stack(ar_logits)                         # [N, V]: logits after toks[:i+1]
            for policy in a.policies.split("|"):
                shipped.restore()
                exec(policy, dict(scope))
                for B in blocks:
                    report(p.id, policy, B, ar, verify_blocks(model, ids, toks, B, dt, dev))


class Settings:
    """The modules' plain-valued attributes (switches, tables) as they are now, to go back to."""

    def __init__(self, *modules):
        plain = (bool, int, float, str, tuple, frozenset, dict, set, type(None))
        self.saved = [(m, {k: copy.copy(v) for k, v in vars(m).items() if isinstance(v, plain)
                           and not k.startswith("__")}) for m in modules]

    def restore(self):
        for m, values in self.saved:
            for k, v in values.items():
                setattr(m, k, copy.copy(v))


def verify_blocks(model, ids, toks, B, dt, dev):
    """The logits of `toks` fed as B-token chain verify steps that accept every token."""
    from dflash24.models.layers import Step
    P, N = ids.shape[0], len(toks)
    cache = model.new_cache(P + N + B, dt, dev, max_spec_tokens=B)
    model(ids, Step.sequential(0, P, device=dev), cache)
    t = torch.tensor(toks, device=dev)
    blocks = []
    for s in range(0, N, B):
        n = min(B, N - s)
        pos = torch.arange(P + s, P + s + n, device=dev)
        step = Step(pos, pos, P + s + n, speculative=True)
        blocks.append(model.logits(model(t[s:s + n], step, cache)[0]))
        cache.commit(step, torch.arange(n, device=dev), P + s)
    return torch.cat(blocks)


def report(prompt, policy, block, ar, blk):
    diff = (ar - blk).abs().amax(-1)
    top2 = ar.topk(2, dim=-1).values
    margin = top2[:, 0] - top2[:, 1]
    flips = (ar.argmax(-1) != blk.argmax(-1)).nonzero().flatten().tolist()
    print(json.dumps({"prompt": prompt, "policy": policy, "block": block, "tokens": ar.shape[0],
                      "max_logit_diff": round(float(diff.max()), 4),
                      "median_logit_diff": round(float(diff.median()), 4),
                      "mean_logit_diff": round(float(diff.mean()), 4),
                      "greedy_flips": len(flips),
                      "flip_margins": [round(float(margin[i]), 4) for i in flips[:8]],
                      "flip_diffs": [round(float(diff[i]), 4) for i in flips[:8]],
                      "smallest_margin": round(float(margin.min()), 4)}), flush=True)


if __name__ == "__main__":
    main()
