"""How much a quantized drafter format changes a trained drafter's proposals, on real target features.

Quantizes DRAFTER_DIR (z-lab layout, written by `dflash24 train-draft`) to Q8_0 / Q6_K / Q4_K GGUFs, runs every
format and the BF16 original (computed in fp32) over the same text: the shipped HumanEval / GSM8K prompts, each
continued by the target's own greedy tokens (never training data), the target's features as context, a block
drafted at every ANCHOR-th position of the continuation. Prints one JSON line per format: cosine of the block logits
to BF16 (min / mean), top-1 agreement with BF16, and top-1 agreement with the target's greedy tokens (the labels
train-draft uses; what acceptance follows). Runs on the CPU or a GPU.

    python benchmarks/draft_formats_quality.py TARGET.gguf DRAFTER_DIR [--prompts 4] [--gen 96] [--anchor 16]
                                                [--device cpu]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main():
    from dflash24.bench.datasets import load_suite
    from dflash24.config import EngineConfig, SamplingParams
    from dflash24.engine import Engine
    from dflash24.models.drafter import DFlashDrafter
    from dflash24.models.layers import Step
    from dflash24.quant.quantize import quantize_draft
    ap = argparse.ArgumentParser()
    ap.add_argument("target")
    ap.add_argument("drafter")
    ap.add_argument("--prompts", type=int, default=4, help="per suite (he, gsm)")
    ap.add_argument("--gen", type=int, default=96, help="greedy target tokens after each prompt")
    ap.add_argument("--anchor", type=int, default=16, help="draft a block every this many positions")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    dev = torch.device(a.device)
    eng = Engine(EngineConfig(model=a.target, device=a.device, ctx=1024, dtype="float32"))
    target = eng.model
    seqs = []
    for suite in ("he", "gsm"):
        for p in load_suite(suite, a.prompts):
            ids = eng.encode_raw(p.text)[:1024 - a.gen - 1]
            out = [t for ev in eng.generate(ids, SamplingParams(max_tokens=a.gen, ignore_eos=True)) for t in ev.token_ids]
            seqs.append((ids + out, len(ids)))
    drafters = {"BF16": DFlashDrafter.from_pretrained(a.drafter, device=dev, max_positions=1100)}
    tmp = tempfile.mkdtemp()
    for q in ("q8_0", "q6_k", "q4_k"):
        quantize_draft(a.drafter, f"{tmp}/{q}.gguf", q)
        drafters[q.upper()] = DFlashDrafter.from_gguf(f"{tmp}/{q}.gguf", device=dev, max_positions=1100)
    layers = tuple(drafters["BF16"].cfg.target_layer_ids)
    B = drafters["BF16"].cfg.block_size
    logits = {k: [] for k in drafters}
    truth = []
    with torch.no_grad():
        for seq, start in seqs:
            ids = torch.tensor(seq, device=dev)
            T = ids.shape[0]
            cache = target.new_cache(T + 1, torch.float32, dev)
            h, feats = target(ids, Step.sequential(0, T, device=dev), cache, layers)
            greedy = target.logits(h).argmax(-1)                  # greedy[q]: the target's token after ids[:q+1]
            for p in range(start, T - B, a.anchor):               # block at p: context < p, first token ids[p]
                truth.append(greedy[p:p + B - 1])
                for name, d in drafters.items():
                    dc = d.new_cache(T + B, torch.float32, dev)
                    d.add_context(feats[:p], torch.arange(p, device=dev), dc)
                    logits[name].append(d.draft(ids[p:p + 1], p, dc, target.token_embd,
                                                lambda h: target.logits(h)).float())
    truth = torch.cat(truth)
    base = torch.cat(logits["BF16"])
    for name, ls in logits.items():
        x = torch.cat(ls)
        cos = torch.nn.functional.cosine_similarity(x.double(), base.double(), dim=-1)
        print(json.dumps({"format": name, "blocks": len(ls), "positions": int(x.shape[0]),
                          "cos_min": round(float(cos.min()), 6), "cos_mean": round(float(cos.mean()), 6),
                          "top1_vs_bf16": round(float((x.argmax(-1) == base.argmax(-1)).float().mean()), 4),
                          "top1_vs_target": round(float((x.argmax(-1) == truth).float().mean()), 4),
                          "first_position_vs_target": round(float((x.view(-1, B - 1, x.shape[-1])[:, 0].argmax(-1)
                                                                 == truth.view(-1, B - 1)[:, 0]).float().mean()), 4)}),
              flush=True)


if __name__ == "__main__":
    main()
