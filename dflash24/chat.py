"""`dflash24 chat`: a terminal chat over the engine, streaming each answer, keeping the conversation.

Commands: /reset (forget the conversation), /stats (details of the last answer and session totals),
/help, /exit (or /quit, Ctrl-D). Ctrl-C while an answer streams stops that answer and keeps what was said.
Input and output are injectable so the loop can be driven by tests.
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Callable, TextIO

from .config import ConfigError, SamplingParams

HELP = "commands: /reset  forget the conversation | /stats  last answer in detail | /exit  quit"


def stats_line(stats, finish_reason: str | None) -> str:
    """One line after each answer: tokens, decode speed, acceptance length, prefill speed."""
    s = stats.as_dict()
    end = {"length": " | hit max tokens", "cancelled": " | interrupted"}.get(finish_reason or "", "")
    cached = f" ({s['reused_tokens']} cached)" if s.get("reused_tokens") else ""
    return (f"[{s['completion_tokens']} tokens | {s['tokens_per_s']:.1f} tok/s | AL {s['acceptance_length']:.2f} | "
            f"prefill {s['prompt_tokens']} tokens{cached} at {s['prefill_tokens_per_s']:.0f} tok/s | {s['mode']}{end}]")


def run_chat(engine, params: SamplingParams = SamplingParams(), input_fn: Callable[[str], str] = input,
             output: TextIO = sys.stdout, system: str | None = None, prompt: str = "> ") -> list[dict]:
    """Run the chat loop until /exit or end of input. Returns the conversation (list of messages)."""
    history: list[dict] = [{"role": "system", "content": system}] if system else []
    last, totals = None, {"answers": 0, "completion_tokens": 0, "decode_s": 0.0}

    def say(text: str = "", end: str = "\n"):
        output.write(text + end)
        output.flush()

    say(f"dflash24 chat: {getattr(engine, 'model_path', 'model')} (context {engine.config.ctx} tokens). {HELP}")
    while True:
        try:
            line = input_fn(prompt)
        except EOFError:
            say()
            break
        except KeyboardInterrupt:
            say()
            break
        text = line.strip()
        if not text:
            continue
        if text.startswith("/"):
            cmd = text.split()[0].lower()
            if cmd in ("/exit", "/quit"):
                break
            if cmd == "/reset":
                history = [m for m in history if m["role"] == "system"]
                say("[conversation cleared]")
            elif cmd == "/stats":
                say(_stats_report(last, totals))
            elif cmd == "/help":
                say(HELP)
            else:
                say(f"[unknown command {cmd}] {HELP}")
            continue

        messages = history + [{"role": "user", "content": line}]
        try:
            ids = engine.encode_chat(messages)
            engine.check_fits(len(ids), 1)
        except (ConfigError, ValueError) as e:            # TemplateError is a ValueError
            say(f"[cannot send this message: {e}; /reset starts a new conversation]")
            continue
        room = engine.config.ctx - len(ids)
        gen_params = dataclasses.replace(params, max_tokens=max(1, min(params.max_tokens, room)))
        pieces, final = [], None
        events = engine.generate(ids, gen_params)
        try:
            for ev in events:
                if ev.text:
                    pieces.append(ev.text)
                    output.write(ev.text)
                    output.flush()
                if ev.finish_reason is not None:
                    final = ev
        except KeyboardInterrupt:
            events.close()
        answer = "".join(pieces)
        say()
        history = messages + [{"role": "assistant", "content": answer}]
        if final is None:
            say("[interrupted]")
            continue
        last = final
        totals["answers"] += 1
        totals["completion_tokens"] += final.stats.completion_tokens
        totals["decode_s"] += final.stats.decode_s
        say(stats_line(final.stats, final.finish_reason))
        if final.finish_reason == "length" and room <= params.max_tokens:
            say("[the context is full; /reset starts a new conversation]")
    return history


def _stats_report(last, totals) -> str:
    if last is None:
        return "[no answer yet]"
    d = last.stats.as_dict()
    lines = ["last answer:"] + [f"  {k:<22} {v}" for k, v in d.items()]
    lines.append(f"  {'finish_reason':<22} {last.finish_reason}")
    tps = totals["completion_tokens"] / totals["decode_s"] if totals["decode_s"] > 0 else 0.0
    lines.append(f"session: {totals['answers']} answers, {totals['completion_tokens']} tokens, {tps:.1f} tok/s overall")
    return "\n".join(lines)
