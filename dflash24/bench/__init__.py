"""`dflash24 bench`: speed and acceptance length on HumanEval / GSM8K / MATH prompts shipped in the package."""
from .datasets import SUITES, BenchPrompt, load_suite, parse_suites, prompt_text
from .runner import add_bench_args, benchmark, run_bench, run_prompt, summarize

__all__ = ["SUITES", "BenchPrompt", "load_suite", "parse_suites", "prompt_text", "add_bench_args", "benchmark",
           "run_bench", "run_prompt", "summarize"]
