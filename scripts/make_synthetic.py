"""Write N synthetic line-aligned English/French pairs with realistic lengths, for scaling measurements.

    python scripts/make_synthetic.py 2000000 /tmp/syn/train        # -> /tmp/syn/train.en, /tmp/syn/train.fr
    python scripts/make_synthetic.py 500000 /tmp/syn/train --from runs/bible/data/train

The material is the Bible corpus's train split: by default read through `translate.sources`
(the `bible.db` that `translate prepare` fetches once into data.cache_dir, ~/.cache/translate),
or, with --from PREFIX, any line-aligned PREFIX.en / PREFIX.fr such as a prepared run's
RUN/data/train. Each verse pair is cut into clauses after , ; : where both sides have as many
clauses (clause i then mostly translates clause i); other verses stay whole. A synthetic pair
takes the English length of a verse drawn at random and fills it with clause pairs drawn at
random among those that still fit, so the lengths follow the corpus's and almost every pair is
unique (a few repeats remain, as in real corpora). The output is deterministic from --seed and written as it is made:
memory does not depend on N.

    python scripts/make_synthetic.py 300000 /tmp/syn/train --lexicon 60000

With --lexicon N the pairs need no corpus: each side is made of pseudo-words (syllables joined)
from a lexicon of N words of its own, drawn with Zipf's law, in sentences whose lengths follow
those of news text (about 25 words, up to 100; the French side about 1.1 times as long). There
is nothing to translate in them, but a SentencePiece vocabulary of 32,000 pieces can be learnt
from them, so that a GPU benchmark sees the shapes of WMT training (scripts/gpu_check.sh).
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import random
import re
import sys
from pathlib import Path

from translate.errors import UserError, run_script
from translate.options import count

CLAUSE_END = re.compile(r"(?<=[,;:])\s+")


def read_pairs(prefix: str | None) -> list[tuple[str, str]]:
    """The verse pairs to recombine: PREFIX.en/.fr, or the Bible source's train split."""
    if prefix:
        src, tgt = Path(f"{prefix}.en"), Path(f"{prefix}.fr")
        if missing := [str(p) for p in (src, tgt) if not p.is_file()]:
            raise UserError(f"--from {prefix}: {missing[0]} not found")
        with open(src, encoding="utf-8") as fs, open(tgt, encoding="utf-8") as ft:
            return [(s.strip(), t.strip()) for s, t in zip(fs, ft) if s.strip() and t.strip()]
    from translate.config import DataConfig
    from translate.sources import bible_source

    return list(bible_source(DataConfig(source="bible"))["train"] or [])


def clause_pairs(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Aligned clause pairs where both sides split into as many clauses; whole verses otherwise."""
    units = []
    for src, tgt in pairs:
        s_parts, t_parts = CLAUSE_END.split(src), CLAUSE_END.split(tgt)
        units += zip(s_parts, t_parts) if len(s_parts) == len(t_parts) else [(src, tgt)]
    return units


def synthetic_pairs(pairs: list[tuple[str, str]], n: int, seed: int):
    """n pairs, each glued from random clause pairs that fit the English length of a random verse."""
    rng = random.Random(seed)
    units = sorted(clause_pairs(pairs), key=lambda u: len(u[0].split()))
    unit_words = [len(s.split()) for s, _ in units]
    verse_words = [len(s.split()) for s, _ in pairs]
    for _ in range(n):
        left = rng.choice(verse_words)
        src, tgt = [], []
        while (fits := bisect.bisect_right(unit_words, left)) or not src:
            k = rng.randrange(max(fits, 1))  # any unit that still fits (the shortest if none does)
            src.append(units[k][0])
            tgt.append(units[k][1])
            left -= unit_words[k]
        yield " ".join(src), " ".join(tgt)


def lexicon(n: int, rng: random.Random, consonants: str, vowels: str) -> list[str]:
    """n distinct pseudo-words of 1-4 syllables, the short ones first (Zipf ranks them first)."""
    syllables = [c + v for c in consonants for v in vowels] + list(vowels)
    words: dict[str, None] = {}
    while len(words) < n:
        k = min(1 + int(rng.expovariate(0.9)), 4)
        words["".join(rng.choice(syllables) for _ in range(k))] = None
    return sorted(words, key=len)


def lexicon_pairs(n: int, words: int, seed: int):
    """n pairs of pseudo-word sentences, lengths like news text's, words drawn by Zipf's law."""
    rng = random.Random(seed)
    en, fr = lexicon(words, rng, "bcdfghklmnprstvw", "aeiou"), lexicon(words, rng, "bcdfjlmnpqrstvz", "aeiouéè")
    weights = [1 / (rank + 1) for rank in range(words)]
    cumulative = list(itertools.accumulate(weights))
    for _ in range(n):
        length = max(1, min(int(rng.lognormvariate(3.1, 0.5)), 100))
        fr_length = max(1, round(length * rng.uniform(0.95, 1.3)))
        src = rng.choices(en, cum_weights=cumulative, k=length)
        tgt = rng.choices(fr, cum_weights=cumulative, k=fr_length)
        yield " ".join(src).capitalize() + ".", " ".join(tgt).capitalize() + "."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("n", type=count, help="number of pairs to write")
    parser.add_argument("out", help="output prefix: writes OUT.en and OUT.fr")
    parser.add_argument("--from", dest="source", metavar="PREFIX", help="read PREFIX.en/PREFIX.fr instead of the Bible")
    parser.add_argument("--lexicon", type=count, metavar="N", help="pseudo-words from a lexicon of N words a side")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.lexicon:
        made, what = (
            lexicon_pairs(args.n, args.lexicon, args.seed),
            f"a lexicon of {args.lexicon:,} pseudo-words a side",
        )
    else:
        pairs = read_pairs(args.source)
        if not pairs:
            sys.exit("error: no sentence pairs to recombine")
        made, what = synthetic_pairs(pairs, args.n, args.seed), f"{len(pairs):,} verse pairs"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{out}.en", "w", encoding="utf-8") as fs, open(f"{out}.fr", "w", encoding="utf-8") as ft:
        for src, tgt in made:
            fs.write(src + "\n")
            ft.write(tgt + "\n")
    print(f"wrote {args.n:,} pairs to {out}.en and {out}.fr (from {what})", file=sys.stderr)


if __name__ == "__main__":
    run_script(main)
