"""From raw pairs to training batches: clean, split, learn the vocabulary, encode once, batch.

`prepare(cfg)` writes the run's data dir:

    RUN/data/{train,valid,test}.{src_lang,tgt_lang}   cleaned text, one sentence per line
    RUN/data/{split}.{src,tgt}.npy                   all piece ids of a split, concatenated
    RUN/data/{split}.{src,tgt}.offsets.npy           where each sentence starts (n + 1 entries)
    RUN/data/meta.json                               counts, fingerprint of what made it
    RUN/spm.model                                    the joint SentencePiece vocabulary

Training reads the ids through memory maps (`TokenData`) and never touches raw text.
`token_batches` groups sentences of similar length into batches of at most `max_tokens`
tokens including padding; `collate` pads them into tensors.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from translate.config import Config, config_to_dict
from translate.errors import UserError
from translate.model import BOS, EOS, PAD
from translate.sources import open_source
from translate.tokenizer import Tokenizer

log = logging.getLogger("translate")
SPLITS = ("train", "valid", "test")
ENCODE_CHUNK = 10_000


# ---------------------------------------------------------------------------- cleaning


def normalize(text: str) -> str:
    """Collapse every run of whitespace (tabs, newlines, NBSP ...) to one space."""
    return " ".join(text.split())


def clean_text_pairs(pairs: Iterable[tuple[str, str]], split: str, counts: dict[str, int]) -> Iterator[tuple[str, str]]:
    """Normalise whitespace, drop pairs with an empty side, drop exact duplicates within the split.

    Duplicates are found by a hash of the pair, so memory grows by 8 bytes a pair, not by the text.
    """
    seen: set[int] = set()
    for src, tgt in pairs:
        counts["read"] += 1
        src, tgt = normalize(src), normalize(tgt)
        if not src or not tgt:
            counts["empty"] += 1
            continue
        key = int.from_bytes(hashlib.blake2b(f"{src}\t{tgt}".encode(), digest_size=8).digest(), "little")
        if key in seen:
            counts["duplicate"] += 1
            continue
        seen.add(key)
        yield src, tgt


def keep_lengths(src_len: int, tgt_len: int, max_len: int, max_ratio: float) -> str | None:
    """Why a train pair of these token lengths is dropped, or None to keep it."""
    if src_len > max_len or tgt_len > max_len:
        return "too_long"
    if max(src_len, tgt_len) > max_ratio * min(src_len, tgt_len):
        return "bad_ratio"
    return None


# ---------------------------------------------------------------------------- token arrays


class TokenData:
    """The piece ids of one side of one split, memory-mapped: `data[i]` is sentence i's ids."""

    def __init__(self, prefix: Path) -> None:
        self.tokens = np.load(f"{prefix}.npy", mmap_mode="r")
        self.offsets = np.load(f"{prefix}.offsets.npy")
        self.lengths = np.diff(self.offsets)  # pieces per sentence, without BOS/EOS

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]


def write_token_data(prefix: Path, sequences: Iterable[list[int]], vocab_size: int) -> None:
    dtype = np.uint16 if vocab_size <= np.iinfo(np.uint16).max else np.int32
    offsets, chunks, total = [0], [], 0
    for seq in sequences:
        chunks.append(np.asarray(seq, dtype=dtype))
        total += len(seq)
        offsets.append(total)
    tokens = np.concatenate(chunks) if chunks else np.zeros(0, dtype=dtype)
    np.save(f"{prefix}.npy", tokens)
    np.save(f"{prefix}.offsets.npy", np.asarray(offsets, dtype=np.int64))


@dataclass
class SplitData:
    src: TokenData
    tgt: TokenData

    def __len__(self) -> int:
        return len(self.src)

    @property
    def src_lens(self) -> np.ndarray:
        return self.src.lengths + 1  # + EOS

    @property
    def tgt_lens(self) -> np.ndarray:
        return self.tgt.lengths + 1  # + BOS (decoder input) or EOS (target)


def load_split(data_dir: Path, split: str) -> SplitData:
    return SplitData(TokenData(data_dir / f"{split}.src"), TokenData(data_dir / f"{split}.tgt"))


# ---------------------------------------------------------------------------- batching


def token_batches(
    src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int, seed: int = 0, epoch: int = 0, shuffle: bool = True
) -> list[np.ndarray]:
    """Group sentence indices into batches of at most `max_tokens` tokens, padding included.

    A batch of n sentences costs n * max(longest source, longest target). Sentences are sorted
    by length (ties broken at random from (seed, epoch)) so that a batch holds similar lengths,
    then the batches are shuffled. A sentence longer than `max_tokens` alone gets its own batch.
    """
    n = len(src_lens)
    rng = np.random.default_rng([seed, epoch])
    noise = rng.random(n) if shuffle else np.arange(n)
    order = np.lexsort((noise, tgt_lens, src_lens))
    batches: list[np.ndarray] = []
    start, longest = 0, 0
    cost = np.maximum(src_lens, tgt_lens)[order]
    for i in range(n):
        longest_i = max(longest, int(cost[i]))
        if i > start and longest_i * (i - start + 1) > max_tokens:
            batches.append(order[start:i])
            start, longest_i = i, int(cost[i])
        longest = longest_i
    if start < n:
        batches.append(order[start:n])
    if shuffle:
        perm = rng.permutation(len(batches))
        batches = [batches[j] for j in perm]
    return batches


def shard_batches(batches: list[np.ndarray], rank: int, world_size: int) -> list[np.ndarray]:
    """Each rank takes every world_size-th batch; the tail is cut so that all ranks have as many."""
    usable = len(batches) - len(batches) % world_size
    return batches[rank:usable:world_size]


@dataclass
class Batch:
    src: torch.Tensor  # (B, S) pieces + EOS, PAD after
    tgt_in: torch.Tensor  # (B, T) BOS + pieces
    tgt_out: torch.Tensor  # (B, T) pieces + EOS
    ntokens: int  # non-pad target tokens

    def to(self, device: torch.device) -> Batch:
        nb = device.type == "cuda"
        return Batch(
            self.src.to(device, non_blocking=nb),
            self.tgt_in.to(device, non_blocking=nb),
            self.tgt_out.to(device, non_blocking=nb),
            self.ntokens,
        )


def collate(data: SplitData, indices: np.ndarray) -> Batch:
    srcs = [data.src[int(i)] for i in indices]
    tgts = [data.tgt[int(i)] for i in indices]
    B, S, T = len(indices), max(len(s) for s in srcs) + 1, max(len(t) for t in tgts) + 1
    src = np.full((B, S), PAD, dtype=np.int64)
    tgt_in = np.full((B, T), PAD, dtype=np.int64)
    tgt_out = np.full((B, T), PAD, dtype=np.int64)
    for b, (s, t) in enumerate(zip(srcs, tgts)):
        src[b, : len(s)], src[b, len(s)] = s, EOS
        tgt_in[b, 0], tgt_in[b, 1 : len(t) + 1] = BOS, t
        tgt_out[b, : len(t)], tgt_out[b, len(t)] = t, EOS
    ntokens = sum(len(t) + 1 for t in tgts)
    return Batch(torch.from_numpy(src), torch.from_numpy(tgt_in), torch.from_numpy(tgt_out), ntokens)


def padding_fraction(batches: list[np.ndarray], src_lens: np.ndarray, tgt_lens: np.ndarray) -> float:
    """Share of padding among all source + target positions of these batches."""
    real = padded = 0
    for b in batches:
        real += int(src_lens[b].sum() + tgt_lens[b].sum())
        padded += len(b) * int(src_lens[b].max() + tgt_lens[b].max())
    return 1.0 - real / max(padded, 1)


# ---------------------------------------------------------------------------- prepare


def fingerprint(cfg: Config) -> str:
    """What the prepared data depends on: the data and vocab config (and the source files' sizes)."""
    raw = {"data": config_to_dict(cfg)["data"], "vocab": config_to_dict(cfg)["vocab"], "seed": cfg.seed}
    for key in ("train", "valid", "test", "dataset", "bible_db"):
        value = raw["data"].get(key)
        if value:
            files = [Path(value), *Path(value).parent.glob(Path(value).name + ".*")] if value else []
            raw[f"{key}_files"] = sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files if p.is_file())
    return hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode()).hexdigest()[:16]


def is_prepared(cfg: Config) -> bool:
    meta = cfg.run_path / "data" / "meta.json"
    if not meta.is_file() or not (cfg.run_path / "spm.model").is_file():
        return False
    return json.loads(meta.read_text()).get("fingerprint") == fingerprint(cfg)


def _write_lines(path: Path, lines: Iterable[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")


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
        counts = {"read": 0, "empty": 0, "duplicate": 0}
        cleaned = clean_text_pairs(pairs, split, counts)
        if split == "train" and cfg.data.max_train_pairs:
            cleaned = (p for p, _ in zip(cleaned, range(cfg.data.max_train_pairs)))
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
    if need >= n_train // 2:
        raise UserError(
            f"train has only {n_train} pairs after cleaning: too few to hold out "
            f"{' and '.join(f'{want[s]} {s}' for s in missing)} pairs (set data.valid/data.test or data.valid_size/test_size)"
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
        s: (open(data_dir / f"{s}.{src}.tmp", "w"), open(data_dir / f"{s}.{tgt}.tmp", "w")) for s in ["train", *missing]
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
    """A reproducible random sample of at most vocab.sample_size train sentences, both sides."""
    per_side = cfg.vocab.sample_size // 2
    rng = random.Random(cfg.seed)
    chosen = set(rng.sample(range(n_train), per_side)) if n_train > per_side else None
    sample = []
    for i, (s, t) in enumerate(_read_pairs(data_dir, "train", cfg)):
        if chosen is None or i in chosen:
            sample += [s, t]
    return sample


def _encode_split(cfg: Config, tok: Tokenizer, data_dir: Path, split: str) -> dict[str, int]:
    """Encode a split to id arrays; for train, drop pairs that are too long or too unbalanced."""
    dropped = {"too_long": 0, "bad_ratio": 0}
    src_seqs: list[list[int]] = []
    tgt_seqs: list[list[int]] = []
    pairs = _read_pairs(data_dir, split, cfg)
    while chunk := [p for _, p in zip(range(ENCODE_CHUNK), pairs)]:
        src_ids = tok.encode([s for s, _ in chunk])
        tgt_ids = tok.encode([t for _, t in chunk])
        for s, t in zip(src_ids, tgt_ids):
            if split == "train":
                why = keep_lengths(len(s) + 1, len(t) + 1, cfg.data.max_len, cfg.data.max_ratio)
                if why:
                    dropped[why] += 1
                    continue
            src_seqs.append(s)
            tgt_seqs.append(t)
    if split == "train":
        log.info(
            f"train: dropped {dropped['too_long']:,} pairs longer than data.max_len={cfg.data.max_len} tokens and "
            f"{dropped['bad_ratio']:,} with a length ratio above data.max_ratio={cfg.data.max_ratio}; "
            f"{len(src_seqs):,} remain"
        )
        if not src_seqs:
            raise UserError(
                f"no train pair is left after the length filters (data.max_len={cfg.data.max_len}, "
                f"data.max_ratio={cfg.data.max_ratio}): raise them"
            )
    write_token_data(data_dir / f"{split}.src", src_seqs, tok.vocab_size)
    write_token_data(data_dir / f"{split}.tgt", tgt_seqs, tok.vocab_size)
    return {"pairs": len(src_seqs), "src_tokens": sum(map(len, src_seqs)), "tgt_tokens": sum(map(len, tgt_seqs))}


def prepare(cfg: Config, force: bool = False) -> Path:
    """Make RUN/data and RUN/spm.model for this config; reuse them when nothing changed."""
    run, data_dir = cfg.run_path, cfg.run_path / "data"
    if not force and is_prepared(cfg):
        log.info(f"{data_dir}: already prepared for this config, nothing to do")
        return data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    meta_path = data_dir / "meta.json"
    meta_path.unlink(missing_ok=True)  # a half-done prepare is never taken for a finished one
    sizes = _clean_splits(cfg, data_dir)
    sample = _sample_sentences(cfg, data_dir, sizes["train"])
    log.info(f"training SentencePiece ({cfg.vocab.model_type}, {cfg.vocab.size} pieces) on {len(sample):,} sentences")
    tok = Tokenizer.train(sample, cfg.vocab.size, cfg.vocab.model_type, cfg.vocab.character_coverage, cfg.seed)
    del sample
    tok.save(run / "spm.model")
    stats = {split: _encode_split(cfg, tok, data_dir, split) for split in SPLITS}
    meta = {"fingerprint": fingerprint(cfg), "vocab_size": tok.vocab_size, "splits": stats}
    meta_path.write_text(json.dumps(meta, indent=2))
    for split, s in stats.items():
        log.info(f"{split}: {s['pairs']:,} pairs, {s['src_tokens']:,} source and {s['tgt_tokens']:,} target pieces")
    return data_dir
