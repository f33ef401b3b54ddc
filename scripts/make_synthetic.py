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
"""

from __future__ import annotations

import argparse
import bisect
import random
import re
import sys
from pathlib import Path

CLAUSE_END = re.compile(r"(?<=[,;:])\s+")


def read_pairs(prefix: str | None) -> list[tuple[str, str]]:
    """The verse pairs to recombine: PREFIX.en/.fr, or the Bible source's train split."""
    if prefix:
        src, tgt = Path(f"{prefix}.en"), Path(f"{prefix}.fr")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("n", type=int, help="number of pairs to write")
    parser.add_argument("out", help="output prefix: writes OUT.en and OUT.fr")
    parser.add_argument("--from", dest="source", metavar="PREFIX", help="read PREFIX.en/PREFIX.fr instead of the Bible")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    pairs = read_pairs(args.source)
    if not pairs:
        sys.exit("error: no sentence pairs to recombine")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{out}.en", "w", encoding="utf-8") as fs, open(f"{out}.fr", "w", encoding="utf-8") as ft:
        for src, tgt in synthetic_pairs(pairs, args.n, args.seed):
            fs.write(src + "\n")
            ft.write(tgt + "\n")
    print(f"wrote {args.n:,} pairs to {out}.en and {out}.fr (from {len(pairs):,} verse pairs)", file=sys.stderr)


if __name__ == "__main__":
    main()
