"""The OpenAI Responses API (`POST /v1/responses`): request body, input items -> chat messages, and the
response object / streaming events built from the output pieces (tools.Piece).

Stateless: `previous_response_id` and stored conversations are refused (400); clients that send the whole
input each turn (Codex, the `openai` client with explicit input lists) work. Output items: `reasoning`
(when the template produces `<think>`), `message` (output_text) and `function_call`; inputs: messages
(string or input_text/output_text parts), `function_call`, `function_call_output`, `reasoning`.
Event names and fields follow `openai.types.responses` (response.created, response.output_item.added,
response.output_text.delta, response.function_call_arguments.done, response.completed, ...).
"""
from __future__ import annotations

import time
import uuid
from typing import Any

from pydantic import Field, field_validator

from .protocol import APIError, _Request
from .tools import Piece, content_text, template_tool_call


class ResponsesRequest(_Request):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, strict=True)
    temperature: float | None = Field(default=None, ge=0, allow_inf_nan=False, strict=True)
    top_p: float | None = Field(default=None, gt=0, le=1, strict=True)
    stream: bool = Field(default=False, strict=True)
    previous_response_id: str | None = None
    parallel_tool_calls: bool = True
    metadata: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None

    @field_validator("previous_response_id")
    @classmethod
    def _stateless(cls, v):
        if v is not None:
            raise ValueError("this server does not store responses; send the whole conversation as input")
        return v

    def chat_tools(self) -> list[dict] | None:
        """Function tools in the chat-completions shape the templates read; other tool types are refused."""
        if not self.tools or self.tool_choice == "none":
            return None
        out = []
        for i, t in enumerate(self.tools):
            if t.get("type") != "function" or not isinstance(t.get("name"), str):
                raise APIError(400, f"tools[{i}]: only function tools are supported, got type {t.get('type')!r}",
                               param=f"tools.{i}", code="unsupported_tool")
            out.append({"type": "function", "function": {
                "name": t["name"], "description": t.get("description") or "", "parameters": t.get("parameters") or {}}})
        return out

    def messages(self) -> list[dict]:
        """The input items as chat messages (function calls merged into the assistant message before them)."""
        out: list[dict] = []
        if self.instructions:
            out.append({"role": "system", "content": self.instructions})
        if isinstance(self.input, str):
            return out + [{"role": "user", "content": self.input}]
        reasoning = None
        for i, item in enumerate(self.input):
            kind, where = item.get("type", "message"), f"input.{i}"
            if kind == "message":
                role = item.get("role")
                if role not in ("user", "assistant", "system", "developer"):
                    raise APIError(400, f"{where}: unknown role {role!r}", param=where)
                msg = {"role": "system" if role == "developer" else role, "content": content_text(item.get("content"), where, RESPONSE_TEXT_PARTS)}
                if role == "assistant" and reasoning is not None:
                    msg["reasoning_content"], reasoning = reasoning, None
                out.append(msg)
            elif kind == "function_call":
                call = template_tool_call(item.get("call_id"), item.get("name"), item.get("arguments"), where)
                last = out[-1] if out else None
                if last is None or last["role"] != "assistant":
                    last = {"role": "assistant", "content": ""}
                    if reasoning is not None:
                        last["reasoning_content"], reasoning = reasoning, None
                    out.append(last)
                last.setdefault("tool_calls", []).append(call)
            elif kind == "function_call_output":
                out.append({"role": "tool", "tool_call_id": item.get("call_id"),
                            "content": content_text(item.get("output"), where + ".output", RESPONSE_TEXT_PARTS)})
            elif kind == "reasoning":
                parts = (item.get("content") or []) + (item.get("summary") or [])
                reasoning = "".join(p.get("text", "") for p in parts if isinstance(p, dict))
            else:
                raise APIError(400, f"{where}: unsupported input item type {kind!r}", param=where,
                               code="unsupported_content")
        return out


RESPONSE_TEXT_PARTS = ("input_text", "output_text", "text")


class ResponseBuilder:
    """Builds the response object and, when streaming, the events, from output pieces."""

    def __init__(self, req: ResponsesRequest, model: str):
        self.req, self.model = req, model
        self.id, self.created = f"resp_{uuid.uuid4().hex}", int(time.time())
        self.output: list[dict] = []
        self.seq = 0
        self.open: dict | None = None           # the reasoning or message item receiving deltas

    def response(self, status: str, usage: dict | None = None, incomplete: str | None = None,
                 timings: dict | None = None) -> dict:
        r = self.req
        tools = [t for t in (r.tools or []) if t.get("type") == "function"]
        body = {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "model": self.model, "output": self.output, "error": None,
                "incomplete_details": {"reason": incomplete} if incomplete else None,
                "instructions": r.instructions, "metadata": r.metadata or {},
                "parallel_tool_calls": r.parallel_tool_calls, "temperature": r.temperature, "top_p": r.top_p,
                "max_output_tokens": r.max_output_tokens, "previous_response_id": None,
                "tool_choice": r.tool_choice or "auto", "tools": [{"strict": None, **t} for t in tools],
                "text": {"format": {"type": "text"}}, "usage": usage}
        if timings is not None:
            body["timings"] = timings
        return body

    def event(self, type_: str, **fields) -> dict:
        ev = {"type": type_, "sequence_number": self.seq, **fields}
        self.seq += 1
        return ev

    # -- pieces -> items (+ events) ------------------------------------------------------------------
    def add(self, piece: Piece) -> list[dict]:
        events: list[dict] = []
        if piece.kind == "tool_call":
            events += self.close()
            call = piece.call
            item = {"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call.id,
                    "name": call.name, "arguments": call.arguments_json, "status": "completed"}
            index = len(self.output)
            self.output.append(item)
            events.append(self.event("response.output_item.added", output_index=index,
                                     item={**item, "arguments": "", "status": "in_progress"}))
            events.append(self.event("response.function_call_arguments.delta", item_id=item["id"],
                                     output_index=index, delta=item["arguments"]))
            events.append(self.event("response.function_call_arguments.done", item_id=item["id"],
                                     output_index=index, arguments=item["arguments"]))
            events.append(self.event("response.output_item.done", output_index=index, item=item))
            return events
        kind = "reasoning" if piece.kind == "reasoning" else "message"
        if self.open is None or self.open["type"] != kind:
            events += self.close()
            events += self._start(kind)
        item, index = self.open, len(self.output) - 1
        part = item["content"][0]
        part["text"] += piece.text
        if kind == "reasoning":
            events.append(self.event("response.reasoning_text.delta", item_id=item["id"], output_index=index,
                                     content_index=0, delta=piece.text))
        else:
            events.append(self.event("response.output_text.delta", item_id=item["id"], output_index=index,
                                     content_index=0, delta=piece.text, logprobs=[]))
        return events

    def _start(self, kind: str) -> list[dict]:
        if kind == "reasoning":
            item = {"type": "reasoning", "id": f"rs_{uuid.uuid4().hex}", "summary": [],
                    "content": [{"type": "reasoning_text", "text": ""}]}
        else:
            item = {"type": "message", "id": f"msg_{uuid.uuid4().hex}", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}]}
        self.output.append(item)
        self.open = item
        index = len(self.output) - 1
        shell = {**item, "content": []}
        if kind == "message":
            shell["status"] = "in_progress"
        return [self.event("response.output_item.added", output_index=index, item=shell),
                self.event("response.content_part.added", item_id=item["id"], output_index=index, content_index=0,
                           part={**item["content"][0], "text": ""})]

    def close(self) -> list[dict]:
        """Finish the open reasoning/message item."""
        item, self.open = self.open, None
        if item is None:
            return []
        index = self.output.index(item)
        part = item["content"][0]
        if item["type"] == "reasoning":
            done = self.event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                              content_index=0, text=part["text"])
        else:
            done = self.event("response.output_text.done", item_id=item["id"], output_index=index,
                              content_index=0, text=part["text"], logprobs=[])
        return [done,
                self.event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                           part=part),
                self.event("response.output_item.done", output_index=index, item=item)]


def responses_usage(n_prompt: int, n_out: int) -> dict:
    return {"input_tokens": n_prompt, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": n_out, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": n_prompt + n_out}
