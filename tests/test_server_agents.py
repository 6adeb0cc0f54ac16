"""Agents end to end: the official `openai` client (chat completions and Responses) and Anthropic
/v1/messages against a real uvicorn server whose engine replays a scripted answer -- fixed token ids from
the tiny fixture's tokenizer, through the engine's real detokenizer/stop handling, the tool-call parser and
the server. Then the follow-up turn with the tool result, checked in the prompt the template rendered.

The tiny models here carry small test templates written in the style of the Qwen ones: Qwen2.5 (tools
listed in the system turn, `<tool_call>{json}</tool_call>`, results in `<tool_response>`) and Qwen3.5
(function/parameter XML, `<think>` opened by the generation prompt unless enable_thinking is false).
"""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from conftest import write_tiny_qwen2_gguf
from dflash24.config import EngineConfig
from dflash24.engine import Engine, Stats, _OutputStream
from dflash24.server import create_app
from test_server import live_server, sse_events

def _nl(template: str) -> str:
    """Every newline as a Jinja expression, so trim_blocks/`{%-` cannot eat the ones the format needs."""
    return template.replace("\n", "{{ '\\n' }}")


QWEN25_STYLE = _nl(
    "{%- if tools %}<|im_start|>system\nYou can call tools.\n<tools>"
    "{%- for t in tools %}\n{{ t | tojson }}{%- endfor %}\n</tools>\n"
    "Call one as <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>.<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}"
    "{%- for c in m.tool_calls or [] %}\n<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)

QWEN35_STYLE = _nl(
    "{%- if tools %}<|im_start|>system\n<tools>{%- for t in tools %}\n{{ t | tojson }}{%- endfor %}\n</tools><|im_end|>\n"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- elif m.role == 'assistant' %}<|im_start|>assistant\n"
    "{%- if m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{%- endif %}{{ m.content }}"
    "{%- for c in m.tool_calls or [] %}\n<tool_call>\n<function={{ c.function.name }}>\n"
    "{%- for k, v in c.function.arguments | items %}<parameter={{ k }}>\n"
    "{{ v if v is string else v | tojson }}\n</parameter>\n{%- endfor %}</function>\n</tool_call>{%- endfor %}"
    "<|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{%- else %}<think>\n{%- endif %}"
    "{%- endif %}"
)

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}, "days": {"type": "integer"}},
                                                "required": ["city"]}}}
CALL_25 = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
CALL_35 = ("Paris weather needed.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
           "</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>")
ARGS = {"city": "Paris", "days": 2}


class ScriptedEngine:
    """A real engine (tokenizer, template, context checks) whose generate() replays `script` -- the token ids
    of a fixed answer, one per step, through the engine's own output stream -- and records each prompt."""

    def __init__(self, engine, script: str = ""):
        self.engine, self.script, self.prompts = engine, script, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, prompt_ids, params, stop=(), cancelled=None):
        self.prompts.append(self.engine.tokenizer.decode(prompt_ids))
        ids = self.engine.tokenizer.encode(self.script, add_special_tokens=False)
        ids = ids[:params.max_tokens] + [self.engine.tokenizer.eos_token_id]
        out = _OutputStream(self.engine.tokenizer, stop, self.engine.tokenizer.eos_token_ids)
        stats = Stats(prompt_tokens=len(prompt_ids), steps=len(ids), accept_hist={1: len(ids)}, decode_s=0.01)
        for i, t in enumerate(ids):
            ev = out.push([t])
            stats.completion_tokens += 1
            if ev.finish_reason is None and i + 1 == params.max_tokens:
                ev.finish_reason = "length"
            if ev.finish_reason is not None:
                ev.text += out.flush()
                ev.stats = stats
                yield ev
                return
            yield ev


def _engine(tmp_path_factory, template):
    path = write_tiny_qwen2_gguf(tmp_path_factory.mktemp("agents") / "tiny-agent.gguf", chat_template=template)
    return Engine(EngineConfig(model=str(path), ctx=1024, device="cpu", cuda_graphs=False))


@pytest.fixture(scope="module")
def q25(tmp_path_factory):
    scripted = ScriptedEngine(_engine(tmp_path_factory, QWEN25_STYLE))
    with live_server(create_app(scripted)) as url:
        yield scripted, url


@pytest.fixture(scope="module")
def q35(tmp_path_factory):
    scripted = ScriptedEngine(_engine(tmp_path_factory, QWEN35_STYLE))
    with live_server(create_app(scripted)) as url:
        yield scripted, url


def oai(url) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)


# -- OpenAI chat completions ----------------------------------------------------------------------------
def test_openai_client_tool_call_then_follow_up(q25):
    scripted, url = q25
    scripted.script = CALL_25
    client = oai(url)
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    r = client.chat.completions.create(model="tiny-agent", messages=msgs, tools=[WEATHER])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    assert json.loads(call.function.arguments) == ARGS
    assert '"name": "get_weather"' in scripted.prompts[-1]             # the tools reached the template

    # the follow-up: the assistant's call and the tool result, as the client sends them back
    scripted.script = "It is 21 C and sunny in Paris."
    follow = msgs + [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21, "sky": "sunny"}'}]
    r2 = client.chat.completions.create(model="tiny-agent", messages=follow, tools=[WEATHER])
    assert r2.choices[0].message.content == "It is 21 C and sunny in Paris." and not r2.choices[0].message.tool_calls
    assert r2.choices[0].finish_reason == "stop"
    prompt = scripted.prompts[-1]
    assert '<tool_response>\n{"temp_c": 21, "sky": "sunny"}\n</tool_response>' in prompt
    # arguments went to the template as a dict (rendered once as JSON, not as a quoted string)
    assert '<|im_start|>assistant\nLet me check.\n<tool_call>\n{"name": "get_weather", "arguments": ' \
           '{"city": "Paris", "days": 2}}\n</tool_call><|im_end|>' in prompt


def test_openai_client_streams_tool_call_deltas(q25):
    scripted, url = q25
    scripted.script = CALL_25
    stream = oai(url).chat.completions.create(model="tiny-agent", messages=[{"role": "user", "content": "?"}],
                                              tools=[WEATHER], stream=True)
    content, calls, finish = "", {}, None
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        assert "<tool" not in (delta.content or "")                     # never half a tag in the text
        for tc in delta.tool_calls or []:
            slot = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            slot["id"] = tc.id or slot["id"]
            slot["name"] += tc.function.name or ""
            slot["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert content == "Let me check." and finish == "tool_calls"
    assert list(calls) == [0] and calls[0]["name"] == "get_weather" and calls[0]["id"]
    assert json.loads(calls[0]["arguments"]) == ARGS


def test_malformed_tool_output_is_text_and_tool_choice_none(q25):
    scripted, url = q25
    scripted.script = 'Oops <tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call> end'
    client = oai(url)
    r = client.chat.completions.create(model="tiny-agent", messages=[{"role": "user", "content": "?"}], tools=[WEATHER])
    assert r.choices[0].message.content == scripted.script and r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason == "stop"
    scripted.script = CALL_25
    r = client.chat.completions.create(model="tiny-agent", messages=[{"role": "user", "content": "?"}],
                                       tools=[WEATHER], tool_choice="none")
    assert "<tools>" not in scripted.prompts[-1]                       # tools not offered...
    assert r.choices[0].message.content == CALL_25 and r.choices[0].message.tool_calls is None   # ...nor parsed
    bad = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{not json"}}]}]})
    assert bad.status_code == 400 and "arguments" in bad.json()["error"]["message"]


def test_qwen35_xml_calls_reasoning_and_enable_thinking(q35):
    scripted, url = q35
    scripted.script = CALL_35
    client = oai(url)
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    r = client.chat.completions.create(model="tiny-agent", messages=msgs, tools=[WEATHER])
    m = r.choices[0].message
    assert scripted.prompts[-1].endswith("<|im_start|>assistant\n<think>\n")
    assert m.model_extra["reasoning_content"] == "Paris weather needed."
    assert m.content is None and r.choices[0].finish_reason == "tool_calls"
    assert json.loads(m.tool_calls[0].function.arguments) == ARGS   # "2" read as the integer the schema asks for

    chunks = list(client.chat.completions.create(model="tiny-agent", messages=msgs, tools=[WEATHER], stream=True))
    reasoning = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks if c.choices)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert reasoning == "Paris weather needed." and content == ""
    assert [json.loads(tc.function.arguments) for tc in calls] == [ARGS]

    # follow-up: reasoning and XML call re-rendered by the template, the result in <tool_response>
    scripted.script = "Sunny."
    follow = msgs + [{"role": "assistant", "content": "", "reasoning_content": "Paris weather needed.",
                      "tool_calls": [m.tool_calls[0].model_dump()]},
                     {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "21 C"}]
    r = client.chat.completions.create(model="tiny-agent", messages=follow, tools=[WEATHER],
                                       extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    prompt = scripted.prompts[-1]
    assert ("<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n"
            "</function>") in prompt
    assert "<tool_response>\n21 C\n</tool_response>" in prompt
    assert prompt.endswith("<think>\n\n</think>\n\n")                   # enable_thinking=False reached the template
    assert r.choices[0].message.content == "Sunny." and "reasoning_content" not in r.choices[0].message.model_extra


# -- Responses API ------------------------------------------------------------------------------------------
RESP_TOOL = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
             "parameters": WEATHER["function"]["parameters"]}


def test_responses_function_call_and_follow_up(q25):
    scripted, url = q25
    scripted.script = CALL_25
    client = oai(url)
    r = client.responses.create(model="tiny-agent", input="Weather in Paris?", tools=[RESP_TOOL],
                                instructions="Be brief.")
    assert r.status == "completed" and r.usage.output_tokens > 0
    kinds = [o.type for o in r.output]
    assert kinds == ["message", "function_call"]
    assert r.output_text == "Let me check."
    fc = r.output[1]
    assert fc.name == "get_weather" and json.loads(fc.arguments) == ARGS and fc.call_id
    assert scripted.prompts[-1].startswith("<|im_start|>system\nYou can call tools.")
    assert "<|im_start|>system\nBe brief.<|im_end|>" in scripted.prompts[-1]

    scripted.script = "21 C."
    r2 = client.responses.create(model="tiny-agent", tools=[RESP_TOOL], input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": fc.call_id, "name": fc.name, "arguments": fc.arguments},
        {"type": "function_call_output", "call_id": fc.call_id, "output": "21 C"}])
    assert r2.output_text == "21 C."
    prompt = scripted.prompts[-1]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>' in prompt
    assert "<tool_response>\n21 C\n</tool_response>" in prompt


def test_responses_streaming_events(q35):
    scripted, url = q35
    scripted.script = "Think first.\n</think>\n\nCalling.\n" + CALL_35.split("\n\n", 1)[1]
    events = list(oai(url).responses.create(model="tiny-agent", input="Weather?", tools=[RESP_TOOL], stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert reasoning == "Think first." and text == "Calling."
    (args_done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert json.loads(args_done.arguments) == ARGS
    final = events[-1].response
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call"]
    assert final.output[2].name == "get_weather" and final.output_text == "Calling."
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    done = [e.item.type for e in events if e.type == "response.output_item.done"]
    assert added == done == ["reasoning", "message", "function_call"]


def test_responses_errors(q25):
    _, url = q25
    r = httpx.post(url + "/v1/responses", json={"input": "x", "previous_response_id": "resp_1"})
    assert r.status_code == 400 and "previous_response_id" in r.json()["error"]["message"]
    r = httpx.post(url + "/v1/responses", json={"input": "x", "tools": [{"type": "web_search"}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_tool"


# -- Anthropic messages ---------------------------------------------------------------------------------------
ANTHROPIC_TOOL = {"name": "get_weather", "description": "Current weather in a city",
                  "input_schema": WEATHER["function"]["parameters"]}


def test_anthropic_tool_use_stream_and_follow_up(q35):
    scripted, url = q35
    scripted.script = CALL_35.replace("</think>\n\n", "</think>\n\nOne moment.\n")
    body = {"model": "tiny-agent", "max_tokens": 200, "tools": [ANTHROPIC_TOOL],
            "messages": [{"role": "user", "content": "Weather in Paris?"}]}
    r = httpx.post(url + "/v1/messages", json=body, timeout=30).json()
    assert r["stop_reason"] == "tool_use"
    assert [b["type"] for b in r["content"]] == ["thinking", "text", "tool_use"]
    assert r["content"][0]["thinking"] == "Paris weather needed." and r["content"][1]["text"] == "One moment."
    use = r["content"][2]
    assert use["name"] == "get_weather" and use["input"] == ARGS and use["id"]

    s = httpx.post(url + "/v1/messages", json={**body, "stream": True}, timeout=30)
    events = sse_events(s.text)
    starts = [d["content_block"]["type"] for n, d in events if n == "content_block_start"]
    assert starts == ["thinking", "text", "tool_use"]
    assert [d["index"] for n, d in events if n == "content_block_start"] == [0, 1, 2]
    assert len([1 for n, _ in events if n == "content_block_stop"]) == 3
    partial = "".join(d["delta"]["partial_json"] for n, d in events
                      if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta")
    assert json.loads(partial) == ARGS
    assert [d["delta"]["stop_reason"] for n, d in events if n == "message_delta"] == ["tool_use"]

    scripted.script = "Got it.\n</think>\n\nIt is sunny."
    follow = {**body, "messages": body["messages"] + [
        {"role": "assistant", "content": r["content"]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "21 C"}]}]}
    r2 = httpx.post(url + "/v1/messages", json=follow, timeout=30).json()
    assert r2["content"] == [{"type": "thinking", "thinking": "Got it.", "signature": ""},
                             {"type": "text", "text": "It is sunny."}] and r2["stop_reason"] == "end_turn"
    prompt = scripted.prompts[-1]
    assert "<think>\nParis weather needed.\n</think>\n\nOne moment.\n<tool_call>\n<function=get_weather>" in prompt
    assert "<tool_response>\n21 C\n</tool_response>" in prompt
    # thinking disabled the Anthropic way reaches the template as enable_thinking=False
    httpx.post(url + "/v1/messages", json={**body, "thinking": {"type": "disabled"}}, timeout=30)
    assert scripted.prompts[-1].endswith("<think>\n\n</think>\n\n")


def test_tools_do_not_change_greedy_output_under_speculation(tmp_path_factory):
    """A real tiny engine behind the server: the same request with tools gives the same message (text and
    any parsed calls) in AR, chain and tree modes (a random DFlash drafter; speculation stays on with tools)."""
    import torch

    from dflash24.gguf.reader import GGUFFile
    from dflash24.models import load_target
    from dflash24.models.drafter import make_random_drafter_dir

    path = write_tiny_qwen2_gguf(tmp_path_factory.mktemp("agents") / "tiny-spec.gguf", n_layers=4, seed=3,
                                 chat_template=QWEN25_STYLE)
    cfg = load_target(GGUFFile(str(path)), "cpu", torch.float32, 64).cfg
    draft = str(make_random_drafter_dir(tmp_path_factory.mktemp("d") / "draft", cfg, 2, dtype=torch.float32,
                                        target_layer_ids=(0, 2)))
    msgs = [{"role": "user", "content": "Weather in Paris? Use the tool."}]
    answers = {}
    for mode in ("ar", "chain", "tree"):
        engine = Engine(EngineConfig(model=str(path), draft=None if mode == "ar" else draft, spec=mode,
                                     ctx=1024, device="cpu", cuda_graphs=False))
        with live_server(create_app(engine)) as url:
            r = oai(url).chat.completions.create(model="tiny-spec", messages=msgs, tools=[WEATHER], max_tokens=48,
                                                 temperature=0)
        m = r.choices[0].message
        answers[mode] = (m.content, [(c.function.name, c.function.arguments) for c in m.tool_calls or []],
                         r.usage.completion_tokens)
    assert answers["chain"] == answers["ar"] and answers["tree"] == answers["ar"]
    assert answers["ar"][2] > 0
