"""Benchmark prompts shipped with the package: 10 each of HumanEval (he), GSM8K (gsm) and MATH-500 (math).

The files (`data/{suite}-10.jsonl`) hold one record per line: `id`, `suite`, `messages` (one user message),
plus the gold answer / test. The benchmark runs them as raw completions in the published prompt styles:
HumanEval's prompt as is (the function header and docstring), `Question: ...\\nAnswer: ` for GSM8K and
`Problem: ...\\nSolution: ` for MATH. `prompt_text` derives these from the stored user message.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

SUITES = ("he", "gsm", "math")
_HE_INSTRUCTION = "Complete the following Python function.\n\n"


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    suite: str
    text: str                           # the raw-completion prompt


def prompt_text(suite: str, record: dict) -> str:
    """The raw-completion prompt of one stored record."""
    try:
        content = record["messages"][0]["content"]
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"benchmark record {record.get('id', '?')!r} has no user message") from None
    if suite == "he":
        return content[len(_HE_INSTRUCTION):] if content.startswith(_HE_INSTRUCTION) else content
    if suite == "gsm":
        question = content.removeprefix("Question: ")
        question = question[:question.rfind("\nAnswer:")] if "\nAnswer:" in question else question.rstrip()
        return f"Question: {question}\nAnswer: "
    if suite == "math":
        problem = content.removeprefix("Problem: ")
        problem = problem[:problem.rfind("\nSolution:")] if "\nSolution:" in problem else problem.rstrip()
        return f"Problem: {problem}\nSolution: "
    raise ValueError(f"unknown benchmark suite {suite!r}; available: {', '.join(SUITES)}")


def load_suite(suite: str, n_prompts: int | None = None) -> list[BenchPrompt]:
    """The first `n_prompts` prompts of a suite (all when None)."""
    if suite not in SUITES:
        raise ValueError(f"unknown benchmark suite {suite!r}; available: {', '.join(SUITES)}")
    text = resources.files(__package__).joinpath("data", f"{suite}-10.jsonl").read_text(encoding="utf-8")
    prompts = []
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{suite}-10.jsonl line {line_no}: {e}") from None
        prompts.append(BenchPrompt(str(record.get("id", f"{suite}_{line_no:02d}")), suite, prompt_text(suite, record)))
    return prompts if n_prompts is None else prompts[:n_prompts]


def parse_suites(spec: str) -> list[str]:
    """'he,gsm' -> ['he', 'gsm'], with a clear error for unknown names."""
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise ValueError("--suite is empty; choose from " + ", ".join(SUITES))
    bad = [s for s in names if s not in SUITES]
    if bad:
        raise ValueError(f"unknown --suite {', '.join(bad)}; choose from {', '.join(SUITES)}")
    return names
