"""End to end through the real command line: prepare -> train -> decode -> evaluate -> ..."""

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml
from conftest import FIXTURES, run_cli, run_main, tiny_config
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from translate.checkpoint import load_checkpoint
from translate.errors import UserError

COMMANDS = ["prepare", "train", "decode", "evaluate", "average", "tune", "attention", "info", "plot"]


pytestmark = pytest.mark.e2e  # every test here runs the real command line (a subprocess, or main() with its argv)


def test_help_lists_every_command():
    out = run_cli("--help").stdout
    for command in COMMANDS:
        assert command in out
    for command in COMMANDS:
        assert "Usage" in run_cli(command, "--help").stdout


def test_prepare_writes_vocab_and_ids_and_reuses_them(tmp_path):
    config = tiny_config(tmp_path)
    run_cli("prepare", "--config", config)
    run = tmp_path / "runs" / "e2e"
    meta = json.loads((run / "data" / "meta.json").read_text())
    # the 400 train pairs and their placeholder copies (data.protect_share 0.1); valid and test as they are
    assert 420 <= meta["splits"]["train"]["pairs"] <= 460 and meta["splits"]["test"]["pairs"] == 40
    assert (run / "spm.model").is_file()
    again = run_cli("prepare", "--config", config)
    assert "nothing to do" in again.stderr


def test_training_writes_run_dir_checkpoints_and_tensorboard(trained_run):
    run, _ = trained_run
    ckpts = run / "checkpoints"
    assert {"last.pt", "best.pt", "step_0000004.pt", "step_0000008.pt"} <= {p.name for p in ckpts.iterdir()}
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["max_steps"] == 8
    log = (run / "train.log").read_text()
    assert "training stopped" in log and "oneDNN primitive cache " in log
    events = EventAccumulator(str(run / "tb"), size_guidance={"images": 0, "tensors": 0}).Reload()
    scalars = set(events.Tags()["scalars"])
    expected = {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s"}
    expected |= {"valid/loss", "valid/ppl", "valid/bleu", "valid/chrf"}
    assert expected <= scalars
    assert [e.step for e in events.Scalars("valid/loss")] == [4, 8]
    assert [e.step for e in events.Scalars("train/loss")] == [2, 4, 6, 8]
    if sys.platform.startswith("linux"):  # the process's resident memory, from /proc
        memory = [e.value for e in events.Scalars("sys/host_memory_mb")]
        assert len(memory) == 4 and all(50 < m < 100_000 for m in memory)
        peak = [e.value for e in events.Scalars("sys/host_memory_peak_mb")]  # since training started
        assert len(peak) == 4 and all(p >= m * 0.95 for p, m in zip(peak, memory)) and peak == sorted(peak)
        assert "(peak " in log
    assert any(t.startswith("valid/attention") for t in events.Tags()["images"])
    assert "valid/samples/text_summary" in events.Tags()["tensors"]


def test_theonednn_primitive_cache_is_sized_by_the_cpu_unless_set(tmp_path, monkeypatch):
    """16 primitives with AMX, 1,024 (oneDNN's own default) without; a value the user set is kept."""
    from translate import cli

    amx, avx512 = tmp_path / "amx", tmp_path / "avx512"
    amx.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n\n")
    avx512.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16\n\n")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    assert cli._cpu_uses_amx(str(amx)) and not cli._cpu_uses_amx(str(avx512))
    assert not cli._cpu_uses_amx(str(tmp_path / "missing"))
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")  # AMX not allowed
    assert not cli._cpu_uses_amx(str(amx))
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
    assert cli._cpu_uses_amx(str(amx))
    monkeypatch.setattr(cli, "_cpu_uses_amx", lambda: True)
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "")  # recorded, so the value set below is undone after
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY")
    assert cli.onednn_primitive_cache() == "16: the CPU has AMX"
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "200")
    assert cli.onednn_primitive_cache() == "200: ONEDNN_PRIMITIVE_CACHE_CAPACITY as set"
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY")
    monkeypatch.setattr(cli, "_cpu_uses_amx", lambda: False)
    assert cli.onednn_primitive_cache() == "1024: no AMX on this CPU"
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "1024"


@pytest.mark.slow  # trains end to end: `make test-all` and CI run it
def test_decode_and_evaluate_a_checkpoint(trained_run, tmp_path):
    run, _ = trained_run
    ckpt = run / "checkpoints" / "best.pt"
    src = tmp_path / "in.en"
    src.write_text("In the beginning God created the heavens.\n\nHe said: hello.\n")
    out = tmp_path / "out.fr"
    run_cli("decode", ckpt, "-i", src, "-o", out, "--beam", "5")
    assert len(out.read_text().split("\n")) == 4 and out.read_text().split("\n")[1] == ""
    greedy = run_cli("decode", ckpt, "--beam", "1", input=src.read_text()).stdout
    assert len(greedy.split("\n")) == 4
    nbest = run_cli("decode", ckpt, "-i", src, "--nbest", "2", "--beam", "3", "--scores").stdout.splitlines()
    assert len(nbest) == 6 and all(len(line.split("\t")) == 3 for line in nbest)

    scores_file = tmp_path / "scores.json"
    hyp = tmp_path / "test.hyp"
    result = run_cli(
        "evaluate", ckpt, "--src", FIXTURES / "bible.test.en", "--ref", FIXTURES / "bible.test.fr",
        "--json", scores_file, "-o", hyp, "--beam", "2",
    )  # fmt: skip
    assert "BLEU" in result.stdout and "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp" in result.stdout
    scores = json.loads(scores_file.read_text())
    assert 0 <= scores["bleu"] <= 100 and 0 <= scores["chrf"] <= 100 and scores["sentences"] == 40
    assert scores["inputs"] == {"ref": str(FIXTURES / "bible.test.fr"), "src": str(FIXTURES / "bible.test.en"),
                                "checkpoints": [str(ckpt)]}  # fmt: skip
    assert scores["search"]["beam_size"] == 2 and scores["search"]["split"] is True
    rescored = run_cli("evaluate", "--hyp", hyp, "--ref", FIXTURES / "bible.test.fr").stdout
    assert f"BLEU {scores['bleu']:.2f}" in rescored


@pytest.mark.slow  # trains end to end: `make test-all` and CI run it
def test_info_average_attention(trained_run, tmp_path):
    run, _ = trained_run
    info = run_cli("info", run / "checkpoints" / "last.pt").stdout
    assert "step: 8" in info and "parameters:" in info and "vocabulary: 300" in info
    ckpt = load_checkpoint(run / "checkpoints" / "last.pt")
    ckpt["metrics"] = {"bleu": None, "loss": 3}  # made by hand: info prints what is there
    torch.save(ckpt, tmp_path / "odd.pt")
    assert "validation: bleu None, loss 3.000" in run_cli("info", tmp_path / "odd.pt").stdout
    avg = tmp_path / "avg.pt"
    run_cli("average", "--last", "2", "--run", run, "-o", avg)
    assert "averaged from" in run_cli("info", avg).stdout
    run_cli("decode", avg, "--beam", "2", input="Hello.\n")
    png = tmp_path / "attn.png"
    out = run_cli("attention", run / "checkpoints" / "best.pt", "God saw the light.", "-o", png).stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "attention heatmap" in out


def test_train_refuses_an_existing_run_without_resume(trained_run):
    run, config = trained_run
    before = {p.name: p.stat().st_mtime_ns for p in (run / "checkpoints").iterdir()}
    result = run_cli("train", "--config", config, check=False)
    assert result.returncode == 2
    assert "--resume" in result.stderr and "Traceback" not in result.stderr
    assert {p.name: p.stat().st_mtime_ns for p in (run / "checkpoints").iterdir()} == before


def test_user_mistakes_are_one_line(tmp_path, monkeypatch, capsys):
    config = tiny_config(tmp_path)
    code, _, err = run_main(monkeypatch, capsys, "train", "--config", config, "--set", "train.warmup_step=3")
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines() == [
        "error: unknown config key 'train.warmup_step'; did you mean 'train.warmup_steps'?"
    ]
    code, _, err = run_main(monkeypatch, capsys, "decode", tmp_path / "nope.pt", "-i", config)
    assert code == 2 and "not found" in err and "Traceback" not in err


def test_decode_refuses_to_write_over_the_file_its_stdin_reads(tmp_path):
    src = tmp_path / "s.en"
    src.write_text("Hello.\n")
    with open(src) as stdin:  # translate decode CKPT -i - -o s.en < s.en
        result = subprocess.run(
            [sys.executable, "-m", "translate", "decode", "any.pt", "-i", "-", "-o", str(src)],
            stdin=stdin, capture_output=True, text=True,
        )  # fmt: skip
    assert result.returncode == 2 and "one of the input files" in result.stderr
    assert src.read_text() == "Hello.\n"


def test_an_exported_model_given_as_a_checkpoint_is_named_as_such(tmp_path):
    (tmp_path / "translate_config.yaml").write_text("name: x\n")
    with pytest.raises(UserError, match="is a model exported by translate export, not a checkpoint"):
        load_checkpoint(tmp_path)


def test_decode_with_stdin_closed_is_one_line():
    command = f"{sys.executable} -m translate decode any.pt -i - <&-"
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
    assert (
        result.returncode == 2
        and result.stderr.strip() == "error: stdin is closed: give --input FILE, or pipe the text in"
    )
