"""Prefix cache: time to first token of turn 2 of a conversation with a long history, cache on vs off, in one
run, and the memory the DeltaNet snapshots take.

    python -m dflash24.synth --preset qwen35-27b --out /root/q35.gguf
    python benchmarks/bench_prefix.py /root/q35.gguf --history 16384 --gpu-mem 24

Turn 1: a user message of about `--history` tokens, answered with `--gen` tokens. Turn 2 re-sends the whole
conversation plus a short new question (what every chat client and agent does). Cold = the cache disabled for
turn 2 (full prefill); warm = turn 1 then turn 2 with the cache on. Both answers must be token-identical. A second
cold prefill in half-size chunks shows whether chunk boundaries alone change the answer on this model and GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

GiB = 1 << 30
WORDS = ("the cache keeps every token of the conversation so that the next turn only reads what is new while "
         "the recurrent state is restored from a snapshot taken at the end of the previous answer").split()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--history", type=int, default=16384, help="approximate tokens in turn 1's user message")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--ctx", type=int, default=20480)
    ap.add_argument("--gpu-mem", type=float, default=None)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    from dflash24.config import EngineConfig, SamplingParams
    from dflash24.engine import Engine

    cuda = args.device == "cuda"
    if cuda and args.gpu_mem:
        _, total = torch.cuda.mem_get_info()
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.gpu_mem * GiB / total))
    eng = Engine(EngineConfig(model=args.gguf, ctx=args.ctx, device=args.device, spec="ar"))
    params = SamplingParams(max_tokens=args.gen, ignore_eos=True)
    # a long user message: repeated words, cut to the wanted token count
    text = " ".join(WORDS[i % len(WORDS)] for i in range(args.history))
    ids = eng.tokenizer.encode(text)[:args.history]
    user1 = eng.tokenizer.decode(ids)
    turn1 = [{"role": "user", "content": user1}]

    def answer(messages):
        prompt = eng.encode_chat(messages)
        t = time.perf_counter()
        events = list(eng.generate(prompt, params))
        st = events[-1].stats
        return ([i for e in events for i in e.token_ids], "".join(e.text for e in events), st,
                time.perf_counter() - t, len(prompt))

    def turn2(reply_text):
        return turn1 + [{"role": "assistant", "content": reply_text},
                        {"role": "user", "content": "Summarise that in one sentence."}]

    rep = {"file": args.gguf, "history_tokens": len(ids)}
    eng.prefix.enabled = False
    _, reply, _, _, _ = answer(turn1)
    cold_ids, _, cold, _, n2 = answer(turn2(reply))                       # full prefill of turn 2
    # the same cold prefill in chunks of another size: do chunk boundaries alone change the answer here?
    from dataclasses import replace
    chunk = eng.config.prefill_chunk
    eng.config = replace(eng.config, prefill_chunk=chunk // 2)
    rechunked_ids, _, _, _, _ = answer(turn2(reply))
    eng.config = replace(eng.config, prefill_chunk=chunk)
    eng.prefix.enabled = True
    answer(turn1)                                                          # fills the cache and its snapshots
    warm_ids, _, warm, _, _ = answer(turn2(reply))
    t0 = time.perf_counter()
    # turn 3 (cache on): another hit, after the warm path has run once (Triton compiles, CUDA graphs)
    _, reply2, _, _, _ = answer(turn2(reply))
    _, _, warm3, _, n3 = answer(turn2(reply) + [{"role": "assistant", "content": reply2},
                                                {"role": "user", "content": "And in one word?"}])
    t_turn3 = time.perf_counter() - t0
    rep["turn2_prompt_tokens"] = n2
    rep["cold"] = {"ttft_s": round(cold.prefill_s, 3), "prefilled": cold.prefill_tokens}
    rep["warm"] = {"ttft_s": round(warm.prefill_s, 3), "prefilled": warm.prefill_tokens,
                   "reused": warm.reused_tokens}
    rep["warm_turn3"] = {"ttft_s": round(warm3.prefill_s, 3), "prefilled": warm3.prefill_tokens,
                         "reused": warm3.reused_tokens, "prompt_tokens": n3, "wall_s_incl_repeat": round(t_turn3, 2)}
    rep["ttft_speedup"] = round(cold.prefill_s / max(warm.prefill_s, 1e-9), 1)
    rep["identical_answers"] = cold_ids == warm_ids
    rep["cold_vs_cold_half_chunks_identical"] = cold_ids == rechunked_ids
    rep["identical_leading_tokens"] = next((i for i, (a, b) in enumerate(zip(cold_ids, warm_ids)) if a != b),
                                           min(len(cold_ids), len(warm_ids)))
    rep["snapshot_MiB"] = round(eng.prefix.snapshot_bytes / 2**20, 1)
    if cuda:
        rep["max_allocated_GiB"] = round(torch.cuda.max_memory_allocated() / GiB, 3)
    print(json.dumps(rep))
    return 0 if rep["identical_answers"] else 1


if __name__ == "__main__":
    sys.exit(main())
