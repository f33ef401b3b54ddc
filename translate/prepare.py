"""From raw pairs to the prepared data of a run: clean, split, learn the vocabulary, encode once.

`prepare(cfg)` writes the run's data dir in a few streaming passes, in memory that does not
grow with the corpus (8 bytes a pair for the dedupe hashes; see data/README.md):

    RUN/data/{train,valid,test}.{src_lang,tgt_lang}   cleaned text, one sentence per line
    RUN/data/{split}.{src,tgt}.npy                   all piece ids of a split, concatenated
    RUN/data/{split}.{src,tgt}.offsets.npy           where each sentence starts (n + 1 entries)
    RUN/data/meta.json                               counts, fingerprint of what made it
    RUN/spm.model                                    the joint SentencePiece vocabulary

The id arrays are written and read by data.py.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import json
import logging
import multiprocessing
import os
import random
import shutil
import signal
import sys
from collections import deque
from collections.abc import Generator, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm
from tqdm import tqdm

from translate.adapt import init_vocabulary, vocabulary_hash
from translate.checkpoint import newest_checkpoint
from translate.config import Config, config_to_dict
from translate.data import TokenWriter, token_dtype
from translate.errors import UserError
from translate.protect import augment_pairs, has_placeholders, placeholder_symbols
from translate.sources import open_source
from translate.textio import atomic_write
from translate.tokenizer import Tokenizer

log = logging.getLogger("translate")
SPLITS = ("train", "valid", "test")
CLEAN_CHUNK = 50_000  # pairs hashed and deduplicated at a time
ENCODE_CHUNK = 10_000  # pairs sent to an encoding worker at a time


# ---------------------------------------------------------------------------- cleaning


def normalize(text: str) -> str:
    """Collapse every run of whitespace (tabs, newlines, NBSP ...) to one space."""
    return " ".join(text.split())


class SeenHashes:
    """A set of 64-bit hashes held in a few sorted numpy arrays: 8 bytes a hash, no Python objects.

    Each `add` appends its new hashes as the smallest array and merges neighbours of similar
    size (the levels of an LSM tree), so there are O(log n) arrays, a lookup is a binary search
    in each, and a hash is copied O(log n) times in all.
    """

    def __init__(self) -> None:
        self.levels: list[np.ndarray] = []  # sorted uint64 arrays, largest first

    def __len__(self) -> int:
        return sum(len(level) for level in self.levels)

    def add(self, keys: np.ndarray) -> np.ndarray:
        """Add (n,) uint64 keys; return the (n,) mask of those not seen before (first occurrence)."""
        unique, first = np.unique(keys, return_index=True)
        fresh = np.ones(len(unique), dtype=bool)
        for level in self.levels:
            found = level[np.searchsorted(level, unique).clip(max=len(level) - 1)]
            fresh &= found != unique
        mask = np.zeros(len(keys), dtype=bool)
        mask[first[fresh]] = True
        if fresh.any():
            self.levels.append(unique[fresh])
        while len(self.levels) > 1 and len(self.levels[-2]) <= 2 * len(self.levels[-1]):
            merged = np.concatenate([self.levels.pop(-2), self.levels.pop()])
            merged.sort(kind="stable")  # timsort: a merge of two sorted runs, O(n)
            self.levels.append(merged)
        return mask


def pair_hashes(pairs: list[tuple[str, str]]) -> np.ndarray:
    """(n,) uint64: an 8-byte blake2b hash of each pair."""
    digests = (hashlib.blake2b(f"{s}\t{t}".encode(), digest_size=8).digest() for s, t in pairs)
    return np.frombuffer(b"".join(digests), dtype=np.uint64)


def clean_text_pairs(
    pairs: Iterable[tuple[str, str]], split: str, counts: dict[str, int], limit: int | None = None
) -> Iterator[tuple[str, str]]:
    """Normalise whitespace, drop pairs with an empty side, drop exact duplicates within the split;
    stop after `limit` kept pairs, having read no further than needed.

    Duplicates are found by a hash of the pair, a chunk of pairs at a time, so memory grows by
    8 bytes a pair (`SeenHashes`), not by the text. The first occurrence is kept, in order.
    """
    seen, chunk, kept = SeenHashes(), [], 0
    want = CLEAN_CHUNK if limit is None else min(CLEAN_CHUNK, limit)
    for src, tgt in pairs:
        counts["read"] += 1
        src, tgt = normalize(src), normalize(tgt)
        if not src or not tgt:
            counts["empty"] += 1
            continue
        counts["same"] += src == tgt
        chunk.append((src, tgt))
        if len(chunk) == want:
            kept += yield from _unseen(chunk, seen, counts)
            if limit is not None and kept == limit:
                return
            chunk, want = [], CLEAN_CHUNK if limit is None else min(CLEAN_CHUNK, limit - kept)
    yield from _unseen(chunk, seen, counts)


def _unseen(
    chunk: list[tuple[str, str]], seen: SeenHashes, counts: dict[str, int]
) -> Generator[tuple[str, str], None, int]:
    """The pairs of `chunk` whose hash is not in `seen` (now added); returns how many."""
    new = seen.add(pair_hashes(chunk))
    counts["duplicate"] += len(chunk) - int(new.sum())
    yield from itertools.compress(chunk, new.tolist())
    return int(new.sum())


def keep_lengths(src_len: int, tgt_len: int, max_len: int, max_ratio: float) -> str | None:
    """Why a train pair of these token lengths is dropped, or None to keep it."""
    if src_len > max_len or tgt_len > max_len:
        return "too_long"
    if max(src_len, tgt_len) > max_ratio * min(src_len, tgt_len):
        return "bad_ratio"
    return None


def length_filter(src_lens: np.ndarray, tgt_lens: np.ndarray, max_len: int, max_ratio: float) -> dict[str, np.ndarray]:
    """`keep_lengths` on (n,) arrays: the (n,) masks of the pairs dropped for each reason."""
    too_long = (src_lens > max_len) | (tgt_lens > max_len)
    bad_ratio = ~too_long & (np.maximum(src_lens, tgt_lens) > max_ratio * np.minimum(src_lens, tgt_lens))
    return {"too_long": too_long, "bad_ratio": bad_ratio}


# ---------------------------------------------------------------------------- token arrays

# ---------------------------------------------------------------------------- prepare


def fingerprint(cfg: Config) -> str:
    """What the prepared data depends on: the data and vocab config (and the source files' sizes)."""
    raw = {"data": config_to_dict(cfg)["data"], "vocab": config_to_dict(cfg)["vocab"], "seed": cfg.seed}
    raw["data"].pop("num_workers", None)  # how many processes encode does not change the result
    if cfg.data.protect_share > 0:  # placeholder pairs are added beside the originals (they once replaced them)
        raw["placeholder_pairs"] = "added"
    if cfg.train.init_from:  # the vocabulary is the checkpoint's, whatever the vocab section says
        raw["vocab"] = vocabulary_hash(cfg)
    for key, files in source_files(cfg).items():
        raw[f"{key}_files"] = sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    return hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode()).hexdigest()[:16]


def source_files(cfg: Config) -> dict[str, list[Path]]:
    """The files each data key given reads, as the sources open them: data.train/valid/test's
    PREFIX.<src_lang> and PREFIX.<tgt_lang> (or the .tsv / .jsonl file), every file of a local
    data.dataset directory, data.bible_db. Paths as the config gives them, `~` expanded."""
    d, found = cfg.data, {}
    for key in ("train", "valid", "test", "dataset", "bible_db"):  # each key given, its list empty where none is
        if not (value := getattr(d, key)):
            continue
        path = Path(value).expanduser()
        if key == "dataset":  # a local directory; a hub name reads the hub's cache
            files = list(path.rglob("*")) if path.is_dir() else []
        elif key == "bible_db" or path.suffix.lower() in (".tsv", ".jsonl"):
            files = [path]
        else:
            files = [Path(f"{path}.{lang}") for lang in dict.fromkeys((d.src_lang, d.tgt_lang))]
        found[key] = [p for p in files if p.is_file()]
    return found


def source_sizes(cfg: Config) -> dict[str, int]:
    """Each source file's size in bytes, by path."""
    return {str(p): p.stat().st_size for files in source_files(cfg).values() for p in files}


def changed_sources(cfg: Config) -> list[str]:
    """The source files that are gone or of another size since the run's data was prepared from them,
    and those read now that were not then (a file added to a dataset directory; only where meta.json
    says that its list is of exactly the files read): nothing where a version recorded none."""
    meta = read_meta(cfg) or {}
    then = meta.get("sources")
    if then is None:
        return []
    changed = {path for path in then if then[path] != _size(Path(path))}
    if meta.get("sources_exact"):
        changed |= set(source_sizes(cfg)) - set(then)
    return sorted(changed)


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size if path.is_file() else None
    except OSError:
        return None


def read_meta(cfg: Config) -> dict | None:
    """The run's data/meta.json, or None where there is none that can be read (a prepare that
    never finished, a file cut short on a full disk)."""
    try:
        meta = json.loads((cfg.run_path / "data" / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def is_prepared(cfg: Config) -> bool:
    if not (cfg.run_path / "spm.model").is_file():
        return False
    return (read_meta(cfg) or {}).get("fingerprint") == fingerprint(cfg)


def _read_pairs(data_dir: Path, split: str, cfg: Config) -> Iterator[tuple[str, str]]:
    with (
        open(data_dir / f"{split}.{cfg.data.src_lang}", encoding="utf-8") as fs,
        open(data_dir / f"{split}.{cfg.data.tgt_lang}", encoding="utf-8") as ft,
    ):
        for s, t in zip(fs, ft):
            yield s.rstrip("\n"), t.rstrip("\n")


def _clean_splits(cfg: Config, data_dir: Path) -> dict[str, int]:
    """Stream every split through the cleaning into text files; hold out valid/test if missing."""
    sources = open_source(cfg.data)
    sizes = {}
    for split in SPLITS:
        pairs = sources.get(split)
        if pairs is None:
            continue
        counts = {"read": 0, "empty": 0, "duplicate": 0, "same": 0}
        cleaned = clean_text_pairs(pairs, split, counts, cfg.data.max_train_pairs if split == "train" else None)
        n = 0
        with (
            open(data_dir / f"{split}.{cfg.data.src_lang}", "w", encoding="utf-8") as fs,
            open(data_dir / f"{split}.{cfg.data.tgt_lang}", "w", encoding="utf-8") as ft,
        ):
            for src, tgt in tqdm(
                cleaned, desc=f"clean {split}", unit=" pairs", leave=False, mininterval=1, disable=None
            ):
                fs.write(src + "\n")
                ft.write(tgt + "\n")
                n += 1
        log.info(
            f"{split}: read {counts['read']:,} pairs, dropped {counts['empty']:,} with an empty side "
            f"and {counts['duplicate']:,} duplicates, kept {n:,}"
        )
        if counts["same"] > (counts["read"] - counts["empty"]) / 2:
            log.warning(
                f"{split}: {counts['same']:,} of {counts['read'] - counts['empty']:,} pairs have the same text on both "
                f"sides: are the {cfg.data.src_lang} and {cfg.data.tgt_lang} sides the same file or column?"
            )
        if n == 0:
            raise UserError(
                f"the {split} split is empty after cleaning (read {counts['read']}, "
                f"{counts['empty']} had an empty side, {counts['duplicate']} were duplicates)"
            )
        sizes[split] = n
    missing = [s for s in ("valid", "test") if s not in sizes]
    if missing:
        sizes.update(_hold_out(cfg, data_dir, sizes["train"], missing))
    return sizes


def _hold_out(cfg: Config, data_dir: Path, n_train: int, missing: list[str]) -> dict[str, int]:
    """Move a random, reproducible part of train into the missing valid/test splits."""
    want = {"valid": cfg.data.valid_size, "test": cfg.data.test_size}
    need = sum(want[s] for s in missing)
    if 2 * need >= n_train:
        files = "data.valid/data.test or " if cfg.data.source == "files" else ""  # hub and bible read no such files
        raise UserError(
            f"train has only {n_train} pairs after cleaning: too few to hold out "
            f"{' and '.join(f'{want[s]} {s}' for s in missing)} pairs (less than half of train is held out; "
            f"set {files}data.valid_size/test_size)"
        )
    picked = random.Random(cfg.seed).sample(range(n_train), need)
    assign: dict[int, str] = {}
    start = 0
    for split in missing:
        for i in picked[start : start + want[split]]:
            assign[i] = split
        start += want[split]
    src, tgt = cfg.data.src_lang, cfg.data.tgt_lang
    outs = {
        s: [open(data_dir / f"{s}.{lang}.tmp", "w", encoding="utf-8") for lang in (src, tgt)]
        for s in ["train", *missing]
    }
    for i, (s_text, t_text) in enumerate(_read_pairs(data_dir, "train", cfg)):
        fs, ft = outs[assign.get(i, "train")]
        fs.write(s_text + "\n")
        ft.write(t_text + "\n")
    for split, (fs, ft) in outs.items():
        fs.close()
        ft.close()
        for lang in (src, tgt):
            Path(data_dir / f"{split}.{lang}.tmp").replace(data_dir / f"{split}.{lang}")
    log.info(f"held out {', '.join(f'{want[s]:,} {s}' for s in missing)} pairs of train (no such split in the source)")
    return {"train": n_train - need, **{s: want[s] for s in missing}}


def _sample_sentences(cfg: Config, data_dir: Path, n_train: int) -> list[str]:
    """A reproducible random sample of at most vocab.sample_size train sentences: both sides of
    sample_size / 2 pairs. Read into a list before SentencePiece starts, so that the text read
    and dropped meanwhile does not fragment the memory SentencePiece allocates."""
    per_side = min(max(cfg.vocab.sample_size // 2, 1), n_train)
    chosen = set(np.random.default_rng(cfg.seed).choice(n_train, per_side, replace=False).tolist())
    return [side for i, pair in enumerate(_read_pairs(data_dir, "train", cfg)) if i in chosen for side in pair]


# ---------------------------------------------------------------------------- encoding


def encode_pairs(
    sp: spm.SentencePieceProcessor, pairs: list[tuple[str, str]], dtype: np.dtype, limits: tuple[int, float] | None
) -> tuple[list[np.ndarray], dict[str, int]]:
    """Encode a chunk of pairs: [src ids, src lengths, tgt ids, tgt lengths] of the kept pairs
    (ids concatenated, without BOS/EOS) and the counts of pairs dropped by the (max_len, max_ratio)
    `limits`, if given."""
    arrays, lengths = [], []
    for side in (0, 1):
        ids = sp.encode([p[side] for p in pairs], out_type=int, num_threads=1)
        lens = np.fromiter(map(len, ids), np.int64, len(ids))
        arrays.append(np.fromiter(itertools.chain.from_iterable(ids), dtype, int(lens.sum())))
        lengths.append(lens)
    keep, dropped = np.ones(len(pairs), dtype=bool), {}
    if limits:  # lengths as the model sees them: + EOS (source) and + BOS/EOS (target)
        for why, mask in length_filter(lengths[0] + 1, lengths[1] + 1, *limits).items():
            dropped[why] = int(mask.sum())
            keep &= ~mask
    out = []
    for ids, lens in zip(arrays, lengths):
        out += [ids[np.repeat(keep, lens)], lens[keep]]
    return out, dropped


_worker_sp: spm.SentencePieceProcessor | None = None
PR_SET_PDEATHSIG = 1  # prctl(2)


def end_with_parent(parent: int) -> None:
    """On Linux, have this (forked) process sent SIGTERM when its parent ends, however it ends: a
    `translate prepare` killed by the OOM killer or `kill -9` would otherwise leave its workers
    running, holding the run's lock (their copy of its file) until killed by hand."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent ended before prctl took effect
        os._exit(1)


def _start_worker(model_bytes: bytes, parent: int) -> None:
    global _worker_sp
    # Ctrl-C reaches the whole process group: the parent stops the pool, its workers say nothing; a
    # SIGTERM ends a worker quietly (forked, it would otherwise run the command's handler)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    end_with_parent(parent)
    _worker_sp = spm.SentencePieceProcessor(model_proto=model_bytes)


def _encode_in_worker(*args: Any) -> tuple[list[np.ndarray], dict[str, int]]:
    return encode_pairs(_worker_sp, *args)


def _encoded_chunks(tasks: Iterable[tuple[Any, ...]], tok: Tokenizer, workers: int) -> Iterator[Any]:
    """`encode_pairs` over the tasks, in order, by `workers` processes (0: in this one), reading at
    most 2 * workers tasks ahead of the results (Pool.imap would read all of them into memory)."""
    if not workers:
        yield from (encode_pairs(tok.sp, *task) for task in tasks)
        return
    # fork: a worker starts in milliseconds and shares the parent's memory until it writes to it
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
    with ProcessPoolExecutor(
        workers, mp_context=context, initializer=_start_worker, initargs=(tok.model_bytes, os.getpid())
    ) as pool:
        pending: deque[Future] = deque()
        try:
            for task in itertools.chain(tasks, [None]):  # None: no more tasks, collect the rest
                if task is not None:
                    pending.append(pool.submit(_encode_in_worker, *task))
                while pending and (len(pending) > 2 * workers or task is None):
                    yield pending.popleft().result()
        except BrokenProcessPool:
            raise UserError(
                f"an encoding worker process died (killed for lack of memory?): lower data.num_workers={workers}"
            ) from None


def _encode_split(cfg: Config, tok: Tokenizer, data_dir: Path, split: str, n: int, workers: int) -> dict[str, int]:
    """Encode a split to id arrays on disk; for train, drop pairs that are too long or too unbalanced."""
    limits = (cfg.data.max_len, cfg.data.max_ratio) if split == "train" else None
    pairs = _read_pairs(data_dir, split, cfg)
    if split == "train" and cfg.data.protect_share > 0 and has_placeholders(tok):
        pairs = augment_pairs(pairs, cfg.data.protect, cfg.data.protect_share, cfg.seed)
        n = round(n * (1 + cfg.data.protect_share))  # the bar's total, with the placeholder copies
    chunks = iter(lambda: list(itertools.islice(pairs, ENCODE_CHUNK)), [])
    results = _encoded_chunks(((chunk, token_dtype(tok.vocab_size), limits) for chunk in chunks), tok, workers)
    writers = [TokenWriter(data_dir / f"{split}.{side}", tok.vocab_size) for side in ("src", "tgt")]
    stats = {"pairs": 0, "src_tokens": 0, "tgt_tokens": 0, "too_long": 0, "bad_ratio": 0}
    with tqdm(total=n, desc=f"encode {split}", unit=" pairs", leave=False, mininterval=1, disable=None) as bar:
        for (src, src_lens, tgt, tgt_lens), dropped in results:
            writers[0].append(src, src_lens)
            writers[1].append(tgt, tgt_lens)
            stats["pairs"] += len(src_lens)
            stats["src_tokens"] += len(src)
            stats["tgt_tokens"] += len(tgt)
            for why, count in dropped.items():
                stats[why] += count
            bar.update(len(src_lens) + sum(dropped.values()))
    for writer in writers:
        writer.close()
    if split == "train":
        log.info(
            f"train: dropped {stats['too_long']:,} pairs longer than data.max_len={cfg.data.max_len} tokens and "
            f"{stats['bad_ratio']:,} with a length ratio above data.max_ratio={cfg.data.max_ratio}; "
            f"{stats['pairs']:,} remain" + (" (placeholder copies included)" if cfg.data.protect_share > 0 else "")
        )
        if not stats["pairs"]:
            raise UserError(
                f"no train pair is left after the length filters (data.max_len={cfg.data.max_len}, "
                f"data.max_ratio={cfg.data.max_ratio}): raise them"
            )
    return {k: stats[k] for k in ("pairs", "src_tokens", "tgt_tokens")}


def prepare(cfg: Config, force: bool = False) -> Path:
    """Make RUN/data and RUN/spm.model for this config; reuse them when nothing changed.

    Everything is built in RUN/data/.partial and moved into place only when whole, so that a
    prepare that fails (a bad line in a source, a full disk, Ctrl-C) leaves the data that was there."""
    run, data_dir = cfg.run_path, cfg.run_path / "data"
    stage = data_dir / ".partial"
    shutil.rmtree(stage, ignore_errors=True)  # what a prepare killed midway left
    if not force and is_prepared(cfg):
        log.info(f"{data_dir}: already prepared for this config, nothing to do")
        return data_dir
    new_dir = not data_dir.exists()
    stage.mkdir(parents=True)
    try:
        tok, stats = _build(cfg, stage)
        meta_path = data_dir / "meta.json"
        meta_path.unlink(missing_ok=True)  # from here the old data is no longer whole: never taken for prepared
        for path in stage.iterdir():
            os.replace(path, data_dir / path.name)
        tok.save(run / "spm.model")  # before the fingerprint, which may hash it (vocabulary_hash)
        meta = {"fingerprint": fingerprint(cfg), "sources": source_sizes(cfg), "sources_exact": True}
        meta["cwd"] = os.getcwd()  # where relative source paths were read from
        meta.update(vocab_size=tok.vocab_size, splits=stats)
        with atomic_write(meta_path) as f:  # last, and whole or not at all: it marks the data prepared
            f.write(json.dumps(meta, indent=2))
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if new_dir and not any(data_dir.iterdir()):  # a first prepare that failed leaves no empty data dir
            data_dir.rmdir()
    for split, s in stats.items():
        log.info(f"{split}: {s['pairs']:,} pairs, {s['src_tokens']:,} source and {s['tgt_tokens']:,} target pieces")
    return data_dir


def _build(cfg: Config, data_dir: Path) -> tuple[Tokenizer, dict[str, dict[str, int]]]:
    """The cleaned splits, their id arrays and the vocabulary, written into `data_dir`; the
    tokenizer and each split's counts."""
    init_model = init_vocabulary(cfg)  # before the corpus is read: a checkpoint that is not there costs no time
    sizes = _clean_splits(cfg, data_dir)
    if init_model is not None:
        whose = (
            "the run's own (its checkpoints')"
            if newest_checkpoint(cfg.run_path / "checkpoints")
            else f"the one of {cfg.train.init_from} (train.init_from)"
        )
        log.info(f"vocabulary: {whose}, not trained")
        tok = Tokenizer(init_model)
    else:
        sample = _sample_sentences(cfg, data_dir, sizes["train"])
        log.info(
            f"training SentencePiece ({cfg.vocab.model_type}, {cfg.vocab.size} pieces) on {len(sample):,} sentences"
        )
        symbols = placeholder_symbols() if cfg.data.protect_share > 0 else []
        tok = Tokenizer.train(
            sample, cfg.vocab.size, cfg.vocab.model_type, cfg.vocab.character_coverage, cfg.seed, symbols
        )
        del sample
    workers = min(os.cpu_count() or 1, 8) if cfg.data.num_workers is None else cfg.data.num_workers
    log.info(f"encoding with {workers or 'no'} worker processes")
    stats = {split: _encode_split(cfg, tok, data_dir, split, sizes[split], workers) for split in SPLITS}
    return tok, stats
