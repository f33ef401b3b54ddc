"""decoding.py: lines in, n-best lists out — order, blank lines, long lines, workers, streaming."""

from __future__ import annotations

import dataclasses
import random
import threading

import pytest
import torch

from tests.conftest import LINES, WORDS, assert_same
from translate.decoding import decode_batches, in_workers, translate_lines
from translate.errors import UserError
from translate.options import SearchOptions

SEARCH = SearchOptions(beam_size=3, length_penalty=0.6, max_len_a=1.0, max_len_b=3)


def translate(model, tokenizer, lines, beam_size=SEARCH.beam_size, nbest=1, **kwargs):
    search = dataclasses.replace(SEARCH, beam_size=beam_size, nbest=nbest)
    return list(translate_lines(model, tokenizer, lines, search, **kwargs))


def test_order_kept_when_lengths_differ(model, tokenizer):
    batched = translate(model, tokenizer, LINES, batch_tokens=60)  # several batches, sorted by length
    alone = [translate(model, tokenizer, [line])[0] for line in LINES]
    assert len(batched) == len(LINES)
    assert len({hyps[0][0] for hyps in alone}) == len(LINES)  # the lines translate differently
    assert_same(batched, alone)


def test_workers_give_the_same_output_in_order(model, tokenizer):
    """Batches decoded two at a time, each on its share of the threads: the same translations in
    input order as one at a time; torch's thread count is restored."""
    threads = torch.get_num_threads()
    lines = [random.Random(i).choice(LINES) for i in range(30)]
    one = translate(model, tokenizer, lines, batch_tokens=120, workers=1, nbest=2)
    two = translate(model, tokenizer, lines, batch_tokens=240, workers=2, nbest=2)  # the same batches
    assert_same(two, one)
    assert torch.get_num_threads() == threads
    with pytest.raises(UserError, match="workers"):
        translate(model, tokenizer, lines, workers=-1)


def test_a_worker_error_reaches_the_caller(model, tokenizer, monkeypatch):
    def out_of_memory(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr("translate.decoding.beam_search", out_of_memory)
    threads = torch.get_num_threads()
    with pytest.raises(UserError, match="out of memory"):
        translate(model, tokenizer, LINES, batch_tokens=40, workers=2)
    assert torch.get_num_threads() == threads


def test_in_workers_keeps_order_and_shares_threads():
    threads = max(2, torch.get_num_threads())
    torch.set_num_threads(threads)
    seen = []

    def work(i: int) -> int:
        seen.append(torch.get_num_threads())
        return i * i

    try:
        assert list(in_workers(work, list(range(20)), 2)) == [i * i for i in range(20)]
        assert set(seen) == {threads // 2}
        assert torch.get_num_threads() == threads
        assert list(in_workers(work, [3], 2)) == [9]  # one item: no threads
    finally:
        torch.set_num_threads(threads)


def test_chunks_and_streaming_give_the_same_output(model, tokenizer):
    whole = translate(model, tokenizer, LINES)
    assert_same(translate(model, tokenizer, iter(LINES), chunk_lines=2), whole)
    assert_same(translate(model, tokenizer, iter(LINES), stream=True, chunk_lines=4), whole)


def test_blank_lines_give_empty_lines(model, tokenizer):
    """Blank lines, and lines of no pieces (zero-width characters: no piece to translate, and the
    search gives no empty translation), give empty lines."""
    lines = ["", "the cat", "   ", "\t", "dog", "", "\u200b", "\ufeff"]
    out = translate(model, tokenizer, lines, nbest=2)
    assert len(out) == len(lines)
    for i in (0, 2, 3, 5, 6, 7):
        assert out[i] == [("", 0.0), ("", 0.0)]
    assert all(len(hyps) == 2 for hyps in out)
    assert translate(model, tokenizer, ["", " "]) == [[("", 0.0)], [("", 0.0)]]
    assert translate(model, tokenizer, []) == []


def test_very_long_line_is_truncated_not_fatal_and_said_once(model, tokenizer, monkeypatch, caplog):
    monkeypatch.setattr("translate.decoding._warned_cut", False)
    long_line = " ".join(WORDS * 40)  # far beyond max_positions = 32
    out = translate(model, tokenizer, ["the cat", long_line, "dog", long_line])  # output up to 31 + 3 > 32 positions
    assert len(out) == 4 and all(len(hyps) == 1 for hyps in out)
    cut = [r.getMessage() for r in caplog.records if "is cut to the model's 31" in r.getMessage()]
    assert len(cut) == 1 and "its end is not translated" in cut[0]


def test_line_count_and_nbest_kept(model, tokenizer):
    lines = [random.Random(i).choice(LINES) for i in range(40)]
    out = translate(model, tokenizer, lines, nbest=3, batch_tokens=100, chunk_lines=7)
    assert len(out) == 40 and all(len(hyps) == 3 for hyps in out)
    for hyps in out:
        assert [s for _, s in hyps] == sorted((s for _, s in hyps), reverse=True)


def test_ensemble_of_two_identical_models(model, tokenizer):
    one = translate(model, tokenizer, LINES[:3])
    two = translate([model, model], tokenizer, LINES[:3])
    assert_same(two, one)


def test_stream_translates_a_line_before_the_next_arrives(model, tokenizer):
    more = threading.Event()

    def interactive():
        yield "the cat"
        assert more.wait(timeout=30)  # the user types the next line only after seeing a result
        yield "dog"

    results = translate_lines(model, tokenizer, interactive(), SEARCH, stream=True)
    first = next(results)
    more.set()
    rest = list(results)
    assert len(first) == 1 and len(rest) == 1


def test_lines_are_read_lazily(model, tokenizer):
    consumed = []

    def lines():
        for i in range(100):
            consumed.append(i)
            yield "the cat"

    results = translate_lines(model, tokenizer, lines(), SEARCH, chunk_lines=5)
    next(results)
    assert len(consumed) <= 6


def test_reading_errors_reach_the_caller_in_stream_mode(model, tokenizer):
    def lines():
        yield "the cat"
        raise UserError("in.en:2: not UTF-8")

    results = translate_lines(model, tokenizer, lines(), SEARCH, stream=True)
    with pytest.raises(UserError, match="in.en:2"):
        list(results)


def test_models_train_mode_is_restored(model, tokenizer):
    model.train()
    try:
        translate(model, tokenizer, ["the cat"])
        assert model.training
    finally:
        model.eval()


def test_nbest_beyond_beam_is_a_user_error(model, tokenizer):
    with pytest.raises(UserError, match="nbest"):
        translate_lines(model, tokenizer, ["the cat"], SearchOptions(beam_size=3, nbest=4))  # raised before iterating


def test_token_batches_respect_the_budget():
    lengths = [5, 30, 7, 7, 12, 3, 50]
    batches = decode_batches(lengths, batch_tokens=60, beam_size=2)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        longest = max(lengths[i] for i in b)
        assert len(b) == 1 or len(b) * 2 * longest <= 60
    assert batches[0] == [6]  # longest first, alone when over budget
