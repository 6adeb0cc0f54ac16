"""The HTTP server: OpenAI chat/completions, Anthropic messages, models, health and Prometheus metrics.

Request path: parse + validate the body (protocol.py) -> tokenize in a thread (chat template or raw text)
-> check the context -> submit a Job to the single generation worker (worker.py; 429 when the queue is
full) -> stream its events as SSE or collect them into one JSON response. A client that goes away cancels
its job. Client mistakes are 4xx with an OpenAI-style error body (Anthropic-style on /v1/messages).
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
import uuid
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..config import ConfigError, SamplingParams
from ..gguf.template import TemplateError
from .metrics import Metrics
from .protocol import (EXTRA_SAMPLING, APIError, ChatCompletionRequest, CompletionRequest, MessagesRequest,
                       parse_body)
from .responses import ResponseBuilder, ResponsesRequest, responses_usage
from .tools import THINK_CLOSE, THINK_OPEN, OutputParser, anthropic_messages, chat_messages, merge_pieces
from .worker import GenerationWorker, Job, QueueFull

log = logging.getLogger("dflash24.server")

MAX_BODY_BYTES = 32 << 20    # a request body larger than this is refused (413) before it is read whole
RESERVED_TEMPLATE_KWARGS = ("messages", "tools", "add_generation_prompt")
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses", "/v1/models", "/health",
             "/metrics")


class _ClientGone(Exception):
    pass


_GONE = object()              # put on a job's event queue when its client disconnects


async def _read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise APIError(413, f"the request body ({int(declared):,} bytes) exceeds {MAX_BODY_BYTES:,} bytes",
                       code="request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise APIError(413, f"the request body exceeds {MAX_BODY_BYTES:,} bytes", code="request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


class _Server:
    """Everything a request handler needs: the engine, its worker, metrics, names and defaults."""

    def __init__(self, engine, api_key: str | None, max_queue: int, model_name: str | None,
                 default_params: SamplingParams | None):
        self.engine = engine
        self.api_key = api_key or None
        self.model_name = model_name or Path(str(engine.model_path)).stem
        self.model_aliases = {self.model_name, Path(str(engine.model_path)).name, str(engine.model_path)}
        self.default_params = default_params or SamplingParams()
        self.created = int(time.time())
        self.metrics = Metrics(gauges={
            "queue_waiting": ("Requests waiting for the GPU.", lambda: self.worker.waiting),
            "generation_running": ("1 while a generation runs on the GPU.", lambda: int(self.worker.busy)),
            "context_tokens": ("KV capacity of the engine in tokens (--ctx).", lambda: engine.config.ctx),
        })
        self.worker = GenerationWorker(engine, max_queue, on_finish=self._finished)

    # -- bookkeeping -----------------------------------------------------------------------------------
    def _finished(self, job: Job):
        final = job.final
        stats = final.stats if final is not None else None
        reason = final.finish_reason if final is not None else ("error" if job.error else "cancelled")
        ttft = job.first_token_at - job.arrived_at if job.first_token_at else None
        latency = job.finished_at - job.arrived_at if final is not None and job.finished_at else None
        queue = job.started_at - job.submitted_at if job.started_at else None
        self.metrics.observe_generation(stats, reason, ttft, latency, queue)

    def check_auth(self, request: Request):
        if self.api_key is None:
            return
        header = request.headers.get("authorization", "")
        token = header[7:].strip() if header[:7].lower() == "bearer " else request.headers.get("x-api-key", "")
        if not token or not hmac.compare_digest(token.encode(), self.api_key.encode()):
            raise APIError(401, "invalid or missing API key (send 'Authorization: Bearer <key>')",
                           type="authentication_error", code="invalid_api_key")

    def check_model(self, name: str | None):
        if name is not None and name not in self.model_aliases:
            raise APIError(404, f"the model {name!r} does not exist; this server serves {self.model_name!r}",
                           param="model", code="model_not_found")

    # -- request -> job --------------------------------------------------------------------------------
    async def encode_chat(self, messages: list[dict], tools, template_kwargs: dict | None) -> list[int]:
        kwargs = dict(template_kwargs or {})
        bad = [k for k in kwargs if k in RESERVED_TEMPLATE_KWARGS]
        if bad:
            raise APIError(400, f"chat_template_kwargs cannot set {', '.join(bad)}", param="chat_template_kwargs")
        try:
            return await run_in_threadpool(self.engine.encode_chat, messages, tools, **kwargs)
        except TemplateError as e:
            raise APIError(400, f"the chat template rejected the messages: {e}", param="messages",
                           code="template_error") from None

    async def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return await run_in_threadpool(self.engine.encode_raw, prompt)
        vocab = len(self.engine.tokenizer)
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"prompt token id {bad[0]} is outside the vocabulary (0..{vocab - 1})", param="prompt")
        return list(prompt)

    def sampling(self, n_prompt: int, limit: int | None, temperature, top_p, top_k, seed,
                 ignore_eos: bool = False, param: str = "messages", extra: dict | None = None) -> SamplingParams:
        ctx = self.engine.config.ctx
        try:
            self.engine.check_fits(n_prompt, limit or 1)
        except ConfigError as e:
            raise APIError(400, f"{e} (the prompt has {n_prompt} tokens; the context holds {ctx})",
                           param=param, code="context_length_exceeded") from None
        if limit is not None and n_prompt + limit > ctx:
            raise APIError(400, f"the context holds {ctx} tokens, but this request needs {n_prompt + limit} "
                                f"({n_prompt} prompt tokens + max_tokens {limit}); shorten the prompt or lower "
                                f"max_tokens to at most {ctx - n_prompt}", param="max_tokens",
                           code="context_length_exceeded")
        d = self.default_params
        try:
            return SamplingParams(
                max_tokens=limit if limit is not None else ctx - n_prompt,
                temperature=d.temperature if temperature is None else float(temperature),
                top_p=d.top_p if top_p is None else float(top_p),
                top_k=d.top_k if top_k is None else max(int(top_k), 0),
                seed=d.seed if seed is None else seed,
                stop_token_ids=d.stop_token_ids, ignore_eos=ignore_eos or d.ignore_eos,
                **{k: (extra or {}).get(k, getattr(d, k)) for k in EXTRA_SAMPLING})
        except ConfigError as e:
            raise APIError(400, str(e)) from None

    def submit(self, request: Request, ids: list[int], params: SamplingParams, stop: tuple[str, ...]) -> Job:
        job = Job(ids, params, stop, asyncio.get_running_loop(), arrived_at=request.scope.get("dflash24.arrived_at"))
        try:
            self.worker.submit(job)
        except QueueFull as e:
            raise APIError(429, str(e), type="rate_limit_exceeded", code="queue_full") from None
        return job

    async def events(self, job: Job, request: Request) -> AsyncIterator:
        """The job's engine events, ending with the one that has a finish_reason. Cancels the job as soon as
        the client disconnects (raising _ClientGone) or when the consumer stops early."""
        done = False
        watcher = asyncio.create_task(self._watch_disconnect(job, request))
        try:
            while True:
                item = await job.events.get()
                if item is _GONE:
                    raise _ClientGone()
                if item is None:
                    done = True
                    raise APIError(500, "the generation ended without a result", type="server_error")
                if isinstance(item, BaseException):
                    done = True
                    raise APIError(500, f"generation failed: {type(item).__name__}: {item}", type="server_error")
                yield item
                if item.finish_reason is not None:
                    done = True
                    return
        finally:
            watcher.cancel()
            if not done:
                self.worker.cancel(job)

    async def _watch_disconnect(self, job: Job, request: Request) -> None:
        """Waits for the ASGI `http.disconnect` (the body is already read) and cancels the job at once, so
        the engine stops at its next step instead of at the next poll."""
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                self.worker.cancel(job)
                job.events.put_nowait(_GONE)
                return

    async def pieces(self, job: Job, request: Request, parser: OutputParser) -> AsyncIterator:
        """(output pieces, engine event) per event: the text split into reasoning, text and tool calls."""
        async for ev in self.events(job, request):
            out = parser.push(ev.text)
            if ev.finish_reason is not None:
                out += parser.finish()
            yield out, ev

    def output_parser(self, ids: list[int], tools) -> OutputParser:
        """The parser for one chat answer: tool calls when tools were offered, `<think>` when the template
        writes reasoning, starting inside it when the generation prompt opened `<think>`."""
        think = THINK_CLOSE in self.engine.chat_template.source
        in_think = think and self.engine.tokenizer.decode(ids[-16:]).rstrip().endswith(THINK_OPEN)
        return OutputParser(tools, think=think, in_think=in_think)

    def timings(self, job: Job, stats) -> dict:
        t = stats.as_dict() if stats is not None else {}
        ms = lambda a, b: round(1e3 * (b - a), 2) if a is not None and b is not None else None  # noqa: E731
        t.update(queue_ms=ms(job.submitted_at, job.started_at), ttft_ms=ms(job.arrived_at, job.first_token_at),
                 total_ms=ms(job.arrived_at, time.perf_counter()))
        return t


def _usage(n_prompt: int, stats) -> dict:
    n_out = stats.completion_tokens if stats is not None else 0
    return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}


def _sse(obj, event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _sse_response(events, on_error, done: bool = False) -> StreamingResponse:
    """An SSE response of the `events` lines: a client that left ends it quietly, an APIError raised while
    streaming becomes `on_error(e)`'s line, and `done` closes an OpenAI stream with `data: [DONE]`."""
    async def body():
        try:
            async for line in events:
                yield line
        except _ClientGone:
            return
        except APIError as e:
            yield on_error(e)
        if done:
            yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


class _CountRequests:
    """ASGI middleware: stamps the arrival time (for TTFT) and counts responses by endpoint and status."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        scope["dflash24.arrived_at"] = time.perf_counter()
        status = 500

        async def send_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            path = scope.get("path", "")
            self.metrics.count_request(path if path in ENDPOINTS else "other", scope.get("method", ""), status)


def create_app(engine, api_key: str | None = None, max_queue: int = 16, model_name: str | None = None,
               default_params: SamplingParams | None = None) -> FastAPI:
    """The FastAPI app serving `engine`.

    api_key: require `Authorization: Bearer <key>` (or `x-api-key`) on /v1/* and /metrics; /health stays open.
    max_queue: requests allowed to wait while one generates; more are answered 429.
    model_name: the id /v1/models reports and requests may name (default: the GGUF file's stem).
    default_params: sampling used for fields a request leaves out (default: greedy, as SamplingParams()).
    """
    srv = _Server(engine, api_key, max_queue, model_name, default_params)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        srv.worker.close()

    app = FastAPI(title="dflash24", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = srv
    app.add_middleware(_CountRequests, metrics=srv.metrics)

    def error_response(request: Request, e: APIError) -> JSONResponse:
        anthropic = request.url.path == "/v1/messages"
        return JSONResponse(e.anthropic_body() if anthropic else e.openai_body(), status_code=e.status,
                            headers={"WWW-Authenticate": "Bearer"} if e.status == 401 else None)

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError):
        return error_response(request, e)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):
        kind = "not_found" if e.status_code == 404 else "invalid_request_error"
        msg = f"{request.method} {request.url.path}: {e.detail}"
        return error_response(request, APIError(e.status_code, msg, type=kind))

    @app.exception_handler(Exception)
    async def server_error(request: Request, e: Exception):
        log.exception("internal error on %s", request.url.path)
        return error_response(request, APIError(500, f"internal error: {type(e).__name__}: {e}", type="server_error"))

    # -- informational -------------------------------------------------------------------------------
    @app.get("/health")
    async def health():
        return {"status": "ok", "model": srv.model_name, "busy": srv.worker.busy, "waiting": srv.worker.waiting}

    @app.get("/v1/models")
    async def models(request: Request):
        srv.check_auth(request)
        return {"object": "list", "data": [{
            "id": srv.model_name, "object": "model", "created": srv.created, "owned_by": "dflash24",
            "context_length": engine.config.ctx, "spec_mode": getattr(engine, "spec_mode", "ar")}]}

    @app.get("/metrics")
    async def metrics(request: Request):
        srv.check_auth(request)
        return PlainTextResponse(srv.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    # -- OpenAI ----------------------------------------------------------------------------------------
    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        srv.check_auth(request)
        req = parse_body(await _read_body(request), ChatCompletionRequest)
        srv.check_model(req.model)
        messages = chat_messages([m.plain() for m in req.messages])
        tools = req.template_tools()
        ids = await srv.encode_chat(messages, tools, req.chat_template_kwargs)
        parser = srv.output_parser(ids, tools)
        params = srv.sampling(len(ids), req.limit(), req.temperature, req.top_p, req.top_k, req.seed, req.ignore_eos,
                              extra=req.extra_sampling())
        job = srv.submit(request, ids, params, req.stop_tuple())
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

        def chunk(delta: dict, finish=None, **extra):
            return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": srv.model_name,
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}], **extra}

        def finish_reason(ev, n_calls: int) -> str:
            return "tool_calls" if n_calls and ev.finish_reason == "stop" else ev.finish_reason

        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)

            async def stream():
                n_calls = 0
                yield _sse(chunk({"role": "assistant", "content": ""}))
                async for pieces, ev in srv.pieces(job, request, parser):
                    for p in pieces:
                        if p.kind == "text":
                            yield _sse(chunk({"content": p.text}))
                        elif p.kind == "reasoning":
                            yield _sse(chunk({"reasoning_content": p.text}))
                        else:
                            yield _sse(chunk({"tool_calls": [{"index": n_calls, **_openai_call(p.call)}]}))
                            n_calls += 1
                    if ev.finish_reason is not None:
                        yield _sse(chunk({}, finish_reason(ev, n_calls), timings=srv.timings(job, ev.stats)))
                        if include_usage:
                            yield _sse({"id": rid, "object": "chat.completion.chunk", "created": created,
                                        "model": srv.model_name, "choices": [],
                                        "usage": _usage(len(ids), ev.stats)})

            return _sse_response(stream(), lambda e: _sse(e.openai_body()), done=True)

        pieces, final = await _collect_pieces(srv, job, request, parser)
        if final is None:
            return Response(status_code=499)
        text = "".join(p.text for p in pieces if p.kind == "text")
        reasoning = "".join(p.text for p in pieces if p.kind == "reasoning")
        calls = [p.call for p in pieces if p.kind == "tool_call"]
        message = {"role": "assistant", "content": text if text or not calls else None}
        if reasoning:
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = [_openai_call(c) for c in calls]
        return {"id": rid, "object": "chat.completion", "created": created, "model": srv.model_name,
                "choices": [{"index": 0, "message": message, "logprobs": None,
                             "finish_reason": finish_reason(final, len(calls))}],
                "usage": _usage(len(ids), final.stats), "timings": srv.timings(job, final.stats)}

    @app.post("/v1/completions")
    async def completions(request: Request):
        srv.check_auth(request)
        req = parse_body(await _read_body(request), CompletionRequest)
        srv.check_model(req.model)
        ids = await srv.encode_prompt(req.prompt)
        params = srv.sampling(len(ids), req.limit(), req.temperature, req.top_p, req.top_k, req.seed,
                              req.ignore_eos, param="prompt", extra=req.extra_sampling())
        job = srv.submit(request, ids, params, req.stop_tuple())
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

        def body(text: str, finish=None, **extra):
            return {"id": rid, "object": "text_completion", "created": created, "model": srv.model_name,
                    "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}], **extra}

        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)

            async def stream():
                async for ev in srv.events(job, request):
                    if ev.text:
                        yield _sse(body(ev.text))
                    if ev.finish_reason is not None:
                        yield _sse(body("", ev.finish_reason, timings=srv.timings(job, ev.stats)))
                        if include_usage:
                            yield _sse({"id": rid, "object": "text_completion", "created": created,
                                        "model": srv.model_name, "choices": [],
                                        "usage": _usage(len(ids), ev.stats)})

            return _sse_response(stream(), lambda e: _sse(e.openai_body()), done=True)

        text, final = await _collect(srv, job, request)
        if final is None:
            return Response(status_code=499)
        return body(text, final.finish_reason, usage=_usage(len(ids), final.stats), timings=srv.timings(job, final.stats))

    # -- Anthropic ---------------------------------------------------------------------------------------
    @app.post("/v1/messages")
    async def messages(request: Request):
        srv.check_auth(request)
        req = parse_body(await _read_body(request), MessagesRequest)
        srv.check_model(req.model)
        tools = req.openai_tools()
        chat = anthropic_messages(req.system, [m.model_dump() for m in req.messages])
        ids = await srv.encode_chat(chat, tools, req.template_kwargs())
        parser = srv.output_parser(ids, tools)
        params = srv.sampling(len(ids), req.max_tokens, req.temperature, req.top_p, req.top_k, None)
        stop = tuple(req.stop_sequences or ())
        job = srv.submit(request, ids, params, stop)
        mid = f"msg_{uuid.uuid4().hex}"
        out_ids: list[int] = []

        def stop_reason(ev, n_calls: int) -> tuple[str, str | None]:
            if ev.finish_reason == "length":
                return "max_tokens", None
            if stop:
                full = engine.tokenizer.decode(out_ids)        # the text before the engine cut the stop string
                hits = [(full.find(s), s) for s in stop if s and s in full]
                if hits:
                    return "stop_sequence", min(hits)[1]
            return ("tool_use" if n_calls else "end_turn"), None

        if req.stream:
            async def stream():
                blocks: list[str] = []              # the type of each block started so far
                is_open = False

                def close():
                    nonlocal is_open
                    if is_open:
                        is_open = False
                        return [_sse({"type": "content_block_stop", "index": len(blocks) - 1}, "content_block_stop")]
                    return []

                def start(block: dict):
                    nonlocal is_open
                    out = close()
                    blocks.append(block["type"])
                    is_open = True
                    return out + [_sse({"type": "content_block_start", "index": len(blocks) - 1,
                                        "content_block": block}, "content_block_start")]

                def delta(d: dict):
                    return _sse({"type": "content_block_delta", "index": len(blocks) - 1, "delta": d},
                                "content_block_delta")

                yield _sse({"type": "message_start", "message": {
                    "id": mid, "type": "message", "role": "assistant", "content": [], "model": srv.model_name,
                    "stop_reason": None, "stop_sequence": None,
                    "usage": {"input_tokens": len(ids), "output_tokens": 0}}}, "message_start")
                async for pieces, ev in srv.pieces(job, request, parser):
                    out_ids.extend(ev.token_ids)
                    for p in pieces:
                        if p.kind == "tool_call":
                            for line in start({"type": "tool_use", "id": p.call.id, "name": p.call.name,
                                               "input": {}}):
                                yield line
                            yield delta({"type": "input_json_delta", "partial_json": p.call.arguments_json})
                            for line in close():
                                yield line
                            continue
                        kind = "thinking" if p.kind == "reasoning" else "text"
                        if not is_open or blocks[-1] != kind:
                            block = ({"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking"
                                     else {"type": "text", "text": ""})
                            for line in start(block):
                                yield line
                        yield delta({"type": "thinking_delta", "thinking": p.text} if kind == "thinking"
                                    else {"type": "text_delta", "text": p.text})
                    if ev.finish_reason is not None:
                        if not blocks:                  # an empty answer is still one (empty) text block
                            for line in start({"type": "text", "text": ""}):
                                yield line
                        for line in close():
                            yield line
                        reason, seq = stop_reason(ev, blocks.count("tool_use"))
                        yield _sse({"type": "message_delta",
                                    "delta": {"stop_reason": reason, "stop_sequence": seq},
                                    "usage": {"output_tokens": _usage(len(ids), ev.stats)["completion_tokens"]},
                                    "timings": srv.timings(job, ev.stats)}, "message_delta")
                        yield _sse({"type": "message_stop"}, "message_stop")

            return _sse_response(stream(), lambda e: _sse(e.anthropic_body(), "error"))

        all_pieces, final = [], None
        try:
            async for pieces, ev in srv.pieces(job, request, parser):
                out_ids.extend(ev.token_ids)
                all_pieces += pieces
                final = ev if ev.finish_reason is not None else None
        except _ClientGone:
            return Response(status_code=499)
        content = []
        for p in merge_pieces(all_pieces):
            if p.kind == "tool_call":
                content.append({"type": "tool_use", "id": p.call.id, "name": p.call.name, "input": p.call.arguments})
            elif p.kind == "reasoning":
                content.append({"type": "thinking", "thinking": p.text, "signature": ""})
            else:
                content.append({"type": "text", "text": p.text})
        reason, seq = stop_reason(final, sum(c["type"] == "tool_use" for c in content))
        usage = _usage(len(ids), final.stats)
        return {"id": mid, "type": "message", "role": "assistant", "model": srv.model_name,
                "content": content or [{"type": "text", "text": ""}], "stop_reason": reason, "stop_sequence": seq,
                "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"]},
                "timings": srv.timings(job, final.stats)}

    # -- OpenAI Responses ------------------------------------------------------------------------------
    @app.post("/v1/responses")
    async def responses(request: Request):
        srv.check_auth(request)
        req = parse_body(await _read_body(request), ResponsesRequest)
        srv.check_model(req.model)
        tools = req.chat_tools()
        ids = await srv.encode_chat(req.messages(), tools, req.chat_template_kwargs)
        parser = srv.output_parser(ids, tools)
        params = srv.sampling(len(ids), req.max_output_tokens, req.temperature, req.top_p, None, None,
                              param="input")
        job = srv.submit(request, ids, params, ())
        b = ResponseBuilder(req, srv.model_name)

        def final_response(ev) -> dict:
            incomplete = "max_output_tokens" if ev.finish_reason == "length" else None
            usage = _usage(len(ids), ev.stats)
            return b.response("incomplete" if incomplete else "completed",
                              responses_usage(len(ids), usage["completion_tokens"]), incomplete,
                              srv.timings(job, ev.stats))

        if req.stream:
            async def stream():
                for e in (b.event("response.created", response=b.response("in_progress")),
                          b.event("response.in_progress", response=b.response("in_progress"))):
                    yield _sse(e, e["type"])
                async for pieces, ev in srv.pieces(job, request, parser):
                    for p in pieces:
                        for e in b.add(p):
                            yield _sse(e, e["type"])
                    if ev.finish_reason is not None:
                        for e in b.close():
                            yield _sse(e, e["type"])
                        body = final_response(ev)
                        e = b.event(f"response.{body['status']}", response=body)
                        yield _sse(e, e["type"])

            def on_error(e):
                err = b.event("error", code=e.code or e.type, message=e.message, param=e.param)
                return _sse(err, "error")

            return _sse_response(stream(), on_error)

        pieces, final = await _collect_pieces(srv, job, request, parser)
        if final is None:
            return Response(status_code=499)
        for p in pieces:
            b.add(p)
        b.close()
        return final_response(final)

    return app


async def _collect(srv: _Server, job: Job, request: Request):
    """(text, final event) of a whole generation; final is None when the client went away."""
    pieces, final = [], None
    try:
        async for ev in srv.events(job, request):
            pieces.append(ev.text)
            if ev.finish_reason is not None:
                final = ev
    except _ClientGone:
        return "", None
    return "".join(pieces), final


async def _collect_pieces(srv: _Server, job: Job, request: Request, parser: OutputParser):
    """(all output pieces, final event) of a whole generation; final is None when the client went away."""
    out, final = [], None
    try:
        async for pieces, ev in srv.pieces(job, request, parser):
            out += pieces
            if ev.finish_reason is not None:
                final = ev
    except _ClientGone:
        return [], None
    return merge_pieces(out), final


def _openai_call(call) -> dict:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments_json}}


def serve(engine, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None, max_queue: int = 16,
          model_name: str | None = None, default_params: SamplingParams | None = None,
          log_level: str = "info") -> None:
    """Serve `engine` over HTTP until interrupted (blocks)."""
    import uvicorn

    if api_key is None and host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s without --api-key: anyone who can reach this port can use the model", host)
    app = create_app(engine, api_key=api_key, max_queue=max_queue, model_name=model_name,
                     default_params=default_params)
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)


def _check_serve_args(args) -> None:
    """Refuse `dflash24 serve` flags that cannot serve."""
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be in 0..65535, got {args.port}")
    if args.max_queue < 0:
        raise ConfigError(f"--max-queue must be >= 0, got {args.max_queue}")


def run_serve(args, load_engine: Callable[[], Any]) -> None:
    """Run `dflash24 serve` with its parsed args (host, port, api_key, max_queue, model_name; sampling defaults
    from --temperature, --top-p, --top-k, --seed where the parser has them): the flags are checked first, then
    `load_engine()` loads the model (minutes for a large one), then the server runs."""
    _check_serve_args(args)
    engine = load_engine()
    serve(engine, host=args.host, port=args.port, api_key=args.api_key, max_queue=args.max_queue,
          model_name=args.model_name, default_params=sampling_defaults(args))


def sampling_defaults(args) -> SamplingParams:
    """SamplingParams from whichever of --temperature/--top-p/--top-k/--seed the parser has. (A request
    without max_tokens may use the rest of the context, as in the OpenAI API.)"""
    kw = {}
    for name in ("temperature", "top_p", "top_k", "seed") + EXTRA_SAMPLING:
        v = getattr(args, name, None)
        if v is not None:
            kw[name] = v
    return SamplingParams(**kw)
