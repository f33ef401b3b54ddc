"""The translation engine: checkpoints loaded once, then lines in, n-best lists out.

An `Engine` owns the models (one, or an ensemble of one vocabulary), the tokenizer, the default
search options, the protected span classes, the default glossary (`decode.glossary` or
--glossary: terms translated one fixed way), the device and precision (set when loading), and how
the work is shared between its workers (`workers` batches at once, each on an equal share of
torch's threads and of `batch_tokens`). Every command that translates holds one:

    engine = Engine.load(EngineSpec(["best.pt"], beam_size=5))
    for nbest in engine.translate(lines):          # lazily, in input order
        ...
    future = engine.submit(["A sentence."])        # continuous batching (translate serve)

`Engine.from_model` wraps a model already in memory (the trainer's validation). `TranslationEngine`
declares what the server and the scripts use; `pool.ProcessEngine` is its other implementation,
decoding processes that each hold an Engine. `EngineSpec` is what an engine is loaded from: typed,
and picklable so that it travels to those processes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from translate.batcher import Batcher
from translate.config import DecodeConfig
from translate.decoding import (
    Progress,
    check_workers,
    decode_workers,
    encode_sources,
    max_source_pieces,
    pad_batch,
    share,
    translate_lines,
)
from translate.errors import UserError
from translate.glossary import Glossary, load_glossary
from translate.hardware import resolve_device
from translate.inference import load_models
from translate.model import Transformer
from translate.options import CLI_NAMES, SearchOptions, ServingLimits, at_least
from translate.protect import NO_PLACEHOLDERS_FOR_GLOSSARY, Protector, Terms, has_placeholders
from translate.search import beam_search
from translate.textio import Translation
from translate.tokenizer import Tokenizer


class TranslationEngine(Protocol):
    """What holders of an engine use: `Engine` (in this process) and `pool.ProcessEngine`."""

    defaults: SearchOptions  # the search options of a call that gives none
    tokenizer: Tokenizer  # the models' vocabulary (segment.py counts a sentence's pieces in it)
    max_pieces: int  # source pieces the models take
    protect: tuple[str, ...]  # the span classes copied verbatim (segment.py counts each span as its placeholder)
    glossary: Terms | None  # the terms of a call that gives none

    @property
    def queued(self) -> int:
        """Sentences submitted and not yet taken into a search."""
        ...

    @property
    def unavailable(self) -> str | None:
        """Why no sentence can be submitted now (None: they can); /health says it."""
        ...

    def translate(
        self, lines: Iterable[str], options: SearchOptions | None = None, *, glossary: Terms | None = None
    ) -> Iterator[Translation]:
        """Each line's n-best list of (text, score), best first, in input order; the terms of
        `glossary` come out as their targets."""
        ...

    def submit(self, texts: list[str], options: SearchOptions | None = None, glossary: Terms | None = None) -> Future:
        """Queue sentences for continuous batching; the future gets their n-best lists in order.
        batcher.QueueFull at once when they cannot be queued."""
        ...

    def start(self) -> None: ...

    def hurry(self) -> None:
        """Start what is queued without waiting out its batching window."""
        ...

    def stop(self) -> None:
        """Finish what is queued and in flight, then end the workers."""
        ...


@dataclass(frozen=True)
class EngineSpec:
    """What to load and how to decode, as the command line says it; None: the first checkpoint's
    decode section (search options, batch_tokens)."""

    checkpoints: Sequence[str | Path]  # kept as a tuple of str
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    dtype: str = "auto"  # auto | fp32 | bf16 | fp16
    quantize: str | None = None  # int8 (CPU)
    protect: bool = True  # copy the checkpoint's decode.protect span classes verbatim
    batch_tokens: int | None = None  # sentences x beam x longest source over the batches in flight
    workers: int = 0  # batches decoded at once (0: decoding.decode_workers)
    threads: int | None = None  # torch threads shared by the workers (None: torch's count)
    beam_size: int | None = None
    length_penalty: float | None = None
    max_len_a: float | None = None
    max_len_b: float | None = None
    nbest: int = 1
    glossary: str | None = None  # a terms.tsv (None: the first checkpoint's decode.glossary, if any)
    limits: ServingLimits = field(default_factory=ServingLimits)  # for submit

    def __post_init__(self) -> None:
        if isinstance(self.checkpoints, (str, Path)):  # its characters would be taken as paths
            raise TypeError(f"checkpoints must be a list of paths, not one path: [{str(self.checkpoints)!r}]")
        object.__setattr__(self, "checkpoints", tuple(str(c) for c in self.checkpoints))  # paths as given


class Engine:
    """Models, tokenizer and decoding settings in one place (see the module's docstring)."""

    def __init__(
        self,
        models: Sequence[Transformer] | Transformer,
        tokenizer: Tokenizer,
        defaults: SearchOptions = SearchOptions(),
        *,
        device: torch.device | str | None = None,
        batch_tokens: int = DecodeConfig.batch_tokens,
        workers: int = 0,
        threads: int | None = None,
        protect: Sequence[str] = (),
        glossary: Glossary | None = None,
        limits: ServingLimits = ServingLimits(),
    ) -> None:
        self.models = [models] if isinstance(models, torch.nn.Module) else list(models)
        self.tokenizer = tokenizer
        self.vocab_size = min(m.vocab_size for m in self.models)
        self.defaults = self.search_options(defaults)
        at_least(batch_tokens, 1, "batch_tokens")
        check_workers(workers)
        self.device = torch.device(device) if device is not None else next(self.models[0].parameters()).device
        self.batch_tokens = batch_tokens
        self.workers = workers or decode_workers(self.device)
        self.threads = threads or torch.get_num_threads()
        self.protect = tuple(protect)
        self.glossary = glossary or None  # the terms of a call that gives none
        if self.glossary and not has_placeholders(tokenizer):
            raise UserError(NO_PLACEHOLDERS_FOR_GLOSSARY)
        self.limits = limits
        self.max_pieces = max_source_pieces(self.models)
        self._batcher: Batcher | None = None

    @classmethod
    def from_model(
        cls,
        models: Sequence[Transformer] | Transformer,
        tokenizer: Tokenizer,
        defaults: SearchOptions = SearchOptions(),
        *,
        device: torch.device | str | None = None,
        batch_tokens: int = DecodeConfig.batch_tokens,
        workers: int = 0,
        protect: Sequence[str] = (),
    ) -> Engine:
        """An engine over models already in memory (the trainer's), left in their mode (translate
        switches dropout off while it runs) and precision."""
        return cls(
            models, tokenizer, defaults, device=device, batch_tokens=batch_tokens, workers=workers, protect=protect
        )

    @classmethod
    def load(cls, spec: EngineSpec) -> Engine:
        """Load spec.checkpoints on its device at its precision; bad values are UserErrors that
        name the command line's options."""
        check_workers(spec.workers)
        device = resolve_device(spec.device)
        glossary = load_glossary(spec.glossary) if spec.glossary else None  # a bad file: before the models load
        models, tokenizer, cfg = load_models(spec.checkpoints, device, dtype=spec.dtype, quantize=spec.quantize)
        if glossary is None and cfg.decode.glossary:
            glossary = load_glossary(cfg.decode.glossary)
        defaults = cfg.decode.search_options(
            CLI_NAMES, spec.nbest, beam_size=spec.beam_size, length_penalty=spec.length_penalty,
            max_len_a=spec.max_len_a, max_len_b=spec.max_len_b,
        )  # fmt: skip
        vocab_size = min(m.vocab_size for m in models)
        if defaults.beam_size > vocab_size:
            raise UserError(
                f"{CLI_NAMES['beam_size']} must be at most the vocabulary's {vocab_size} pieces, got {defaults.beam_size}"
            )
        batch_tokens = cfg.decode.batch_tokens if spec.batch_tokens is None else spec.batch_tokens
        at_least(batch_tokens, 1, CLI_NAMES["batch_tokens"])
        return cls(
            models, tokenizer, defaults, device=device, batch_tokens=batch_tokens, workers=spec.workers,
            threads=spec.threads, protect=cfg.decode.protect if spec.protect else (), glossary=glossary,
            limits=spec.limits,
        )  # fmt: skip

    # ------------------------------------------------------------------------ shares of the work

    @property
    def worker_threads(self) -> int:
        """torch threads of one worker."""
        return share(self.threads, self.workers)

    @property
    def worker_tokens(self) -> int:
        """batch_tokens of one worker."""
        return share(self.batch_tokens, self.workers)

    # ------------------------------------------------------------------------ translating

    def search_options(self, options: SearchOptions | None = None) -> SearchOptions:
        """`options` (None: the engine's defaults) checked, against the models too: a UserError
        naming the first bad value, before any work."""
        options = (options or self.defaults).check()
        if options.beam_size > self.vocab_size:
            raise UserError(
                f"beam_size must be at most the vocabulary's {self.vocab_size} pieces, got {options.beam_size}"
            )
        return options

    def translate(
        self,
        lines: Iterable[str],
        options: SearchOptions | None = None,
        *,
        stream: bool = False,
        on_progress: Progress | None = None,
        glossary: Terms | None = None,
    ) -> Iterator[Translation]:
        """Each line's n-best list, in input order, lazily (decoding.translate_lines): `stream`
        translates whatever lines have arrived (stdin); `on_progress(n)` as n lines are done; the
        terms of `glossary` come out as their targets. A line is translated whole, its pieces cut to
        what the models take (max_positions - 1); translator.translate_texts splits paragraphs and
        documents into sentences first, as `translate decode` does."""
        return translate_lines(
            self.models, self.tokenizer, lines, self.search_options(options), batch_tokens=self.batch_tokens,
            device=self.device, stream=stream, workers=self.workers, on_progress=on_progress, protect=self.protect,
            glossary=glossary or self.glossary,
        )  # fmt: skip

    def translate_in_worker(
        self, texts: list[str], options: SearchOptions | None = None, glossary: Terms | None = None
    ) -> list[Translation]:
        """`translate` on one worker's share (its batch tokens, one batch at a time, the calling
        thread's torch threads): what a decoding thread runs for a greedy request."""
        return list(
            translate_lines(
                self.models, self.tokenizer, texts, self.search_options(options), batch_tokens=self.worker_tokens,
                device=self.device, workers=1, protect=self.protect, glossary=glossary or self.glossary,
            )
        )  # fmt: skip

    def encode(self, lines: list[str], glossary: Terms | None = None) -> tuple[Protector, list[list[int] | None]]:
        """The lines' protected spans and glossary terms masked (the Protector restores them in the
        translations) and each line's source ids, cut to the models' capacity; None for a blank line."""
        protector = Protector(self.protect, self.tokenizer, glossary or self.glossary)
        return protector, encode_sources(self.tokenizer, list(protector.mask_lines(lines)), self.max_pieces)

    def best_tokens(self, text: str, options: SearchOptions | None = None) -> list[int]:
        """The 1-best output pieces (ids) of one non-blank sentence, spans not masked: what an
        attention plot is drawn over."""
        sources = encode_sources(self.tokenizer, [text], self.max_pieces)
        src = pad_batch(sources, self.device)  # type: ignore[arg-type]  # (1, S)
        return beam_search(self.models, src, self.search_options(options))[0][0].tokens

    # ------------------------------------------------------------------------ continuous batching

    @property
    def queued(self) -> int:
        return self._batcher.queued if self._batcher else 0

    @property
    def unavailable(self) -> str | None:
        return None  # its threads live as long as it does

    def submit(self, texts: list[str], options: SearchOptions | None = None, glossary: Terms | None = None) -> Future:
        """Queue sentences for the decoding threads (started on first use); see TranslationEngine."""
        options = self.search_options(options)
        if isinstance(texts, (str, bytes)):
            raise TypeError(f"texts must be a list of str, not one {type(texts).__name__}")
        if self._batcher is None:
            self.start()
        return self._batcher.submit(texts, options, glossary)  # type: ignore[union-attr]

    def start(self) -> None:
        """Start `workers` decoding threads that batch continuously (batcher.Batcher)."""
        if self._batcher is None:
            self._batcher = Batcher(
                self, workers=self.workers, window=self.limits.window, max_batch=self.limits.max_batch,
                max_queue=self.limits.max_queue,
            )  # fmt: skip
            self._batcher.start()

    def hurry(self) -> None:
        if self._batcher is not None:
            self._batcher.hurry()

    def stop(self) -> None:
        if self._batcher is not None:
            self._batcher.stop()


def first_best(translations: Iterable[Translation]) -> list[str]:
    """The best text of each n-best list."""
    return [nbest[0][0] for nbest in translations]
