"""One joint SentencePiece vocabulary for both languages: PAD=0, UNK=1, BOS=2, EOS=3.

The model lives in the run dir as `spm.model` and, as bytes, inside every checkpoint, so a
checkpoint decodes text with nothing else.
"""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

from translate.errors import UserError

log = logging.getLogger("translate")

PAD, UNK, BOS, EOS = 0, 1, 2, 3  # the token ids every model and data file uses

# Typographic punctuation a vocabulary may lack (one learned from straight quotes and hyphens): in text
# to translate, each is read as its plain form where the vocabulary has that and not it (I don’t know
# would be I don<unk>t know), as Moses' punctuation normalisation does before translation.
PLAIN_PUNCTUATION = {
    **dict.fromkeys("’‘‚′´`", "'"),
    **dict.fromkeys("“”„″«»", '"'),
    **dict.fromkeys("‐‑‒–—―−", "-"),
}


class Tokenizer:
    def __init__(self, model_bytes: bytes) -> None:
        self.model_bytes = bytes(model_bytes)
        self.sp = spm.SentencePieceProcessor(model_proto=self.model_bytes)
        ids = (self.sp.pad_id(), self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id())
        if ids != (PAD, UNK, BOS, EOS):
            raise UserError(f"SentencePiece model has PAD/UNK/BOS/EOS ids {ids}, expected (0, 1, 2, 3)")
        lacks = {c: UNK in self.sp.encode(c) for c in {*PLAIN_PUNCTUATION, *PLAIN_PUNCTUATION.values()}}
        self.plain = str.maketrans({c: p for c, p in PLAIN_PUNCTUATION.items() if lacks[c] and not lacks[p]})

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        if not path.is_file():
            raise UserError(f"SentencePiece model not found: {path}")
        try:
            return cls(path.read_bytes())
        except RuntimeError:
            raise UserError(f"{path}: not a SentencePiece model") from None

    @classmethod
    def train(
        cls,
        sentences: Iterable[str],
        vocab_size: int,
        model_type: str = "unigram",
        character_coverage: float = 1.0,
        seed: int = 1,
        user_symbols: Iterable[str] = (),
    ) -> Tokenizer:
        """Train on the given sentences (a sample of both sides of the train split); each of
        `user_symbols` becomes one piece (the placeholders of translate/protect.py)."""
        model = io.BytesIO()
        spm.set_random_generator_seed(seed)
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(sentences),
                model_writer=model,
                vocab_size=vocab_size,
                model_type=model_type,
                character_coverage=character_coverage,
                pad_id=PAD,
                unk_id=UNK,
                bos_id=BOS,
                eos_id=EOS,
                input_sentence_size=0,  # the caller already sampled
                max_sentence_length=16384,
                hard_vocab_limit=True,
                user_defined_symbols=list(user_symbols),
                minloglevel=2,
            )
        except RuntimeError as e:
            limit = re.search(r"value <= (\d+)", str(e))
            if limit:
                raise UserError(
                    f"vocab.size {vocab_size} is too large for this corpus: set it to at most {limit.group(1)}"
                ) from None
            required = re.search(r"smaller than required_chars\. \d+ vs (\d+)", str(e))
            if required:  # the pieces must hold every character kept, and the special and placeholder pieces
                raise UserError(
                    f"vocab.size {vocab_size} is too small for this corpus: its characters alone need "
                    f"{required.group(1)} pieces; raise vocab.size"
                ) from None
            raise
        return cls(model.getvalue())

    def save(self, path: str | Path) -> None:
        from translate.textio import atomic_write

        with atomic_write(path, "wb") as f:  # a model that was there stays whole if this fails
            f.write(self.model_bytes)

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Texts to translate -> piece ids (no BOS/EOS), typographic punctuation the vocabulary lacks
        read as its plain form (PLAIN_PUNCTUATION; the prepared data is encoded as it is)."""
        return self.sp.encode([t.translate(self.plain) for t in texts] if self.plain else texts, out_type=int)

    def decode(self, ids: list[list[int]]) -> list[str]:
        """Piece ids -> detokenized text; PAD/BOS/EOS are dropped, and the space of a last bare '▁' piece
        (no text ends in a space; Hugging Face's Marian tokenizer drops it too)."""
        return [
            text.rstrip(" ") for text in self.sp.decode([[i for i in seq if i not in (PAD, BOS, EOS)] for seq in ids])
        ]

    def pieces(self, text: str) -> list[str]:
        return self.sp.encode(text.translate(self.plain), out_type=str)

    def id_to_piece(self, i: int) -> str:
        return self.sp.id_to_piece(i)
