"""Corpus BLEU and chrF with sacreBLEU's default settings and signatures."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sacrebleu.metrics import BLEU, CHRF

from translate.errors import UserError


def score(hypotheses: list[str], references: list[str], *more: list[str]) -> dict[str, Any]:
    """Detokenized hypotheses against raw references, one each (13a tokenization, mixed case); `more`:
    further references of the same sentences (multi-reference BLEU and chrF, `nrefs:N` in the signatures)."""
    if (other := next((refs for refs in (references, *more) if len(refs) != len(hypotheses)), None)) is not None:
        raise UserError(f"{len(hypotheses)} hypotheses but {len(other)} references: line counts must match")
    if not references:
        raise UserError("no sentences to score: the references are empty")
    bleu, chrf = BLEU(), CHRF()
    b = bleu.corpus_score(hypotheses, [references, *more])
    c = chrf.corpus_score(hypotheses, [references, *more])
    return {
        "bleu": round(b.score, 2),
        "chrf": round(c.score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "bleu_detail": str(b),
        "sentences": len(hypotheses),
    }


def sentence_chrf(hypotheses: Sequence[str], references: Sequence[str]) -> list[float]:
    """sacreBLEU's sentence-level chrF of each hypothesis against its reference (0..100)."""
    chrf = CHRF()
    return [round(chrf.sentence_score(h, [r]).score, 2) for h, r in zip(hypotheses, references, strict=True)]


def format_scores(scores: dict[str, Any]) -> str:
    return (
        f"BLEU {scores['bleu']:.2f}  ({scores['bleu_signature']})\n"
        f"chrF {scores['chrf']:.2f}  ({scores['chrf_signature']})\n"
        f"{scores['bleu_detail']}"
    )
