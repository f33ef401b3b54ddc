"""Continuous batching: the threads behind `Engine.submit`.

Each thread keeps a running `search.BeamSearch` per set of search options; between two of its
steps the queued sentences join it (up to `max_batch` sentences in flight a thread, a thread
taking no more than its share of what is queued and in flight), and each sentence leaves as soon
as it is done, its request answered once all of its sentences are. A thread with nothing in
flight waits for a request, then up to `window` seconds for more. Greedy requests (beam_size 1)
are decoded at once by the engine. The queue is bounded in sentences: past `max_queue`, `submit`
raises `QueueFull` and nothing queued is touched (`TooManySentences` where the sentences would
not fit even an empty queue).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from translate.decoding import pad_batch, to_translations
from translate.options import SearchOptions
from translate.protect import Protector, Terms
from translate.search import BeamSearch, Ensemble, max_output_lengths
from translate.textio import Translation

if TYPE_CHECKING:
    from translate.engine import Engine

log = logging.getLogger("translate")


class QueueFull(Exception):
    """An engine cannot take these sentences now (its queue is full, or it is stopping)."""


class TooManySentences(QueueFull):
    """Sentences that no queue of the engine's size can ever take at once: retrying cannot help."""


def check_room(queued: int, n: int, max_queue: int, gone: str | None) -> None:
    """QueueFull when n more sentences cannot be queued: `gone` (why none can), n above max_queue
    itself (TooManySentences), or a queue of `queued` sentences that n would take past max_queue."""
    if gone:
        raise QueueFull(gone)
    if n > max_queue:
        raise TooManySentences(f"{n} sentences in one request; at most {max_queue} (--max-queue)")
    if queued + n > max_queue:
        raise QueueFull(
            f"server busy: {queued} sentences queued and these {n} would pass --max-queue {max_queue}; retry later"
        )


@dataclass(eq=False)  # a job is itself, hashable: requests failing together are gathered in a dict
class Job:
    """One request's sentences and search options; `future` gets its list of n-best lists."""

    texts: list[str]
    search: SearchOptions
    future: Future = field(default_factory=Future)
    results: list[Translation] = field(default_factory=list)  # each sentence's n-best list, as it is done
    left: int = 0  # sentences still searching
    protector: Protector | None = None  # the request's masked spans
    glossary: Terms | None = None  # the request's terms


class Batcher:
    """`workers` decoding threads over one engine's models, each on the engine's share of torch's
    threads (torch's setting is per thread), batching continuously (see the module's docstring)."""

    def __init__(
        self, engine: Engine, *, workers: int, window: float, max_batch: int, max_queue: int,
        on_take: Callable[[int], object] | None = None,
    ) -> None:  # fmt: skip
        self.engine = engine
        self.on_take = on_take  # called with the number of sentences each time a thread takes some
        self.window, self.max_queue, self.max_batch = window, max_queue, max_batch
        self.jobs: deque[Job] = deque()
        self.queued = 0  # sentences waiting in self.jobs
        self.cond = threading.Condition()
        self.stopping = False
        self.hurrying = False  # set on SIGTERM (and by stop): no more waiting out batching windows
        self.in_flight = [0] * max(1, workers)  # sentences each thread is searching
        self.threads = [
            threading.Thread(target=self._run, args=(i,), name=f"translate-batcher-{i}", daemon=True)
            for i in range(max(1, workers))
        ]

    def start(self) -> None:
        for model in self.engine.models:
            model.eval()
        for thread in self.threads:
            thread.start()

    def hurry(self) -> None:
        """Start searching what is queued now rather than at the end of its batching window."""
        with self.cond:
            self.hurrying = True
            self.cond.notify_all()

    def stop(self) -> None:
        """Decode what is queued and in flight, then end the threads."""
        with self.cond:
            self.stopping = self.hurrying = True
            self.cond.notify_all()
        for thread in self.threads:
            if thread.is_alive():
                thread.join()

    def submit(self, texts: list[str], search: SearchOptions, glossary: Terms | None = None) -> Future:
        """Queue a request's sentences; QueueFull when the queue cannot take them."""
        job = Job(texts, search, glossary=glossary)
        with self.cond:
            gone = "the server is shutting down" if self.stopping else None
            check_room(self.queued, len(texts), self.max_queue, gone)
            self.jobs.append(job)
            self.queued += len(texts)
            self.cond.notify_all()
        job.future.add_done_callback(lambda future: future.cancelled() and self._forget(job))
        return job.future

    def _forget(self, job: Job) -> None:
        """Take a cancelled job out of the queue at once (if a thread has not just taken it)."""
        with self.cond:
            try:
                self.jobs.remove(job)
            except ValueError:
                return  # taken: the thread that took it drops it
            self.queued -= len(job.texts)
        if self.on_take is not None:
            self.on_take(len(job.texts))  # out of the queue, as if taken

    def _take(self, me: int) -> list[Job] | None:
        """The jobs thread `me` takes now (not cancelled ones): without waiting while it has
        sentences in flight; None once stopped with nothing queued or in flight."""
        with self.cond:
            if not self.in_flight[me]:
                self.cond.wait_for(lambda: self.jobs or self.stopping)
                if not self.jobs:
                    return None
                self.cond.wait_for(lambda: self.queued >= self.max_batch or self.hurrying, timeout=self.window)
            share = -(-(self.queued + sum(self.in_flight)) // len(self.in_flight))
            room = min(self.max_batch, share) - self.in_flight[me]
            jobs: list[Job] = []
            n = 0
            while self.jobs and (n + len(self.jobs[0].texts) <= room or not (n or self.in_flight[me])):
                n += len(self.jobs[0].texts)
                jobs.append(self.jobs.popleft())
            self.queued -= n
            self.in_flight[me] += n
        if n and self.on_take is not None:
            self.on_take(n)
        # a job whose request was cancelled is dropped; the others can no longer be cancelled
        taken = [job for job in jobs if job.future.set_running_or_notify_cancel()]
        self._done(me, sum(len(job.texts) for job in jobs if job not in taken))
        return taken

    def _done(self, me: int, sentences: int) -> None:
        if sentences:
            with self.cond:
                self.in_flight[me] -= sentences

    def _run(self, me: int) -> None:
        torch.set_num_threads(self.engine.worker_threads)
        searches: dict[SearchOptions, BeamSearch] = {}  # the running search of each search options
        while (jobs := self._take(me)) is not None:
            self._begin(me, jobs, searches)
            for search in list(searches):
                self._step(me, searches, search)

    def _begin(self, me: int, jobs: list[Job], searches: dict[SearchOptions, BeamSearch]) -> None:
        """Encode the jobs' sentences and have them join the running search of their options, those
        of one options at once (or decode a job at once: greedy, or no sentence to search)."""
        joining: dict[SearchOptions, list] = {}  # options -> [(job, its sources, their indices)]
        for job in jobs:
            try:
                if job.search.beam_size == 1:
                    self._answer(me, job, self.engine.translate_in_worker(job.texts, job.search, job.glossary))
                    continue
                job.protector, sources = self.engine.encode(job.texts, job.glossary)
            except Exception as e:  # the request fails with the reason; the others go on
                self._fail(me, [job], e)
                continue
            job.results = [[("", 0.0)] * job.search.nbest for _ in sources]
            todo = [i for i, ids in enumerate(sources) if ids is not None]
            job.left = len(todo)
            if todo:
                joining.setdefault(job.search, []).append((job, [sources[i] for i in todo], todo))
            else:
                self._answer(me, job, job.results)
        for o, group in joining.items():
            jobs = [job for job, _, _ in group]
            try:
                src = pad_batch([ids for _, sources, _ in group for ids in sources], self.engine.device)
                if o not in searches:
                    searches[o] = BeamSearch(Ensemble(self.engine.models), o.beam_size, o.length_penalty, o.nbest)
                with torch.inference_mode():
                    max_lens = max_output_lengths(src, o.max_len_a, o.max_len_b, searches[o].ensemble.max_output)
            except Exception as e:  # these requests fail with the reason; the others go on
                self._fail(me, jobs, e)
                continue
            try:
                searches[o].add(src, max_lens, [(job, i) for job, _, todo in group for i in todo])
            except Exception as e:  # the search may be half-joined: it ends, and every request in it fails
                self._fail(me, list(dict.fromkeys(jobs + [job for job, _ in searches.pop(o).keys])), e)

    def _step(self, me: int, searches: dict[SearchOptions, BeamSearch], options: SearchOptions) -> None:
        """One step of the search of these options; the sentences done go to their requests."""
        search = searches[options]
        jobs = list(dict.fromkeys(job for job, _ in search.keys))  # before the step, which drops the done ones
        try:
            done = search.step()
            translations = to_translations(self.engine.tokenizer, [hyps for _, hyps in done], options.nbest)
        except Exception as e:  # every request of this search fails (those it finished too); the others go on
            self._fail(me, jobs, e)
            del searches[options]
            return
        for ((job, i), _), translation in zip(done, translations, strict=True):
            job.results[i] = translation
            job.left -= 1
            if job.left == 0:
                self._answer(me, job, job.results)
        if not search.keys:
            del searches[options]

    def _answer(self, me: int, job: Job, translations: list[Translation]) -> None:
        if job.protector is not None:
            translations = list(job.protector.restore(translations))
        job.future.set_result(translations)
        self._done(me, len(job.texts))

    def _fail(self, me: int, jobs: list[Job], e: Exception) -> None:
        log.error(f"decoding {sum(len(job.texts) for job in jobs)} sentences failed: {type(e).__name__}: {e}")
        for job in jobs:
            if not job.future.done():
                job.future.set_exception(e)
                self._done(me, len(job.texts))
