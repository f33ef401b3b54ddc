"""Write verse pairs of the offline Bible corpus as line-aligned files, PREFIX.en and PREFIX.fr:
any English and French translation of the db, any books, cleaned as `data.source: bible` cleans
them. Used to make the adaptation example's "corpus of your own" (docs/training.md, Adapting):

    python scripts/bible_corpus.py my/corpus --en 3 --fr 5 --books 45-49,51-58,60-65

(the Bible in Basic English and Darby's French of the New Testament letters, Philippians and
James left out: neither translation is in the default model's training data, whose English is
the World English Bible and whose French is Louis Segond).
"""

from __future__ import annotations

import argparse
import sqlite3
from pathlib import Path

from translate.config import DataConfig
from translate.errors import UserError, run_script
from translate.sources import bible_pairs, fetch_bible_db


def book_numbers(spec: str) -> set[int]:
    """Book numbers (1 Genesis ... 66 Revelation) of a list like 45-49,51-58."""
    books: set[int] = set()
    for part in spec.split(","):
        first, _, last = part.partition("-")
        try:
            numbers = range(int(first), int(last or first) + 1)
        except ValueError:
            raise UserError(f"--books: {part!r} is not a book number or a range like 45-49") from None
        if not numbers or not 1 <= numbers[0] <= numbers[-1] <= 66:
            raise UserError(f"--books: {part!r} is not within the books 1 to 66, first to last")
        books.update(numbers)
    return books


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prefix", type=Path, help="writes PREFIX.en and PREFIX.fr")
    parser.add_argument("--en", default="4", help="English translation code (4 WEB, k KJV, 3 BBE)")
    parser.add_argument("--fr", default="l", help="French translation code (l Louis Segond, 5 Darby)")
    parser.add_argument("--books", default="1-66", help="book numbers, e.g. 45-49,51-58")
    parser.add_argument("--db", type=Path, help="a bible.db to read (as data.bible_db); default: the one fetched")
    args = parser.parse_args()
    books = book_numbers(args.books)
    db = args.db or fetch_bible_db(Path(DataConfig().cache_dir).expanduser())
    if not db.is_file():
        raise UserError(f"--db: file not found: {db}")
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        pairs = [pair for book, pair in bible_pairs(con, args.en, args.fr, db) if book in books]
    except sqlite3.DatabaseError as e:
        raise UserError(f"{db}: not a readable bible.db ({e})") from None
    finally:
        con.close()
    args.prefix.parent.mkdir(parents=True, exist_ok=True)
    for side, lang in enumerate(("en", "fr")):
        Path(f"{args.prefix}.{lang}").write_text("".join(p[side] + "\n" for p in pairs), encoding="utf-8")
    print(f"{len(pairs):,} pairs of {len(books)} books ({args.en} -> {args.fr}) in {args.prefix}.en / .fr")


if __name__ == "__main__":
    run_script(main)
