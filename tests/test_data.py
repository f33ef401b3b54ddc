import numpy as np
import pytest

from translate.data import (
    SplitData,
    TokenData,
    clean_text_pairs,
    collate,
    keep_lengths,
    shard_batches,
    token_batches,
    write_token_data,
)
from translate.model import BOS, EOS, PAD


def test_cleaning_counts():
    pairs = [("a  b", "x\ty"), ("", "z"), ("a b", "x y"), ("c", "  "), ("d", "w")]
    counts = {"read": 0, "empty": 0, "duplicate": 0}
    out = list(clean_text_pairs(pairs, "train", counts))
    assert out == [("a b", "x y"), ("d", "w")]
    assert counts == {"read": 5, "empty": 2, "duplicate": 1}


def test_length_filters():
    assert keep_lengths(10, 12, 128, 3.0) is None
    assert keep_lengths(129, 12, 128, 3.0) == "too_long"
    assert keep_lengths(40, 10, 128, 3.0) == "bad_ratio"


def random_lengths(n=2000, seed=0):
    rng = np.random.default_rng(seed)
    src = rng.integers(2, 60, n)
    tgt = np.clip((src * rng.uniform(0.8, 1.4, n)).astype(int), 2, 80)
    return src, tgt


def test_batches_respect_budget_and_cover_everything_once():
    src, tgt = random_lengths()
    batches = token_batches(src, tgt, 1000, seed=3, epoch=0)
    seen = np.concatenate(batches)
    assert sorted(seen.tolist()) == list(range(len(src)))
    for b in batches:
        assert len(b) * max(src[b].max(), tgt[b].max()) <= 1000


def test_batches_are_deterministic_per_seed_and_epoch():
    src, tgt = random_lengths()
    a = token_batches(src, tgt, 1000, seed=3, epoch=1)
    b = token_batches(src, tgt, 1000, seed=3, epoch=1)
    c = token_batches(src, tgt, 1000, seed=3, epoch=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(len(x) == len(y) and np.array_equal(x, y) for x, y in zip(a, c))


def test_long_sentence_gets_its_own_batch():
    src, tgt = np.array([5, 5, 300]), np.array([5, 5, 10])
    batches = token_batches(src, tgt, 100, shuffle=False)
    assert [sorted(b.tolist()) for b in batches] == [[0, 1], [2]]


def test_shards_are_disjoint_and_equal():
    batches = [np.array([i]) for i in range(11)]
    shards = [shard_batches(batches, r, 3) for r in range(3)]
    assert {len(s) for s in shards} == {3}
    flat = [int(b[0]) for s in shards for b in s]
    assert len(set(flat)) == 9


def test_token_data_round_trip_and_collate(tmp_path):
    src = [[5, 6, 7], [8], [9, 10]]
    tgt = [[11, 12], [13, 14, 15, 16], [17]]
    write_token_data(tmp_path / "s", src, 100)
    write_token_data(tmp_path / "t", tgt, 100)
    data = SplitData(TokenData(tmp_path / "s"), TokenData(tmp_path / "t"))
    assert len(data) == 3 and data.src[1].tolist() == [8]
    assert data.src_lens.tolist() == [4, 2, 3]
    batch = collate(data, np.array([0, 1]))
    assert batch.src.tolist() == [[5, 6, 7, EOS], [8, EOS, PAD, PAD]]
    assert batch.tgt_in.tolist() == [[BOS, 11, 12, PAD, PAD], [BOS, 13, 14, 15, 16]]
    assert batch.tgt_out.tolist() == [[11, 12, EOS, PAD, PAD], [13, 14, 15, 16, EOS]]
    assert batch.ntokens == 3 + 5


@pytest.mark.parametrize("vocab, dtype", [(8000, np.uint16), (70000, np.int32)])
def test_token_dtype_fits_vocab(tmp_path, vocab, dtype):
    write_token_data(tmp_path / "x", [[vocab - 1]], vocab)
    data = TokenData(tmp_path / "x")
    assert data.tokens.dtype == dtype and int(data[0][0]) == vocab - 1
