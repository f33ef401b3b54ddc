"""The engine's pipeline: lines of text -> batches by length -> search -> text, in input order.

`translate_lines` streams: it reads its lines lazily in chunks (up to `chunk_lines`, or with
`stream=True` whatever has already arrived, so a pipe or a terminal gets each translation at
once), sorts each chunk by source length into token-budget batches, decodes them with
search.py, restores the input order and yields one n-best list of (text, score) per input line.
Blank lines give empty translations without running the model; a source longer than the model
can hold is cut to its first `max_positions - 1` pieces. `engine.Engine.translate` runs it with
the engine's settings (the trainer's validation too, through `Engine.from_model`).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

import torch

from translate.config import DecodeConfig
from translate.errors import UserError
from translate.hardware import is_out_of_memory
from translate.model import Transformer
from translate.options import SearchOptions, at_least
from translate.protect import Protector, Terms
from translate.search import Hypothesis, beam_search
from translate.textio import Translation
from translate.tokenizer import EOS, PAD, Tokenizer

log = logging.getLogger("translate")

Progress = Callable[[int], object]  # called with the number of lines just done


def translate_lines(
    models: Sequence[Transformer] | Transformer,
    tokenizer: Tokenizer,
    lines: Iterable[str],
    search: SearchOptions = SearchOptions(),
    *,
    batch_tokens: int = DecodeConfig.batch_tokens,
    device: torch.device | str | None = None,
    stream: bool = False,
    chunk_lines: int = 2000,
    workers: int = 0,
    on_progress: Progress | None = None,
    protect: Sequence[str] = (),
    glossary: Terms | None = None,
) -> Iterator[Translation]:
    """Translate `lines` (an ensemble when several models are given): an iterator that yields, per
    input line and in input order, its `search.nbest` (text, score) pairs, best first (score: log-prob /
    length penalty). Bad arguments raise UserError at once; the work happens as it is iterated.

    batch_tokens bounds sentences x beam_size x padded source length of the batches in flight;
    `workers` batches decode at once (0: `decode_workers` chooses), each with an equal share of
    batch_tokens and of torch's threads. The models must already be on `device` (default: the
    first model's). `on_progress(n)` is called as each batch of n lines is done (blank lines too).
    Spans of the `protect` classes are copied verbatim, the terms of `glossary` come out as their
    targets (translate/protect.py, translate/glossary.py).
    """
    models = [models] if isinstance(models, torch.nn.Module) else list(models)
    search.check()
    at_least(batch_tokens, 1, "batch_tokens")
    at_least(chunk_lines, 1, "chunk_lines")
    lines = checked_lines(lines)
    check_workers(workers)
    device = torch.device(device) if device is not None else next(models[0].parameters()).device
    workers = workers or decode_workers(device)
    max_pieces = max_source_pieces(models)
    protector = Protector(protect, tokenizer, glossary)
    chunks = (arrived_chunks if stream else fixed_chunks)(protector.mask_lines(lines), chunk_lines)
    return protector.restore(
        translation
        for chunk in chunks
        for translation in translate_sources(
            models,
            tokenizer,
            encode_sources(tokenizer, chunk, max_pieces),
            search,
            batch_tokens,
            device,
            workers,
            on_progress,
        )
    )


def checked_lines(lines: Iterable[str]) -> Iterator[str]:
    """The lines, each checked as it comes: a TypeError for one string given for the lines (its
    characters would be taken as lines) or a line that is not a str, a ValueError for a line that
    is not text (a lone surrogate, which no encoding can write)."""
    if isinstance(lines, (str, bytes)):  # at once, not when the first line is wanted
        raise TypeError(f"lines must be an iterable of str, not one {type(lines).__name__}")

    def each(lines: Iterable[str]) -> Iterator[str]:
        for i, line in enumerate(lines):
            if not isinstance(line, str):
                raise TypeError(f"line {i} is a {type(line).__name__}, not a str")
            try:
                line.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ValueError(f"line {i} holds a lone surrogate ({line[e.start]!r}), which is not text") from None
            yield line

    return each(lines)


def fixed_chunks(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    """Consecutive chunks of up to `size` lines."""
    it = iter(lines)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


_END = object()


def arrived_chunks(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    """Chunks of the lines that have already arrived (at least one, at most `size`).

    A thread reads `lines` into a bounded queue; each chunk takes what is there without waiting
    for more, so a line typed at a terminal is translated at once and a pipe still gets batches.
    An error raised while reading (e.g. undecodable bytes) is raised here after the lines before it.
    """
    q: queue.Queue = queue.Queue(maxsize=size)
    stop = threading.Event()

    def put(item: object) -> None:
        while not stop.is_set():
            try:
                return q.put(item, timeout=0.1)
            except queue.Full:
                continue

    def reader() -> None:
        try:
            for line in lines:
                if stop.is_set():
                    return
                put(line)
        except BaseException as e:  # handed to the consumer
            put(e)
        put(_END)

    threading.Thread(target=reader, daemon=True, name="translate-reader").start()
    try:
        while True:
            item = _wait(q)  # wait for one line, then take what is already there
            chunk: list[str] = []
            while item is not _END and not isinstance(item, BaseException):
                chunk.append(item)  # type: ignore[arg-type]
                if len(chunk) == size:
                    item = None
                    break
                try:
                    item = q.get_nowait()
                except queue.Empty:
                    item = None
                    break
            if chunk:
                yield chunk
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
    finally:
        stop.set()


def _wait(q: queue.Queue) -> object:
    """q.get() in short waits: Ctrl-C may be delivered to another thread (the blocked reader, a
    torch worker), and an endless wait would never see it; between waits Python handles it."""
    while True:
        try:
            return q.get(timeout=0.2)
        except queue.Empty:
            continue


def max_source_pieces(models: Sequence[Transformer]) -> int:
    """The most pieces of a source the models hold (with its EOS): longer ones are cut to it."""
    return min(m.cfg.max_positions for m in models) - 1


_warned_cut = False  # once per process


def encode_sources(tokenizer: Tokenizer, lines: list[str], max_pieces: int) -> list[list[int] | None]:
    """Each line's source ids (pieces cut to max_pieces, + EOS); None for a blank line or one of no
    pieces (a zero-width space): nothing to translate. The first line cut is logged (a warning),
    once per process."""
    global _warned_cut
    texts = [line.strip() for line in lines]
    todo = [i for i, text in enumerate(texts) if text]
    sources: list[list[int] | None] = [None] * len(lines)
    for i, pieces in zip(todo, tokenizer.encode([texts[i] for i in todo]) if todo else [], strict=True):
        if not pieces:
            continue
        if len(pieces) > max_pieces and not _warned_cut:
            _warned_cut = True
            log.warning(
                f"a sentence of {len(pieces)} pieces is cut to the model's {max_pieces}: its end is not translated "
                "(this warning comes once)"
            )
        sources[i] = pieces[:max_pieces] + [EOS]
    return sources


def decode_batches(lengths: list[int], batch_tokens: int, beam_size: int = 1) -> list[list[int]]:
    """Indices grouped into batches, longest first, so that sentences x beam_size x the longest
    length stays within batch_tokens (a longer sentence gets a batch of its own)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * beam_size * lengths[batches[-1][0]] <= batch_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def pad_batch(sources: list[list[int]], device: torch.device) -> torch.Tensor:
    """Right-pad with PAD: (B, S)."""
    src = torch.full((len(sources), max(map(len, sources))), PAD, dtype=torch.long)
    for row, ids in enumerate(sources):
        src[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return src.to(device)


def translate_sources(
    models: list[Transformer],
    tokenizer: Tokenizer,
    sources: list[list[int] | None],
    search: SearchOptions,
    batch_tokens: int,
    device: torch.device,
    workers: int = 1,
    on_progress: Progress | None = None,
) -> list[Translation]:
    """Decode every non-blank source in token-budget batches, `workers` at once; results in the
    order of `sources`."""
    nbest = search.nbest
    results: list[Translation] = [[("", 0.0)] * nbest for _ in sources]
    todo = [i for i, ids in enumerate(sources) if ids is not None]
    lengths = [len(sources[i]) for i in todo]  # type: ignore[arg-type]
    budget = share(batch_tokens, workers)
    batches = [[todo[j] for j in batch] for batch in decode_batches(lengths, budget, search.beam_size)]
    while 0 < len(batches) < workers and max(map(len, batches)) > 1:  # too few batches for the workers: halve one
        big = max(batches, key=len)
        batches.remove(big)
        batches += [big[: len(big) // 2], big[len(big) // 2 :]]

    def decode(rows: list[int]) -> list[list[Hypothesis]]:
        src = pad_batch([sources[i] for i in rows], device)  # type: ignore[misc]
        try:
            return beam_search(models, src, search)
        except (RuntimeError, MemoryError) as e:
            if not is_out_of_memory(e):
                raise
            raise UserError(
                f"out of memory on {device} decoding {len(rows)} sentences of up to {src.size(1)} tokens: "
                f"lower --batch-tokens (decode.batch_tokens), now {batch_tokens}"
            ) from None

    with eval_mode(models):
        for rows, hyps in zip(batches, in_workers(decode, batches, workers), strict=True):
            for i, translation in zip(rows, to_translations(tokenizer, hyps, nbest), strict=True):
                results[i] = translation
            if on_progress:
                on_progress(len(rows))
    if on_progress and len(todo) < len(sources):
        on_progress(len(sources) - len(todo))
    return results


def to_translations(tokenizer: Tokenizer, hyps: list[list[Hypothesis]], nbest: int) -> list[Translation]:
    """Each sentence's hypotheses as text: always `nbest` (text, score) pairs (the last repeated
    where the search found fewer)."""
    texts = iter(tokenizer.decode([h.tokens for hs in hyps for h in hs]))
    out = []
    for hs in hyps:
        best = [(next(texts), h.score) for h in hs] or [("", float("-inf"))]
        out.append((best + best[-1:] * nbest)[:nbest])
    return out


def decode_workers(device: torch.device) -> int:
    """How many batches decode at once by default: 2 on a CPU where torch has 2 threads or more
    (each then runs on half of them; small matrix products scale poorly across threads, so two
    batches side by side are 1.1-1.3x faster on 2 cores, see docs/performance.md), else 1."""
    return 2 if device.type == "cpu" and torch.get_num_threads() >= 2 else 1


def share(total: int, workers: int) -> int:
    """One worker's share of `total` (torch threads, batch tokens): at least 1."""
    return max(1, total // workers)


T = TypeVar("T")
R = TypeVar("R")


def in_workers(fn: Callable[[T], R], items: list[T], workers: int) -> Iterator[R]:
    """fn over items, results in order; with workers > 1 in that many threads, each with an equal
    share of torch's threads (restored afterwards). torch releases the GIL inside its ops."""
    if workers <= 1 or len(items) <= 1:
        yield from map(fn, items)
        return
    threads = torch.get_num_threads()
    pool = ThreadPoolExecutor(workers, "translate-decode", torch.set_num_threads, (share(threads, workers),))
    try:
        yield from pool.map(fn, items)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        torch.set_num_threads(threads)


@contextmanager
def eval_mode(models: list[Transformer]) -> Iterator[None]:
    """Dropout off while decoding; each model's train/eval mode is restored afterwards."""
    was_training = [m.training for m in models]
    for m in models:
        m.eval()
    try:
        yield
    finally:
        for m, training in zip(models, was_training, strict=True):
            m.train(training)


def check_workers(workers: int) -> None:
    if workers < 0:
        raise UserError(f"--workers must be at least 0 (0 = auto), got {workers}")
