"""Benchmark report: per-prompt rows, the per-suite summary table, and an optional PNG bar chart."""
from __future__ import annotations

from pathlib import Path

_PROMPT_COLS = (("prompt", 9), ("mode", 5), ("in", 5), ("out", 5), ("tok/s", 8), ("AL", 6), ("prefill t/s", 11),
                ("finish", 6))


def prompt_header() -> str:
    return " ".join(f"{name:>{w}}" if i > 1 else f"{name:<{w}}" for i, (name, w) in enumerate(_PROMPT_COLS))


def format_prompt_row(r: dict) -> str:
    values = (r["id"], r["mode"], r["prompt_tokens"], r["completion_tokens"], f"{r['tokens_per_s']:.1f}",
              f"{r['acceptance_length']:.2f}", f"{r['prefill_tokens_per_s']:.0f}", r["finish_reason"])
    return " ".join(f"{v!s:>{w}}" if i > 1 else f"{v!s:<{w}}" for i, (v, (_, w)) in enumerate(zip(values, _PROMPT_COLS)))


def format_summary(results: dict) -> str:
    """suite x mode table with pooled tok/s, acceptance length, tokens, and speedup vs AR where measured."""
    head = f"{'suite':<6} {'mode':<5} {'prompts':>7} {'tokens':>7} {'tok/s':>9} {'AL':>6} {'prefill t/s':>11} {'speedup':>8} {'same as AR':>10}"
    lines = [head, "-" * len(head)]
    for suite, by_mode in results["suites"].items():
        for mode, s in by_mode.items():
            sp = results["speedup_vs_ar"].get(suite, {}).get(mode)
            same = results["identical_to_ar"].get(suite, {}).get(mode)
            sp_text = f"{sp:.2f}x" if sp else ""
            same_text = f"{same['identical']}/{same['prompts']}" if same else ""
            lines.append(f"{suite:<6} {mode:<5} {s['prompts']:>7} {s['completion_tokens']:>7} {s['tokens_per_s']:>9.1f} "
                         f"{s['acceptance_length']:>6.2f} {s['prefill_tokens_per_s']:>11.0f} {sp_text:>8} {same_text:>10}")
    return "\n".join(lines)


def write_chart(results: dict, path: Path) -> Path | None:
    """A grouped bar chart of tok/s per suite and mode (speedup annotated); None when matplotlib is absent."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    suites, modes = list(results["suites"]), results["modes"]
    width = 0.8 / max(len(modes), 1)
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(suites), 3.6))
    for j, mode in enumerate(modes):
        xs = [i + (j - (len(modes) - 1) / 2) * width for i in range(len(suites))]
        ys = [results["suites"][s].get(mode, {}).get("tokens_per_s", 0.0) for s in suites]
        bars = ax.bar(xs, ys, width, label=mode)
        for bar, s in zip(bars, suites):
            sp = results["speedup_vs_ar"].get(s, {}).get(mode)
            al = results["suites"][s].get(mode, {}).get("acceptance_length", 0.0)
            note = f"{sp:.2f}x\nAL {al:.2f}" if sp else ""
            if note:
                ax.annotate(note, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                            fontsize=7)
    ax.set_xticks(range(len(suites)), suites)
    ax.set_ylabel("decode tokens/s")
    ax.set_title(f"dflash24 bench: {Path(str(results.get('model', ''))).name} on {results.get('device', '')}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
