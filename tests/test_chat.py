"""Terminal chat on a real tiny engine, driven with injected input and a recording output."""
from __future__ import annotations

import io

import pytest

from dflash24.chat import run_chat
from dflash24.config import EngineConfig, SamplingParams
from dflash24.engine import Engine

CTX = 256


@pytest.fixture(scope="module")
def engine(tiny_qwen2_gguf):
    return Engine(EngineConfig(model=str(tiny_qwen2_gguf), ctx=CTX, device="cpu", cuda_graphs=False))


class Recorder:
    """Wraps the engine: records every prompt given to generate(); can raise KeyboardInterrupt mid-answer."""

    def __init__(self, engine, interrupt_after: int | None = None):
        self.engine, self.interrupt_after = engine, interrupt_after
        self.prompts: list[list[int]] = []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, prompt_ids, params, stop=(), cancelled=None):
        self.prompts.append(list(prompt_ids))
        for i, ev in enumerate(self.engine.generate(prompt_ids, params, stop, cancelled)):
            if self.interrupt_after is not None and i >= self.interrupt_after:
                raise KeyboardInterrupt
            yield ev


class Output(io.StringIO):
    def __init__(self):
        super().__init__()
        self.writes: list[str] = []

    def write(self, s):
        self.writes.append(s)
        return super().write(s)


def feed(lines):
    it = iter(lines)

    def input_fn(prompt):
        try:
            return next(it)
        except StopIteration:
            raise EOFError from None
    return input_fn


PARAMS = SamplingParams(max_tokens=8, ignore_eos=True)


def test_multi_turn_history_streaming_and_stats_lines(engine):
    rec, out = Recorder(engine), Output()
    history = run_chat(rec, PARAMS, input_fn=feed(["hello", "and again", "/exit", "never read"]), output=out)
    assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant"]
    a1 = history[1]["content"]
    # the second prompt carries the first exchange, rendered by the chat template
    assert rec.prompts[0] == engine.encode_chat([{"role": "user", "content": "hello"}])
    assert rec.prompts[1] == engine.encode_chat([{"role": "user", "content": "hello"},
                                                 {"role": "assistant", "content": a1},
                                                 {"role": "user", "content": "and again"}])
    # the answer equals the engine's greedy answer and was written in several pieces (streamed)
    expected = "".join(ev.text for ev in engine.generate(rec.prompts[0], PARAMS))
    assert a1 == expected
    text = out.getvalue()
    assert a1 in text
    assert sum(1 for w in out.writes if w and w in a1) >= 2
    stats_lines = [line for line in text.splitlines() if "tok/s" in line and "AL" in line]
    assert len(stats_lines) == 2
    assert "8 tokens" in stats_lines[0] and "AL 1.00" in stats_lines[0] and "hit max tokens" in stats_lines[0]


def test_reset_stats_help_and_unknown_command(engine):
    rec, out = Recorder(engine), Output()
    history = run_chat(rec, PARAMS, input_fn=feed(["/stats", "one", "", "/stats", "/reset", "two", "/help", "/what"]),
                       output=out, system="You are terse.")
    text = out.getvalue()
    assert "[no answer yet]" in text
    assert "tokens_per_s" in text and "acceptance_length" in text and "session: 1 answers, 8 tokens" in text
    assert "[conversation cleared]" in text
    assert "[unknown command /what]" in text
    # after /reset only the system prompt and the new turn are sent
    assert rec.prompts[1] == engine.encode_chat([{"role": "system", "content": "You are terse."},
                                                 {"role": "user", "content": "two"}])
    assert [m["role"] for m in history] == ["system", "user", "assistant"]
    assert len(rec.prompts) == 2                       # empty line and commands never reach the engine


def test_too_long_message_is_refused_and_the_chat_goes_on(engine):
    rec, out = Recorder(engine), Output()
    history = run_chat(rec, PARAMS, input_fn=feed(["x " * 400, "short"]), output=out)
    assert "cannot send this message" in out.getvalue()
    assert [m["content"] for m in history if m["role"] == "user"] == ["short"]
    assert len(rec.prompts) == 1


def test_answers_stop_at_the_context(engine):
    out = Output()
    history = run_chat(Recorder(engine), SamplingParams(max_tokens=10_000, ignore_eos=True),
                       input_fn=feed(["hello"]), output=out)
    n_prompt = len(engine.encode_chat(history[:1]))
    assert f"{CTX - n_prompt} tokens" in out.getvalue()
    assert "context is full" in out.getvalue()


def test_ctrl_c_stops_the_answer_not_the_chat(engine):
    rec, out = Recorder(engine, interrupt_after=2), Output()
    history = run_chat(rec, PARAMS, input_fn=feed(["hello", "/exit"]), output=out)
    assert "[interrupted]" in out.getvalue()
    assert history[-1]["role"] == "assistant"          # the partial answer is kept in the conversation
    assert len(rec.prompts) == 1
