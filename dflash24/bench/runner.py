"""`dflash24 bench`: decode speed and acceptance length on the shipped prompt suites, per prompt and per suite.

Every prompt runs as a raw completion for up to `max_tokens` tokens (end of text also stops it, as in the
published DFlash benchmarks), greedy by default. When the engine decodes speculatively, the same run also
builds an autoregressive engine and reports per suite the speedup (spec tok/s / AR tok/s, measured in this
run) and how many outputs are token-identical to AR (greedy speculative decoding is lossless, so all should
be). With `temperature` > 0 (agent / chat traffic) each prompt samples with its own seed (`seed` + its
index), the same in every mode; sampled outputs are compared by distribution, not token for token, so the
identical-to-AR count is left out and the acceptance length is the number to read.

Engines come from `make_engine(mode)`: mode None is the engine's default (the fastest available), 'ar' /
'chain' / 'tree' force one. One engine exists at a time (they would not both fit on a 24 GB GPU).
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence, TextIO

from ..config import SamplingParams
from .datasets import SUITES, BenchPrompt, load_suite, parse_suites
from .report import format_prompt_row, format_summary, prompt_header, write_chart


def run_prompt(engine, prompt: BenchPrompt, max_tokens: int, sampling: SamplingParams | None = None) -> dict:
    """Generate for one prompt (greedy, or with `sampling`'s settings); returns its record (speed, acceptance,
    tokens, a hash of the output)."""
    ids = engine.encode_raw(prompt.text)
    engine.check_fits(len(ids), 1)
    n = max(1, min(max_tokens, engine.config.ctx - len(ids)))
    params = replace(sampling, max_tokens=n) if sampling is not None else SamplingParams(max_tokens=n)
    out_ids, text, final = [], [], None
    for ev in engine.generate(ids, params):
        out_ids += ev.token_ids
        text.append(ev.text)
        if ev.finish_reason is not None:
            final = ev
    s = final.stats
    d = s.as_dict()
    return {
        "id": prompt.id, "suite": prompt.suite, "mode": s.mode, "finish_reason": final.finish_reason,
        "prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens,
        "tokens_per_s": d["tokens_per_s"], "acceptance_length": d["acceptance_length"],
        "prefill_tokens_per_s": d["prefill_tokens_per_s"], "prefill_s": s.prefill_s, "decode_s": s.decode_s,
        "steps": s.steps, "accept_hist": {int(k): v for k, v in s.accept_hist.items()},
        "draft_ms_per_step": d["draft_ms_per_step"], "verify_ms_per_step": d["verify_ms_per_step"],
        "output_sha1": hashlib.sha1(json.dumps(out_ids).encode()).hexdigest(),
        "text_head": "".join(text)[:160],
    }


def summarize(records: list[dict]) -> dict:
    """Pooled numbers of one suite x mode: tok/s = all tokens / all decode time; AL over all steps."""
    tokens = sum(r["completion_tokens"] for r in records)
    decode_s = sum(r["decode_s"] for r in records)
    prompt_tokens = sum(r["prompt_tokens"] for r in records)
    prefill_s = sum(r["prefill_s"] for r in records)
    hist: dict[int, int] = {}
    for r in records:
        for k, v in r["accept_hist"].items():
            hist[int(k)] = hist.get(int(k), 0) + v
    steps = sum(hist.values())
    return {
        "prompts": len(records), "completion_tokens": tokens, "decode_s": round(decode_s, 4),
        "tokens_per_s": round(tokens / decode_s, 2) if decode_s > 0 else 0.0,
        "acceptance_length": round(sum(k * v for k, v in hist.items()) / steps, 3) if steps else 0.0,
        "prefill_tokens_per_s": round(prompt_tokens / prefill_s, 1) if prefill_s > 0 else 0.0,
        "mean_prompt_tokens_per_s": round(sum(r["tokens_per_s"] for r in records) / len(records), 2) if records else 0.0,
    }


def _release(engine):
    del engine
    gc.collect()
    try:
        import torch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover -- torch is a dependency
        pass


def benchmark(make_engine: Callable[[str | None], object], suites: Sequence[str] = SUITES, n_prompts: int = 10,
              max_tokens: int = 256, out_dir: str | Path | None = None, output: TextIO = sys.stdout,
              modes: Sequence[str | None] | None = None, warmup: int = 1, temperature: float = 0.0,
              top_p: float = 1.0, seed: int = 0) -> dict:
    """Run the suites with each mode's engine; print rows as they finish and a summary; write results.json
    (and bench.png when matplotlib is installed) into `out_dir`. Returns the results dict.

    modes None: the default engine, then 'ar' too if the default is speculative. temperature > 0: every
    prompt samples (top_p) with seed `seed` + its index in the run, in every mode.
    """
    if n_prompts < 1:
        raise ValueError(f"--n-prompts must be >= 1, got {n_prompts}")
    if max_tokens < 1:
        raise ValueError(f"--max-tokens must be >= 1, got {max_tokens}")
    sampled = temperature > 0
    base = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p)   # validates them
    prompts = {s: load_suite(s, n_prompts) for s in suites}
    plan = list(modes) if modes is not None else [None]
    records: list[dict] = []
    meta: dict = {}
    i = 0
    while i < len(plan):
        engine = make_engine(plan[i])
        mode = getattr(engine, "spec_mode", plan[i] or "ar")
        if modes is None and i == 0 and mode != "ar":
            plan.append("ar")
        meta.setdefault("model", str(getattr(engine, "model_path", "")))
        meta.setdefault("ctx", engine.config.ctx)
        meta.setdefault("device", _device_name(engine))
        output.write(f"\n== mode {mode} ==\n{prompt_header()}\n")
        first = next(iter(prompts.values()))[0]
        for _ in range(warmup):                     # kernels compile and graphs are captured here
            run_prompt(engine, first, min(max_tokens, 16), replace(base, seed=seed))
        k = 0
        for suite in suites:
            for p in prompts[suite]:
                rec = run_prompt(engine, p, max_tokens, replace(base, seed=seed + k) if sampled else None)
                k += 1
                records.append(rec)
                output.write(format_prompt_row(rec) + "\n")
                output.flush()
        _release(engine)
        engine = None
        i += 1

    settings = dict(n_prompts=n_prompts, max_tokens=max_tokens)
    if sampled:
        settings.update(temperature=temperature, top_p=top_p, seed=seed)
    results = build_results(records, suites, meta, compare_outputs=not sampled, **settings)
    output.write("\n" + format_summary(results) + "\n")
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
        written = [str(out / "results.json")]
        png = write_chart(results, out / "bench.png")
        if png is not None:
            written.append(str(png))
        output.write("wrote " + ", ".join(written) + "\n")
    return results


def build_results(records: list[dict], suites: Sequence[str], meta: dict, compare_outputs: bool = True,
                  **settings) -> dict:
    """Per suite x mode summaries, speedups over AR, and (greedy runs: compare_outputs) how many outputs
    equal AR's."""
    modes = list(dict.fromkeys(r["mode"] for r in records))
    per_suite: dict = {}
    speedup: dict = {}
    lossless: dict = {}
    for suite in suites:
        per_suite[suite] = {m: summarize([r for r in records if r["suite"] == suite and r["mode"] == m]) for m in modes}
        ar = per_suite[suite].get("ar")
        for m in modes:
            if m == "ar" or ar is None:
                continue
            spec = per_suite[suite][m]
            speedup.setdefault(suite, {})[m] = round(spec["tokens_per_s"] / ar["tokens_per_s"], 3) if ar["tokens_per_s"] else None
            if not compare_outputs:
                continue
            ar_out = {r["id"]: r["output_sha1"] for r in records if r["suite"] == suite and r["mode"] == "ar"}
            same = sum(1 for r in records if r["suite"] == suite and r["mode"] == m and ar_out.get(r["id"]) == r["output_sha1"])
            lossless.setdefault(suite, {})[m] = {"identical": same, "prompts": spec["prompts"]}
    return {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **meta, **settings, "modes": modes,
            "suites": per_suite, "speedup_vs_ar": speedup, "identical_to_ar": lossless, "prompts": records}


def _device_name(engine) -> str:
    dev = getattr(engine, "device", None)
    try:
        import torch
        if dev is not None and getattr(dev, "type", str(dev)) == "cuda":
            return torch.cuda.get_device_name(dev)
    except Exception:  # noqa: BLE001 -- a name is only informative
        pass
    return str(dev) if dev is not None else "unknown"


# -- command line ----------------------------------------------------------------------------------------
def add_bench_args(parser: argparse.ArgumentParser) -> None:
    """--suite, --n-prompts, --max-tokens, --out, --warmup (skipping any the parser already has)."""
    have = set(parser._option_string_actions)  # noqa: SLF001 -- avoids clashing with shared sampling flags
    add = lambda flag, **kw: None if flag in have else parser.add_argument(flag, **kw)  # noqa: E731
    add("--suite", default="he,gsm,math", help=f"comma-separated suites from {', '.join(SUITES)}")
    add("--n-prompts", type=int, default=10, help="prompts per suite (at most 10 are shipped)")
    add("--max-tokens", type=int, default=256, help="tokens to generate per prompt (default 256)")
    add("--out", default="bench-out", help="directory for results.json (and bench.png with matplotlib)")
    add("--warmup", type=int, default=1, help="untimed generations per engine before measuring")
    add("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples every prompt")
    add("--top-p", type=float, default=1.0)
    add("--seed", type=int, default=0, help="sampled runs: prompt i uses seed + i, in every mode")


def run_bench(args, make_engine: Callable[[argparse.Namespace], object], output: TextIO = sys.stdout) -> int:
    """CLI entry: `make_engine(args)` builds an engine from parsed model flags; the benchmark calls it with
    `args.spec` replaced per mode (the default engine first, then --spec ar when it is speculative)."""
    from ..config import ConfigError
    try:
        suites = parse_suites(args.suite)
    except ValueError as e:
        raise ConfigError(str(e)) from None

    def factory(mode: str | None):
        if mode is None:
            return make_engine(args)
        return make_engine(argparse.Namespace(**{**vars(args), "spec": mode}))

    if args.n_prompts < 1 or args.max_tokens < 1:
        raise ConfigError(f"--n-prompts and --max-tokens must be >= 1 (got {args.n_prompts}, {args.max_tokens})")
    forced = getattr(args, "spec", None)
    benchmark(factory, suites, n_prompts=args.n_prompts, max_tokens=args.max_tokens, out_dir=args.out,
              output=output, modes=None if forced in (None, "ar") else [forced, "ar"],
              warmup=getattr(args, "warmup", 1), temperature=getattr(args, "temperature", 0.0),
              top_p=getattr(args, "top_p", 1.0), seed=getattr(args, "seed", None) or 0)
    return 0
