"""Tool-call and reasoning parsing (dflash24.server.tools) on recorded-style outputs of Qwen2.5 (JSON in
<tool_call>) and Qwen3.5/3.6 (function/parameter XML, <think>) chat templates: whole and streamed in every
chunking, malformed and partial calls, text around calls, several calls; and request conversion."""
from __future__ import annotations

import json

import pytest

from dflash24.server.protocol import APIError
from dflash24.server.tools import OutputParser, anthropic_messages, chat_messages, parse_call, parse_output

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                         "units": {"type": "string", "enum": ["c", "f"]}}}}},
    {"type": "function", "function": {"name": "run", "parameters": {
        "type": "object", "properties": {"cmd": {"type": "string"}, "env": {"type": "object"}}}}},
]

# Outputs written the way the templates render an assistant's tool calls (Qwen2.5: one JSON object per
# <tool_call>, newline-separated; Qwen3.5: <function=...> with one <parameter=...> per argument, strings raw).
QWEN25_ONE = 'I will look it up.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
QWEN25_TWO = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
              '<tool_call>\n{"name": "run", "arguments": {"cmd": "ls -la", "env": {"A": "1"}}}\n</tool_call>')
QWEN35_ONE = ('<think>\nThe user wants the weather, so I call the tool.\n</think>\n\nChecking.\n\n'
              '<tool_call>\n<function=get_weather>\n<parameter=city>\n42 Rue "X"\n</parameter>\n'
              '<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>')
QWEN35_TWO = ('<tool_call>\n<function=run>\n<parameter=cmd>\necho "a\nb"\n</parameter>\n<parameter=env>\n'
              '{"PATH": "/bin"}\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n'
              '<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>')


def streamed(text: str, chunk: int, **kw) -> tuple[str, str, list]:
    p = OutputParser(TOOLS, **kw)
    pieces = []
    for i in range(0, len(text), chunk):
        pieces += p.push(text[i:i + chunk])
    pieces += p.finish()
    return ("".join(x.text for x in pieces if x.kind == "reasoning"),
            "".join(x.text for x in pieces if x.kind == "text"),
            [x.call for x in pieces if x.kind == "tool_call"])


def calls_of(calls) -> list[tuple[str, dict]]:
    return [(c.name, c.arguments) for c in calls]


CASES = [
    (QWEN25_ONE, {}, "", "I will look it up.", [("get_weather", {"city": "Paris", "days": 3})]),
    (QWEN25_TWO, {}, "", "", [("get_weather", {"city": "Paris"}), ("run", {"cmd": "ls -la", "env": {"A": "1"}})]),
    (QWEN35_ONE, {"think": True}, "The user wants the weather, so I call the tool.", "Checking.",
     [("get_weather", {"city": '42 Rue "X"', "days": 2})]),
    (QWEN35_TWO, {}, "", "", [("run", {"cmd": 'echo "a\nb"', "env": {"PATH": "/bin"}}), ("get_weather", {"city": "Oslo"})]),
    # the Qwen3.5 generation prompt opens <think>: the answer starts inside it
    ("Let me think.\n</think>\n\nIt is sunny.", {"in_think": True}, "Let me think.", "It is sunny.", []),
    ("plain answer, no tools <tool", {}, "", "plain answer, no tools <tool", []),
    ("text after\n<tool_call>\n{\"name\": \"run\", \"arguments\": {}}\n</tool_call>\nDone.", {}, "", "text afterDone.",
     [("run", {})]),
    # bare calls (no <tool_call> tags), as Qwen2.5-Coder-0.5B wrote one for Claude Code (recorded 2026-11-30)
    (' {"name": "run", "arguments": {"cmd": "cat /tmp/x.txt", "env": {"A": "}{"}}}', {}, "", "",
     [("run", {"cmd": "cat /tmp/x.txt", "env": {"A": "}{"}})]),
    ('{"name": "get_weather", "arguments": {"city": "Oslo"}}\n{"name": "run", "arguments": {}}\nDone.', {}, "",
     "Done.", [("get_weather", {"city": "Oslo"}), ("run", {})]),
    # a JSON answer that is not a call, and an object after text: both stay text
    ('{"city": "Oslo", "temp": 3} is the reading.', {}, "", '{"city": "Oslo", "temp": 3} is the reading.', []),
    ('Here: {"name": "run", "arguments": {}}', {}, "", 'Here: {"name": "run", "arguments": {}}', []),
]


@pytest.mark.parametrize("text,kw,reasoning,content,calls", CASES)
def test_whole_and_streamed_in_every_chunking(text, kw, reasoning, content, calls):
    r, t, c = parse_output(text, TOOLS, **kw)
    assert (r, t, calls_of(c)) == (reasoning, content, calls)
    for chunk in (1, 2, 3, 7, 64):
        r, t, c = streamed(text, chunk, **kw)
        assert (r, t, calls_of(c)) == (reasoning, content, calls), chunk
    for call in c:                                  # arguments are valid JSON for the OpenAI wire format
        assert json.loads(call.arguments_json) == call.arguments and call.id.startswith("call_")


MALFORMED = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\n</tool_call>',      # broken JSON
    '<tool_call>\n{"arguments": {"city": "Paris"}}\n</tool_call>',                       # no name
    '<tool_call>\n{"name": "delete_everything", "arguments": {}}\n</tool_call>',         # tool not offered
    '<tool_call>\n["get_weather"]\n</tool_call>',                                         # not an object
    '<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</tool_call>',  # no </function>
    '<tool_call>\n<function=get_weather>\nstray <parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>',
]


@pytest.mark.parametrize("bad", MALFORMED)
def test_malformed_calls_come_back_as_the_same_text(bad):
    text = f"Before. {bad} After."
    for chunk in (1, 5, 1000):
        r, t, c = streamed(text, chunk)
        assert c == [] and r == ""
        assert t == text


@pytest.mark.parametrize("partial", [
    '<tool_call>\n{"name": "get_weather", "arguments": {"ci',          # cut by max_tokens
    '{"name": "get_weather", "arguments": {"city": "Pa',                # a bare call cut by max_tokens
    '<tool_call>\n<function=get_weather>\n<parameter=city>\nPar',
    '<tool_ca',
])
def test_partial_calls_at_the_end_are_text(partial):
    text = "Sure. " + partial
    for chunk in (1, 4, 1000):
        assert streamed(text, chunk) == ("", text, [])


def test_streaming_holds_back_only_what_may_be_a_tag():
    p = OutputParser(TOOLS)
    assert [x.text for x in p.push("Hello <tool")] == ["Hello"]        # " <tool" might open a call
    assert [x.text for x in p.push("box> here")] == [" <toolbox> here"]
    p = OutputParser(TOOLS)
    assert [(x.kind, x.text) for x in p.push('ok\n<tool_call>\n{"name": "run", ')] == [("text", "ok")]
    pieces = p.push('"arguments": {"cmd": "x"}}\n</tool_call>')
    assert [(x.kind, x.call.name) for x in pieces] == [("tool_call", "run")]


def test_without_tools_and_without_think_everything_is_text():
    for text in (QWEN25_ONE, QWEN35_ONE):
        assert parse_output(text, None) == ("", text, [])


def test_unterminated_thought_is_reasoning():
    assert parse_output("<think>\nstill thinking when max_tokens hit", TOOLS, think=True) == \
        ("still thinking when max_tokens hit", "", [])


def test_parse_call_forms():
    assert calls_of([parse_call('{"name": "run", "arguments": "{\\"cmd\\": \\"ls\\"}"}')]) == [("run", {"cmd": "ls"})]
    assert parse_call('{"name": "run", "parameters": {"cmd": "ls"}}').arguments == {"cmd": "ls"}
    # schema-less XML values: JSON when they parse, text otherwise
    assert parse_call("<function=f>\n<parameter=n>\n3\n</parameter>\n<parameter=s>\nhi\n</parameter>\n</function>"
                      ).arguments == {"n": 3, "s": "hi"}


def test_chat_messages_parse_arguments_and_reject_bad_json():
    msgs = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "run", "arguments": '{"cmd": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"}]
    out = chat_messages(msgs)
    assert out[0]["tool_calls"][0]["function"]["arguments"] == {"cmd": "ls"}
    assert out[1] == msgs[1]
    with pytest.raises(APIError) as e:
        chat_messages([{"role": "assistant", "tool_calls": [{"function": {"name": "run", "arguments": "{oops"}}]}])
    assert e.value.status == 400 and "not valid JSON" in e.value.message



@pytest.mark.parametrize("arrays", [100_000, 900, 65])
def test_json_nested_too_deep_is_malformed_not_a_crash(arrays):
    """A model that writes a call nested thousands of levels deep, or a client whose argument string is, meets the
    same 64-level bound as a request body: the call is malformed (kept as text) / a 400, not a RecursionError."""
    deep = "[" * arrays + "]" * arrays
    assert parse_call('{"name": "run", "arguments": {"x": %s}}' % deep) is None
    assert parse_call('{"name": "run", "arguments": %s}' % json.dumps('{"x": %s}' % deep)) is None
    assert parse_call('<function=run>\n<parameter=x>\n%s\n</parameter>\n</function>' % deep).arguments == {"x": deep}
    with pytest.raises(APIError) as e:
        chat_messages([{"role": "assistant",
                        "tool_calls": [{"function": {"name": "run", "arguments": '{"x": %s}' % deep}}]}])
    assert e.value.status == 400 and "nested more than 64 levels deep" in e.value.message
    shallow = "[" * 10 + "]" * 10
    assert parse_call('{"name": "run", "arguments": {"x": %s}}' % shallow).arguments == {"x": json.loads(shallow)}


def test_anthropic_blocks_to_template_messages():
    out = anthropic_messages([{"type": "text", "text": "Be brief."}], [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "call it"},
                                          {"type": "text", "text": "Checking."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": "21 C"}]},
                                     {"type": "text", "text": "and tomorrow?"}]},
    ])
    assert out == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "call it", "tool_calls": [
            {"type": "function", "id": "toolu_1", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "21 C"},
        {"role": "user", "content": "and tomorrow?"},
    ]
    with pytest.raises(APIError):
        anthropic_messages(None, [{"role": "user", "content": [{"type": "image", "source": {}}]}])
