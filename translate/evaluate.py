"""Corpus BLEU and chrF with sacreBLEU's default settings and signatures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sacrebleu.metrics import BLEU, CHRF

from translate.errors import UserError, atomic_write, check_output_path, text_lines


def score(hypotheses: list[str], references: list[str]) -> dict[str, Any]:
    """Detokenized hypotheses against raw references, one each (13a tokenization, mixed case)."""
    if len(hypotheses) != len(references):
        raise UserError(f"{len(hypotheses)} hypotheses but {len(references)} references: line counts must match")
    if not references:
        raise UserError("no sentences to score: the references are empty")
    bleu, chrf = BLEU(), CHRF()
    b = bleu.corpus_score(hypotheses, [references])
    c = chrf.corpus_score(hypotheses, [references])
    return {
        "bleu": round(b.score, 2),
        "chrf": round(c.score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "bleu_detail": str(b),
        "sentences": len(hypotheses),
    }


def format_scores(scores: dict[str, Any]) -> str:
    return (
        f"BLEU {scores['bleu']:.2f}  ({scores['bleu_signature']})\n"
        f"chrF {scores['chrf']:.2f}  ({scores['chrf_signature']})\n"
        f"{scores['bleu_detail']}"
    )


def read_lines(path: str | Path, what: str) -> list[str]:
    """Lines of a UTF-8 text file (BOM and CRLF accepted); one clear error for anything else,
    an empty file included (there is nothing to score)."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{what} file not found: {path}")
    if path.is_dir():
        raise UserError(f"{what} file {path} is a directory")
    lines = list(text_lines(open(path, "rb"), str(path)))
    if not lines:
        raise UserError(f"{what} file {path} is empty: nothing to score")
    return lines


def write_json(scores: dict[str, Any], path: str | Path) -> None:
    """Write the scores as JSON: to a temporary file renamed at the end, never half-written."""
    path = check_output_path(path, "--json")
    with atomic_write(path) as f:
        f.write(json.dumps(scores, indent=2, ensure_ascii=False) + "\n")
