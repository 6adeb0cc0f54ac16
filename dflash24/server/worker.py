"""One generation at a time: a FIFO of jobs consumed by a single worker thread that owns the engine.

The engine is synchronous and GPU-bound, so it runs in its own thread; request handlers on the asyncio
loop submit a `Job` and read its events from an asyncio queue that the worker feeds with
`loop.call_soon_threadsafe`. Waiting jobs are bounded (`max_queue`); a full queue is refused at once
(`QueueFull`, answered with 429) instead of piling up. Cancelling a job (its client disconnected) removes
it from the queue if it has not started, or makes the engine's `cancelled()` callback return True so the
running generation stops after the current step.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from ..config import SamplingParams

log = logging.getLogger("dflash24.server")


class QueueFull(Exception):
    pass


@dataclass
class Job:
    prompt_ids: list[int]
    params: SamplingParams
    stop: tuple[str, ...]
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)   # Event | BaseException | None (= end)
    cancel_flag: threading.Event = field(default_factory=threading.Event)
    submitted_at: float = field(default_factory=time.perf_counter)
    arrived_at: float | None = None     # when the HTTP request arrived (before tokenization); for TTFT
    started_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    cancel_seen: bool = False           # the engine asked `cancelled()` and was told to stop
    final: object = None                # the engine's last Event (finish_reason + stats), once finished
    error: BaseException | None = None

    def __post_init__(self):
        if self.arrived_at is None:
            self.arrived_at = self.submitted_at

    def cancelled(self) -> bool:
        """The callback the engine polls between steps."""
        if self.cancel_flag.is_set():
            self.cancel_seen = True
            return True
        return False


class GenerationWorker:
    def __init__(self, engine, max_queue: int = 16, on_finish: Callable[[Job], None] | None = None):
        """`on_finish(job)` is called in the worker thread when a job ends (finished, cancelled or failed)."""
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.engine, self.max_queue, self.on_finish = engine, max_queue, on_finish
        self._jobs: collections.deque[Job] = collections.deque()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.running: Job | None = None

    # -- called from the asyncio side ------------------------------------------------------------------
    @property
    def waiting(self) -> int:
        return len(self._jobs)

    @property
    def busy(self) -> bool:
        return self.running is not None

    def submit(self, job: Job) -> None:
        """Queue a job; raises QueueFull when `max_queue` jobs are already waiting for the GPU."""
        with self._cv:
            if self._closed:
                raise RuntimeError("the generation worker is shut down")
            if (self._jobs or self.running is not None) and len(self._jobs) >= self.max_queue:
                raise QueueFull(f"the server is busy: {len(self._jobs)} requests are waiting for the GPU "
                                f"(--max-queue {self.max_queue}); retry later")
            self._jobs.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="dflash24-generate", daemon=True)
                self._thread.start()
            self._cv.notify()

    def cancel(self, job: Job) -> None:
        """Stop a job: dropped from the queue if waiting, stopped at the next step if running."""
        job.cancel_flag.set()
        with self._cv:
            try:
                self._jobs.remove(job)
            except ValueError:
                pass

    def close(self, timeout: float = 5.0) -> None:
        with self._cv:
            self._closed = True
            for job in self._jobs:
                job.cancel_flag.set()
            self._jobs.clear()
            if self.running is not None:
                self.running.cancel_flag.set()
            self._cv.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    # -- worker thread ---------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._jobs and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                job = self._jobs.popleft()
                self.running = job
            try:
                if not job.cancel_flag.is_set():
                    self._generate(job)
            finally:
                job.finished_at = time.perf_counter()
                with self._cv:
                    self.running = None
                if self.on_finish is not None:
                    try:
                        self.on_finish(job)
                    except Exception:  # noqa: BLE001 -- bookkeeping must never stop the worker
                        log.exception("on_finish callback failed")
                self._deliver(job, None)

    def _generate(self, job: Job) -> None:
        job.started_at = time.perf_counter()
        try:
            for ev in self.engine.generate(job.prompt_ids, job.params, stop=job.stop, cancelled=job.cancelled):
                if job.first_token_at is None and (ev.token_ids or ev.finish_reason):
                    job.first_token_at = time.perf_counter()
                if ev.finish_reason is not None:
                    job.final = ev
                if not self._deliver(job, ev):
                    job.cancel_flag.set()           # nobody is listening any more
        except Exception as e:  # noqa: BLE001 -- reported to the request that caused it; keep serving
            log.exception("generation failed")
            job.error = e
            self._deliver(job, e)

    @staticmethod
    def _deliver(job: Job, item) -> bool:
        try:
            job.loop.call_soon_threadsafe(job.events.put_nowait, item)
            return True
        except RuntimeError:                        # the request's event loop is closed
            return False
