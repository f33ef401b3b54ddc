"""`translate serve`: the model loaded once behind an HTTP JSON API (Starlette on uvicorn).

    POST /translate  {"text": "..."} or {"texts": [...]}, optional beam_size, length_penalty, nbest
                     -> {"translation": "..."} or {"translations": [...]} in input order; with
                     nbest, a list per sentence (best first) and "scores" of the same shape
    GET  /health     -> {"status": "ok", ...}

Requests are parsed and checked on the event loop, then queued for the decoding workers
(--workers: on a CPU, processes, two where torch has 2+ threads, each on its share of them, with
its own copy of the models (`ProcessBatcher`), as two threads of one process would wait for each
other's Python at every step; on a GPU, threads). Each worker batches continuously (`Batcher`):
its sentences of one set of search options are one running beam search (`search.BeamSearch`,
the search of `translate decode`), queued sentences join it between two steps (its share of the
work, at most --max-batch in flight), and each sentence leaves it as soon as it is done, its
request answered once all of its sentences are. An idle worker waits a short window
(--batch-window-ms) for more requests before it starts. The queue is bounded in sentences: past
--max-queue a request gets 503 at once; a body over --max-request-bytes or more than
--max-texts sentences gets 413, a malformed one 400, each with one line of JSON
`{"error": "..."}`, and none of them touches the requests already queued. SIGTERM (or Ctrl-C)
stops accepting connections, answers every request already accepted (queued ones start without
waiting out their window), and exits 0 (130 for Ctrl-C).
Each request is logged with its size and latency; its text only with --log-text.

About 730 lines: the request checks, the batchers and the HTTP application are one server and
change together; each piece is small and tested through a real socket (tests/test_serve.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from translate.config import SearchOptions
from translate.errors import UserError
from translate.page import index

log = logging.getLogger("translate")

FIELDS = ("text", "texts", "beam_size", "length_penalty", "nbest")
MAX_BEAM = 64


class RequestError(Exception):
    """A request the server refuses: its HTTP status and a one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Job:
    """One request's sentences and search options; `future` gets its list of n-best lists."""

    texts: list[str]
    search: SearchOptions
    future: Future = field(default_factory=Future)
    results: list = field(default_factory=list)  # each sentence's n-best list, as it is done
    left: int = 0  # sentences still searching
    protector: object = None  # the request's masked spans (translate.protect.Protector)


def check_room(queued: int, n: int, max_queue: int, gone: str | None) -> None:
    """RequestError 503 when the server cannot take n more sentences: `gone` (why it takes none),
    or a queue of `queued` sentences that n would take past max_queue."""
    if gone:
        raise RequestError(503, gone)
    if queued + n > max_queue:
        raise RequestError(503, f"server busy: {queued} sentences queued (--max-queue {max_queue}); retry later")


class Batcher:
    """The threads that decode (`workers` of them, each with an equal share of torch's threads),
    with continuous batching: each thread keeps a running `BeamSearch` per search options, and
    between two of its steps the queued sentences join it (up to `max_batch` sentences in flight
    a thread, a thread taking no more than its share of what is queued and in flight), while each
    sentence leaves as soon as it is done and its request is answered once all of its sentences
    are. A thread with nothing in flight waits for a request, then up to `window` seconds for
    more. Greedy requests (beam_size 1) are decoded at once, in one `translate_lines` call."""

    def __init__(
        self, models, tokenizer, batch_tokens: int, *, workers: int, window: float, max_queue: int, max_batch: int,
        protect: Sequence[str] = (), on_take=None,
    ) -> None:  # fmt: skip
        self.models, self.tokenizer, self.batch_tokens = models, tokenizer, batch_tokens
        self.on_take = on_take  # called with the number of sentences each time a thread takes some
        self.protect = protect  # span classes copied verbatim (the checkpoint's decode.protect)
        self.window, self.max_queue, self.max_batch = window, max_queue, max_batch
        self.max_pieces = min(m.cfg.max_positions for m in models) - 1
        for model in models:
            model.eval()
        self.jobs: deque[Job] = deque()
        self.queued = 0  # sentences waiting in self.jobs
        self.cond = threading.Condition()
        self.stopping = False
        self.hurrying = False  # set on SIGTERM (and by stop): no more waiting out batching windows
        import torch

        self.intra_op = max(1, torch.get_num_threads() // max(1, workers))
        self.in_flight = [0] * max(1, workers)  # sentences each thread is searching
        self.threads = [
            threading.Thread(target=self._run, args=(i,), name=f"translate-batcher-{i}", daemon=True)
            for i in range(max(1, workers))
        ]

    def start(self) -> None:
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
            thread.join()

    def submit(self, texts: list[str], search: SearchOptions) -> Future:
        """Queue a request's sentences; RequestError 503 when the queue cannot take them."""
        job = Job(texts, search)
        with self.cond:
            check_room(
                self.queued, len(texts), self.max_queue, "the server is shutting down" if self.stopping else None
            )
            self.jobs.append(job)
            self.queued += len(texts)
            self.cond.notify_all()
        return job.future

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
        import torch

        torch.set_num_threads(self.intra_op)  # this thread's share (torch's setting is per thread)
        searches: dict[SearchOptions, object] = {}  # the running BeamSearch of each search options
        while (jobs := self._take(me)) is not None:
            self._begin(me, jobs, searches)
            for search in list(searches):
                self._step(me, searches, search)

    def _begin(self, me: int, jobs: list[Job], searches: dict) -> None:
        """Encode the jobs' sentences and have them join the running search of their options, those
        of one options at once (or decode a job at once: greedy, or no sentence to search)."""
        import torch

        from translate.decoding import encode_sources, pad_batch, translate_lines
        from translate.protect import Protector
        from translate.search import BeamSearch, Ensemble, max_output_lengths

        joining: dict[SearchOptions, list] = {}  # options -> [(job, its sources, their indices)]
        for job in jobs:
            try:
                if job.search.beam_size == 1:
                    translations = list(
                        translate_lines(
                            self.models, self.tokenizer, job.texts, job.search, batch_tokens=self.batch_tokens,
                            workers=1, protect=self.protect,
                        )
                    )  # fmt: skip
                    self._answer(me, job, translations)
                    continue
                job.protector = Protector(self.protect, self.tokenizer)
                sources = encode_sources(self.tokenizer, list(job.protector.mask_lines(job.texts)), self.max_pieces)
            except Exception as e:  # the request gets a 500 with the reason; the server goes on
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
            try:
                rows = [ids for _, sources, _ in group for ids in sources]
                src = pad_batch(rows, next(self.models[0].parameters()).device)
                if o not in searches:
                    searches[o] = BeamSearch(Ensemble(self.models), o.beam_size, o.length_penalty, o.nbest)
                with torch.inference_mode():
                    max_lens = max_output_lengths(src, o.max_len_a, o.max_len_b)
                searches[o].add(src, max_lens, [(job, i) for job, _, todo in group for i in todo])
            except Exception as e:  # these requests get a 500 with the reason; the server goes on
                self._fail(me, [job for job, _, _ in group], e)

    def _step(self, me: int, searches: dict, options: SearchOptions) -> None:
        """One step of the search of these options; the sentences done go to their requests."""
        from translate.decoding import to_translations

        search = searches[options]
        try:
            done = search.step()
            translations = to_translations(self.tokenizer, [hyps for _, hyps in done], options.nbest)
        except Exception as e:  # every request of this search gets a 500; the server goes on
            self._fail(me, list(dict.fromkeys(job for job, _ in search.keys)), e)
            del searches[options]
            return
        for ((job, i), _), translation in zip(done, translations, strict=True):
            job.results[i] = translation
            job.left -= 1
            if job.left == 0:
                self._answer(me, job, job.results)
        if not search.keys:
            del searches[options]

    def _answer(self, me: int, job: Job, translations: list) -> None:
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


class DecodingFailed(Exception):
    """A decoding process's report of a failure (its message names the error)."""


class ProcessBatcher:
    """The same service as `Batcher` from `workers` decoding processes (on a CPU), each with the
    models and a one-thread Batcher of its own, so that no two decoding threads share a GIL (two
    threads of one process wait for each other's Python at every step of their searches). This
    process keeps the count of sentences queued (sent to a process and not yet taken into its
    search) against --max-queue, and sends each request to the process with the fewest sentences
    outstanding; a reader thread per process answers the futures."""

    def __init__(self, load: dict, *, workers: int, threads: int, max_queue: int) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")  # a fork of a process with torch's threads may hang
        self.max_queue, self.stopping, self.lock = max_queue, False, threading.Lock()
        self.conns, self.procs = [], []
        for i in range(workers):
            parent, child = context.Pipe()
            proc = context.Process(
                target=decoding_process, args=(child, load, threads), name=f"translate-decoder-{i}", daemon=True
            )
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)
        replies = [self._receive(conn) for conn in self.conns]
        if failed := [reply[1] for reply in replies if reply[0] != "ready"]:
            self.stop()
            raise UserError(failed[0])
        self.defaults = replies[0][1]  # the checkpoint's search options, as every process has them
        self.outstanding = [0] * workers  # sentences sent to each process and not answered
        self.waiting = [0] * workers  # of those, the ones not yet taken into its search
        self.futures: dict[int, tuple[Future, int, int]] = {}  # request id -> (future, process, sentences)
        self.next_id = 0
        self.alive = set(range(workers))
        self.readers = [threading.Thread(target=self._read, args=(i,), daemon=True) for i in range(workers)]

    @staticmethod
    def _receive(conn) -> tuple:
        try:
            return conn.recv()
        except (EOFError, OSError):
            return ("failed", "a decoding process ended while loading the model")

    @property
    def queued(self) -> int:
        return sum(self.waiting)

    def start(self) -> None:
        for reader in self.readers:
            reader.start()

    def submit(self, texts: list[str], search: SearchOptions) -> Future:
        """Send a request's sentences to a process; RequestError 503 when the queue cannot take them."""
        future: Future = Future()
        future.set_running_or_notify_cancel()  # it is decoded even if its client goes: not cancellable
        with self.lock:
            gone = (
                "the server is shutting down" if self.stopping else None if self.alive else "no decoding process left"
            )
            check_room(self.queued, len(texts), self.max_queue, gone)
            while self.alive:
                worker = min(self.alive, key=lambda i: (self.outstanding[i], i))
                try:
                    self.conns[worker].send(("job", self.next_id + 1, texts, search))
                    break
                except OSError:  # it has just ended (its reader fails what it held)
                    self.alive.discard(worker)
            else:
                raise RequestError(503, "no decoding process left")
            self.next_id += 1
            self.futures[self.next_id] = (future, worker, len(texts))
            self.outstanding[worker] += len(texts)
            self.waiting[worker] += len(texts)
        return future

    def _read(self, worker: int) -> None:
        """Answer the futures of one process's replies until it stops (or ends: its requests fail)."""
        for reply in messages(self.conns[worker], until="stopped"):
            with self.lock:
                if reply[0] == "taken":
                    self.waiting[worker] -= reply[1]
                    continue
                future, _, n = self.futures.pop(reply[1])
                self.outstanding[worker] -= n
            if reply[0] == "done":
                future.set_result(reply[2])
            else:
                future.set_exception(DecodingFailed(reply[2]))
        with self.lock:
            self.alive.discard(worker)
            lost = [id for id, (_, w, _) in self.futures.items() if w == worker]
            lost = [self.futures.pop(id)[0] for id in lost]
            self.outstanding[worker] = self.waiting[worker] = 0
        if not self.stopping:
            log.error(f"decoding process {worker} ended; {len(lost)} requests fail")
        for future in lost:
            future.set_exception(DecodingFailed("the decoding process ended"))

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


def messages(conn, until: str):
    """The messages from one end of a pipe until one of kind `until` or the other end is gone."""
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == until:
            return
        yield message


def decoding_load(
    checkpoints: Sequence[str | Path], *, device: str, workers: int, window_ms: float = 5.0, dtype: str = "auto",
    quantize: str | None = None, beam: int | None = None, length_penalty: float | None = None,
    batch_tokens: int | None = None, protect: bool = True, max_batch: int = 256,
) -> dict:  # fmt: skip
    """What each decoding worker loads and how it batches, from serve's options (the defaults are serve's)."""
    return {
        "checkpoints": [str(c) for c in checkpoints], "device": device, "dtype": dtype, "quantize": quantize,
        "beam": beam, "length_penalty": length_penalty, "batch_tokens": batch_tokens, "protect": protect,
        "workers": workers, "window": window_ms / 1000, "max_batch": max_batch,
    }  # fmt: skip


def load_for_serving(load: dict, workers: int):
    """(models, tokenizer, search defaults, batch tokens of one decoding thread, protected span
    classes, the checkpoint's decode defaults for /health) from serve's options."""
    from translate.hardware import resolve_device
    from translate.inference import load_models
    from translate.translator import decode_options

    dev = resolve_device(load["device"])
    models, tokenizer, cfg = load_models(load["checkpoints"], dev, dtype=load["dtype"], quantize=load["quantize"])
    defaults, batch_tokens = decode_options(cfg, load["beam"], load["length_penalty"], load["batch_tokens"])
    protect = cfg.decode.protect if load["protect"] else ()
    return models, tokenizer, defaults, max(1, batch_tokens // workers), protect


def decoding_process(conn, load: dict, threads: int) -> None:
    """One decoding process of a ProcessBatcher: load the models, then decode the requests sent
    through `conn` with a one-thread Batcher until told to stop (or the server is gone)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the server drains us
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    import torch

    from translate.inference import keep_freed_memory

    keep_freed_memory()
    torch.set_num_threads(threads)
    sending = threading.Lock()

    def send(message: tuple) -> None:
        with sending:
            try:
                conn.send(message)
            except OSError:
                pass  # the server is gone

    try:
        models, tokenizer, defaults, batch_tokens, protect = load_for_serving(load, load["workers"])
    except UserError as e:
        send(("failed", str(e)))
        return
    except Exception as e:
        send(("failed", f"loading {', '.join(map(str, load['checkpoints']))} failed: {type(e).__name__}: {e}"))
        return
    batcher = Batcher(
        models, tokenizer, batch_tokens, workers=1, window=load["window"], max_queue=1 << 62,
        max_batch=load["max_batch"], protect=protect, on_take=lambda n: send(("taken", n)),
    )  # fmt: skip
    batcher.start()
    send(("ready", defaults))

    def answer(id: int, future: Future) -> None:
        e = future.exception()
        send(("done", id, future.result()) if e is None else ("failed", id, f"{type(e).__name__}: {e}"))

    for message in messages(conn, until="stop"):
        if message[0] == "hurry":
            batcher.hurry()
            continue
        _, id, texts, search = message
        batcher.submit(texts, search).add_done_callback(lambda future, id=id: answer(id, future))
    batcher.stop()
    send(("stopped",))


def parse_request(body: bytes, defaults: SearchOptions, max_texts: int) -> tuple[list[str], bool, SearchOptions, bool]:
    """A /translate body -> (sentences, whether one "text" was given, search options, whether
    nbest was given); RequestError 400 (malformed) or 413 (too many sentences)."""
    if not body.strip():
        raise RequestError(400, 'empty body: send a JSON object such as {"text": "Hello."}')
    try:
        request = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RequestError(400, f"the body is not valid JSON: {e}") from None
    if not isinstance(request, dict):
        raise RequestError(400, f'the body must be a JSON object such as {{"text": "Hello."}}, not {_kind(request)}')
    if unknown := [key for key in request if key not in FIELDS]:
        raise RequestError(400, f"unknown field {unknown[0]!r} (known: {', '.join(FIELDS)})")
    if ("text" in request) == ("texts" in request):
        raise RequestError(400, 'give either "text" (a string) or "texts" (a list of strings)')
    single = "text" in request
    if single:
        if not isinstance(request["text"], str):
            raise RequestError(400, f'"text" must be a string, not {_kind(request["text"])}')
        texts = [request["text"]]
    else:
        texts = request["texts"]
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise RequestError(400, '"texts" must be a list of strings')
        if len(texts) > max_texts:
            raise RequestError(413, f"{len(texts)} sentences in one request; at most {max_texts} (--max-texts)")
    beam_size = request.get("beam_size", defaults.beam_size)
    if not _is_int(beam_size) or not 1 <= beam_size <= MAX_BEAM:
        raise RequestError(400, f'"beam_size" must be an integer from 1 to {MAX_BEAM}, got {json.dumps(beam_size)}')
    length_penalty = request.get("length_penalty", defaults.length_penalty)
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)) or not length_penalty >= 0:
        raise RequestError(400, f'"length_penalty" must be a number >= 0, got {json.dumps(length_penalty)}')
    nbest = request.get("nbest", 1)
    if not _is_int(nbest) or not 1 <= nbest <= beam_size:
        raise RequestError(
            400, f'"nbest" must be an integer from 1 to the beam size ({beam_size}), got {json.dumps(nbest)}'
        )
    search = dataclasses.replace(defaults, beam_size=beam_size, length_penalty=float(length_penalty), nbest=nbest)
    return texts, single, search, "nbest" in request


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


async def read_body(request, max_request_bytes: int) -> bytes:
    """The request's body; RequestError 413 as soon as it is known to be over the limit."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_request_bytes:
        raise RequestError(413, f"the body has {int(length)} bytes; at most {max_request_bytes} (--max-request-bytes)")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_request_bytes:
            raise RequestError(413, f"the body is over {max_request_bytes} bytes (--max-request-bytes)")
    return bytes(body)


def answer(translations: list, single: bool, with_nbest: bool) -> dict:
    """The JSON answer: one translation or a list, with nbest a list per sentence and their scores."""
    if with_nbest:
        out = [[text for text, _ in nbest] for nbest in translations]
        scores = [[round(score, 4) for _, score in nbest] for nbest in translations]
        return {"translation": out[0], "scores": scores[0]} if single else {"translations": out, "scores": scores}
    out = [nbest[0][0] for nbest in translations]
    return {"translation": out[0]} if single else {"translations": out}


def create_app(
    batcher: Batcher,
    defaults: SearchOptions,
    *,
    max_request_bytes: int,
    max_texts: int,
    log_text: bool = False,
    info: dict | None = None,
):
    """The Starlette application: /translate and /health, every error as one line of JSON."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    answered = 0

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    async def translate(request) -> JSONResponse:
        nonlocal answered
        start = time.perf_counter()
        size, status, texts = 0, 200, []
        try:
            body = await read_body(request, max_request_bytes)
            size = len(body)
            texts, single, search, with_nbest = parse_request(body, defaults, max_texts)
            translations = await asyncio.wrap_future(batcher.submit(texts, search))
        except RequestError as e:
            status, response = e.status, error(e.status, str(e))
        except Exception as e:  # a fault in decoding: reported, the server goes on
            status, response = 500, error(500, str(e) if isinstance(e, DecodingFailed) else f"{type(e).__name__}: {e}")
        else:
            response = JSONResponse(answer(translations, single, with_nbest))
            answered += 1
        line = f"POST /translate {status} {len(texts)} sentences {size} bytes {1000 * (time.perf_counter() - start):.1f} ms"
        if log_text and texts:
            line += f" text={json.dumps(texts, ensure_ascii=False)}"
        log.info(line)
        return response

    async def health(request) -> JSONResponse:
        return JSONResponse({"status": "ok", "queued": batcher.queued, "answered": answered, **(info or {})})

    async def http_error(request, exc: HTTPException) -> JSONResponse:
        return error(exc.status_code, exc.detail)

    app = Starlette(
        routes=[
            Route("/translate", translate, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/", index, methods=["GET"]),
        ],
        exception_handlers={HTTPException: http_error},
    )
    app.state.answered = lambda: answered
    return app


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: any free port); UserError if it cannot be had."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.create_server((host, port), family=family, backlog=1024)
        # Connections accepted from it inherit its protocol number. Named IPPROTO_TCP (create_server
        # leaves 0), asyncio sets TCP_NODELAY on each; otherwise a response's body, written after
        # its headers, waits for the client's delayed ACK of them (Nagle): ~40 ms a request.
        return socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, fileno=sock.detach())
    except OSError as e:
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def check_limits(
    batch_window_ms: float, max_batch: int, max_queue: int, max_texts: int, max_request_bytes: int
) -> None:
    """The server's own options, each in its range (UserError naming the option otherwise)."""
    for option, value, low in [
        ("--batch-window-ms", batch_window_ms, 0),
        ("--max-batch", max_batch, 1),
        ("--max-queue", max_queue, 1),
        ("--max-texts", max_texts, 1),
        ("--max-request-bytes", max_request_bytes, 1),
    ]:
        if not value >= low or not math.isfinite(value):
            raise UserError(f"{option} must be at least {low}, got {value}")
    if max_texts > max_queue:
        raise UserError(f"--max-texts ({max_texts}) must not exceed --max-queue ({max_queue})")


def serve(
    checkpoints: Sequence[str | Path],
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    beam: int | None = None,
    length_penalty: float | None = None,
    batch_tokens: int | None = None,
    workers: int = 0,
    device: str = "auto",
    dtype: str = "auto",
    quantize: str | None = None,
    batch_window_ms: float = 5.0,
    max_batch: int = 256,
    max_queue: int = 1024,
    max_texts: int = 256,
    max_request_bytes: int = 1 << 20,
    log_text: bool = False,
    protect: bool = True,
) -> int:
    """`translate serve`: load the checkpoints once and answer HTTP until SIGTERM or Ctrl-C;
    returns the number of /translate requests answered."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise UserError("translate serve needs starlette and uvicorn: pip install 'translate[serve]'") from None
    from translate.decoding import check_workers, decode_workers
    from translate.hardware import resolve_device

    check_limits(batch_window_ms, max_batch, max_queue, max_texts, max_request_bytes)
    check_workers(workers)
    if beam is not None and not 1 <= beam <= MAX_BEAM:
        raise UserError(f"--beam must be from 1 to {MAX_BEAM}, got {beam}")
    sock = listen(host, port)
    dev = resolve_device(device)
    workers = workers or decode_workers(dev)
    load = decoding_load(
        checkpoints, device=str(dev), workers=workers, window_ms=batch_window_ms, dtype=dtype, quantize=quantize,
        beam=beam, length_penalty=length_penalty, batch_tokens=batch_tokens, protect=protect, max_batch=max_batch,
    )  # fmt: skip
    if dev.type == "cpu" and workers > 1:  # decoding processes, each on its share of the threads
        import torch

        threads = max(1, torch.get_num_threads() // workers)
        batcher = ProcessBatcher(load, workers=workers, threads=threads, max_queue=max_queue)
        defaults = batcher.defaults
    else:  # decoding threads of this process
        models, tokenizer, defaults, thread_tokens, protected = load_for_serving(load, workers)
        batcher = Batcher(
            models, tokenizer, thread_tokens, workers=workers, protect=protected, window=batch_window_ms / 1000,
            max_queue=max_queue, max_batch=max_batch,
        )  # fmt: skip
    info = {
        "models": [str(c) for c in checkpoints], "device": str(dev), "beam_size": defaults.beam_size,
        "length_penalty": defaults.length_penalty,
    }  # fmt: skip
    app = create_app(
        batcher, defaults, max_request_bytes=max_request_bytes, max_texts=max_texts, log_text=log_text, info=info
    )
    log.info(
        f"serving {', '.join(map(str, checkpoints))} on http://{host}:{sock.getsockname()[1]} ({dev}, beam "
        f"{defaults.beam_size}, batch window {batch_window_ms:g} ms); SIGTERM or Ctrl-C stops after answering the "
        "requests in flight"
    )
    return run_until_stopped(app, batcher, sock)


def run_until_stopped(app, batcher: Batcher, sock: socket.socket) -> int:
    """Serve `app` on `sock` until SIGTERM or Ctrl-C, the requests in flight answered; returns their count."""
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            batcher.hurry()  # the requests in flight need not wait out their batching windows
            await super().shutdown(sockets)

    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off", timeout_graceful_shutdown=None)
    server = Server(config)
    # uvicorn handles SIGTERM and SIGINT while it runs, then raises the signal again under the handler
    # that was there before: for SIGTERM a quiet one, so a drained server exits 0.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    batcher.start()
    try:
        server.run(sockets=[sock])
    finally:
        batcher.stop()
        signal.signal(signal.SIGTERM, previous)
        sock.close()
    answered = app.state.answered()
    log.info(f"stopped: answered {answered} requests")
    return answered
