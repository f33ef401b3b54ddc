"""Typed options of decoding and serving: `SearchOptions` (how beam search runs) and
`ServingLimits` (how `translate serve` batches and what it refuses), each the one home of its
defaults and checks. The config's decode section (config.DecodeConfig) takes its defaults from
SearchOptions; the command line's names for them are `CLI_NAMES`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass

from translate.errors import UserError


def count(text: str) -> int:
    """An argparse type: a whole number of at least 1 (the scripts' sizes, repeats, clients ...)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def counts(text: str) -> list[int]:
    """An argparse type: comma-separated whole numbers of at least 1 ('1,4,16')."""
    return [count(part) for part in text.split(",")]


def at_least(value: float, low: float, name: str) -> None:
    """A UserError unless value is a finite number >= low (NaN and infinity are refused)."""
    if not math.isfinite(value):
        raise UserError(f"{name} must be a finite number, got {value}")
    if value < low:
        raise UserError(f"{name} must be at least {low}, got {value}")


@dataclass(frozen=True)
class SearchOptions:
    """How beam search runs, from the command line (--beam, --lenpen, --max-len-a/b, --nbest:
    `CLI_NAMES`), a request or the config, through the engine to search.beam_search. beam_size 1
    is greedy search."""

    beam_size: int = 5
    length_penalty: float = 0.6  # GNMT's alpha
    max_len_a: float = 1.2  # max output length = a * source length + b
    max_len_b: float = 10
    nbest: int = 1  # hypotheses returned per sentence, best first

    def check(self, names: dict[str, str] | None = None) -> SearchOptions:
        """self, or a UserError naming the first bad value as names[field] (default: the field)."""
        name = (names or {}).get
        for field in ("beam_size", "nbest"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int):
                raise UserError(f"{name(field, field)} must be a whole number, got {value!r}")
        at_least(self.beam_size, 1, name("beam_size", "beam_size"))
        at_least(self.length_penalty, 0, name("length_penalty", "length_penalty"))
        at_least(self.max_len_a, 0, name("max_len_a", "max_len_a"))
        at_least(self.max_len_b, 0, name("max_len_b", "max_len_b"))
        if not 1 <= self.nbest <= self.beam_size:
            raise UserError(
                f"{name('nbest', 'nbest')} must be between 1 and the beam size ({self.beam_size}), got {self.nbest}"
            )
        return self

    def given(self, names: dict[str, str] | None = None, **values: float | None) -> SearchOptions:
        """These options with the values given (None: not given, keep this one's); checked."""
        return dataclasses.replace(self, **{k: v for k, v in values.items() if v is not None}).check(names)


CLI_NAMES = {
    "beam_size": "--beam",
    "length_penalty": "--lenpen",
    "max_len_a": "--max-len-a",
    "max_len_b": "--max-len-b",
    "nbest": "--nbest",
    "batch_tokens": "--batch-tokens",
}


MAX_TEXTS = 256  # texts in one request by default


@dataclass(frozen=True)
class ServingLimits:
    """How `translate serve` batches and what it refuses: the one home of the server's limits and
    their checks (each named by its --option in messages)."""

    batch_window_ms: float = 5.0  # how long an idle worker waits for more requests before it starts
    max_batch: int = 256  # sentences a decoding worker searches at once
    max_queue: int = 1024  # sentences waiting; past it: 503
    max_texts: int | None = None  # texts in one request; past it: 413 (None: MAX_TEXTS, or max_queue where less)
    max_request_bytes: int = 1 << 20  # body size; past it: 413
    max_beam: int = 64  # the largest beam_size a request (or --beam) may ask for
    body_timeout_s: float = 30.0  # to receive a request's body; past it: 408 (so SIGTERM waits no longer for one)

    def __post_init__(self) -> None:
        if self.max_texts is None:  # the default, under a smaller queue: that queue
            object.__setattr__(self, "max_texts", min(MAX_TEXTS, self.max_queue))

    def check(self) -> ServingLimits:
        """self, or a UserError naming the first option out of its range."""
        for option, value, low in [
            ("--batch-window-ms", self.batch_window_ms, 0),
            ("--max-batch", self.max_batch, 1),
            ("--max-queue", self.max_queue, 1),
            ("--max-texts", self.max_texts, 1),
            ("--max-request-bytes", self.max_request_bytes, 1),
            ("--body-timeout-s", self.body_timeout_s, 0.001),
        ]:
            if not math.isfinite(value):
                raise UserError(f"{option} must be a finite number, got {value}")
            if not value >= low:
                raise UserError(f"{option} must be at least {low:g}, got {value}")
        if self.max_texts > self.max_queue:
            raise UserError(f"--max-texts ({self.max_texts}) must not exceed --max-queue ({self.max_queue})")
        return self

    @property
    def window(self) -> float:
        """The batching window in seconds."""
        return self.batch_window_ms / 1000
