"""Which sentences go together: token-budget batches of similar lengths, shuffled per epoch.

`token_batches` needs only the (n,) source and target length arrays and runs in O(n) (radix
sorts and a loop over distinct lengths), so the time to build an epoch's batches grows with the
corpus only as fast as reading those arrays. Each DDP rank takes its share (`shard_batches`).
"""

from __future__ import annotations

import numpy as np


def round_up(n, multiple: int):
    """n (an int or an integer array) rounded up to a multiple of `multiple`."""
    return -(-n // multiple) * multiple


def length_order(src_lens: np.ndarray, tgt_lens: np.ndarray, rng: np.random.Generator | None) -> np.ndarray:
    """Sentence indices sorted by the longer side, then by source minus target length (so that
    neighbours are alike on both sides), ties at random from `rng` (by index without one).

    Each key is a stable sort of 16-bit integers, which numpy does by radix sort: O(n). Both
    lengths below 256 tokens (the usual case) fit one key.
    """
    cost, diff = np.maximum(src_lens, tgt_lens).astype(np.int64), src_lens.astype(np.int64) - tgt_lens
    if cost.max() < 2**8 and np.abs(diff).max() < 2**7:
        keys = [(cost * 2**8 + diff + 2**7).astype(np.uint16)]
    else:  # least significant first; clipping the difference only changes how ties are broken
        keys = [
            np.clip(diff + 2**15, 0, 2**16 - 1).astype(np.uint16),
            cost.astype(np.uint16) if cost.max() < 2**16 else cost,
        ]
    if rng is None:
        order = np.arange(len(cost))
    else:
        order = np.argsort(rng.integers(0, 2**16, len(cost), dtype=np.uint16), kind="stable")
    for key in keys:
        order = order[np.argsort(key[order], kind="stable")]
    return order


def batch_starts(cost: np.ndarray, max_tokens: int) -> np.ndarray:
    """Where each batch starts when (n,) non-decreasing costs are packed greedily: a sentence joins
    the open batch while (batch size + 1) * its cost <= max_tokens, else it opens a new batch.

    Done a run of equal costs at a time, so the loop is over distinct lengths, not sentences.
    """
    firsts = np.flatnonzero(np.concatenate([[True], cost[1:] != cost[:-1]]))
    ends = np.append(firsts[1:], len(cost))
    starts, open_size = [], 0  # sentences in the open batch (0 before the first)
    for first, end, c in zip(firsts.tolist(), ends.tolist(), np.maximum(cost[firsts], 1).tolist()):
        per = max(max_tokens // c, 1)  # sentences of this cost a batch holds (a too-long one alone)
        joins = min(max(max_tokens // c - open_size, 0), end - first) if open_size else 0
        if first + joins == end:
            open_size += joins
            continue
        new = np.arange(first + joins, end, per)
        starts.append(new)
        open_size = end - int(new[-1])
    return np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64)


def token_batches(
    src_lens: np.ndarray,
    tgt_lens: np.ndarray,
    max_tokens: int,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    pad_to_multiple: int = 1,
) -> list[np.ndarray]:
    """Group sentence indices into batches of at most `max_tokens` tokens, padding included.

    A batch of n sentences costs n * max(longest source, longest target). Sentences are sorted
    by length (`length_order`, ties broken at random from (seed, epoch)), packed greedily in that
    order, then the batches are shuffled. A sentence longer than `max_tokens` gets its own batch.
    The lengths count EOS (source) and BOS/EOS (target), as `SplitData.src_lens`/`tgt_lens` give them.
    With `pad_to_multiple` > 1 a sentence costs its longer side rounded up to a multiple of it, as
    `collate` pads it: the sentences of one rounded length fill batches of the same size, so that
    the epoch has a few batch shapes (data.collate says why that matters).
    Needs only the two (n,) length arrays; O(n) time.
    """
    src_lens, tgt_lens = np.asarray(src_lens), np.asarray(tgt_lens)
    if len(src_lens) == 0:
        return []
    rng = np.random.default_rng([seed, epoch])
    order = length_order(src_lens, tgt_lens, rng if shuffle else None)
    cost = np.maximum(src_lens, tgt_lens)
    if pad_to_multiple > 1:
        cost = round_up(cost, pad_to_multiple)
        key = cost.astype(np.uint16) if cost.max() < 2**16 else cost  # 16 bits: a radix sort, O(n)
        order = order[np.argsort(key[order], kind="stable")]  # by rounded cost, length order within
    batches = np.split(order, batch_starts(cost[order], max_tokens)[1:])
    if shuffle:
        batches = [batches[j] for j in rng.permutation(len(batches))]
    return batches


def shard_batches(batches: list[np.ndarray], rank: int, world_size: int) -> list[np.ndarray]:
    """Each rank takes every world_size-th batch; the tail is cut so that all ranks have as many."""
    usable = len(batches) - len(batches) % world_size
    return batches[rank:usable:world_size]


def padding_fraction(batches: list[np.ndarray], src_lens: np.ndarray, tgt_lens: np.ndarray) -> float:
    """Share of padding among all source + target positions of these batches."""
    real = padded = 0
    for b in batches:
        real += int(src_lens[b].sum() + tgt_lens[b].sum())
        padded += len(b) * int(src_lens[b].max() + tgt_lens[b].max())
    return 1.0 - real / max(padded, 1)
