"""Chat templates: equal to transformers' apply_chat_template with the Qwen2.5 template; sandboxed."""
import json
import logging
import os

import pytest

from dflash24.gguf.reader import GGUFFile
from dflash24.gguf.template import CHATML_TEMPLATE, ChatTemplate, TemplateError

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Wetter für eine Stadt (°C)",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "城市"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {"name": "now", "description": "current time", "parameters": {"type": "object", "properties": {}}}},
]

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are a terse assistant."}, {"role": "user", "content": "2+2?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
     {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "写一首诗 😀"}],
    [{"role": "user", "content": "  leading and trailing whitespace \n\n"}, {"role": "assistant", "content": ""},
     {"role": "user", "content": "<|im_start|> literal specials <|im_end|>"}],
    [{"role": "user", "content": "Weather in Tokyo?"},
     {"role": "assistant", "content": "", "tool_calls": [
         {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "東京"}}}]},
     {"role": "tool", "content": "{\"temp\": 21}"},
     {"role": "tool", "content": "second result"},
     {"role": "assistant", "content": "It is 21 °C."}],
    [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "time?"},
     {"role": "assistant", "content": "Let me check.", "tool_calls": [
         {"type": "function", "function": {"name": "now", "arguments": {}}},
         {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
     {"role": "tool", "content": "12:00"}],
]


@pytest.fixture(scope="module")
def template(default_gguf_path):
    return ChatTemplate.from_gguf(GGUFFile(default_gguf_path))


def test_template_from_gguf(template):
    assert "<|im_start|>" in template.source and not template.is_chatml_fallback
    assert template.eos_token == "<|im_end|>" and template.bos_token == "<|endoftext|>"


@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("gen", [True, False])
@pytest.mark.parametrize("with_tools", [False, True])
def test_equals_hf(template, hf_default_tokenizer, conv, gen, with_tools):
    messages = CONVERSATIONS[conv]
    tools = TOOLS if with_tools else None
    ours = template.render(messages, add_generation_prompt=gen, tools=tools)
    theirs = hf_default_tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=gen, tokenize=False)
    assert ours == theirs
    assert ours.endswith("<|im_start|>assistant\n") == gen


def test_render_does_not_mutate_messages(template):
    messages = [{"role": "user", "content": "x"}]
    snapshot = json.dumps(messages)
    template.render(messages)
    assert json.dumps(messages) == snapshot


def test_tojson_like_hf():
    t = ChatTemplate("{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ '<&>' | tojson }}")
    out = t.render([], x={"k": "ü中"})
    assert out == '{"k": "ü中"}|' + json.dumps({"k": "ü中"}, ensure_ascii=False, indent=2) + '|"<&>"'


def test_helpers():
    t = ChatTemplate("{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
                     "{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }} {{ dict(a=1)['a'] }} {{ strftime_now('%Y') | length }}"
                     "{% generation %}G{% endgeneration %} {{ bos_token }}{{ eos_token }} {{ enable_thinking }}",
                     bos_token="<s>", eos_token="</s>")
    assert t.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], enable_thinking=False) \
        == "1 1 4G <s></s> False"


def test_reasoning_alias():
    t = ChatTemplate("{% for m in messages %}[{{ m.reasoning_content }}]{% endfor %}")
    assert t.render([{"role": "assistant", "content": "x", "reasoning": "because"}]) == "[because]"


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{{ joiner.__init__.__globals__ }}",
    "{{ messages.__class__ }}",
    "{{ self._TemplateReference__context }}",
    "{% set x = messages.append(1) %}",                 # immutable sandbox: no mutating list methods
    "{% set ns = namespace() %}{% set ns._x = 1 %}",
    "{{ namespace(__init__=1) }}",
    "{{ raise_exception('refused by template') }}",
    "{{ undefined_thing.attr }}",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "{% for i in range(10**9) %}x{% endfor %}",
    "{{ 1 / 0 }}",
])
def test_hostile_or_broken_templates_raise(source):
    with pytest.raises(TemplateError):
        ChatTemplate(source).render([{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("source,message", [
    ("{{ 'x' * 10**10 }}", "'\\*' would build a value of 10,000,000,000 items"),
    ("{% set l = [0] * 10**9 %}ok", "'\\*' would build a value of 1,000,000,000 items"),
    ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
     "'\\+' would build a value of 33,554,432 items"),
    ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
     "'~' would build a string of 33,554,432 characters"),
    ("{% set a = 10 %}{{ a ** 100000 }}", "'\\*\\*' would build an integer of more than 65,536 bits"),
    ("{{ 'x'|center(10**10) }}", "an argument of 10,000,000,000"),
    ("{{ messages|tojson(indent=10**9) }}", "an argument of 1,000,000,000"),
    ("{{ messages|tojson(indent=1000) }}", "tojson indent past 64"),
    ("{{ ('a\\n' * 1000000)|indent(100) }}", "an indent past"),
    ("{{ ('a ' * 1000000)|wordwrap(5, wrapstring='x' * 100) }}", "a wordwrap past"),
    ("{{ ('a' * 100000)|wordwrap(1, true, 'x' * 1000) }}", "a wordwrap past"),
    ("{{ '%1000000000s' % 'x' }}", "a format with a width past"),
    ("{{ '%1000000000s'|format('x') }}", "a format with a width past"),
    ("{{ '{:>1000000000}'.format('x') }}", "a format with a width past"),
    ("{% set ns = namespace(s='xxxx') %}{% for i in range(9) %}{% set ns.s = ns.s|replace('', ns.s) %}{% endfor %}",
     "a replace past"),
    ("{% set ns = namespace(s='xxxx') %}{% for i in range(9) %}{% set ns.s = ns.s.replace('', ns.s) %}{% endfor %}",
     "a replace past"),
    ("{% set l = ['x' * 1000000] * 1000 %}{{ l|join }}", "a join of 1,000,000,000 characters"),
    ("{% set l = ['x' * 1000000] * 1000 %}{{ ''.join(l) }}", "a join of 1,000,000,000 characters"),
])
def test_memory_bombs_are_refused_before_they_allocate(source, message):
    """A file's template may not build a value larger than a prompt may be (the host's memory is the limit
    otherwise: 'x' * 10**10 asks for 10 GB); the check comes before the value exists."""
    with pytest.raises(TemplateError, match=message):
        ChatTemplate(source).render([{"role": "user", "content": "hi"}])
    assert ChatTemplate("{{ 'ab' * 3 }}{{ [1] + [2] }}{{ 'a' ~ 1 }}{{ 2 ** 10 }}").render([]) == "ababab[1, 2]a11024"
    within = ChatTemplate("{{ '%3s|' % 'a' }}{{ '{:>2}'.format('b') }}{{ 'c'|center(3) }}{{ 'dd'|replace('d', 'e') }}"
                          "{{ ['f', 'g']|join('-') }}{{ 'h\\ni'|indent(2) }}{{ [1]|tojson(indent=2) }}"
                          "{{ 'j k'|wordwrap(1, wrapstring='/') }}")
    assert within.render([]) == "  a| b c eef-gh\n  i[\n  1\n]j/k"


def test_a_loop_that_spins_is_stopped(monkeypatch):
    """Loops that print nothing never reach the output cap; the render's deadline stops them, and a render
    that ends in time is left alone (no stray timeout later)."""
    import time

    from dflash24.gguf import template as tpl
    monkeypatch.setattr(tpl, "RENDER_SECONDS", 0.3)
    spin = ChatTemplate("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}")
    t0 = time.perf_counter()
    with pytest.raises(TemplateError, match="ran longer than 0.3 s"):
        spin.render([{"role": "user", "content": "hi"}])
    assert time.perf_counter() - t0 < 5
    assert ChatTemplate(CHATML_TEMPLATE).render([{"role": "user", "content": "hi"}]).endswith("assistant\n")
    time.sleep(0.5)                                      # past the deadline of that render: nothing fires


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="the resident size is read from /proc (Linux)")
def test_a_render_that_hoards_memory_is_stopped(monkeypatch):
    """Distinct large strings kept in a namespace's list pass every size check one at a time; the watcher stops
    the render once the process has grown by MAX_RENDER_GROWTH, long before the deadline."""
    import time

    from dflash24.gguf import template as tpl
    monkeypatch.setattr(tpl, "MAX_RENDER_GROWTH", 64 << 20)
    hoard = ChatTemplate("{% set ns = namespace(l=[]) %}{% for i in range(1000) %}"
                         "{% set ns.l = ns.l + ['x' * 8000000] %}{% endfor %}{{ ns.l|length }}")
    t0 = time.perf_counter()
    with pytest.raises(TemplateError, match="grew the process by more than 64 MiB"):
        hoard.render([])
    assert time.perf_counter() - t0 < tpl.RENDER_SECONDS
    assert ChatTemplate("{{ ('x' * 4000000)|length }}").render([]) == "4000000"   # 4 MB: within the bound


@pytest.mark.parametrize("source", ["{% for x in %}", "{{ unclosed", "{% if %}{% endif %}", "", "{% endfor %}"])
def test_syntax_errors_raise(source):
    with pytest.raises(TemplateError):
        ChatTemplate(source)


def test_template_error_is_value_error():
    assert issubclass(TemplateError, ValueError)


def test_bad_messages():
    t = ChatTemplate(CHATML_TEMPLATE)
    with pytest.raises(TemplateError, match="list"):
        t.render("hello")
    with pytest.raises(TemplateError, match="role"):
        t.render([{"content": "x"}])
    with pytest.raises(TemplateError, match="plain data"):
        t.render([{"role": "user", "content": object()}])


class _NoTemplate:
    path = "no-template.gguf"
    metadata = {"tokenizer.ggml.tokens": ["<|endoftext|>", "<|im_end|>"], "tokenizer.ggml.eos_token_id": 1}

    def get(self, key, default=None):
        return self.metadata.get(key, default)


def test_chatml_fallback(caplog):
    with caplog.at_level(logging.WARNING):
        t = ChatTemplate.from_gguf(_NoTemplate())
    assert "no chat template" in caplog.text and t.is_chatml_fallback
    assert t.eos_token == "<|im_end|>"
    out = t.render([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    assert out == "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n"
