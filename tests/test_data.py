import gc
import json
import logging
import os
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_config

from translate import prepare as prepare_module
from translate.batching import batch_starts, length_order, padding_fraction, shard_batches, token_batches
from translate.config import load_config
from translate.data import NpyWriter, Prefetcher, SplitData, TokenData, TokenWriter, collate, write_token_data
from translate.errors import UserError
from translate.prepare import SeenHashes, clean_text_pairs, keep_lengths, length_filter, prepare
from translate.rundir import RunLock
from translate.tokenizer import BOS, EOS, PAD

# ---------------------------------------------------------------------------- cleaning


def test_cleaning_counts():
    pairs = [("a  b", "x\ty"), ("", "z"), ("a b", "x y"), ("c", "  "), ("d", "w"), ("e f", "e  f")]
    counts = {"read": 0, "empty": 0, "duplicate": 0, "same": 0}
    out = list(clean_text_pairs(pairs, "train", counts))
    assert out == [("a b", "x y"), ("d", "w"), ("e f", "e f")]
    assert counts == {"read": 6, "empty": 2, "duplicate": 1, "same": 1}


def test_dedupe_across_chunks_keeps_first_occurrences_in_order(monkeypatch):
    monkeypatch.setattr(prepare_module, "CLEAN_CHUNK", 7)
    rng = np.random.default_rng(0)
    pairs = [(f"s{i}", f"t{i % 5}") for i in rng.integers(0, 40, 300)]  # many repeats, far apart
    counts = {"read": 0, "empty": 0, "duplicate": 0, "same": 0}
    out = list(clean_text_pairs(pairs, "train", counts))
    assert out == list(dict.fromkeys(pairs))
    assert counts["duplicate"] == len(pairs) - len(out)


def test_cleaning_limit_reads_no_further_than_needed(monkeypatch):
    monkeypatch.setattr(prepare_module, "CLEAN_CHUNK", 4)
    pairs = [("a", "x"), ("a", "x"), ("", "y"), ("b", "y")] + [(f"s{i}", "t") for i in range(20)]
    source = iter(pairs)
    counts = {"read": 0, "empty": 0, "duplicate": 0, "same": 0}
    out = list(clean_text_pairs(source, "train", counts, limit=6))
    assert out == [("a", "x"), ("b", "y")] + [(f"s{i}", "t") for i in range(4)]
    assert counts == {"read": 8, "empty": 1, "duplicate": 1, "same": 0}
    assert next(source) == ("s4", "t")  # nothing read past the sixth kept pair


def test_seen_hashes_is_a_set():
    rng = np.random.default_rng(1)
    seen, reference = SeenHashes(), set()
    for size in [5, 50, 3, 200, 1, 0, 80] * 4:
        keys = rng.integers(0, 400, size).astype(np.uint64)  # repeats within and across calls
        new = seen.add(keys)
        expected = []
        for k in keys.tolist():
            expected.append(k not in reference)
            reference.add(k)
        assert new.tolist() == expected
    assert len(seen) == len(reference)
    assert len(seen.levels) <= 2 + np.log2(len(reference))  # levels stay logarithmic


def test_length_filters():
    assert keep_lengths(10, 12, 128, 3.0) is None
    assert keep_lengths(129, 12, 128, 3.0) == "too_long"
    assert keep_lengths(40, 10, 128, 3.0) == "bad_ratio"
    src, tgt = random_lengths(500)
    masks = length_filter(src, tgt, 50, 1.3)
    for i in range(len(src)):
        why = keep_lengths(int(src[i]), int(tgt[i]), 50, 1.3)
        assert [k for k, m in masks.items() if m[i]] == ([why] if why else [])


# ---------------------------------------------------------------------------- batching


def random_lengths(n=2000, seed=0):
    rng = np.random.default_rng(seed)
    src = rng.integers(2, 60, n)
    tgt = np.clip((src * rng.uniform(0.8, 1.4, n)).astype(int), 2, 80)
    return src, tgt


def test_batches_respect_budget_and_cover_everything_once():
    src, tgt = random_lengths()
    src[:3] = [1500, 2, 1001]  # longer than the budget: alone in their batches
    batches = token_batches(src, tgt, 1000, seed=3, epoch=0)
    seen = np.concatenate(batches)
    assert sorted(seen.tolist()) == list(range(len(src)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(src[b].max(), tgt[b].max()) <= 1000


def test_batches_padded_to_a_multiple_fit_the_budget_padding_included_and_have_few_sizes(tmp_path):
    raw_src, raw_tgt = random_lengths()  # pieces; with EOS (BOS) as training gives them below
    raw_src[:200] = raw_tgt[:200] = 7  # 8 with EOS: a multiple of 8 exactly
    write_token_data(tmp_path / "s", [[5] * n for n in raw_src], 100)
    write_token_data(tmp_path / "t", [[6] * n for n in raw_tgt], 100)
    data = SplitData(TokenData(tmp_path / "s"), TokenData(tmp_path / "t"))
    batches = token_batches(data.src_lens, data.tgt_lens, 1000, seed=3, epoch=0, pad_to_multiple=8)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(data)))
    sizes = {}
    for b in batches:
        batch = collate(data, b, pad_to_multiple=8)
        c = max(batch.src.size(1), batch.tgt_out.size(1))  # what the batch costs as collated
        assert len(b) * c <= 1000  # the padded batch, not only its real tokens
        sizes.setdefault(c, []).append(len(b))
    for c, ns in sizes.items():  # one size per rounded length (as full as the budget allows), but for the last
        assert sum(n != 1000 // c for n in ns) <= 1, (c, ns)
    assert 1000 // 8 in sizes[8]  # sentences of 8 positions are costed 8, as collated, not 16
    plain = token_batches(data.src_lens, data.tgt_lens, 1000, seed=3, epoch=0)
    assert len({len(b) for b in batches}) < len({len(b) for b in plain}) / 2


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


@pytest.mark.parametrize("longest", [100, 3000])  # one 16-bit key, or one per length
def test_length_order_sorts_by_longer_side_then_difference(longest):
    rng = np.random.default_rng(longest)
    src, tgt = rng.integers(1, longest, 3000), rng.integers(1, longest, 3000)
    order = length_order(src, tgt, np.random.default_rng(0))
    assert sorted(order.tolist()) == list(range(3000))
    keys = list(zip(np.maximum(src, tgt)[order].tolist(), (src - tgt)[order].tolist()))
    assert keys == sorted(keys)


def greedy_starts(cost, max_tokens):
    """The packing one sentence at a time, as the vectorised `batch_starts` must reproduce it."""
    starts, longest = [0], 0
    for i, c in enumerate(cost.tolist()):
        if i > starts[-1] and max(longest, c) * (i - starts[-1] + 1) > max_tokens:
            starts.append(i)
            longest = 0
        longest = max(longest, c)
    return starts


@pytest.mark.parametrize("max_tokens", [1, 7, 64, 1000])
def test_vectorised_packing_equals_sentence_by_sentence_greedy(max_tokens):
    rng = np.random.default_rng(max_tokens)
    cost = np.sort(np.concatenate([rng.integers(1, 40, 500), rng.integers(900, 1100, 5)]))
    assert batch_starts(cost, max_tokens).tolist() == greedy_starts(cost, max_tokens)


def test_sorting_by_the_longer_side_keeps_padding_low():
    src, tgt = random_lengths(5000)
    batches = token_batches(src, tgt, 4096, seed=1)
    unsorted = np.array_split(np.random.default_rng(0).permutation(len(src)), len(batches))
    assert padding_fraction(batches, src, tgt) < padding_fraction(unsorted, src, tgt) / 3


def test_shards_are_disjoint_and_equal():
    batches = [np.array([i]) for i in range(11)]
    shards = [shard_batches(batches, r, 3) for r in range(3)]
    assert {len(s) for s in shards} == {3}
    flat = [int(b[0]) for s in shards for b in s]
    assert len(set(flat)) == 9


# ---------------------------------------------------------------------------- token arrays


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


def test_collate_pads_to_a_multiple_and_projects_rows_in_multiples(tmp_path):
    src, tgt = [[5, 6, 7], [8]], [[11, 12], [13, 14, 15, 16, 17, 18]]
    write_token_data(tmp_path / "s", src, 100)
    write_token_data(tmp_path / "t", tgt, 100)
    data = SplitData(TokenData(tmp_path / "s"), TokenData(tmp_path / "t"))
    plain, padded = collate(data, np.array([0, 1])), collate(data, np.array([0, 1]), pad_to_multiple=4)
    assert padded.src.shape == (2, 4) and padded.tgt_in.shape == padded.tgt_out.shape == (2, 8)
    for a, b in [(plain.src, padded.src), (plain.tgt_in, padded.tgt_in), (plain.tgt_out, padded.tgt_out)]:
        assert torch.equal(b[:, : a.size(1)], a) and bool((b[:, a.size(1) :] == PAD).all())  # only padding added
    assert padded.ntokens == plain.ntokens == 3 + 7
    real = np.flatnonzero(padded.tgt_out.reshape(-1).numpy() != PAD)
    assert padded.keep is None and collate(data, np.array([0, 1]), 4, project_multiple=1).keep.tolist() == list(real)
    rounded = collate(data, np.array([0, 1]), 4, project_multiple=8).keep  # 10 real positions -> 16
    assert len(rounded) == 16 and set(real) <= set(rounded.tolist()) and rounded.tolist() == sorted(rounded.tolist())
    assert len(collate(data, np.array([0, 1]), 4, project_multiple=64).keep) == 16  # no more than the batch has
    assert collate(data, np.array([0, 1]), 4, project_multiple=5).keep.tolist() == list(real)  # 10 is a multiple


def test_writers_append_chunks_to_one_array(tmp_path):
    writer = TokenWriter(tmp_path / "x", 1000)
    writer.append(np.array([1, 2, 3]), np.array([2, 1]))
    writer.append(np.zeros(0), np.zeros(0))
    writer.append(np.array([4, 5, 6, 7]), np.array([1, 0, 3]))
    writer.close()
    tokens = TokenData(tmp_path / "x")
    assert [tokens[i].tolist() for i in range(len(tokens))] == [[1, 2], [3], [4], [], [5, 6, 7]]
    empty = NpyWriter(tmp_path / "empty.npy", np.int64)
    empty.close()
    assert np.load(tmp_path / "empty.npy").shape == (0,)


@pytest.mark.parametrize("vocab, dtype", [(8000, np.uint16), (70000, np.int32)])
def test_token_dtype_fits_vocab(tmp_path, vocab, dtype):
    write_token_data(tmp_path / "x", [[vocab - 1]], vocab)
    data = TokenData(tmp_path / "x")
    assert data.tokens.dtype == dtype and int(data[0][0]) == vocab - 1


# ---------------------------------------------------------------------------- prepare


def prepared_arrays(run):
    names = [f"{s}.{side}" for s in ("train", "valid", "test") for side in ("src", "tgt")]
    return {n: np.load(run / "data" / n) for name in names for n in (f"{name}.npy", f"{name}.offsets.npy")}


def test_workers_write_the_same_ids_as_one_process(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare_module, "ENCODE_CHUNK", 37)  # many chunks, to check that workers keep their order
    runs = {}
    for workers in (0, 2):
        cfg = load_config(tiny_config(tmp_path, name=f"w{workers}"), [f"data.num_workers={workers}"])
        prepare(cfg)
        runs[workers] = prepared_arrays(cfg.run_path)
    assert runs[0].keys() == runs[2].keys()
    for name, array in runs[0].items():
        assert array.dtype == runs[2][name].dtype and np.array_equal(array, runs[2][name]), name
    pairs = len(runs[0]["train.src.offsets.npy"]) - 1
    assert 400 + 20 <= pairs <= 400 + 60  # the 400 pairs and their placeholder copies (protect_share 0.1)


def test_prepare_reuses_unchanged_config_and_rebuilds_changed_one(tmp_path, caplog):
    config = tiny_config(tmp_path)
    cfg = load_config(config, ["data.num_workers=0"])
    caplog.set_level(logging.INFO, logger="translate")
    prepare(cfg)
    meta = cfg.run_path / "data" / "meta.json"
    stamp = {p.name: p.stat().st_mtime_ns for p in [meta, *(cfg.run_path / "data").glob("*.npy")]}
    caplog.clear()
    prepare(load_config(config, ["data.num_workers=2"]))  # the worker count does not change the data
    assert "nothing to do" in caplog.text
    assert stamp == {p.name: p.stat().st_mtime_ns for p in [meta, *(cfg.run_path / "data").glob("*.npy")]}
    caplog.clear()
    before = json.loads(meta.read_text())
    prepare(load_config(config, ["vocab.size=200"]))
    after = json.loads(meta.read_text())
    assert "nothing to do" not in caplog.text
    assert after["fingerprint"] != before["fingerprint"] and after["vocab_size"] == 200


def test_a_worker_that_dies_is_a_clear_error_not_a_hang(tmp_path, monkeypatch):
    cfg = load_config(tiny_config(tmp_path), ["data.num_workers=2"])
    encode = prepare_module.encode_pairs

    def dies_after_train(sp, pairs, dtype, limits):
        if limits is None:  # valid or test: encoded after train, without length limits
            os.kill(os.getpid(), signal.SIGKILL)
        return encode(sp, pairs, dtype, limits)

    monkeypatch.setattr(prepare_module, "encode_pairs", dies_after_train)
    with pytest.raises(UserError, match="encoding worker process died.*data.num_workers=2"):
        prepare(cfg)
    assert not (cfg.run_path / "data" / "meta.json").exists()


KILLED_PREPARE = """
import os, sys, time
from pathlib import Path
from translate import prepare as m
from translate.config import load_config

def stuck(sp, pairs, dtype, limits):  # a worker that would encode for a long time
    Path(sys.argv[2]).write_text(str(os.getpid()))
    time.sleep(120)

m.encode_pairs = stuck
m.prepare(load_config(sys.argv[1], ["data.num_workers=2"]))
"""


def process_ended(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie has ended
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_workers_end_with_a_killed_prepare_and_free_the_run(tmp_path):
    config, worker_pid = tiny_config(tmp_path), tmp_path / "worker.pid"
    parent = subprocess.Popen([sys.executable, "-c", KILLED_PREPARE, str(config), str(worker_pid)])
    try:
        deadline = time.monotonic() + 120
        while not worker_pid.exists() or not worker_pid.read_text():
            assert parent.poll() is None and time.monotonic() < deadline, "no worker started encoding"
            time.sleep(0.1)
        worker = int(worker_pid.read_text())
        parent.kill()  # as the OOM killer or kill -9 would: no handler runs
        parent.wait()
        deadline = time.monotonic() + 20
        while not process_ended(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert process_ended(worker), "an encoding worker outlived its killed parent"
        RunLock(load_config(config).run_path).release()  # nobody holds the run's lock
    finally:
        parent.kill()


def test_missing_valid_and_test_are_held_out_of_train(tmp_path):
    overrides = ["data.valid=null", "data.test=null", "data.valid_size=20", "data.test_size=30", "data.num_workers=0"]
    cfg = load_config(tiny_config(tmp_path), overrides)
    prepare(cfg)
    lines = {s: (cfg.run_path / "data" / f"{s}.en").read_text().splitlines() for s in ("train", "valid", "test")}
    assert [len(lines[s]) for s in ("train", "valid", "test")] == [350, 20, 30]
    meta = json.loads((cfg.run_path / "data" / "meta.json").read_text())
    assert meta["splits"]["valid"]["pairs"] == 20 and meta["splits"]["test"]["pairs"] == 30
    assert set(lines["train"]).isdisjoint(lines["valid"] + lines["test"])


def test_prefetcher_keeps_the_order_and_raises_where_the_items_failed():
    def items():
        yield from range(5)
        raise ValueError("item 5")

    got = []
    with Prefetcher(items(), depth=2) as ahead:
        with pytest.raises(ValueError, match="item 5"):
            for item in ahead:
                got.append(item)
    assert got == [0, 1, 2, 3, 4]
    assert not ahead.thread.is_alive()


def test_a_closed_prefetcher_lets_go_of_its_items_source():
    """Left after one item (as a benchmark takes one update), the thread must not keep what the
    source holds alive (on a GPU: a trainer's model and optimizer)."""

    class Holder:
        pass

    holder = Holder()
    ref = weakref.ref(holder)

    def items(held):
        while True:
            yield [held] if held is None else []  # the generator's frame holds `held`, its items do not

    with Prefetcher(items(holder), depth=2) as ahead:
        assert next(ahead) == []
    del holder
    gc.collect()
    assert not ahead.thread.is_alive() and ref() is None


def test_a_meta_json_cut_short_is_prepared_again_not_a_traceback(tmp_path):
    """meta.json marks the data prepared; one left empty (a disk that filled as it was written by
    an earlier version) counts as not prepared, and the next prepare writes it whole."""
    from translate.prepare import changed_sources, is_prepared

    cfg = load_config(tiny_config(tmp_path), ["data.num_workers=0"])
    prepare(cfg)
    meta = cfg.run_path / "data" / "meta.json"
    meta.write_text("")
    assert not is_prepared(cfg) and changed_sources(cfg) == []
    prepare(cfg)
    assert is_prepared(cfg) and json.loads(meta.read_text())["fingerprint"]
    assert not [p.name for p in meta.parent.iterdir() if p.name.endswith(".tmp")]


def test_the_source_files_recorded_are_those_read(tmp_path, monkeypatch):
    """meta.json's sources (whose change refuses a resume, and prepares again) are exactly the files the
    sources open: PREFIX.<lang> under a `~` or glob characters, not the files beside them; every file of
    a local dataset directory."""
    from translate.prepare import changed_sources, is_prepared, source_files, source_sizes

    monkeypatch.setenv("HOME", str(tmp_path))
    corpus = tmp_path / "c[1]"
    corpus.mkdir()
    fixtures = Path(__file__).parent / "fixtures"
    for lang in ("en", "fr"):
        (corpus / f"base.{lang}").write_bytes((fixtures / f"bible.train.{lang}").read_bytes())
    (corpus / "base.README").write_text("notes beside the corpus\n")
    cfg = load_config(tiny_config(tmp_path, data={"train": "~/c[1]/base", "num_workers": 0}))
    assert source_files(cfg)["train"] == [corpus / "base.en", corpus / "base.fr"]
    prepare(cfg)
    (corpus / "base.README").unlink()  # not a source: the run is still prepared and resumable
    assert is_prepared(cfg) and changed_sources(cfg) == []
    with open(corpus / "base.fr", "a", encoding="utf-8") as f:
        f.write("Une ligne de plus.\n")
    assert not is_prepared(cfg) and changed_sources(cfg) == [str(corpus / "base.fr")]

    saved = tmp_path / "saved"
    (saved / "train").mkdir(parents=True)
    for name in ("dataset_dict.json", "train/data-00000-of-00001.arrow", "train/state.json"):
        (saved / name).write_text("{}")
    hub = load_config(tiny_config(tmp_path, name="hub", data={"source": "hub", "dataset": str(saved)}))
    assert sorted(source_files(hub)["dataset"]) == sorted(p for p in saved.rglob("*") if p.is_file())
    meta = hub.run_path / "data" / "meta.json"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"sources": source_sizes(hub), "sources_exact": True}))
    assert changed_sources(hub) == []
    (saved / "train" / "data-00001-of-00002.arrow").write_text("{}")  # a file more since: other data
    assert changed_sources(hub) == [str(saved / "train" / "data-00001-of-00002.arrow")]
    named = load_config(tiny_config(tmp_path, data={"source": "hub", "dataset": "wmt/wmt14"}))
    assert source_files(named)["dataset"] == []  # a hub name: its key, no file (as the fingerprints before)


def test_holding_out_too_many_pairs_says_the_rule(tmp_path):
    from translate.prepare import _hold_out

    cfg = load_config(tiny_config(tmp_path))  # data.source files
    with pytest.raises(UserError, match=r"only 3000 pairs .* 500 valid and 1000 test pairs \(less than half of train"):
        _hold_out(cfg, tmp_path, 3000, ["valid", "test"])
    hub = load_config(tiny_config(tmp_path), ["data.source=hub", "data.dataset=d", "data.train=null"])
    with pytest.raises(UserError, match=r"held out; set data.valid_size/test_size\)$"):  # hub reads no data.valid
        _hold_out(hub, tmp_path, 3000, ["valid", "test"])
