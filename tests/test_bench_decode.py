"""scripts/bench_decode.py on the tiny trained run: it runs, and its comparisons hold."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).parent.parent / "scripts" / "bench_decode.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_decode", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_runs_and_cached_equals_no_cache(bench, trained_run, capsys):
    run, _ = trained_run
    args = ["--sentences", "6", "--batch-sentences", "4", "--beam", "3", "--repeats", "1", "--vs-nocache"]
    bench.main([str(run / "checkpoints" / "best.pt"), *args])
    out = capsys.readouterr().out
    assert "6 sentences, 2 greedy / 2 beam batches" in out  # the run's data/test.en by default
    for name in ("greedy", "beam 3", "greedy no-cache", "beam 3 no-cache"):
        row = next(line for line in out.splitlines() if line.startswith(name + " "))
        sent_s, tok_s, seconds, peak_mb = map(float, row[len(name) :].split())
        assert sent_s > 0 and tok_s > 0 and seconds > 0 and peak_mb > 0
    assert "greedy cached / no-cache" in out and "beam 3 cached / no-cache" in out
    assert out.count("100.0% outputs identical") == 2


def test_bench_int8_and_token_budget(bench, trained_run, capsys):
    run, _ = trained_run
    args = ["--sentences", "5", "--batch-sentences", "0", "--repeats", "1", "--quantize", "int8"]
    bench.main([str(run / "checkpoints" / "best.pt"), *args])
    out = capsys.readouterr().out
    assert "5 sentences, 1 greedy / 1 beam batches" in out and "int8" in out


def test_bench_says_what_is_missing(bench, tmp_path, monkeypatch, trained_run):
    with pytest.raises(SystemExit, match="checkpoint not found"):
        bench.main([str(tmp_path / "none.pt")])
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    run, _ = trained_run
    with pytest.raises(SystemExit, match="needs HF transformers"):
        bench.main([str(run / "checkpoints" / "best.pt"), "--vs-hf", "--sentences", "2", "--repeats", "1"])


def test_hf_marian_holds_the_same_model(bench, trained_run):
    pytest.importorskip("transformers")
    from translate.checkpoint import load_model

    run, _ = trained_run
    model, _, _ = load_model(run / "checkpoints" / "best.pt")
    hf = bench.hf_marian(model)
    src = torch.tensor([[10, 20, 30, 3], [11, 12, 3, 0]])
    tgt = torch.tensor([[2, 40, 50], [2, 60, 70]])
    with torch.no_grad():
        theirs = hf(input_ids=src, attention_mask=src != 0, decoder_input_ids=tgt).logits
        torch.testing.assert_close(theirs, model(src, tgt), atol=1e-5, rtol=1e-5)


def small_run_alpha_0(bench, trained_run, capsys, system: str) -> str:
    """The bench on 6 sentences, batches of 3, beam 3, alpha 0, against `system`; its output."""
    run, _ = trained_run
    args = ["--sentences", "6", "--batch-sentences", "3", "--beam", "3", "--repeats", "1", system]
    bench.main([str(run / "checkpoints" / "best.pt"), *args, "--length-penalty", "0"])
    return capsys.readouterr().out


def test_hf_beam_without_length_penalty_is_the_same_search(bench, trained_run, capsys):
    """With alpha 0 HF's beam search (early_stopping="never") and ours rank alike and find the same
    1-best (ours stops sooner)."""
    pytest.importorskip("transformers")
    out = small_run_alpha_0(bench, trained_run, capsys, "--vs-hf")
    assert "beam 3 ours / HF generate" in out
    assert out.count("100.0% outputs identical") == 2  # greedy and beam 3


def test_ct2_holds_the_same_model(bench, trained_run, capsys):
    """CTranslate2 converted from the same weights gives the same greedy outputs (cut to each
    sentence's limit). Its beam search is not compared here: its one maximum length per batch
    changes the search of the sentences that reach theirs, which this barely trained model's do."""
    pytest.importorskip("transformers")
    pytest.importorskip("ctranslate2")
    out = small_run_alpha_0(bench, trained_run, capsys, "--vs-ct2")
    assert "beam 3 ours / CTranslate2" in out
    assert next(line for line in out.splitlines() if line.startswith("greedy ours / CTranslate2")).endswith(
        "(100.0% outputs identical)"
    )
