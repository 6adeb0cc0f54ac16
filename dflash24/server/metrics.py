"""Prometheus metrics in the text exposition format (version 0.0.4), written by hand: no dependency.

Counters, gauges and histograms with fixed buckets; everything is guarded by one lock because request
handlers (asyncio loop) and the middleware update them while /metrics renders.
"""
from __future__ import annotations

import math
import threading
from typing import Callable

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
ACCEPT_BUCKETS = (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0)
RATE_BUCKETS = (1, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000)


def _fmt(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v)) if not float(v).is_integer() else str(int(v))


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    esc = lambda s: str(s).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')  # noqa: E731
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in labels.items()) + "}"


class _Histogram:
    def __init__(self, buckets):
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.sum, self.count = 0.0, 0

    def observe(self, v: float, n: int = 1):
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += n
        self.sum += v * n
        self.count += n

    def lines(self, name: str) -> list[str]:
        out = [f'{name}_bucket{{le="{_fmt(b)}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        out.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        out.append(f"{name}_sum {_fmt(self.sum)}")
        out.append(f"{name}_count {self.count}")
        return out


class Metrics:
    PREFIX = "dflash24_"

    def __init__(self, gauges: dict[str, tuple[str, Callable[[], float]]] | None = None):
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, str, str], int] = {}          # (endpoint, method, status) -> n
        self.finished: dict[str, int] = {}                            # finish reason -> n
        self.counters = {name: 0.0 for name in self._COUNTERS}
        self.hists = {name: _Histogram(b) for name, (b, _) in self._HISTOGRAMS.items()}
        self.gauges = gauges or {}

    _COUNTERS = {
        "prompt_tokens_total": "Prompt tokens processed (prefill).",
        "completion_tokens_total": "Tokens generated.",
        "prefill_seconds_total": "Seconds spent in prefill.",
        "decode_seconds_total": "Seconds spent generating after prefill.",
        "verify_steps_total": "Target forward steps after prefill (decode steps in AR mode, verify steps in speculative modes).",
        "draft_steps_total": "Drafter steps (speculative modes only).",
        "draft_seconds_total": "Seconds spent drafting.",
        "verify_seconds_total": "Seconds spent in target verification.",
        "accepted_tokens_total": "Tokens committed by decode/verify steps (sum of the acceptance lengths).",
        "prefix_cache_hits_total": "Requests that reused cached tokens of the previous request (prefix cache).",
        "prefix_cache_reused_tokens_total": "Prompt tokens taken from the prefix cache (prefill tokens saved).",
        "prefill_tokens_total": "Prompt tokens actually prefilled (prompt tokens minus reused ones).",
    }
    _HISTOGRAMS = {
        "time_to_first_token_seconds": (LATENCY_BUCKETS, "Time from request arrival to the first generated token."),
        "request_latency_seconds": (LATENCY_BUCKETS, "Time from request arrival to the last generated token."),
        "queue_wait_seconds": (LATENCY_BUCKETS, "Time a request waited for the GPU."),
        "acceptance_length": (ACCEPT_BUCKETS, "Mean tokens committed per target step, one observation per request."),
        "decode_tokens_per_second": (RATE_BUCKETS, "Decode speed of each request (completion tokens / decode time)."),
    }

    def count_request(self, endpoint: str, method: str, status: int):
        with self._lock:
            key = (endpoint, method, str(status))
            self.requests[key] = self.requests.get(key, 0) + 1

    def observe_generation(self, stats, finish_reason: str | None, ttft_s: float | None,
                           latency_s: float | None, queue_s: float | None):
        """One finished generation (`stats` is the engine's Stats)."""
        with self._lock:
            reason = finish_reason or "error"
            self.finished[reason] = self.finished.get(reason, 0) + 1
            if stats is None:
                return
            c = self.counters
            c["prompt_tokens_total"] += stats.prompt_tokens
            c["completion_tokens_total"] += stats.completion_tokens
            c["prefill_seconds_total"] += stats.prefill_s
            c["decode_seconds_total"] += stats.decode_s
            c["verify_steps_total"] += stats.steps
            c["draft_steps_total"] += stats.steps if stats.mode != "ar" else 0
            c["draft_seconds_total"] += stats.draft_s
            c["verify_seconds_total"] += stats.verify_s
            c["accepted_tokens_total"] += sum(k * v for k, v in stats.accept_hist.items())
            reused = getattr(stats, "reused_tokens", 0)
            c["prefix_cache_hits_total"] += 1 if reused else 0
            c["prefix_cache_reused_tokens_total"] += reused
            c["prefill_tokens_total"] += stats.prompt_tokens - reused
            if ttft_s is not None:
                self.hists["time_to_first_token_seconds"].observe(ttft_s)
            if latency_s is not None:
                self.hists["request_latency_seconds"].observe(latency_s)
            if queue_s is not None:
                self.hists["queue_wait_seconds"].observe(queue_s)
            if stats.steps:
                self.hists["acceptance_length"].observe(stats.acceptance_length)
            if stats.decode_s > 0:
                self.hists["decode_tokens_per_second"].observe(stats.tokens_per_s)

    def render(self) -> str:
        p, out = self.PREFIX, []
        with self._lock:
            out += [f"# HELP {p}requests_total HTTP requests by endpoint and status code.",
                    f"# TYPE {p}requests_total counter"]
            for (endpoint, method, status), n in sorted(self.requests.items()):
                out.append(f"{p}requests_total{_labels({'endpoint': endpoint, 'method': method, 'status': status})} {n}")
            out += [f"# HELP {p}generations_total Finished generations by finish reason.",
                    f"# TYPE {p}generations_total counter"]
            for reason, n in sorted(self.finished.items()):
                out.append(f"{p}generations_total{_labels({'finish_reason': reason})} {n}")
            for name, help_ in self._COUNTERS.items():
                out += [f"# HELP {p}{name} {help_}", f"# TYPE {p}{name} counter", f"{p}{name} {_fmt(self.counters[name])}"]
            for name, (_, help_) in self._HISTOGRAMS.items():
                out += [f"# HELP {p}{name} {help_}", f"# TYPE {p}{name} histogram"]
                out += self.hists[name].lines(p + name)
        for name, (help_, fn) in self.gauges.items():
            out += [f"# HELP {p}{name} {help_}", f"# TYPE {p}{name} gauge", f"{p}{name} {_fmt(fn())}"]
        return "\n".join(out) + "\n"
