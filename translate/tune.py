"""The length penalty chosen on held-out pairs: `decode.tune_length_penalty` at the end of
training, and `translate tune` for any checkpoint.

Beam search ranks finished hypotheses by log-probability / ((5 + length) / 6) ** alpha (GNMT's
length penalty), so alpha decides how long the output comes out. The best alpha is a property of
the trained model, not of the config: checkpoints of one config trained with other seeds or
vocabularies prefer 0.6 or 1.0 by up to 0.9 BLEU (docs/experiments.md). So each value of a grid
translates the held-out sources as `translate evaluate` does (the checkpoint's beam, a line's
sentences apart), the highest BLEU wins (a tie: the value nearest the one configured), and the
choice goes into the checkpoint's decode section, which every command that translates takes its
defaults from, with the scores beside it (`tune_length_penalty` in the checkpoint; `translate
info` shows them).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from translate.checkpoint import atomic_save, link, load_checkpoint
from translate.engine import Engine, EngineSpec
from translate.errors import UserError
from translate.evaluate import score
from translate.textio import check_output_path, through_link
from translate.translator import CHUNK_LINES, translate_texts

log = logging.getLogger("translate")

GRID = (0.6, 0.8, 1.0, 1.2)  # `translate tune`'s default grid


@dataclass(frozen=True)
class Choice:
    """The outcome of a search over length penalties, as it is kept in the checkpoint."""

    chosen: float
    before: float  # decode.length_penalty as configured, before the first choice
    bleu: dict[float, float]  # alpha -> BLEU of the held-out pairs
    beam_size: int
    lines: int  # held-out lines translated at each alpha

    def summary(self) -> str:
        scores = ", ".join(f"{float(a)}: {b:.2f}" for a, b in self.bleu.items())
        return f"length penalty {float(self.chosen)} (was {float(self.before)}; BLEU at {scores}; beam {self.beam_size}, {self.lines} lines)"


def check_grid(grid: Sequence[float], name: str) -> list[float]:
    """The grid as a sorted list without repeats; a UserError for an empty grid or a negative value."""
    values = sorted(set(float(a) for a in grid))
    if not values:
        raise UserError(f"{name} needs at least one length penalty")
    for alpha in values:
        if not (alpha >= 0 and math.isfinite(alpha)):  # NaN fails both comparisons, so check each value
            raise UserError(f"{name}: a length penalty must be a finite number >= 0, got {alpha:g}")
    return values


def choose(bleu: dict[float, float], before: float) -> float:
    """The alpha of the highest BLEU; among equals, the one nearest `before`."""
    return max(bleu, key=lambda a: (bleu[a], -abs(a - before)))


def search_length_penalty(
    engine: Engine,
    sources: Sequence[str],
    references: Sequence[str],
    grid: Sequence[float],
    *,
    split: bool = True,
    on_alpha: Callable[[float, float], object] | None = None,
) -> Choice:
    """Translate `sources` at each alpha of `grid` (the engine's other search options) and score
    them against `references`; `on_alpha(alpha, bleu)` after each."""
    if len(sources) != len(references):
        raise UserError(f"{len(sources)} source lines but {len(references)} references: line counts must match")
    bleu = {}
    for alpha in grid:
        options = engine.defaults.given(length_penalty=alpha)
        hypotheses = []
        for start in range(0, len(sources), CHUNK_LINES):
            chunk = list(sources[start : start + CHUNK_LINES])
            hypotheses += translate_texts(engine, chunk, options, split=split)
        bleu[alpha] = score(hypotheses, list(references))["bleu"]
        if on_alpha:
            on_alpha(alpha, bleu[alpha])
    before = engine.defaults.length_penalty
    return Choice(choose(bleu, before), before, bleu, engine.defaults.beam_size, len(sources))


def write_choice(path: Path, choice: Choice, ckpt: dict[str, Any] | None = None) -> list[Path]:
    """The choice into the checkpoint at `path` (its decode.length_penalty and the scores), saved
    atomically; the other names of that file in its directory (best.pt, last.pt and step_N.pt are
    hard links of one file) are linked to the new one. Returns every name updated."""
    path = through_link(path)  # a link's file is tuned, and that file's other names (hard links) beside it
    ckpt = ckpt if ckpt is not None else load_checkpoint(path)
    twins = [
        p
        for p in sorted(path.parent.glob("*.pt"))
        if p != path and not p.is_symlink() and p.exists() and p.samefile(path)
    ]
    if earlier := ckpt.get("tune_length_penalty"):  # tuned again: `before` stays the configured value
        choice = replace(choice, before=earlier["before"])
    ckpt["config"]["decode"]["length_penalty"] = choice.chosen
    ckpt["tune_length_penalty"] = asdict(choice)
    atomic_save(ckpt, path)
    for twin in twins:
        link(path, twin)
    return [path, *twins]


def tune_checkpoint(
    path: Path,
    sources: Sequence[str],
    references: Sequence[str],
    grid: Sequence[float] | None = None,
    *,
    spec: EngineSpec | None = None,
    write: bool = True,
    skip_if_done: bool = False,
    split: bool = True,
) -> tuple[Choice | None, list[Path]]:
    """Search `grid` (None: the checkpoint's decode.tune_length_penalty, else GRID) for the
    checkpoint at `path` (loaded by `spec`, default: as `translate
    evaluate` loads it; `split`: a line's sentences apart), logging each alpha, and write the
    choice into it (`write`). With `skip_if_done`, nothing is done where the checkpoint already
    keeps a choice of the same search: (None, []). The search uses the checkpoint's beam
    (spec.beam_size is ignored). Returns the choice and the files written."""
    ckpt = load_checkpoint(path)
    kept = ckpt.get("tune_length_penalty")
    grid = check_grid(grid or ckpt["config"]["decode"].get("tune_length_penalty") or GRID, "the length-penalty grid")
    beam = ckpt["config"]["decode"]["beam_size"]
    if (
        skip_if_done
        and kept
        and sorted(kept["bleu"]) == grid
        and (kept["beam_size"], kept["lines"]) == (beam, len(sources))
    ):
        log.info(f"{path}: length penalty {float(kept['chosen'])} already chosen on these pairs; not searched again")
        return None, []
    if write:  # before the search, not after it
        check_output_path(path, "checkpoint")
    engine = Engine.load(
        replace(spec, checkpoints=[path], beam_size=None, length_penalty=None) if spec else EngineSpec([path])
    )
    start = time.perf_counter()

    def logged(alpha: float, bleu: float) -> None:
        log.info(f"length penalty {float(alpha)}: BLEU {bleu:.2f} ({len(sources)} lines, beam {beam})")

    choice = search_length_penalty(engine, sources, references, grid, split=split, on_alpha=logged)
    del engine
    written = write_choice(path, choice, ckpt) if write else []
    where = f"; written into {', '.join(p.name for p in written)}" if written else ""
    log.info(f"chose {choice.summary()} in {time.perf_counter() - start:.0f} s{where}")
    return choice, written
