"""Chat templates: the Jinja2 template a GGUF carries in `tokenizer.chat_template`, rendered as HF does.

Rendering matches transformers' `apply_chat_template`: a sandboxed, immutable Jinja2 environment with
`trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, a `tojson` filter that keeps non-ASCII text
and does not HTML-escape, `raise_exception(msg)`, `strftime_now(fmt)`, `namespace` (no underscore names) and
`dict`. The template is untrusted input (it comes from a downloaded file), so any failure while compiling or
rendering it, sandbox violations included, surfaces as `TemplateError`, and a render is bounded: no string or list
longer than MAX_OUTPUT_CHARS built by `*`, `+`, `~`, a call or a filter (sized before it is built where the
operands tell: operators, widths, counts, `replace`, `join`, `indent`), no `**` result over MAX_POWER_BITS, no
`tojson` indent over MAX_JSON_INDENT, no output past MAX_OUTPUT_CHARS, no render longer than RENDER_SECONDS, and
(where the process's resident size can be read: Linux) no render that grows it by more than MAX_RENDER_GROWTH, which
catches what the sizes above cannot see, such as many distinct large strings kept in a namespace's list.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import json
import logging
import os
import re
import threading
import time
from datetime import datetime
from typing import Any, Mapping, Sequence

import jinja2
import jinja2.compiler
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

log = logging.getLogger(__name__)

# Used when a file has no template: plain ChatML, the format of every Qwen instruct model.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] if message['content'] is string else '') + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

MAX_OUTPUT_CHARS = 16 << 20   # a rendered prompt longer than this is a runaway template; no string or list the
                              # template builds (operators, calls, filters) may be longer either
MAX_POWER_BITS = 1 << 16      # `a ** b` of integers: a result of more bits is a runaway template
MAX_JSON_INDENT = 64          # tojson(indent=...): an indent is written once per nesting level of every line
RENDER_SECONDS = 5.0          # a render that runs longer is stopped (a template's loops can spin without output)
MAX_RENDER_GROWTH = 1 << 30   # bytes: a render that grows the process's resident memory by more is stopped
WATCH_SECONDS = 0.01          # how often a render's watcher looks at the clock and the resident size


class TemplateError(ValueError):
    """A chat template that cannot be compiled or rendered (syntax, sandbox violation, raise_exception...)."""


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for HF's training masks; here it just
    renders its body, so templates that use it still work."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


class _Namespace(jinja2.utils.Namespace):
    """Jinja's `namespace()` without underscore-prefixed attributes (they are the way into CPython internals)."""

    def __init__(*args, **kwargs):     # same signature trick as jinja2.utils.Namespace: `self` may be a kwarg
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for key in attrs:
            _Namespace._check(key)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, key, value):
        _Namespace._check(key)
        jinja2.utils.Namespace.__setitem__(self, key, value)

    @staticmethod
    def _check(key):
        if isinstance(key, str) and key.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {key!r} is not allowed (underscore prefix)")


def _indent_width(indent: Any) -> int:
    """The characters an indent argument (a count or a string, as json.dumps and the indent filter take it) adds."""
    return indent if isinstance(indent, int) else len(indent) if isinstance(indent, str) else 0


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    if _indent_width(indent) > MAX_JSON_INDENT:
        raise jinja2.exceptions.SecurityError(f"tojson indent past {MAX_JSON_INDENT} (each nesting level repeats it)")
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


def _make_dict(*args, **kwargs):
    return dict(*args, **kwargs)


class _SizedConcat(jinja2.compiler.CodeGenerator):
    """Compiles `a ~ b` to the environment's `sized_concat` (Jinja's own joins the strings unchecked)."""

    def visit_Concat(self, node: jinja2.nodes.Concat, frame) -> None:
        self.write("environment.sized_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _StrictSandbox(ImmutableSandboxedEnvironment):
    """Jinja's sandbox turns an unsafe attribute into an Undefined that only fails when used further
    (`{{ x.__class__ }}` renders ''); here any unsafe access fails at once."""

    intercepted_binops = frozenset({"*", "+", "**", "%"})
    code_generator_class = _SizedConcat

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (Jinja's names: no clash with kwargs)
        """Calls from the template (functions, methods): no integer argument past MAX_OUTPUT_CHARS (a width, a
        count) and no format string with such a width; a result longer than that is refused."""
        _check_arguments(args, kwargs)
        owner = getattr(__obj, "__self__", None)
        check = _STR_METHOD_CHECKS.get(getattr(__obj, "__name__", "")) if isinstance(owner, str) else None
        if check is not None:
            check(owner, *args, **kwargs)
        return _sized(super().call(__context, __obj, *args, **kwargs), "a call")

    def wrap_str_format(self, value):
        """`'...'.format` / `format_map` as the sandbox wraps them, once their string's widths are checked."""
        if isinstance(getattr(value, "__self__", None), str):
            _check_format(value.__self__)
        return super().wrap_str_format(value)

    def unsafe_undefined(self, obj, attribute):
        raise jinja2.exceptions.SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")

    def call_binop(self, context, operator, left, right):
        """`*` and `+` may not build a string or list longer than MAX_OUTPUT_CHARS, nor `**` an integer of more
        than MAX_POWER_BITS bits: refused before the value is made (it could exhaust the host's memory)."""
        sized = (str, list, tuple)
        size = 0
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, sized) and isinstance(n, int):
                    size = len(seq) * max(n, 0)
        elif operator == "+" and isinstance(left, sized) and isinstance(right, sized):
            size = len(left) + len(right)
        if size > MAX_OUTPUT_CHARS:
            raise jinja2.exceptions.SecurityError(
                f"'{operator}' would build a value of {size:,} items (at most {MAX_OUTPUT_CHARS:,})")
        if operator == "%" and isinstance(left, str):
            _check_format(left)
        if operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
            if right * abs(left).bit_length() > MAX_POWER_BITS:
                raise jinja2.exceptions.SecurityError(
                    f"'**' would build an integer of more than {MAX_POWER_BITS:,} bits")
        return super().call_binop(context, operator, left, right)

    def sized_concat(self, values) -> str:
        """`a ~ b ~ ...`: their strings joined, at most MAX_OUTPUT_CHARS long."""
        parts = [str(v) for v in values]
        size = sum(map(len, parts))
        if size > MAX_OUTPUT_CHARS:
            raise jinja2.exceptions.SecurityError(
                f"'~' would build a string of {size:,} characters (at most {MAX_OUTPUT_CHARS:,})")
        return "".join(parts)


def _sized(value: Any, what: str) -> Any:
    if isinstance(value, (str, list, tuple, dict)) and len(value) > MAX_OUTPUT_CHARS:
        raise jinja2.exceptions.SecurityError(f"{what} built a value of {len(value):,} items "
                                              f"(at most {MAX_OUTPUT_CHARS:,})")
    return value


def _check_arguments(args, kwargs) -> None:
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and abs(a) > MAX_OUTPUT_CHARS:
            raise jinja2.exceptions.SecurityError(f"an argument of {a:,} (at most {MAX_OUTPUT_CHARS:,})")


_HUGE_WIDTH = re.compile(r"%[-+ #0]*\d{8,}|\{[^{}]*:[^{}]*\d{8,}[^{}]*\}")     # %100000000s, {:>100000000}


def _check_format(fmt: str) -> None:
    if _HUGE_WIDTH.search(fmt):
        raise jinja2.exceptions.SecurityError(f"a format with a width past {MAX_OUTPUT_CHARS:,}")


def _check_replace(text: Any, old: Any = "", new: Any = "") -> None:
    if isinstance(text, str) and isinstance(old, str) and isinstance(new, str):
        count = text.count(old) if old else len(text) + 1
        if len(text) + count * (len(new) - len(old)) > MAX_OUTPUT_CHARS:
            raise jinja2.exceptions.SecurityError(f"a replace past {MAX_OUTPUT_CHARS:,} characters")


def _check_join(items: Any, sep: Any = "") -> None:
    if isinstance(items, (list, tuple)) and isinstance(sep, str):
        size = sum(len(x) for x in items if isinstance(x, str)) + len(sep) * max(len(items) - 1, 0)
        if size > MAX_OUTPUT_CHARS:
            raise jinja2.exceptions.SecurityError(f"a join of {size:,} characters (at most {MAX_OUTPUT_CHARS:,})")


def _check_indent(text: Any, width: Any = 4) -> None:
    if isinstance(text, str) and len(text) + _indent_width(width) * (text.count("\n") + 1) > MAX_OUTPUT_CHARS:
        raise jinja2.exceptions.SecurityError(f"an indent past {MAX_OUTPUT_CHARS:,} characters")


def _check_wordwrap(text: Any, width: Any = 79, wrapstring: Any = None) -> None:
    # lines: at most one a word plus one each `width` characters (long words broken), and at most one a character
    if isinstance(text, str) and isinstance(wrapstring, str) and isinstance(width, int) and width > 0:
        breaks = min(len(text), len(text.split()) + len(text) // width)
        if len(text) + breaks * len(wrapstring) > MAX_OUTPUT_CHARS:
            raise jinja2.exceptions.SecurityError(f"a wordwrap past {MAX_OUTPUT_CHARS:,} characters")


# Filters whose result size their arguments tell, checked before they run: name -> check(the filter's arguments
# after the context Jinja passes first where it does).
_FILTER_CHECKS = {
    "format": lambda fmt=None, *args, **kw: _check_format(fmt) if isinstance(fmt, str) else None,
    "replace": lambda ctx, text=None, old="", new="", *args, **kw: _check_replace(text, old, new),
    "join": lambda ctx, items=None, d="", *args, **kw: _check_join(items, d),
    "indent": lambda text=None, width=4, *args, **kw: _check_indent(text, width),
    "wordwrap": lambda env, text=None, width=79, long=True, wrapstring=None, *args, **kw: _check_wordwrap(
        text, width, wrapstring),
}


# The same checks for the str methods a template calls: name -> check(the string, the call's arguments).
_STR_METHOD_CHECKS = {
    "replace": lambda text, old="", new="", *args, **kw: _check_replace(text, old, new),
    "join": lambda sep, items=None, *args, **kw: _check_join(items, sep),
}


def _sized_filter(name: str, fn):
    """A filter that refuses huge integer arguments (widths, counts), runs its entry of _FILTER_CHECKS, and
    refuses a result past MAX_OUTPUT_CHARS."""
    check = _FILTER_CHECKS.get(name)

    @functools.wraps(fn)                                 # keeps Jinja's pass_context / pass_environment marks
    def filtered(*args, **kwargs):
        _check_arguments(args, kwargs)
        if check is not None:
            check(*args, **kwargs)
        return _sized(fn(*args, **kwargs), f"the filter {name!r}")
    return filtered


class _RenderStopped(BaseException):
    """Raised inside the rendering thread by its watcher (a BaseException: no `except Exception` in the code it
    interrupts swallows it)."""


def _resident_bytes() -> int | None:
    """The process's resident memory in bytes, or None where /proc/self/statm does not exist."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@contextlib.contextmanager
def _watched(seconds: float, growth: int):
    """Stop the code in this block once `seconds` have passed or the resident memory has grown by more than
    `growth` bytes: a watcher thread raises _RenderStopped in this thread (delivered between two bytecodes, so a
    template's loops stop even when they print nothing). Yields a dict whose "why" says what stopped it."""
    thread, lock, stop, state = threading.get_ident(), threading.Lock(), threading.Event(), {"why": None}
    set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
    start, base = time.monotonic(), _resident_bytes()

    def watch():
        while not stop.wait(WATCH_SECONDS):
            now = _resident_bytes() if base is not None else None
            if time.monotonic() - start > seconds:
                why = f"ran longer than {seconds:g} s (a runaway loop)"
            elif now is not None and now - base > growth:
                why = f"grew the process by more than {growth / 2**20:,.0f} MiB (a runaway template)"
            else:
                continue
            with lock:
                if not stop.is_set():
                    state["why"] = why
                    set_async_exc(ctypes.c_ulong(thread), ctypes.py_object(_RenderStopped))
            return

    watcher = threading.Thread(target=watch, name="template-watch", daemon=True)
    watcher.start()
    try:
        yield state
    finally:
        with lock:
            stop.set()
            if state["why"] is not None:
                set_async_exc(ctypes.c_ulong(thread), None)      # not delivered yet: withdraw it


def _environment() -> ImmutableSandboxedEnvironment:
    env = _StrictSandbox(trim_blocks=True, lstrip_blocks=True,
                                       extensions=[jinja2.ext.loopcontrols, _GenerationTag])
    env.filters["tojson"] = _tojson
    env.filters.update({name: _sized_filter(name, f) for name, f in env.filters.items()})
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now,
                       namespace=_Namespace, dict=_make_dict)
    return env


def _plain(value: Any, where: str) -> Any:
    """A deep copy as plain JSON-like data, so the template sees only dicts, lists and scalars."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain({f.name: getattr(value, f.name) for f in dataclasses.fields(value)}, where)
    if hasattr(value, "model_dump"):            # pydantic models (the server's request types)
        return _plain(value.model_dump(exclude_none=True), where)
    raise TemplateError(f"{where}: a chat message can only hold plain data, not {type(value).__name__}")


_REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")


class ChatTemplate:
    """A compiled chat template. `render(messages)` -> the prompt text (special tokens spelled out)."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
        if not isinstance(source, str) or not source.strip():
            raise TemplateError("chat template is empty")
        self.source = source
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""
        try:
            self._template = _environment().from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise TemplateError(f"chat template does not compile: {e.message} (template line {e.lineno})") from e
        except Exception as e:  # noqa: BLE001 -- untrusted input: anything else is also a broken template
            raise TemplateError(f"chat template does not compile: {type(e).__name__}: {e}") from e

    @classmethod
    def from_gguf(cls, gf) -> "ChatTemplate":
        """The template of a `GGUFFile` (`tokenizer.chat_template`); plain ChatML with a warning when absent."""
        tokens = gf.get("tokenizer.ggml.tokens") or []

        def token(key):
            i = gf.get(key)
            return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else ""

        source = gf.get("tokenizer.chat_template")
        if not source:
            log.warning("%s has no chat template (tokenizer.chat_template); using plain ChatML", gf.path)
            source = CHATML_TEMPLATE
        return cls(source, bos_token=token("tokenizer.ggml.bos_token_id"), eos_token=token("tokenizer.ggml.eos_token_id"))

    @property
    def is_chatml_fallback(self) -> bool:
        return self.source == CHATML_TEMPLATE

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None, **template_kwargs: Any) -> str:
        """The prompt for `messages` (dicts with `role`, `content`, optionally `tool_calls`,
        `reasoning_content`...). `tools` are JSON schemas as in the OpenAI API. Extra keyword arguments
        (e.g. `enable_thinking=False`) are passed to the template."""
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise TemplateError("messages must be a list of {'role': ..., 'content': ...} dicts")
        chat = []
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) and not hasattr(m, "model_dump") and not dataclasses.is_dataclass(m):
                raise TemplateError(f"messages[{i}] is a {type(m).__name__}, not a dict")
            m = _plain(m, f"messages[{i}]")
            if "role" not in m:
                raise TemplateError(f"messages[{i}] has no 'role'")
            # Templates read the reasoning under `reasoning_content`; accept the other common names for it.
            reasoning = next((m[k] for k in _REASONING_KEYS if m.get(k) is not None), None)
            if reasoning is not None:
                m = {**m, "reasoning_content": reasoning}
            chat.append(m)
        context = dict(bos_token=self.bos_token, eos_token=self.eos_token)
        context.update(_plain(template_kwargs, "template_kwargs"))
        context.update(messages=chat, tools=_plain(list(tools), "tools") if tools is not None else None,
                       documents=None, add_generation_prompt=bool(add_generation_prompt))
        watch = {"why": None}
        try:
            pieces, size = [], 0
            with _watched(RENDER_SECONDS, MAX_RENDER_GROWTH) as watch:
                for piece in self._template.generate(**context):
                    pieces.append(piece)
                    size += len(piece)
                    if size > MAX_OUTPUT_CHARS:
                        raise TemplateError(f"chat template output exceeds {MAX_OUTPUT_CHARS:,} characters")
            return "".join(pieces)
        except TemplateError:
            raise
        except _RenderStopped:
            raise TemplateError(f"chat template {watch['why'] or 'was stopped by its watcher'}") from None
        except jinja2.exceptions.SecurityError as e:
            raise TemplateError(f"chat template violates the sandbox: {e}") from e
        except jinja2.exceptions.TemplateError as e:    # raise_exception(), undefined values, ...
            raise TemplateError(f"chat template failed: {e}") from e
        except (Exception, RecursionError, MemoryError) as e:  # noqa: BLE001 -- untrusted template code
            raise TemplateError(f"chat template failed: {type(e).__name__}: {e}") from e
