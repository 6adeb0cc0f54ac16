"""Wire formats: request bodies of the OpenAI and Anthropic APIs as pydantic models, and the API error.

Bodies are validated strictly where a wrong type would change the meaning (a string `max_tokens` is an
error, not coerced) and leniently where clients send fields this engine ignores (`user`, `logprobs`,
`metadata`, ... are accepted and dropped). Every failure becomes an `APIError` with a message that names
the field, which the app turns into a 4xx response.
"""
from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


MAX_JSON_DEPTH = 64      # arrays / objects inside each other in a body; tool schemas nest a dozen levels at most


def _nested_deeper_than(data: Any, limit: int) -> bool:
    """Whether `data` (parsed JSON) nests arrays and objects more than `limit` deep (iterative: no recursion)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        if items is None:
            continue
        if depth > limit:
            return True
        stack.extend((v, depth + 1) for v in items if isinstance(v, (dict, list)))
    return False


class NestedTooDeep(json.JSONDecodeError):
    """JSON nested past MAX_JSON_DEPTH (a JSONDecodeError, so code that refuses malformed JSON refuses it too)."""

    def __init__(self):
        super().__init__(f"nested more than {MAX_JSON_DEPTH} levels deep", "", 0)


def loads_bounded(text: str | bytes) -> Any:
    """json.loads for untrusted text (a request body, a string inside one, a model's tool call): input nested past
    MAX_JSON_DEPTH, or past the parser's own recursion limit, raises NestedTooDeep."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise NestedTooDeep() from None
    if _nested_deeper_than(value, MAX_JSON_DEPTH):
        raise NestedTooDeep()
    return value


class APIError(Exception):
    """An error answered to the client: HTTP status + OpenAI-style body {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def openai_body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def anthropic_body(self) -> dict:
        kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                413: "request_too_large", 429: "rate_limit_error"}.get(self.status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}


def parse_body(raw: bytes, model: type[BaseModel]) -> BaseModel:
    """JSON bytes -> validated request model, or APIError(400) naming the bad field."""
    try:
        data = loads_bounded(raw)
    except NestedTooDeep:
        raise APIError(400, f"the request body is nested more than {MAX_JSON_DEPTH} levels deep",
                       code="invalid_json") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(data).__name__}",
                       code="invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        parts = []
        for err in errors[:3]:
            loc = ".".join(str(p) for p in err["loc"]) or "body"
            parts.append(f"{loc}: {err['msg']}")
        more = f" (and {len(errors) - 3} more errors)" if len(errors) > 3 else ""
        param = ".".join(str(p) for p in errors[0]["loc"]) if errors else None
        raise APIError(400, "invalid request: " + "; ".join(parts) + more, param=param,
                       code="invalid_value") from None


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


# -- OpenAI --------------------------------------------------------------------------------------------
class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    """One message; extra keys (tool_calls, tool_call_id, name, reasoning_content) go to the template as is."""
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[ContentPart] | None = None

    def plain(self) -> dict:
        d = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            d["content"] = join_text_parts(self.content, "content")
        elif self.content is None:
            d["content"] = ""
        return d


def join_text_parts(parts: list, where: str) -> str:
    out = []
    for i, p in enumerate(parts):
        if p.type != "text" or p.text is None:
            raise APIError(400, f"{where}[{i}]: only text content parts are supported, got type {p.type!r}",
                           param=where, code="unsupported_content")
        out.append(p.text)
    return "".join(out)


class StreamOptions(BaseModel):
    include_usage: bool = False


EXTRA_SAMPLING = ("min_p", "repetition_penalty", "frequency_penalty", "presence_penalty")


class _Sampling(_Request):
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1, strict=True)
    temperature: float | None = Field(default=None, ge=0, allow_inf_nan=False, strict=True)
    top_p: float | None = Field(default=None, gt=0, le=1, strict=True)
    top_k: int | None = Field(default=None, ge=-1, strict=True)        # -1 / 0 = off
    seed: int | None = Field(default=None, strict=True)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2, strict=True)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2, strict=True)
    min_p: float | None = Field(default=None, ge=0, le=1, strict=True)                 # extension (vLLM)
    repetition_penalty: float | None = Field(default=None, gt=0, le=10, strict=True)   # extension (vLLM)
    stop: str | list[str] | None = None
    stream: bool = Field(default=False, strict=True)
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, strict=True)
    ignore_eos: bool = Field(default=False, strict=True)    # extension, as in vLLM and llama.cpp
    logprobs: bool | int | None = None
    echo: bool = False

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v):
        if isinstance(v, list) and len(v) > 16:
            raise ValueError("at most 16 stop sequences")
        return v

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, v):
        if v:          # silently dropping them would give scoring clients wrong answers
            raise ValueError("logprobs are not supported by this server")
        return v

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, v):
        if v:
            raise ValueError("echo is not supported by this server")
        return v

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v):
        if v != 1:
            raise ValueError("only n=1 is supported (one sequence at a time)")
        return v

    def extra_sampling(self) -> dict:
        """The SamplingParams fields beyond temperature/top_p/top_k/seed that the request sets."""
        return {k: getattr(self, k) for k in EXTRA_SAMPLING if getattr(self, k) is not None}

    def stop_tuple(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, strict=True)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None     # "none" | "auto" | "required" | {"type": "function", ...}
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, v):
        if isinstance(v, str) and v not in ("none", "auto", "required"):
            raise ValueError(f"tool_choice must be 'none', 'auto', 'required' or a function, got {v!r}")
        return v

    def template_tools(self) -> list[dict] | None:
        """The tools handed to the chat template: none when tool_choice is 'none'."""
        return None if self.tool_choice == "none" or not self.tools else self.tools

    def limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v):
        if isinstance(v, list):
            if not v:
                raise ValueError("the prompt is empty")
            if isinstance(v[0], str):
                if len(v) != 1:
                    raise ValueError("only one prompt per request is supported")
                return v[0]
        return v

    def limit(self) -> int | None:
        return self.max_tokens


# -- Anthropic -----------------------------------------------------------------------------------------
class AnthropicMessage(BaseModel):
    role: Literal["user", "assistant", "system"]     # "system" is not Anthropic's, but Claude Code sends it
    content: str | list[dict[str, Any]]


class AnthropicTool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=dict)


class MessagesRequest(_Request):
    model: str | None = None
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    max_tokens: int = Field(ge=1, strict=True)
    stop_sequences: list[str] | None = Field(default=None, max_length=16)
    temperature: float | None = Field(default=None, ge=0, allow_inf_nan=False, strict=True)
    top_p: float | None = Field(default=None, gt=0, le=1, strict=True)
    top_k: int | None = Field(default=None, ge=0, strict=True)
    stream: bool = Field(default=False, strict=True)
    tools: list[AnthropicTool] | None = None
    tool_choice: dict[str, Any] | None = None           # {"type": "auto" | "any" | "tool" | "none"}
    thinking: dict[str, Any] | None = None              # {"type": "enabled" | "disabled", ...}
    chat_template_kwargs: dict[str, Any] | None = None

    def template_kwargs(self) -> dict | None:
        """chat_template_kwargs, with enable_thinking from `thinking` unless set there."""
        kwargs = dict(self.chat_template_kwargs or {})
        if self.thinking is not None and "enable_thinking" not in kwargs:
            kwargs["enable_thinking"] = self.thinking.get("type") == "enabled"
        return kwargs or None

    def openai_tools(self) -> list[dict] | None:
        if not self.tools or (self.tool_choice or {}).get("type") == "none":
            return None
        return [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                                  "parameters": t.input_schema}} for t in self.tools]
