"""`translate serve`: an engine behind an HTTP JSON API (Starlette on uvicorn).

    POST /translate  {"text": "..."} or {"texts": [...]}, optional beam_size, length_penalty, nbest,
                     format ("text", "html", "markdown"), glossary ({"source term": "target term"}),
                     split (true: a text's sentences translated apart)
                     -> {"translation": "..."} or {"translations": [...]} in input order; with
                     nbest, a list per text (best first) and "scores" of the same shape
    GET  /health     -> {"status": "ok", ...}; 503 {"status": "unavailable", "error": "...", ...} when
                     no request can be translated (no decoding process left)
    GET  /           -> a page to try it (page.py)

This module is the HTTP layer only: requests are parsed and checked on the event loop, then
handed to the engine's `submit` (`pool.open_engine`: decoding processes on a CPU, threads on a
GPU; both batch continuously, see batcher.py). The limits are one `ServingLimits`: a body over
--max-request-bytes, more than --max-texts texts, or more sentences once split than the whole
queue holds gets 413, a malformed one 400, a full queue (--max-queue sentences) 503 at once, each with one line of JSON `{"error": "..."}`, and
none of them touches the requests already queued. SIGTERM (or Ctrl-C) stops accepting
connections, answers every request already accepted (queued ones start without waiting out
their window), and exits 0 (130 for Ctrl-C). Each request is logged with its size and latency;
its text only with --log-text.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from typing import Any

from translate.batcher import QueueFull, TooManySentences
from translate.decoding import check_workers
from translate.documents import format_of_request
from translate.engine import EngineSpec, TranslationEngine, first_best
from translate.errors import UserError
from translate.glossary import Glossary, glossary_of_request
from translate.options import SearchOptions, ServingLimits
from translate.page import index
from translate.pool import DecodingFailed, open_engine, resolve_spec
from translate.segment import join_sentences, split_sentences
from translate.translator import sentence_budget, translate_texts

log = logging.getLogger("translate")

FIELDS = ("text", "texts", "beam_size", "length_penalty", "nbest", "format", "glossary", "split")


@dataclass(frozen=True)
class TranslateRequest:
    """A /translate body, checked."""

    texts: list[str]
    single: bool  # one "text" was given
    search: SearchOptions
    with_nbest: bool  # "nbest" was given: the answer has a list per text and scores
    format: str = "text"  # text | html | markdown (documents.py)
    split: bool = True  # a text's sentences translated apart (format text, no "nbest" given)
    glossary: Glossary | None = None

    @property
    def whole(self) -> bool:
        """Each text translated as one sentence by the engine (no splitting, no document)."""
        return self.format == "text" and (not self.split or self.with_nbest)


class RequestError(Exception):
    """A request the server refuses: its HTTP status and a one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_request(body: bytes, defaults: SearchOptions, limits: ServingLimits) -> TranslateRequest:
    """A /translate body, checked: RequestError 400 (malformed) or 413 (too many texts)."""
    if not body.strip():
        raise RequestError(400, 'empty body: send a JSON object such as {"text": "Hello."}')
    try:
        request = json.loads(body, object_pairs_hook=_once_each)
    except RepeatedKey as e:
        raise RequestError(400, f"the body gives {e.args[0]!r} twice in one object") from None
    except RecursionError:
        raise RequestError(400, "the body is not valid JSON: nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer of more than 4,300 digits
        raise RequestError(400, f"the body is not valid JSON: {e}") from None
    if not isinstance(request, dict):
        raise RequestError(400, f'the body must be a JSON object such as {{"text": "Hello."}}, not {_kind(request)}')
    try:  # JSON lets a string hold half of a UTF-16 pair (\ud800): not text, and no answer could hold it
        json.dumps(request, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise RequestError(400, "the body holds a lone surrogate (\\ud800-\\udfff escape), which is not text") from None
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
        if len(texts) > limits.max_texts:
            raise RequestError(413, f"{len(texts)} texts in one request; at most {limits.max_texts} (--max-texts)")
    beam_size = request.get("beam_size", defaults.beam_size)
    if not _is_int(beam_size) or not 1 <= beam_size <= limits.max_beam:
        raise RequestError(
            400, f'"beam_size" must be an integer from 1 to {limits.max_beam}, got {json.dumps(beam_size)}'
        )
    length_penalty = request.get("length_penalty", defaults.length_penalty)
    if (
        isinstance(length_penalty, bool)
        or not isinstance(length_penalty, (int, float))
        or not 0 <= length_penalty < math.inf
    ):
        raise RequestError(400, f'"length_penalty" must be a finite number >= 0, got {json.dumps(length_penalty)}')
    nbest = request.get("nbest", 1)
    if not _is_int(nbest) or not 1 <= nbest <= beam_size:
        raise RequestError(
            400, f'"nbest" must be an integer from 1 to the beam size ({beam_size}), got {json.dumps(nbest)}'
        )
    search = defaults.given(beam_size=beam_size, length_penalty=float(length_penalty), nbest=nbest)
    try:
        format = format_of_request(request.get("format", "text"))
        glossary = glossary_of_request(request["glossary"]) if "glossary" in request else None
    except ValueError as e:
        raise RequestError(400, str(e)) from None
    split = request.get("split", True)
    if not isinstance(split, bool):
        raise RequestError(400, f'"split" must be true or false, got {json.dumps(split)}')
    if format != "text" and nbest > 1:
        raise RequestError(400, f'"nbest" above 1 gives a list per sentence: not with "format": "{format}"')
    texts = [text.removeprefix("\ufeff") for text in texts]  # a byte order mark, as decode drops it from a file
    return TranslateRequest(texts, single, search, "nbest" in request and format == "text", format, split, glossary)


class RepeatedKey(ValueError):
    """A JSON object that names one key twice (json.loads would keep the last silently)."""


def _once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise RepeatedKey(key)
        out[key] = value
    return out


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


class ClientGone(Exception):
    """The client closed its connection before its answer was ready."""


async def read_body(request, limits: ServingLimits) -> bytes:
    """The request's body; RequestError 413 as soon as it is known to be over the limit, 408 when it
    has not all arrived within limits.body_timeout_s (a client that stalls holds neither a
    connection's task nor SIGTERM's drain for longer)."""
    most = limits.max_request_bytes
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > most:
        raise RequestError(413, f"the body has {int(length)} bytes; at most {most} (--max-request-bytes)")
    from starlette.requests import ClientDisconnect

    body = bytearray()

    async def receive() -> None:
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > most:
                raise RequestError(413, f"the body is over {most} bytes (--max-request-bytes)")

    try:
        await asyncio.wait_for(receive(), limits.body_timeout_s)
    except ClientDisconnect:  # gone while sending its body: 499, as gone while waiting for its answer
        raise ClientGone from None
    except asyncio.TimeoutError:
        raise RequestError(
            408, f"the body did not arrive within {limits.body_timeout_s:g} s (--body-timeout-s): {len(body)} bytes"
        ) from None
    return bytes(body)


async def until_client_gone(receive: Callable[[], Awaitable[dict]], work: Awaitable[Any]) -> Any:
    """`work`'s result; if the client hangs up first (`receive`, the request's ASGI channel, says
    http.disconnect), `work` is cancelled, which drops its sentences not yet taken into a search,
    and ClientGone is raised: a client that gives up and retries does not pile up work."""

    async def disconnect() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    task, gone = asyncio.ensure_future(work), asyncio.ensure_future(disconnect())
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
    if not task.done() or task.cancelled():
        raise ClientGone
    return task.result()


def answer(translations: list, single: bool, with_nbest: bool) -> dict:
    """The JSON answer: one translation or a list, with nbest a list per sentence and their scores."""
    if with_nbest:
        out = [[text for text, _ in nbest] for nbest in translations]
        scores = [[round(score, 4) for _, score in nbest] for nbest in translations]
        return {"translation": out[0], "scores": scores[0]} if single else {"translations": out, "scores": scores}
    out = first_best(translations)
    return {"translation": out[0]} if single else {"translations": out}


async def translate_request(engine: TranslationEngine, r: TranslateRequest) -> list:
    """The n-best lists of a request's texts, through the engine's continuous batching: the texts
    whole; or every sentence of every text in one submit, joined back (1-best; as
    segment.translate_paragraphs does); or, for a document, its sentences submitted from a thread."""
    if r.whole:
        return await asyncio.wrap_future(engine.submit(r.texts, r.search, r.glossary))
    if r.format == "text":
        splits = [split_sentences(text, **sentence_budget(engine, r.glossary)) for text in r.texts]
        flat = [s for sentences, _ in splits for s in sentences]
        done = iter(first_best(await asyncio.wrap_future(engine.submit(flat, r.search, r.glossary))) if flat else [])
        return [[(join_sentences([next(done) for _ in s], gaps, outer=False), 0.0)] for s, gaps in splits]
    submitted: list[Future] = []
    gone = threading.Event()

    def submit(sentences: list[str]) -> Future:  # from the document's thread
        if gone.is_set():
            raise CancelledError  # its client is gone: the rest of the document is not submitted
        submitted.append(future := engine.submit(sentences, r.search, r.glossary))
        if gone.is_set():  # gone while submitting: the loop below may have missed this future
            future.cancel()
        return future

    try:
        out = await asyncio.to_thread(
            translate_texts, engine, r.texts, r.search, format=r.format, split=r.split, glossary=r.glossary,
            submit=submit,
        )  # fmt: skip
    except asyncio.CancelledError:
        gone.set()
        for future in submitted:
            future.cancel()  # what no search has taken yet leaves the queue; the thread's wait ends
        raise
    return [[(text, 0.0)] for text in out]


def create_app(engine: TranslationEngine, limits: ServingLimits, *, log_text: bool = False, info: dict | None = None):
    """The Starlette application over an engine: /translate and /health (`info` added to its
    answer), every error as one line of JSON."""
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
        status, texts = 200, []
        size = request.headers.get("content-length", "?")  # a body refused unread: its announced size
        try:
            body = await read_body(request, limits)
            size = len(body)
            r = parse_request(body, engine.defaults, limits)
            texts = r.texts
            translations = await until_client_gone(request.receive, translate_request(engine, r))
        except ClientGone:  # logged as nginx does; the answer goes nowhere
            status, response = 499, error(499, "the client closed the connection")
        except RequestError as e:
            status, response = e.status, error(e.status, str(e))
        except TooManySentences as e:  # a text's sentences, once split, more than the whole queue holds
            status, response = 413, error(413, str(e))
        except QueueFull as e:
            status, response = 503, error(503, str(e))
        except UserError as e:  # the request's own fault found while translating it (a document's markup)
            status, response = 400, error(400, str(e))
        except Exception as e:  # a fault in decoding: reported, the server goes on
            status, response = 500, error(500, str(e) if isinstance(e, DecodingFailed) else f"{type(e).__name__}: {e}")
        else:
            response = JSONResponse(answer(translations, r.single, r.with_nbest))
            answered += 1
        count = len(texts) if texts or status == 200 else "?"  # a request refused before its texts were read
        line = f"POST /translate {status} {count} texts {size} bytes {1000 * (time.perf_counter() - start):.1f} ms"
        if log_text and texts:
            line += f" text={json.dumps(texts, ensure_ascii=False)}"
        log.info(line)
        return response

    async def health(request) -> JSONResponse:
        """200 and status ok while requests can be translated; else 503 and the reason (a load
        balancer then sends its requests elsewhere)."""
        why = engine.unavailable
        state = {"status": "ok"} if why is None else {"status": "unavailable", "error": why}
        body = {**state, "queued": engine.queued, "answered": answered, **(info or {})}
        return JSONResponse(body, status_code=200 if why is None else 503)

    async def http_error(request, exc: HTTPException) -> JSONResponse:
        response = error(exc.status_code, exc.detail)
        response.headers.update(getattr(exc, "headers", None) or {})  # 405's Allow
        return response

    app = Starlette(
        routes=[
            Route("/translate", translate, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/", index, methods=["GET"]),
        ],
        exception_handlers={HTTPException: http_error},
    )
    app.router.redirect_slashes = False  # /translate/ is another path (404), not a redirect
    app.state.answered = lambda: answered
    return app


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: any free port); UserError if it cannot be had."""
    if not 0 <= port <= 65535:
        raise UserError(f"--port must be from 0 to 65535 (0: any free port), got {port}")
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.create_server((host, port), family=family, backlog=1024)
        # Connections accepted from it inherit its protocol number. Named IPPROTO_TCP (create_server
        # leaves 0), asyncio sets TCP_NODELAY on each; otherwise a response's body, written after
        # its headers, waits for the client's delayed ACK of them (Nagle): ~40 ms a request.
        return socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, fileno=sock.detach())
    except socket.gaierror as e:  # the address's name cannot be resolved
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    except OSError as e:
        raise UserError(f"cannot listen on {host}:{port}: {os.strerror(e.errno) if e.errno else e}") from None


def serve(spec: EngineSpec, *, host: str = "127.0.0.1", port: int = 8080, log_text: bool = False) -> int:
    """`translate serve`: load the engine once and answer HTTP until SIGTERM or Ctrl-C; returns
    the number of /translate requests answered."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise UserError(
            "translate serve needs starlette and uvicorn: pip install -e '.[serve]' in the project's checkout"
        ) from None
    limits = spec.limits.check()
    check_workers(spec.workers)
    if spec.beam_size is not None and not 1 <= spec.beam_size <= limits.max_beam:
        raise UserError(f"--beam must be from 1 to {limits.max_beam}, got {spec.beam_size}")
    sock = listen(host, port)
    spec = resolve_spec(spec)
    engine = open_engine(spec)
    defaults = engine.defaults
    info = {
        "models": list(spec.checkpoints), "device": spec.device, "beam_size": defaults.beam_size,
        "length_penalty": defaults.length_penalty,
    }  # fmt: skip
    app = create_app(engine, limits, log_text=log_text, info=info)
    log.info(
        f"serving {', '.join(spec.checkpoints)} on http://{host}:{sock.getsockname()[1]} ({info['device']}, beam "
        f"{defaults.beam_size}, batch window {limits.batch_window_ms:g} ms); SIGTERM or Ctrl-C stops after answering "
        "the requests in flight"
    )
    return run_until_stopped(app, engine, sock)


def run_until_stopped(app, engine: TranslationEngine, sock: socket.socket) -> int:
    """Serve `app` on `sock` until SIGTERM or Ctrl-C, the requests in flight answered; returns their count."""
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            engine.hurry()  # the requests in flight need not wait out their batching windows
            await super().shutdown(sockets)

    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off", timeout_graceful_shutdown=None)
    server = Server(config)
    # uvicorn handles SIGTERM and SIGINT while it runs, then raises the signal again under the handler
    # that was there before: for SIGTERM a quiet one, so a drained server exits 0.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    engine.start()
    try:
        server.run(sockets=[sock])
    finally:  # on Ctrl-C too, before `interrupted`
        engine.stop()
        signal.signal(signal.SIGTERM, previous)
        sock.close()
        answered = app.state.answered()
        log.info(f"stopped: answered {answered} request{'s' * (answered != 1)}")
    return answered
