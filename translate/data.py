"""The prepared data as training reads it: piece ids on disk, memory-mapped, and batches.

    RUN/data/{split}.{src,tgt}.npy                   all piece ids of a split, concatenated
    RUN/data/{split}.{src,tgt}.offsets.npy           where each sentence starts (n + 1 entries)

`TokenWriter` writes them (translate/prepare.py encodes the splits); `load_split` maps them
(`TokenData`), so training never touches raw text. `token_batches` (translate/batching.py) groups
sentences of similar length into batches of at most `max_tokens` tokens including padding, from
the lengths alone; `collate` pads them into tensors.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from translate.batching import round_up
from translate.tokenizer import BOS, EOS, PAD

WRITE_CHUNK = 10_000  # sequences converted to arrays at a time


class TokenData:
    """The piece ids of one side of one split, memory-mapped: `data[i]` is sentence i's ids."""

    def __init__(self, prefix: Path) -> None:
        self.tokens = np.load(f"{prefix}.npy", mmap_mode="r")
        self.offsets = np.load(f"{prefix}.offsets.npy", mmap_mode="r")
        self.lengths = np.diff(self.offsets).astype(np.int32)  # pieces per sentence, without BOS/EOS

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= np.iinfo(np.uint16).max else np.int32)


class NpyWriter:
    """A 1-D .npy file written by appending chunks; the header gets the final length on `close`."""

    def __init__(self, path: Path | str, dtype: np.dtype) -> None:
        self.file, self.dtype, self.size = open(path, "wb"), np.dtype(dtype), 0
        self._header()

    def _header(self) -> None:
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": (self.size,)}
        np.lib.format.write_array_header_1_0(self.file, header)  # 128 bytes for any length below 10^60

    def append(self, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values, dtype=self.dtype)
        self.file.write(values.data)
        self.size += len(values)

    def close(self) -> None:
        self.file.seek(0)
        self._header()
        self.file.close()


class TokenWriter:
    """Appends sentences to PREFIX.npy (ids) and PREFIX.offsets.npy, never holding more than a chunk."""

    def __init__(self, prefix: Path | str, vocab_size: int) -> None:
        self.tokens = NpyWriter(f"{prefix}.npy", token_dtype(vocab_size))
        self.offsets = NpyWriter(f"{prefix}.offsets.npy", np.int64)
        self.offsets.append(np.zeros(1))

    def append(self, ids: np.ndarray, lengths: np.ndarray) -> None:
        """`ids` (sum(lengths),): the pieces of len(lengths) sentences, concatenated."""
        self.offsets.append(self.tokens.size + np.cumsum(lengths, dtype=np.int64))
        self.tokens.append(ids)

    def close(self) -> None:
        self.tokens.close()
        self.offsets.close()


def write_token_data(prefix: Path, sequences: Iterable[list[int]], vocab_size: int) -> None:
    """Write piece-id sequences as PREFIX.npy + PREFIX.offsets.npy, streaming a chunk at a time."""
    writer, it = TokenWriter(prefix, vocab_size), iter(sequences)
    while chunk := list(itertools.islice(it, WRITE_CHUNK)):
        lengths = np.fromiter(map(len, chunk), np.int64, len(chunk))
        writer.append(np.fromiter(itertools.chain.from_iterable(chunk), np.int64, int(lengths.sum())), lengths)
    writer.close()


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


# ---------------------------------------------------------------------------- batches


@dataclass
class Batch:
    src: torch.Tensor  # (B, S) pieces + EOS, PAD after
    tgt_in: torch.Tensor  # (B, T) BOS + pieces
    tgt_out: torch.Tensor  # (B, T) pieces + EOS
    ntokens: int  # non-pad target tokens
    keep: torch.Tensor | None = None  # (N,) flat (B*T) positions whose logits the loss needs (see collate)

    def to(self, device: torch.device) -> Batch:
        """On `device`; from pinned memory the copies do not wait for the device (non_blocking)."""
        nb = device.type == "cuda"
        keep = self.keep.to(device, non_blocking=nb) if self.keep is not None else None
        moved = (x.to(device, non_blocking=nb) for x in (self.src, self.tgt_in, self.tgt_out))
        return Batch(*moved, self.ntokens, keep)

    def target(self) -> torch.Tensor:
        """The targets the logits of model(src, tgt_in, keep) line up with: those of the positions
        `keep` (N,), or all of tgt_out (B, T) where keep is None."""
        return self.tgt_out.view(-1).index_select(0, self.keep) if self.keep is not None else self.tgt_out

    def pin_memory(self) -> Batch:
        keep = self.keep.pin_memory() if self.keep is not None else None
        return Batch(self.src.pin_memory(), self.tgt_in.pin_memory(), self.tgt_out.pin_memory(), self.ntokens, keep)


def projected_positions(tgt_out: np.ndarray, ntokens: int, multiple: int) -> np.ndarray:
    """Flat positions of `tgt_out` (B, T) whose logits the loss needs: the non-pad ones, and after
    them as many padding positions as make the count a multiple of `multiple` (where the batch has
    that many). Padding counts for nothing in the loss; the rounding gives the output projection
    a few distinct row counts. Computed on the host, so the update never asks the device which
    positions are padding."""
    keep = tgt_out.reshape(-1) != PAD
    extra = -ntokens % multiple
    if extra:
        keep[np.flatnonzero(~keep)[:extra]] = True
    return np.flatnonzero(keep)


def collate(
    data: SplitData, indices: np.ndarray, pad_to_multiple: int = 1, project_multiple: int | None = None
) -> Batch:
    """The sentences `indices` as padded tensors, each side's length rounded up to a multiple of
    `pad_to_multiple`; with `project_multiple`, `keep` holds the positions to project
    (`projected_positions`).

    With batches packed by the same rounded lengths (batching.token_batches), the matrix products
    see a few shapes: on a CPU in bf16 every new shape makes oneDNN build its kernels and buffers
    again, and the heap fragments on the ever new sizes (host memory grew by half over 1,000
    updates of the default run with lengths as they come; docs/experiments.md, "Host memory over
    a run")."""
    srcs = [data.src[int(i)] for i in indices]
    tgts = [data.tgt[int(i)] for i in indices]
    B = len(indices)
    S = round_up(max(len(s) for s in srcs) + 1, pad_to_multiple)
    T = round_up(max(len(t) for t in tgts) + 1, pad_to_multiple)
    src = np.full((B, S), PAD, dtype=np.int64)
    tgt_in = np.full((B, T), PAD, dtype=np.int64)
    tgt_out = np.full((B, T), PAD, dtype=np.int64)
    for b, (s, t) in enumerate(zip(srcs, tgts)):
        src[b, : len(s)], src[b, len(s)] = s, EOS
        tgt_in[b, 0], tgt_in[b, 1 : len(t) + 1] = BOS, t
        tgt_out[b, : len(t)], tgt_out[b, len(t)] = t, EOS
    ntokens = sum(len(t) + 1 for t in tgts)
    keep = (
        None if project_multiple is None else torch.from_numpy(projected_positions(tgt_out, ntokens, project_multiple))
    )
    return Batch(torch.from_numpy(src), torch.from_numpy(tgt_in), torch.from_numpy(tgt_out), ntokens, keep)


# ---------------------------------------------------------------------------- ahead of time


class Prefetcher(Iterator):
    """The items of `items`, made ahead in a background thread, at most `depth` waiting.

    Training collates the next updates' batches here (into pinned memory on a GPU) while the
    device works on the current one. The items come in their order; an exception raised while
    making one is raised by the `next` that would have returned it. `close` stops the thread."""

    _END = object()

    def __init__(self, items: Iterable, depth: int = 2) -> None:
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.closed = threading.Event()
        self.finished = False
        self.thread = threading.Thread(target=self._fill, args=(iter(items),), name="translate-prefetch", daemon=True)
        self.thread.start()

    def _fill(self, items: Iterator) -> None:
        try:
            for item in items:
                if not self._put(item):
                    return
            self._put(self._END)
        except BaseException as error:  # handed to the consumer, which raises it
            self._put(_Failure(error))

    def _put(self, item) -> bool:
        while not self.closed.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __next__(self):
        if self.finished:
            raise StopIteration
        item = self.queue.get()
        if item is self._END:
            self.finished = True
            raise StopIteration
        if isinstance(item, _Failure):
            self.finished = True
            raise item.error
        return item

    def close(self) -> None:
        """Stops the thread and drops the items made ahead (on a GPU, pinned batches)."""
        self.closed.set()
        self.thread.join()
        while not self.queue.empty():
            self.queue.get_nowait()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class _Failure:
    error: BaseException
