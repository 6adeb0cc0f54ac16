"""Tool calls and reasoning in the model's output, and tool messages in the requests.

Output: `OutputParser` splits the streamed assistant text into pieces -- reasoning (`<think>...</think>`),
plain text and complete tool calls -- for every wire format (OpenAI chat, Anthropic messages, Responses).
It understands both tool-call spellings of the Qwen chat templates:

    Qwen2.5 / Qwen3:   <tool_call>\\n{"name": "f", "arguments": {"x": 1}}\\n</tool_call>
    Qwen3.5 / 3.6:     <tool_call>\\n<function=f>\\n<parameter=x>\\n1\\n</parameter>\\n</function>\\n</tool_call>

(the second as the Qwen3.5 template writes an assistant's `tool_calls`: string values as is, other values
as JSON). Small Qwen2.5-Coder models often drop the tags and answer with the bare object
`{"name": "f", "arguments": {...}}` (recorded from Qwen2.5-Coder-0.5B driven by Claude Code): an answer
(or the text right after a call) that starts with `{` is held back until its top-level object closes, and
is a call if it parses as one naming an offered tool. Text that may be the start of a tag is held back
until it is resolved, so a stream never shows half a tag. A call is reported only once it closes; a call
that does not parse, names a tool the request did not offer, or never closes is returned as plain text,
unchanged.

Input: `chat_messages` turns OpenAI messages into what the templates read (assistant `tool_calls` with
`function.arguments` as a dict, `role: tool` messages); `anthropic_messages` does the same for Anthropic
`tool_use` / `tool_result` / `thinking` blocks. No constrained decoding: `tool_choice` "required" or a named
tool only passes the tools to the template; the model may still answer in text.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from .protocol import APIError, loads_bounded

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

_XML_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*)</function>", re.DOTALL)
_XML_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass
class Piece:
    kind: str                       # "text" | "reasoning" | "tool_call"
    text: str = ""
    call: ToolCall | None = None


def tool_schemas(tools: list[dict] | None) -> dict[str, dict]:
    """name -> JSON schema of its parameters, for OpenAI-style tools ({"type": "function", "function": {...}})."""
    out = {}
    for t in tools or ():
        fn = t.get("function", t) if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            out[fn["name"]] = params if isinstance(params, dict) else {}
    return out


def parse_call(body: str, schemas: dict[str, dict] | None = None) -> ToolCall | None:
    """The call inside one `<tool_call>...</tool_call>` (body without the tags), or None if it is malformed.
    `schemas` (name -> parameter schema): when given, the name must be one of them, and XML parameter values
    of type string stay strings while the others are read as JSON."""
    body = body.strip()
    if body.startswith("{"):
        try:
            obj = loads_bounded(body)
        except json.JSONDecodeError:
            return None
        if not isinstance(obj, dict):
            return None
        name, args = obj.get("name"), obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):                   # some models write the arguments as a JSON string
            try:
                args = loads_bounded(args)
            except json.JSONDecodeError:
                return None
        if args is None:
            args = {}
    else:
        m = _XML_FUNCTION.fullmatch(body)
        if m is None:
            return None
        name, inner = m.group(1).strip(), m.group(2)
        props = ((schemas or {}).get(name) or {}).get("properties") or {}
        args, end = {}, 0
        for p in _XML_PARAMETER.finditer(inner):
            if inner[end:p.start()].strip():          # stray text between parameters
                return None
            key = p.group(1).strip()
            args[key] = _xml_value(p.group(2), props.get(key))
            end = p.end()
        if inner[end:].strip():
            return None
    if not isinstance(name, str) or not name or not isinstance(args, dict):
        return None
    if schemas is not None and name not in schemas:
        return None
    return ToolCall(name, args)


def _xml_value(raw: str, schema) -> Any:
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind == "string" or (isinstance(kind, list) and "string" in kind and len(kind) == 1):
        return raw
    try:
        return loads_bounded(raw)
    except json.JSONDecodeError:
        return raw


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper start of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class OutputParser:
    """Streaming split of the assistant's text into reasoning, text and tool calls.

    tools: the tools offered to the model (OpenAI format), or None to leave `<tool_call>` as text.
    think: parse a leading `<think>...</think>` (templates that produce reasoning).
    in_think: the prompt already opened `<think>` (thinking templates put it in the generation prompt)."""

    def __init__(self, tools: list[dict] | None = None, think: bool = False, in_think: bool = False):
        self.schemas = tool_schemas(tools) if tools else None
        self.state = "reasoning" if in_think else ("start" if think else "text")
        self.buf = ""
        self.calls = 0
        self.after_call = False     # text right after a call: its leading whitespace is dropped
        self.reasoned = False       # some reasoning text was emitted (the newline after <think> is dropped)
        self.space = ""             # whitespace cut before the open call, given back if the call is malformed
        self.started = False        # some non-whitespace text was emitted (a bare JSON call can only come first)

    def push(self, text: str) -> list[Piece]:
        self.buf += text
        out: list[Piece] = []
        while True:
            before = (self.state, len(self.buf))
            self._step(out)
            if (self.state, len(self.buf)) == before:
                return merge_pieces(out)

    def finish(self) -> list[Piece]:
        """The pieces left when the generation ends: held-back text, an unfinished thought or call."""
        out = self.push("")
        rest, self.buf = self.buf, ""
        if self.state == "reasoning":
            self._reasoning(out, rest.rstrip("\n"))
        elif self.state == "call":
            self._text(out, self.space + CALL_OPEN + rest)      # never closed: the model's text, unchanged
        elif self.state == "bare":
            self._text(out, rest)                               # an object that never closed: text
        elif self.state == "text" or (self.state == "start" and rest.strip()):
            self._text(out, rest)
        self.state = "text"
        return merge_pieces(out)

    def _step(self, out: list[Piece]) -> None:
        buf = self.buf
        if self.state == "start":                   # before any text: is there a `<think>`?
            stripped = buf.lstrip()
            if stripped.startswith(THINK_OPEN):
                self.buf, self.state = stripped[len(THINK_OPEN):], "reasoning"
            elif stripped and not THINK_OPEN.startswith(stripped):
                self.state = "text"
        elif self.state == "reasoning":
            i = buf.find(THINK_CLOSE)
            if i >= 0:
                self._reasoning(out, buf[:i].rstrip("\n"))
                self.buf, self.state = buf[i + len(THINK_CLOSE):], "after_think"
                return
            keep = _partial_suffix(buf, THINK_CLOSE)        # and the newlines that may precede </think>
            keep = len(buf) - len(buf[:len(buf) - keep].rstrip("\n"))
            if keep < len(buf):
                self._reasoning(out, buf[:len(buf) - keep])
                self.buf = buf[len(buf) - keep:]
        elif self.state == "after_think":           # drop the blank line(s) after </think>
            if buf.strip("\n"):
                self.buf, self.state = buf.lstrip("\n"), "text"
        elif self.state == "text":
            tools = self.schemas is not None
            if tools and not self.started and buf.lstrip().startswith("{"):
                self.state = "bare"                 # maybe a call without its tags
                return
            if tools and not self.started and not buf.strip():
                return                              # wait: whitespace may precede a bare call
            i = buf.find(CALL_OPEN) if tools else -1
            if i >= 0:                              # whitespace just before a call is not part of the text
                text = buf[:i].rstrip()
                self._text(out, text)
                self.space = buf[len(text):i]
                self.buf, self.state = buf[i + len(CALL_OPEN):], "call"
                return
            keep = 0
            if tools:                               # a possible tag start, and the whitespace before it
                keep = _partial_suffix(buf, CALL_OPEN)
                keep = len(buf) - len(buf[:len(buf) - keep].rstrip())
            if keep < len(buf):
                self._text(out, buf[:len(buf) - keep])
                self.buf = buf[len(buf) - keep:]
        elif self.state == "call":
            i = buf.find(CALL_CLOSE)
            if i < 0:
                return
            body, self.buf, self.state = buf[:i], buf[i + len(CALL_CLOSE):], "text"
            self._call_or_text(out, body, self.space + CALL_OPEN + body + CALL_CLOSE)
        elif self.state == "bare":
            end = _object_end(buf)
            if end < 0:
                return
            body, self.buf, self.state = buf[:end], buf[end:], "text"
            self._call_or_text(out, body, body)

    def _call_or_text(self, out: list[Piece], body: str, as_text: str) -> None:
        """A closed call body: a tool_call piece if it parses as a call of an offered tool, else `as_text`."""
        call = parse_call(body, self.schemas)
        if call is None:
            self._text(out, as_text)
            return
        self.calls += 1
        self.after_call = True
        out.append(Piece("tool_call", call=call))

    def _reasoning(self, out: list[Piece], text: str) -> None:
        if not self.reasoned:
            text = text.lstrip("\n")
            self.reasoned = bool(text)
        out.append(Piece("reasoning", text))

    def _text(self, out: list[Piece], text: str) -> None:
        if self.after_call:
            text = text.lstrip()
            if not text:
                return
            self.after_call = False
        self.started = self.started or bool(text.strip())
        out.append(Piece("text", text))


def _object_end(text: str) -> int:
    """Index just past the top-level JSON object that `text` starts with (after whitespace), or -1 while it
    is still open (strings and escapes respected; the object's validity is parse_call's business)."""
    depth, in_str, esc = 0, False, False
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
    return -1


def merge_pieces(pieces: list[Piece]) -> list[Piece]:
    out: list[Piece] = []
    for p in pieces:
        if p.kind != "tool_call" and not p.text:
            continue
        if out and p.kind != "tool_call" and out[-1].kind == p.kind:
            out[-1] = Piece(p.kind, out[-1].text + p.text)
        else:
            out.append(p)
    return out


def parse_output(text: str, tools: list[dict] | None = None, think: bool = False,
                 in_think: bool = False) -> tuple[str, str, list[ToolCall]]:
    """(reasoning, text, tool calls) of a whole answer."""
    p = OutputParser(tools, think, in_think)
    pieces = p.push(text) + p.finish()
    return ("".join(x.text for x in pieces if x.kind == "reasoning"),
            "".join(x.text for x in pieces if x.kind == "text"),
            [x.call for x in pieces if x.kind == "tool_call"])


# -- requests -> template messages -------------------------------------------------------------------------
def _arguments_dict(args, where: str) -> dict:
    if isinstance(args, dict):
        return args
    if args is None or args == "":
        return {}
    if isinstance(args, str):
        try:
            value = loads_bounded(args)
        except json.JSONDecodeError as e:
            raise APIError(400, f"{where}: the arguments are not valid JSON ({e})", param=where) from None
        if isinstance(value, dict):
            return value
    raise APIError(400, f"{where}: the arguments must be a JSON object", param=where)


def template_tool_call(call_id: str | None, name: str, arguments, where: str) -> dict:
    """One assistant tool call as the Qwen templates read it (arguments as a dict)."""
    if not isinstance(name, str) or not name:
        raise APIError(400, f"{where}: a tool call needs a function name", param=where)
    out = {"type": "function", "function": {"name": name, "arguments": _arguments_dict(arguments, where)}}
    if call_id:
        out["id"] = call_id
    return out


def chat_messages(messages: list[dict]) -> list[dict]:
    """OpenAI chat messages (plain dicts) -> template messages: `tool_calls[].function.arguments` parsed
    from its JSON string into a dict."""
    out = []
    for i, m in enumerate(messages):
        calls = m.get("tool_calls")
        if calls:
            if not isinstance(calls, list):
                raise APIError(400, f"messages[{i}].tool_calls must be a list", param=f"messages.{i}.tool_calls")
            fixed = []
            for j, c in enumerate(calls):
                where = f"messages.{i}.tool_calls.{j}"
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict):
                    raise APIError(400, f"{where}: expected {{'type': 'function', 'function': {{...}}}}", param=where)
                fixed.append(template_tool_call(c.get("id"), fn.get("name"), fn.get("arguments"), where))
            m = {**m, "tool_calls": fixed}
        out.append(m)
    return out


def content_text(content, where: str, text_types: tuple[str, ...] = ("text",)) -> str:
    """A message's content as text: a string, or a list of parts whose type is one of `text_types`
    (Anthropic blocks: "text"; Responses parts: "input_text" / "output_text" / "text"). Anything else is a 400."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for k, b in enumerate(content):
            if isinstance(b, dict) and b.get("type") in text_types and isinstance(b.get("text"), str):
                parts.append(b["text"])
            else:
                kind = b.get("type") if isinstance(b, dict) else type(b).__name__
                raise APIError(400, f"{where}[{k}]: only text is supported here, got {kind!r}", param=where,
                               code="unsupported_content")
        return "".join(parts)
    raise APIError(400, f"{where}: expected a string or a list of text parts", param=where)


def anthropic_messages(system, messages: list[dict]) -> list[dict]:
    """Anthropic system + messages (blocks as dicts) -> template messages. `tool_use` blocks become the
    assistant's `tool_calls`, `tool_result` blocks `role: tool` messages, `thinking` blocks its reasoning."""
    out = []
    if system:
        out.append({"role": "system", "content": content_text(system, "system")})
    for i, m in enumerate(messages):
        role, content = m["role"], m["content"]
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        text, calls, reasoning = [], [], []
        for k, b in enumerate(content):
            where, kind = f"messages.{i}.content.{k}", b.get("type")
            if kind == "text":
                text.append(b.get("text") or "")
            elif kind == "tool_use" and role == "assistant":
                calls.append(template_tool_call(b.get("id"), b.get("name"), b.get("input"), where))
            elif kind == "tool_result" and role == "user":
                if text:                            # text before the result keeps its place
                    out.append({"role": "user", "content": "".join(text)})
                    text = []
                result = content_text(b.get("content"), where + ".content")
                if b.get("is_error"):
                    result = f"Error: {result}"
                out.append({"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": result})
            elif kind in ("thinking", "redacted_thinking") and role == "assistant":
                reasoning.append(b.get("thinking") or "")
            else:
                raise APIError(400, f"{where}: unsupported content block {kind!r} in a {role} message",
                               param=where, code="unsupported_content")
        if role == "assistant":
            msg = {"role": "assistant", "content": "".join(text)}
            if calls:
                msg["tool_calls"] = calls
            if reasoning:
                msg["reasoning_content"] = "".join(reasoning)
            out.append(msg)
        elif text:
            out.append({"role": role, "content": "".join(text)})
    return out
