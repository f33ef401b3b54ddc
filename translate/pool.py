"""`ProcessEngine`: the TranslationEngine of `translate serve` on a CPU with several workers.

Each worker is a decoding process holding its own `Engine` (the checkpoints loaded from the same
`EngineSpec`) and a one-thread continuous `Batcher`, on its share of the CPU threads: two decoding
threads of one process would wait for each other's Python at every step of their searches. This
process keeps the count of sentences queued (sent to a process and not yet taken into its search)
against the spec's max_queue, sends each request to the process with the fewest sentences
outstanding, and a reader thread per process answers the futures. A process that ends fails the
requests it held; the others go on. `open_engine` chooses between it and an in-process `Engine`.

The pipe protocol, parent to process: ("job", id, texts, options, glossary), ("cancel", id), ("hurry",), ("stop",); process to
parent: ("ready", defaults, max source pieces, the vocabulary's bytes, the protected classes, the default glossary) or ("failed", message) once loaded, then ("taken", n), ("done", id,
translations), ("failed", id, message), ("cancelled", id), and ("stopped",) last. ("cancel", id), sent when a
request's future is cancelled (its client gone), drops the request if its process has not taken it into a search.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import queue
import signal
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, InvalidStateError

import torch

from translate.batcher import Batcher, QueueFull, check_room
from translate.decoding import decode_workers, share
from translate.engine import Engine, EngineSpec, TranslationEngine
from translate.errors import UserError
from translate.hardware import resolve_device
from translate.inference import keep_freed_memory
from translate.options import SearchOptions
from translate.protect import Terms
from translate.textio import Translation
from translate.tokenizer import Tokenizer

log = logging.getLogger("translate")


class DecodingFailed(Exception):
    """A decoding process's report of a failure (its message names the error)."""


def resolve_spec(spec: EngineSpec) -> EngineSpec:
    """The spec with its device, workers and threads chosen (auto made concrete)."""
    device = resolve_device(spec.device)
    workers = spec.workers or decode_workers(device)
    threads = spec.threads or torch.get_num_threads()
    return dataclasses.replace(spec, device=str(device), workers=workers, threads=threads)


def open_engine(spec: EngineSpec) -> TranslationEngine:
    """The engine `translate serve` decodes with: on a CPU with several workers a ProcessEngine,
    else an Engine whose workers are threads (a GPU's kernels run while Python waits)."""
    spec = resolve_spec(spec)
    if resolve_device(spec.device).type == "cpu" and spec.workers > 1:
        return ProcessEngine(spec)
    return Engine.load(spec)


class ProcessEngine:
    """spec.workers decoding processes behind one TranslationEngine (see the module's docstring)."""

    def __init__(self, spec: EngineSpec) -> None:
        context = multiprocessing.get_context("spawn")  # a fork of a process with torch's threads may hang
        self.max_queue, self.stopping, self.lock = spec.limits.max_queue, False, threading.Lock()
        self.conns, self.procs = [], []
        for i in range(spec.workers):
            parent, child = context.Pipe()
            proc = context.Process(
                target=decoding_process, args=(child, spec), name=f"translate-decoder-{i}", daemon=True
            )
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)
        replies = [self._receive(conn) for conn in self.conns]
        if failed := [reply[1] for reply in replies if reply[0] != "ready"]:
            self.stop()
            raise UserError(failed[0])
        self.defaults: SearchOptions = replies[0][1]  # the search defaults, as every process has them
        # what segment.py needs to cut a sentence too long for the models, as `decode` does
        self.max_pieces: int = replies[0][2]
        self.tokenizer = Tokenizer(replies[0][3])
        self.protect, self.glossary = replies[0][4], replies[0][5]  # the spans it protects, its default terms
        self.outstanding = [0] * spec.workers  # sentences sent to each process and not answered
        self.waiting = [0] * spec.workers  # of those, the ones not yet taken into its search
        self.futures: dict[int, tuple[Future, int, int]] = {}  # request id -> (future, process, sentences)
        self.next_id = 0
        self.alive = set(range(spec.workers))
        self.readers = [threading.Thread(target=self._read, args=(i,), daemon=True) for i in range(spec.workers)]

    @staticmethod
    def _receive(conn) -> tuple:
        try:
            return conn.recv()
        except (EOFError, OSError):
            return ("failed", "a decoding process ended while loading the model")

    @property
    def queued(self) -> int:
        return sum(self.waiting)

    @property
    def unavailable(self) -> str | None:  # read under self.lock by submit
        return "the server is shutting down" if self.stopping else None if self.alive else "no decoding process left"

    def start(self) -> None:
        for reader in self.readers:
            if not reader.is_alive():
                reader.start()

    def translate(
        self, lines: Iterable[str], options: SearchOptions | None = None, *, glossary: Terms | None = None
    ) -> Iterator[Translation]:
        """The lines in requests of up to max_queue sentences, one after the other."""
        self.start()
        lines = list(lines)
        for i in range(0, len(lines), self.max_queue):
            yield from self.submit(lines[i : i + self.max_queue], options, glossary).result()

    def submit(self, texts: list[str], options: SearchOptions | None = None, glossary: Terms | None = None) -> Future:
        """Send sentences to a process; QueueFull when the queue cannot take them."""
        options = (options or self.defaults).check()
        if isinstance(texts, (str, bytes)):
            raise TypeError(f"texts must be a list of str, not one {type(texts).__name__}")
        future: Future = Future()  # cancelled (its client gone): the process drops what it has not taken
        with self.lock:
            check_room(self.queued, len(texts), self.max_queue, self.unavailable)
            while self.alive:
                worker = min(self.alive, key=lambda i: (self.outstanding[i], i))
                try:
                    self.conns[worker].send(("job", self.next_id + 1, texts, options, glossary))
                    break
                except OSError:  # it has just ended (its reader fails what it held)
                    self.alive.discard(worker)
            else:
                raise QueueFull("no decoding process left")
            self.next_id += 1
            self.futures[self.next_id] = (future, worker, len(texts))
            self.outstanding[worker] += len(texts)
            self.waiting[worker] += len(texts)
            id = self.next_id
        future.add_done_callback(lambda f: f.cancelled() and self._send(worker, ("cancel", id)))
        return future

    def _send(self, worker: int, message: tuple) -> None:
        with self.lock:
            try:
                self.conns[worker].send(message)
            except OSError:
                pass  # it has ended: its reader fails what it held

    def _read(self, worker: int) -> None:
        """Answer the futures of one process's replies until it stops (or ends: its requests fail)."""
        for reply in messages(self.conns[worker], until="stopped"):
            with self.lock:
                if reply[0] == "taken":
                    self.waiting[worker] -= reply[1]
                    continue
                future, _, n = self.futures.pop(reply[1])
                self.outstanding[worker] -= n
            try:
                if reply[0] == "done":
                    future.set_result(reply[2])
                elif reply[0] == "failed":
                    future.set_exception(DecodingFailed(reply[2]))
            except InvalidStateError:  # cancelled after its process had taken it: the answer goes nowhere
                pass
        with self.lock:
            self.alive.discard(worker)
            lost = [id for id, (_, w, _) in self.futures.items() if w == worker]
            lost = [self.futures.pop(id)[0] for id in lost]
            self.outstanding[worker] = self.waiting[worker] = 0
        if not self.stopping:
            log.error(f"decoding process {worker} ended; {len(lost)} requests fail")
        for future in lost:
            try:
                future.set_exception(DecodingFailed("the decoding process ended"))
            except InvalidStateError:  # cancelled meanwhile: no one waits for it
                pass

    def hurry(self) -> None:
        """Have every process start searching what it holds without waiting out its batching window."""
        self._tell(("hurry",))

    def _tell(self, message: tuple) -> None:
        with self.lock:
            for conn in self.conns:
                try:
                    conn.send(message)
                except OSError:
                    pass  # already gone

    def stop(self) -> None:
        """Have every process decode what it holds and end."""
        with self.lock:
            self.stopping = True
        self._tell(("stop",))
        for reader in getattr(self, "readers", []):
            if reader.is_alive():
                reader.join()
        for proc in self.procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()


def messages(conn, until: str) -> Iterator[tuple]:
    """The messages from one end of a pipe until one of kind `until` or the other end is gone."""
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == until:
            return
        yield message


def decoding_process(conn, spec: EngineSpec) -> None:
    """One decoding process: load an Engine from `spec`, then decode the jobs sent through `conn`
    with a one-thread Batcher until told to stop (or the parent is gone). Being a process of its
    own, it sets its process-wide state itself: signals, torch's threads (its share), malloc."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent drains us
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    keep_freed_memory()
    torch.set_num_threads(share(spec.threads or torch.get_num_threads(), spec.workers))
    # One thread writes to the parent, in order: no other thread of this process ever waits on the
    # pipe, so this one keeps reading what the parent sends (a parent blocked writing a large job
    # while its reader waits would otherwise wait for us as we wait for it).
    outbox: queue.SimpleQueue = queue.SimpleQueue()

    def post() -> None:
        while (message := outbox.get()) is not None:
            try:
                conn.send(message)
            except OSError:
                pass  # the parent is gone

    poster = threading.Thread(target=post, name="translate-decoder-replies", daemon=True)
    poster.start()

    def send(message: tuple) -> None:
        outbox.put(message)

    def finish() -> None:  # what was sent reaches the parent before the process ends
        outbox.put(None)
        poster.join()

    try:
        engine = Engine.load(spec)
    except UserError as e:
        send(("failed", str(e)))
        return finish()
    except Exception as e:
        send(("failed", f"loading {', '.join(spec.checkpoints)} failed: {type(e).__name__}: {e}"))
        return finish()
    limits = spec.limits
    batcher = Batcher(
        engine, workers=1, window=limits.window, max_batch=limits.max_batch, max_queue=1 << 62,
        on_take=lambda n: send(("taken", n)),
    )  # fmt: skip
    batcher.start()
    send(("ready", engine.defaults, engine.max_pieces, engine.tokenizer.model_bytes, engine.protect, engine.glossary))

    jobs: dict[int, Future] = {}  # the batcher's future of each request not yet answered

    def answer(id: int, future: Future) -> None:
        jobs.pop(id, None)
        if future.cancelled():  # dropped before its search began
            send(("cancelled", id))
            return
        e = future.exception()
        send(("done", id, future.result()) if e is None else ("failed", id, f"{type(e).__name__}: {e}"))

    for message in messages(conn, until="stop"):
        if message[0] == "hurry":
            batcher.hurry()
            continue
        if message[0] == "cancel":
            if (job := jobs.get(message[1])) is not None:
                job.cancel()  # only if not yet taken into a search
            continue
        _, id, texts, options, glossary = message
        jobs[id] = batcher.submit(texts, options, glossary)
        jobs[id].add_done_callback(lambda future, id=id: answer(id, future))
    batcher.stop()
    send(("stopped",))
    finish()
