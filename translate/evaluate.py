"""Corpus BLEU and chrF with sacreBLEU's default settings and signatures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sacrebleu.metrics import BLEU, CHRF

from translate.errors import UserError


def score(hypotheses: list[str], references: list[str]) -> dict[str, Any]:
    """Detokenized hypotheses against raw references, one each (13a tokenization, mixed case)."""
    if len(hypotheses) != len(references):
        raise UserError(f"{len(hypotheses)} hypotheses but {len(references)} references: line counts must match")
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
    """Lines of a UTF-8 text file (BOM and CRLF accepted); one clear error for anything else."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} file not found: {path}")
    lines = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise UserError(f"{path}:{number}: not UTF-8 (byte {e.start + 1} of the line)") from None
            if number == 1:
                line = line.removeprefix("\ufeff")
            lines.append(line.rstrip("\r\n"))
    return lines


def write_json(scores: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(scores, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
