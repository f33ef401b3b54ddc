"""Every user mistake and fault ends in one `error:` line and exit 2, never a traceback, and
leaves the files the user had as they were (docs/errors.md lists the cases).

Most cases run the command line in this process (`translate.cli.main` with its argv, as the
console script does), which saves a torch import per case; one case per category, and the
ones about signals, pipes and stdin, run it in a subprocess (`run_cli`).
"""

from __future__ import annotations

import errno
import fcntl
import gzip
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import FIXTURES, run_cli, run_main, tiny_config
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from translate.checkpoint import CHECKPOINT_FORMAT, load_checkpoint

# ---------------------------------------------------------------------------- helpers


def snapshot(*roots: Path) -> dict[str, tuple[int, str]]:
    """Every file under `roots`: (mtime, sha1 of the bytes)."""
    files = {}
    for root in roots:
        for path in [root] if root.is_file() else sorted(root.rglob("*")):
            if path.is_file():
                files[str(path)] = (path.stat().st_mtime_ns, hashlib.sha1(path.read_bytes()).hexdigest())
    return files


def changed(before: dict[str, tuple[int, str]]) -> list[str]:
    """The files of a `snapshot` that are gone or differ now (new files do not count)."""
    now = snapshot(*map(Path, before))
    return [path for path, state in before.items() if now.get(path) != state]


def assert_one_error(code: int, err: str, *names: object, logs: bool = False) -> str:
    """Exit 2, no traceback, one `error:` line naming `names`; with `logs`, progress lines may precede it."""
    lines = err.strip().splitlines()
    assert code == 2, err
    assert "Traceback" not in err and "Fatal" not in err, err
    assert [line for line in lines if line.startswith("error:")] == lines[-1:], err
    assert logs or len(lines) == 1, err
    for name in names:
        assert str(name) in lines[-1], f"{name!r} not in {lines[-1]!r}"
    return lines[-1]


@pytest.fixture
def cli(monkeypatch, capsys):
    return lambda *args: run_main(monkeypatch, capsys, *args)


@pytest.fixture
def files(tmp_path) -> SimpleNamespace:
    """Small bad inputs of every kind, and a good tiny config."""
    d = tmp_path / "in"
    d.mkdir()
    f = SimpleNamespace(dir=d, config=tiny_config(d))
    writes = {
        "bad.yaml": b"model:\n  d_model: 32\n   n_heads: [\n",
        "list.yaml": b"- model\n- train\n",
        "binary.yaml": b"\xff\xfe\x00bad",
        "typo.yaml": b"model:\n  d_modle: 32\n",
        "twice.yaml": b"train:\n  lr: 1.0e-3\nmodel: {}\ntrain:\n  max_steps: 5\n",
        "two.en": b"one\ntwo\n",
        "two.fr": b"un\n",
        "bad.en": b"fine\nbad \xff here\n",
        "bad.fr": b"bien\nmal\n",
        "empty.en": b"",
        "empty.fr": b"",
        "blank.en": b"  \n\t\n",
        "blank.fr": b"x\ny\n",
        "bad.jsonl": b'{"en": "a", "fr": "b"}\n{"en": "a", \n',
        "surrogate.jsonl": b'{"en": "a", "fr": "b"}\n{"en": "a \\ud800", "fr": "b"}\n',
        "blankend.en": b"one\ntwo\n\n",
        "blankend.fr": b"un\ndeux\n",
        "gz.en": gzip.compress(b"one\ntwo\n", mtime=0),
        "gz.fr": b"un\ndeux\n",
        "three.fr": b"un\ndeux\ntrois\n",
        "terms.tsv": b"Lord\tSeigneur\n",
        "odd.en": "\ufeffHello.\r\n\n   \n...!?\n中文句子。\n😀🎉\n".encode(),
    }
    for name, data in writes.items():
        (d / name).write_bytes(data)
        setattr(f, name.replace(".", "_"), d / name)
    return f


@pytest.fixture(scope="module")
def broken(trained_run, tmp_path_factory) -> SimpleNamespace:
    """Checkpoint files that are wrong in every way a user can meet."""
    run, _ = trained_run
    d = tmp_path_factory.mktemp("broken")
    good = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    data = (run / "checkpoints" / "last.pt").read_bytes()
    (d / "truncated.pt").write_bytes(data[: len(data) // 2])
    middle = len(data) // 2  # bytes damaged inside the weights: torch.load reads them as they are
    (d / "damaged.pt").write_bytes(data[:middle] + b"\xff" * 4096 + data[middle + 4096 :])
    (d / "empty.pt").write_bytes(b"")
    (d / "text.pt").write_text("not a checkpoint\n")
    torch.save({**good, "format": 99}, d / "future.pt")
    torch.save({"model": torch.nn.Linear(4, 2).state_dict(), "epoch": 3}, d / "unrelated.pt")
    torch.save({"format": CHECKPOINT_FORMAT, "model": {}}, d / "incomplete.pt")
    torch.save({**good, "config": "decode: {}"}, d / "badconfig.pt")
    torch.save({**good, "spm_model": b"not a sentencepiece model"}, d / "badspm.pt")
    shrunk = {k: v[..., :1].clone() if v.dim() else v for k, v in good["model"].items()}
    torch.save({**good, "model": shrunk}, d / "shapes.pt")
    return SimpleNamespace(dir=d, **{p.stem: p for p in d.iterdir()})


@pytest.fixture
def run_copy(trained_run, tmp_path) -> tuple[Path, list[str]]:
    """A copy of the trained run (at step 8) and the options that resume it for one more step."""
    run, _ = trained_run
    copy = tmp_path / "runs" / run.name
    shutil.copytree(run, copy)
    return copy, ["--config", copy, "--set", f"run_dir={copy.parent}", "--set", "train.max_steps=9"]


# ---------------------------------------------------------------------------- config

CONFIG_CASES = {
    "missing file": (lambda f: ["--config", f.dir / "nope.yaml"], ["config file not found", "nope.yaml"]),
    "yaml syntax": (lambda f: ["--config", f.bad_yaml], ["bad.yaml", "line 3", "YAML syntax error"]),
    "not a mapping": (lambda f: ["--config", f.list_yaml], ["list.yaml", "mapping"]),
    "not utf-8": (lambda f: ["--config", f.binary_yaml], ["binary.yaml", "UTF-8"]),
    "unknown key": (lambda f: ["--config", f.typo_yaml], ["'model.d_modle'", "did you mean 'model.d_model'"]),
    "wrong type": (lambda f: ["--config", f.config, "--set", "train.lr=fast"], ["'train.lr' expects float"]),
    "negative lr": (lambda f: ["--config", f.config, "--set", "train.lr=-1"], ["train.lr must be positive"]),
    "heads": (
        lambda f: ["--config", f.config, "--set", "model.d_model=30", "--set", "model.n_heads=4"],
        ["model.d_model (30)", "model.n_heads (4)"],
    ),
    "beam 0": (lambda f: ["--config", f.config, "--set", "decode.beam_size=0"], ["decode.beam_size"]),
    "no heads": (lambda f: ["--config", f.config, "--set", "model.n_heads=0"], ["model.n_heads", "positive"]),
    "infinite lr": (lambda f: ["--config", f.config, "--set", "train.lr=.inf"], ["train.lr must be a finite number"]),
    "nan length penalty": (
        lambda f: ["--config", f.config, "--set", "decode.length_penalty=.nan"],
        ["decode.length_penalty must be a finite number"],
    ),
    "negative length penalty": (
        lambda f: ["--config", f.config, "--set", "decode.length_penalty=-1"],
        ["decode.length_penalty must be at least 0"],
    ),
    "key given twice": (lambda f: ["--config", f.twice_yaml], ["twice.yaml", "line 4", "key 'train' given twice"]),
    "max_tokens below a sentence": (
        lambda f: ["--config", f.config, "--set", "train.max_tokens=64"],
        ["train.max_tokens (64)", "data.max_len (128)"],
    ),
    "one language twice": (
        lambda f: ["--config", f.config, "--set", "data.tgt_lang=en"],
        ["data.src_lang and data.tgt_lang are both 'en'"],
    ),
    "a path for a language": (lambda f: ["--config", f.config, "--set", "data.tgt_lang=../fr"], ["'../fr'"]),
    "--set without =": (lambda f: ["--config", f.config, "--set", "foo"], ["--set", "'foo'"]),
    "--set into a value": (
        lambda f: ["--config", f.config, "--set", "model.d_model.x=1"],
        ["'d_model' is not a section"],
    ),
    "--set without key": (lambda f: ["--config", f.config, "--set", "=3"], ["--set", "'=3'"]),
    "--set bad value": (
        lambda f: ["--config", f.config, "--set", "train.max_steps=[1"],
        ["'train.max_steps' expects int"],
    ),
}


@pytest.mark.parametrize("case", CONFIG_CASES)
def test_config_mistakes(cli, files, case):
    args, names = CONFIG_CASES[case]
    before = snapshot(files.dir)
    assert_one_error(*cli("prepare", *args(files))[::2], *names)
    assert not changed(before)
    assert not (files.dir / "runs").exists()  # refused before anything was written


def test_config_mistake_and_bad_options_through_the_console(files):
    result = run_cli("train", "--config", files.config, "--set", "train.max_tokens=64", check=False)
    assert_one_error(result.returncode, result.stderr, "train.max_tokens (64)", "raise train.max_tokens")


@pytest.mark.parametrize(
    "args, names",
    [
        (["decod"], ["No such command 'decod'", "Did you mean 'decode'"]),
        (["decode", "x.pt", "--beam", "abc"], ["'--beam'", "integer", "--help"]),
        (["decode", "x.pt", "--bem", "3"], ["--bem"]),
        (["evaluate", "--hyp", "x"], ["Missing option '--ref'"]),
        (["info"], ["Missing argument"]),
    ],
)
def test_command_line_usage_mistakes_are_one_line(cli, args, names):
    assert_one_error(*cli(*args)[::2], *names)


def test_vocab_larger_than_the_corpus_allows(cli, files):
    code, _, err = cli("prepare", "--config", files.config, "--set", "vocab.size=50000")
    assert_one_error(code, err, "vocab.size 50000 is too large", "at most", logs=True)


def test_a_glossary_the_config_names_is_read_before_training(cli, files):
    code, _, err = cli("train", "--config", files.config, "--set", f"decode.glossary={files.dir / 'nope.tsv'}")
    assert_one_error(code, err, "glossary file not found", "nope.tsv")
    assert not [p for p in (files.dir / "runs").rglob("*") if p.name in ("data", "checkpoints", "spm.model")]


def test_vocab_smaller_than_the_corpus_characters(cli, files):
    code, _, err = cli("prepare", "--config", files.config, "--set", "vocab.size=8")
    assert_one_error(code, err, "vocab.size 8 is too small", "pieces; raise vocab.size", logs=True)


# ---------------------------------------------------------------------------- data

DATA_CASES = {
    "missing files": (["data.train=" + "{d}/nope"], ["data.train: file not found", "nope.en"]),
    "line counts": (["data.valid={d}/two"], ["two.en has 2 lines", "two.fr has 1"]),
    "undecodable": (["data.valid={d}/bad"], ["bad.en:2", "not UTF-8"]),
    "empty file": (["data.valid={d}/empty"], ["empty.en", "empty"]),
    "empty after cleaning": (["data.valid={d}/blank"], ["valid split is empty after cleaning", "2 had an empty side"]),
    "bad jsonl": (["data.valid={d}/bad.jsonl"], ["bad.jsonl:2", "not valid JSON"]),
    "lone surrogate": (["data.valid={d}/surrogate.jsonl"], ["surrogate.jsonl:2", "\\ud800, a lone surrogate"]),
    "blank lines at the end": (["data.valid={d}/blankend"], ["blankend.en has 3 lines", "ends in 1 blank line"]),
    "compressed": (["data.valid={d}/gz"], ["gz.en:1", "not UTF-8", "a gzip file? decompress it first"]),
    "length filters": (
        ["data.max_len=4", "train.max_tokens=16"],
        ["no train pair is left after the length filters", "data.max_len=4"],
    ),
}


@pytest.mark.parametrize("case", DATA_CASES)
def test_data_mistakes(cli, files, case):
    sets, names = DATA_CASES[case]
    before = snapshot(files.dir, FIXTURES)
    options = [x for s in sets for x in ("--set", s.format(d=files.dir))]
    assert_one_error(*cli("prepare", "--config", files.config, *options)[::2], *names, logs=True)
    assert not changed(before)
    assert not (files.dir / "runs" / "e2e" / "data").exists()  # nothing half made, nothing taken for prepared data


def test_a_failed_prepare_leaves_the_data_that_was_there(cli, files, monkeypatch):
    """Prepared data is built aside and moved into place whole: a mistake found late (the valid split's
    files of different lengths, Ctrl-C while the vocabulary is trained) changes nothing of the run."""
    run = files.dir / "runs" / "e2e"
    assert cli("prepare", "--config", files.config)[0] == 0
    before = snapshot(run / "data", run / "spm.model")  # (prepare.log tells of each attempt)
    assert_one_error(
        *cli("prepare", "--config", files.config, "--set", f"data.valid={files.dir}/two")[::2], "two.en", logs=True
    )
    assert not changed(before) and sorted(p.name for p in (run / "data").iterdir()) == sorted(
        Path(p).name for p in before if Path(p).parent.name == "data"
    )
    monkeypatch.setattr(
        "translate.prepare.Tokenizer.train", lambda *args, **kwargs: (_ for _ in ()).throw(KeyboardInterrupt)
    )
    assert cli("prepare", "--config", files.config, "--force")[0] == 130
    assert not changed(before) and not (run / "data" / ".partial").exists()
    monkeypatch.undo()
    assert "nothing to do" in cli("prepare", "--config", files.config)[2]  # still prepared for the config


def test_data_mistake_through_the_console(files):
    result = run_cli("prepare", "--config", files.config, "--set", f"data.valid={files.dir}/two", check=False)
    assert_one_error(result.returncode, result.stderr, files.two_en, "2 lines", files.two_fr, logs=True)


# ---------------------------------------------------------------------------- checkpoints

CHECKPOINT_CASES = {
    "missing": ("missing.pt", ["checkpoint not found", "missing.pt"]),
    "directory": ("", ["is a directory, not a checkpoint"]),
    "truncated": ("truncated.pt", ["truncated.pt", "truncated or corrupt"]),
    "damaged": ("damaged.pt", ["damaged.pt", "corrupt: its record", "fails its checksum"]),
    "empty": ("empty.pt", ["empty.pt", "an empty file"]),
    "text": ("text.pt", ["text.pt", "not a checkpoint"]),
    "other format": ("future.pt", ["future.pt", "checkpoint format 99", f"reads format {CHECKPOINT_FORMAT}"]),
    "unrelated model": ("unrelated.pt", ["unrelated.pt", "not a translate checkpoint"]),
    "incomplete": ("incomplete.pt", ["incomplete.pt", "no config, vocab_size, spm_model"]),
    "corrupt config": ("badconfig.pt", ["badconfig.pt", "corrupt: its config"]),
    "corrupt vocabulary": ("badspm.pt", ["badspm.pt", "corrupt: its spm_model"]),
    "other shapes": ("shapes.pt", ["shapes.pt", "weights do not fit", "size mismatch"]),
}


@pytest.mark.parametrize("case", CHECKPOINT_CASES)
def test_checkpoint_mistakes(cli, broken, files, case):
    name, names = CHECKPOINT_CASES[case]
    before = snapshot(broken.dir, files.dir)
    out = files.dir / "out.fr"
    commands = [["decode", broken.dir / name, "-i", files.odd_en, "-o", out], ["info", broken.dir / name]]
    for command in commands[: 1 if case == "other shapes" else 2]:  # info reads no weights
        assert_one_error(*cli(*command)[::2], *names)
    assert not changed(before) and not out.exists()


def test_checkpoint_mistake_through_the_console(broken):
    result = run_cli("decode", broken.truncated, input="Hello.\n", check=False)
    assert_one_error(result.returncode, result.stderr, broken.truncated, "truncated or corrupt")


def test_average_mistakes(cli, trained_run, broken, tmp_path):
    run, _ = trained_run
    ckpts = run / "checkpoints"
    before = snapshot(run / "data", run / "spm.model")  # (prepare.log tells of each attempt)
    out = tmp_path / "avg.pt"
    step_4 = ckpts / "step_0000004.pt"
    twin = tmp_path / "twin.pt"  # another name of an input's file (as last.pt is of the newest step's)
    os.link(step_4, twin)
    heads = tmp_path / "heads.pt"  # weights of the same shapes, another model
    ckpt = load_checkpoint(step_4)
    ckpt["config"]["model"]["n_heads"] *= 2
    torch.save(ckpt, heads)
    cases = [
        (["average", ckpts / "best.pt", "-o", out], ["at least two checkpoints"]),
        (["average", step_4, ckpts / "last.pt", "-o", twin], ["twin.pt", "one of the input files"]),
        (["average", step_4, heads, "-o", out], ["heads.pt", "model.n_heads", "one model"]),
        (["average", step_4, twin, "-o", out], ["step_0000004.pt and", "twin.pt are the same checkpoint"]),
        (["average", ckpts / "best.pt", broken.text, "-o", out], ["text.pt", "not a checkpoint"]),
        (["average", ckpts / "best.pt", broken.shapes, "-o", out], ["shapes.pt", "has shape"]),
        (["average", "--last", "0", "--run", run, "-o", out], ["--last must be at least 2"]),
        (["average", "--last", "9", "--run", run, "-o", out], ["fewer than --last 9"]),
        (["average", "--last", "2", "--run", run, "-o", tmp_path / "no" / "avg.pt"], ["directory", "does not exist"]),
        (["average", step_4, ckpts / "last.pt", "-o", ckpts / "last.pt"], ["one of the input files"]),
        (["average", step_4, ckpts / "last.pt", "-o", ckpts / "step_0000099.pt"], ["the run's own", "averaged.pt"]),
        (["average", "--last", "2", "--run", run, ckpts / "best.pt", "-o", out], ["either checkpoints or --last"]),
        (["average", "--last", "2", "--run", tmp_path / "nope", "-o", out], ["nope", "not a run directory"]),
        (["average", ckpts / "best.pt", ckpts / "last.pt", "--run", run, "-o", out], ["--run goes with --last"]),
    ]
    for args, names in cases:
        assert_one_error(*cli(*args)[::2], *names)
    assert not changed(before) and not out.exists()
    with pytest.MonkeyPatch.context() as here:  # a bare name in the run's checkpoints is a run's own too
        here.chdir(ckpts)
        assert_one_error(*cli("average", "step_0000004.pt", "step_0000008.pt", "-o", "step_9.pt")[::2], "the run's own")
    assert not changed(before)
    elsewhere = tmp_path / "checkpoints" / "avg_of_step_8.pt"  # not a run's directory, not a step's name
    elsewhere.parent.mkdir()
    assert cli("average", step_4, ckpts / "last.pt", "-o", elsewhere)[0] == 0 and elsewhere.is_file()


def test_prepare_of_a_trained_run_with_other_settings_is_refused(cli, trained_run, tmp_path):
    run, _ = trained_run
    copy = tmp_path / "runs" / run.name
    shutil.copytree(run, copy)
    before = {path: state for path, state in snapshot(copy).items() if not path.endswith(".lock")}
    config = copy / "config.yaml"
    code, _, err = cli(
        "prepare", "--config", config, "--set", f"run_dir={tmp_path / 'runs'}", "--set", "vocab.size=200"
    )
    assert_one_error(code, err, "cannot prepare: vocab.size is 200 here but", "--set name=")
    assert not changed(before)
    assert (copy / "prepare.log").read_text().rstrip().endswith(err.strip())  # the log says why, as the console did
    code, out, err = cli("prepare", "--config", config, "--set", f"run_dir={tmp_path / 'runs'}")  # as it trained
    assert code == 0 and "prepared data in" in out and not changed(before)
    code, out, err = cli(  # settings that do not change the data
        "prepare", "--config", config, "--set", f"run_dir={tmp_path / 'runs'}", "--set", "model.dropout=0.3",
        "--set", "data.num_workers=1",
    )  # fmt: skip
    assert code == 0 and not changed(before)

    (copy / "checkpoints" / "last.pt").unlink()  # its step checkpoints are left: --resume would write over them
    code, _, err = cli("train", "--config", config, "--set", f"run_dir={tmp_path / 'runs'}", "--resume")
    assert_one_error(code, err, "holds checkpoints but no last.pt", "ln ", logs=True)
    lone = tmp_path / "runs" / "lone" / "checkpoints"  # a best.pt alone (no tb/): not written over either
    lone.mkdir(parents=True)
    shutil.copy(copy / "checkpoints" / "best.pt", lone / "best.pt")
    code, _, err = cli("train", "--config", config, "--set", f"run_dir={tmp_path / 'runs'}", "--set", "name=lone")
    assert_one_error(code, err, "holds checkpoints but no last.pt", "and add --resume", logs=True)
    assert not changed({k: v for k, v in before.items() if not k.endswith(("last.pt", ".log"))})


# ---------------------------------------------------------------------------- decode and evaluate


def decode_cases(f: SimpleNamespace, ckpt: Path) -> dict[str, tuple[list, list]]:
    ref, out = FIXTURES / "bible.test.fr", f.dir / "out.fr"
    return {
        "undecodable input": (["decode", ckpt, "-i", f.bad_en, "-o", out], ["bad.en:2", "not UTF-8"]),
        "missing input": (["decode", ckpt, "-i", f.dir / "nope.en"], ["input file not found", "nope.en"]),
        "input is a directory": (["decode", ckpt, "-i", f.dir], ["is a directory"]),
        "output is the input": (["decode", ckpt, "-i", f.odd_en, "-o", f.odd_en], ["is the input file"]),
        "one checkpoint twice": (["decode", ckpt, ckpt, "-i", f.odd_en, "-o", out], ["are the same checkpoint"]),
        "output is the checkpoint": (["decode", ckpt, "-i", f.odd_en, "-o", ckpt], ["is one of the input files"]),
        "output is a directory": (["decode", ckpt, "-i", f.odd_en, "-o", f.dir], ["is a directory"]),
        "output dir missing": (["decode", ckpt, "-i", f.odd_en, "-o", f.dir / "no" / "o.fr"], ["does not exist"]),
        "output dir is a file": (["decode", ckpt, "-i", f.odd_en, "-o", f.two_en / "o.fr"], ["is not a directory"]),
        "beam 0": (["decode", ckpt, "-i", f.odd_en, "--beam", "0"], ["--beam must be at least 1, got 0"]),
        "negative beam": (["decode", ckpt, "-i", f.odd_en, "--beam", "-3"], ["--beam must be at least 1, got -3"]),
        "batch tokens 0": (["decode", ckpt, "-i", f.odd_en, "--batch-tokens", "0"], ["--batch-tokens"]),
        "negative max len": (["decode", ckpt, "-i", f.odd_en, "--max-len-a", "-1"], ["--max-len-a"]),
        "negative workers": (["decode", ckpt, "-i", f.odd_en, "--workers", "-1"], ["--workers must be at least 0"]),
        "nbest above beam": (["decode", ckpt, "-i", f.odd_en, "--beam", "2", "--nbest", "3"], ["nbest", "(2)"]),
        "beam above the vocabulary": (["decode", ckpt, "-i", f.odd_en, "--beam", "100000"], ["--beam", "vocabulary"]),
        "nan length penalty": (["decode", ckpt, "-i", f.odd_en, "--lenpen", "nan"], ["--lenpen", "finite", "nan"]),
        "negative length penalty": (["decode", ckpt, "-i", f.odd_en, "--lenpen", "-1"], ["--lenpen", "at least 0"]),
        "infinite max len": (["decode", ckpt, "-i", f.odd_en, "--max-len-a", "inf"], ["--max-len-a", "finite"]),
        "output is the glossary": (
            ["decode", ckpt, "-i", f.odd_en, "-o", f.terms_tsv, "--glossary", f.terms_tsv],
            ["--output", "one of the input files"],
        ),
        "unknown device": (["decode", ckpt, "-i", f.odd_en, "--device", "tpu"], ["--device", "'tpu'"]),
        "output names a directory": (
            ["decode", ckpt, "-i", f.odd_en, "-o", "new/."],
            ["--output", "new/. names a dir"],
        ),
        "json names a directory": (
            ["evaluate", "--hyp", f.two_fr, "--ref", f.two_fr, "--json", "j/"],
            ["--json", "j/"],
        ),
        "line counts": (
            ["evaluate", "--hyp", f.two_fr, "--ref", f.three_fr],
            ["two.fr has 1 line but", "three.fr has 3"],
        ),
        "empty reference": (["evaluate", "--hyp", f.empty_fr, "--ref", f.empty_fr], ["empty.fr is empty"]),
        "blank reference": (["evaluate", "--hyp", f.two_en, "--ref", f.blank_en], ["blank.en has only blank lines"]),
        "one reference twice": (["evaluate", "--hyp", ref, "--ref", ref, "--ref", ref], ["--ref", "given twice"]),
        "second reference counts": (
            ["evaluate", "--hyp", f.two_en, "--ref", f.two_en, "--ref", f.three_fr],
            ["three.fr has 3 lines but", "two.en has 2"],
        ),
        "undecodable hypothesis": (["evaluate", "--hyp", f.bad_en, "--ref", f.two_en], ["bad.en:2", "UTF-8"]),
        "source and reference counts": (
            ["evaluate", ckpt, "--src", f.two_en, "--ref", f.three_fr],
            ["two.en has 2 lines", "three.fr has 3"],
        ),
        "evaluate output is the source": (
            ["evaluate", ckpt, "--src", f.two_en, "--ref", f.dir / "two.fr", "-o", f.two_en],
            ["--output", "one of the input files"],
        ),
        "json is the reference": (["evaluate", "--hyp", ref, "--ref", ref, "--json", ref], ["--json", "input files"]),
        "two outputs in one file": (
            ["evaluate", ckpt, "--src", f.two_en, "--ref", f.dir / "two.fr", "-o", out, "--json", out],
            ["--output and --json are the same file"],
        ),
        "report and json in one file": (
            ["evaluate", "--hyp", ref, "--ref", ref, "--json", f.dir / "s", "--report", f.dir / "s"],
            ["--report and --json are the same file"],
        ),
        "output without a source": (["evaluate", "--hyp", ref, "--ref", ref, "-o", out], ["--output", "--hyp"]),
        "search options without a source": (
            ["evaluate", "--hyp", ref, "--ref", ref, "--beam", "4", "--no-split"],
            ["--beam, --no-split", "with --hyp nothing is translated"],
        ),
        "json dir missing": (["evaluate", "--hyp", ref, "--ref", ref, "--json", f.dir / "no" / "s.json"], ["--json"]),
        "attention layer": (["attention", ckpt, "Hello.", "--layer", "5", "-o", f.dir / "a.png"], ["--layer 5"]),
        "attention head": (["attention", ckpt, "Hello.", "--head", "7", "-o", f.dir / "a.png"], ["--head 7"]),
        "attention empty": (["attention", ckpt, " ", "-o", f.dir / "a.png"], ["sentence to translate is empty"]),
        "attention format": (["attention", ckpt, "Hello.", "-o", f.dir / "a.txt"], ["a.txt", ".png"]),
        "plot missing run": (["plot", f.dir / "nope", "-o", f.dir / "c.png"], ["run directory not found", "nope"]),
        "plot of a file": (["plot", f.two_en, "-o", f.dir / "c.png"], ["two.en is not a directory"]),
    }


class AnyPath:
    def __getattr__(self, name: str) -> Path:
        return Path(name)


DECODE_CASES = list(decode_cases(AnyPath(), Path("x.pt")))  # type: ignore[arg-type]


@pytest.mark.parametrize("case", DECODE_CASES)
def test_decode_and_evaluate_mistakes(cli, trained_run, files, case):
    run, _ = trained_run
    args, names = decode_cases(files, run / "checkpoints" / "best.pt")[case]
    before = snapshot(files.dir, run, FIXTURES)
    assert_one_error(*cli(*args)[::2], *names)
    assert not changed(before)
    assert not (files.dir / "out.fr").exists() and not list(files.dir.glob(".*.tmp"))  # nothing half-written


@pytest.mark.slow  # the stdin and signal cases below run decode in a subprocess by default
def test_decode_evaluate_mistake_through_the_console(files):
    result = run_cli("evaluate", "--hyp", files.two_fr, "--ref", files.three_fr, check=False)
    assert_one_error(result.returncode, result.stderr, files.two_fr, "1 line but", files.three_fr, "3")


def test_odd_input_is_translated_line_for_line(cli, trained_run, files):
    """Empty input, a BOM, CRLF, blank and whitespace-only lines, punctuation, Chinese and emoji."""
    ckpt = trained_run[0] / "checkpoints" / "best.pt"
    out = files.dir / "out.fr"
    assert cli("decode", ckpt, "-i", files.odd_en, "-o", out, "--beam", "2")[0] == 0
    lines = out.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 7 and lines[-1] == "" and lines[1] == lines[2] == ""  # 6 lines, blank ones kept blank
    assert cli("decode", ckpt, "-i", files.empty_en, "-o", out)[0] == 0 and out.read_bytes() == b""
    clean = files.dir / "clean.fr"
    clean.write_text("Bonjour à tous mes amis.\nLe chat est sur la table.\n")
    odd = files.dir / "odd.fr"
    odd.write_bytes("\ufeffBonjour à tous mes amis.\r\nLe chat est sur la table.\r\n".encode())
    code, out_text, _ = cli("evaluate", "--hyp", odd, "--ref", clean)
    assert code == 0 and "BLEU 100.00" in out_text  # BOM and CRLF are accepted


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks for a GPU that is there")
def test_cuda_without_a_gpu(cli, files):
    assert_one_error(*cli("decode", "x.pt", "-i", files.odd_en, "--device", "cuda")[::2], "no CUDA GPU")
    code, _, err = cli("train", "--config", files.config, "--set", "train.device=cuda")
    assert_one_error(code, err, "train.device cuda", "no CUDA GPU")


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks for a GPU that is there")
def test_cuda_without_a_gpu_through_the_console(trained_run, files):
    ckpt = trained_run[0] / "checkpoints" / "best.pt"
    result = run_cli("decode", ckpt, "-i", files.odd_en, "--device", "cuda", check=False)
    assert_one_error(result.returncode, result.stderr, "--device cuda", "no CUDA GPU")


def test_out_of_memory_while_decoding_names_the_setting(cli, trained_run, files, monkeypatch):
    def oom(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr("translate.decoding.beam_search", oom)
    out = files.dir / "out.fr"
    code, _, err = cli("decode", trained_run[0] / "checkpoints" / "best.pt", "-i", files.odd_en, "-o", out)
    assert_one_error(code, err, "out of memory", "--batch-tokens")
    assert not out.exists() and not list(files.dir.glob(".out.fr*"))


# ---------------------------------------------------------------------------- stdin, stdout and signals


def start_decode(ckpt: Path) -> subprocess.Popen:
    """`translate decode CKPT` reading a stdin that stays open, as at a terminal. Its SIGINT is the
    default one even when this process ignores it (a background job does), as at a terminal."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # handlers, unlike SIG_IGN, reset at exec
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "translate", "decode", str(ckpt), "--beam", "1"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    finally:
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_while_reading_stdin_is_one_line(trained_run):
    p = start_decode(trained_run[0] / "checkpoints" / "best.pt")
    p.stdin.write(b"Hello.\n")
    p.stdin.flush()
    assert p.stdout.readline()  # translated: the model is loaded and the reader waits for more
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=60) == 130
    assert p.stderr.read().decode().strip() == "interrupted"  # not Python's fatal error at shutdown
    p.stdin.close()


def test_sigterm_mid_output_is_one_line_and_leaves_the_old_output_whole(trained_run, tmp_path):
    """SIGTERM (a `kill`, a batch system) cleans up as Ctrl-C does: exit 143, one line, the output
    file that was there untouched and no temporary file left beside it."""
    out = tmp_path / "out.fr"
    out.write_text("mine\n")
    p = subprocess.Popen(
        [sys.executable, "-m", "translate", "decode", str(trained_run[0] / "checkpoints" / "best.pt"), "-o", str(out)],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    p.stdin.write(b"Hello.\n")
    p.stdin.flush()
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".out.fr.*.tmp")) and time.monotonic() < deadline:  # writing its output
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) == 143
    assert p.stderr.read().decode().strip() == "terminated"
    assert out.read_text() == "mine\n" and sorted(q.name for q in tmp_path.iterdir()) == ["out.fr"]
    p.stdin.close()


@pytest.mark.skipif(not (sys.platform == "linux" and os.uname().machine == "x86_64"), reason="tgkill of x86-64 Linux")
def test_ctrl_c_delivered_to_the_reader_thread_still_stops(trained_run):
    """The kernel may hand SIGINT to any thread; when the one blocked reading stdin gets it, the
    main thread must still notice (it once waited forever)."""
    import ctypes
    import time

    p = start_decode(trained_run[0] / "checkpoints" / "best.pt")
    p.stdin.write(b"Hello.\n")
    p.stdin.flush()
    assert p.stdout.readline()
    time.sleep(0.3)
    tasks = [int(t) for t in os.listdir(f"/proc/{p.pid}/task") if int(t) != p.pid]
    blocked_in_read = [t for t in tasks if Path(f"/proc/{p.pid}/task/{t}/syscall").read_text().split()[0] == "0"]
    assert blocked_in_read, "no thread of decode is waiting on stdin"
    ctypes.CDLL(None).syscall(234, p.pid, blocked_in_read[0], signal.SIGINT)  # tgkill(pid, tid, SIGINT)
    assert p.wait(timeout=60) == 130
    assert p.stderr.read().decode().strip() == "interrupted"
    p.stdin.close()


def test_reader_of_stdout_gone_is_a_quiet_exit(trained_run):
    """`translate decode CKPT | head -1` at a terminal: no traceback when head exits."""
    p = start_decode(trained_run[0] / "checkpoints" / "best.pt")
    p.stdin.write(b"Hello.\n")
    p.stdin.flush()
    assert p.stdout.readline()
    p.stdout.close()
    p.stdin.write(b"Good morning.\n")
    p.stdin.flush()
    assert p.wait(timeout=60) == 1
    assert p.stderr.read() == b""
    p.stdin.close()


def test_ctrl_c_during_prepare(cli, files, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("translate.prepare.Tokenizer.train", interrupted)
    code, _, err = cli("prepare", "--config", files.config)
    assert code == 130 and err.strip().splitlines()[-1] == "interrupted" and "Traceback" not in err
    assert not (files.dir / "runs" / "e2e" / "data" / "meta.json").exists()  # the next prepare starts again


# ---------------------------------------------------------------------------- runs and devices


def test_run_dir_that_cannot_be_created(cli, files):
    code, _, err = cli("prepare", "--config", files.config, "--set", f"run_dir={files.two_en}")
    assert_one_error(code, err, "cannot create the run directory", "two.en", "Not a directory")


def test_run_mistake_through_the_console(files):
    result = run_cli("train", "--config", files.config, "--set", f"run_dir={files.two_en}", check=False)
    assert_one_error(result.returncode, result.stderr, "cannot create the run directory", files.two_en)
    name = ["--set", f"run_dir={files.two_en.parent}", "--set", f"name={files.two_en.name}"]  # the run is a file
    result = run_cli("train", "--config", files.config, *name, check=False)
    assert_one_error(result.returncode, result.stderr, "is a file, not a directory", files.two_en)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_output_directories(cli, trained_run, files):
    ro = files.dir / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        ckpt = trained_run[0] / "checkpoints" / "best.pt"
        ref = FIXTURES / "bible.test.fr"
        assert_one_error(*cli("decode", ckpt, "-i", files.odd_en, "-o", ro / "o.fr")[::2], "not writable", ro)
        assert_one_error(*cli("evaluate", "--hyp", ref, "--ref", ref, "--json", ro / "s.json")[::2], "not writable")
        code, _, err = cli("prepare", "--config", files.config, "--set", f"run_dir={ro}")
        assert_one_error(code, err, "cannot create the run directory", "Permission denied")
    finally:
        ro.chmod(0o755)


def test_unwritable_places_are_one_line(cli, files, monkeypatch):
    """What a read-only directory gives (also when the tests run as root, who may write anywhere)."""
    ref = FIXTURES / "bible.test.fr"
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == files.dir else real_access(p, mode))
    assert_one_error(*cli("evaluate", "--hyp", ref, "--ref", ref, "--json", files.dir / "s.json")[::2], "not writable")

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(files.dir / "runs" / "x"))

    monkeypatch.setattr("translate.prepare.prepare", denied)
    code, _, err = cli("prepare", "--config", files.config)
    assert_one_error(code, err, "runs/x: Permission denied")


def test_a_start_that_failed_before_its_first_checkpoint_is_started_again(cli, tmp_path):
    """A run that stopped on a mistake before saving anything (here it diverged) has only its
    TensorBoard events: the corrected command starts it again, without --resume, and its curves
    hold each step once."""
    config = tiny_config(tmp_path, name="again", max_bad_steps=3, save_every=100)
    failed = run_cli("train", "--config", config, "--set", "train.lr=1e30", check=False)  # a process, as a user's
    assert_one_error(failed.returncode, failed.stderr, "updates in a row had a non-finite loss", logs=True)
    run = tmp_path / "runs" / "again"
    assert (run / "tb").is_dir() and not list((run / "checkpoints").glob("*.pt"))
    code, _, err = cli("train", "--config", config)
    assert code == 0, err
    events = EventAccumulator(str(run / "tb")).Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [2, 4, 6, 8]


def test_train_into_a_used_run(cli, run_copy):
    copy, options = run_copy
    before = snapshot(copy / "checkpoints")
    code, _, err = cli("train", *options)
    assert_one_error(code, err, "already holds a training run", "--resume")
    with open(copy / ".lock", "w") as held:  # another training holds the run
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        code, _, err = cli("train", *options, "--resume")
        assert_one_error(code, err, "in use by another training", ".lock")
        data = snapshot(copy / "data", copy / "spm.model")
        code, _, err = cli("prepare", *options, "--force")  # would replace the data the training reads
        assert_one_error(code, err, "in use by another training", ".lock")
        assert not changed(data)
    assert not changed(before)


def test_resume_with_other_data_settings_changes_nothing(cli, run_copy):
    """Refused before the data would be prepared again for the new settings."""
    copy, options = run_copy
    before = snapshot(copy / "checkpoints", copy / "data", copy / "spm.model", copy / "config.yaml")
    code, _, err = cli("train", *options, "--set", "vocab.size=200", "--resume")
    assert_one_error(code, err, "cannot resume", "vocab.size", "last.pt")
    assert not changed(before)


@pytest.mark.parametrize("command", ["train", "prepare"])
def test_resume_or_prepare_after_the_source_files_changed_changes_nothing(cli, run_copy, command):
    """Refused before the data would be prepared again from the changed files (a new draw of the valid
    and test pairs would replace the run's)."""
    copy, options = run_copy
    meta_path = copy / "data" / "meta.json"
    meta = json.loads(meta_path.read_text())
    source = sorted(meta["sources"])[0]
    meta["sources"][source] += 1  # as if the file had grown since
    meta_path.write_text(json.dumps(meta))
    before = snapshot(copy / "checkpoints", copy / "data", copy / "spm.model", copy / "config.yaml")
    code, _, err = cli(command, *options, *(["--resume"] if command == "train" else []))
    assert_one_error(
        code, err, f"cannot {command.replace('train', 'resume')}", source, "gone, new or changed", "--set name="
    )
    assert not changed(before)


def test_resume_from_another_directory_of_relative_data_paths_says_where(cli, tmp_path, monkeypatch):
    """Data paths relative to the working directory, resumed from another one: the files are not
    'gone, new or changed', they are looked for elsewhere; the message names where they were read."""
    project = tmp_path / "project"
    shutil.copytree(FIXTURES, project / "corpus", ignore=shutil.ignore_patterns("documents", "glossary", "sources"))
    relative = {split: f"corpus/bible.{split}" for split in ("train", "valid", "test")}
    cfg = tiny_config(tmp_path, data=relative, max_steps=2, eval_every=2, save_every=2)
    monkeypatch.chdir(project)
    code, _, err = cli("train", "--config", str(cfg))
    assert code == 0, err
    config = tmp_path / "runs" / "e2e" / "config.yaml"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    before = snapshot(tmp_path / "runs" / "e2e" / "checkpoints", tmp_path / "runs" / "e2e" / "data")
    for command in (["train", "--resume"], ["prepare"]):
        code, _, err = cli(command[0], "--config", str(config), *command[1:])
        where = f"is not found from {tmp_path / 'elsewhere'}, where the config's relative data paths lead now"
        assert_one_error(code, err, "corpus/bible.", where, f"run from {project}, where it was prepared")
    assert not changed(before)


def test_a_checkpoint_saved_without_checksums_loads(trained_run, tmp_path):
    if not hasattr(torch.serialization, "set_crc32_options"):
        pytest.skip("this torch always writes checksums")
    ckpt = load_checkpoint(trained_run[0] / "checkpoints" / "last.pt")
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(ckpt, tmp_path / "nocrc.pt")
    finally:
        torch.serialization.set_crc32_options(True)
    assert load_checkpoint(tmp_path / "nocrc.pt")["step"] == ckpt["step"]


def test_resume_from_a_damaged_last_checkpoint_names_the_one_before(cli, run_copy):
    copy, options = run_copy
    last, earlier = copy / "checkpoints" / "last.pt", copy / "checkpoints" / "step_0000008.pt"
    data = last.read_bytes()
    last.unlink()  # a damaged copy of its own: step_0000008.pt, to which it was linked, stays whole
    last.write_bytes(data[: len(data) // 2] + b"\xff" * 4096 + data[len(data) // 2 + 4096 :])
    before = snapshot(copy / "checkpoints", copy / "data")
    code, _, err = cli("train", *options, "--resume")
    assert_one_error(code, err, "last.pt", "fails its checksum", f"ln -f {earlier} {last}")
    assert not changed(before)


def test_run_directories_that_are_files(cli, files):
    run = files.dir / "runs" / "e2e"
    run.mkdir(parents=True)
    (run / "checkpoints").write_text("not a directory\n")
    code, _, err = cli("train", "--config", files.config)
    assert_one_error(code, err, run / "checkpoints", "is a file, not a directory")
    (run / "checkpoints").unlink()
    (run / "data").write_text("not a directory\n")
    assert_one_error(*cli("prepare", "--config", files.config)[::2], run / "data", "is a file, not a directory")


def test_resume_or_prepare_with_another_seed_changes_nothing(cli, run_copy):
    """The seed drew the run's held-out splits, its vocabulary's sample and its batches' order."""
    copy, options = run_copy
    before = snapshot(copy / "checkpoints", copy / "data", copy / "spm.model")
    code, _, err = cli("train", *options, "--set", "seed=5", "--resume")
    assert_one_error(code, err, "cannot resume", "seed is 5 here but 1", "last.pt")
    config = [o for o in options if o != "--resume"]
    code, _, err = cli("prepare", *config, "--set", "seed=5")
    assert_one_error(code, err, "cannot prepare", "seed is 5 here but 1", "--set name=")
    assert not changed(before)


def test_a_trained_run_prepared_again_keeps_its_vocabulary(cli, run_copy):
    """Data prepared again for a run that has trained (its sources touched, so that the fingerprint
    differs; --force) is encoded with the checkpoints' vocabulary, and the run resumes."""
    copy, options = run_copy
    vocabulary = (copy / "spm.model").read_bytes()
    meta_path = copy / "data" / "meta.json"
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "fingerprint": "touched"}))
    code, _, err = cli("train", *options, "--resume")
    assert code == 0, err
    assert "vocabulary: the run's own" in err and (copy / "spm.model").read_bytes() == vocabulary
    (copy / "spm.model").write_bytes(b"another vocabulary")
    code, _, err = cli("prepare", *options[:2], *options[2:4], "--force")
    assert code == 0, err
    assert (copy / "spm.model").read_bytes() == vocabulary
    assert "nothing to do" in cli("prepare", *options[:2], *options[2:4])[2]  # its fingerprint: of the vocabulary kept


def test_resume_from_another_directory_is_refused_not_a_new_run(cli, trained_run, tmp_path, monkeypatch):
    """A run's config.yaml names its run_dir relative to where it was trained: --resume from elsewhere
    would start another run from step 0 (the run's directory and name on the command line: as asked)."""
    run, _ = trained_run
    home = tmp_path / "project" / "runs" / run.name
    shutil.copytree(run, home)
    config = home / "config.yaml"
    config.write_text(config.read_text().replace(f"run_dir: {run.parent}", "run_dir: runs"))
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("train", "--config", config, "--resume")
    assert_one_error(code, err, "cannot resume", home, f"--set run_dir={home.parent} --set name={run.name}")
    assert not (tmp_path / "runs").exists()
    code, _, err = cli("prepare", "--config", home)  # would prepare a stray run here (its log, its lock)
    assert_one_error(code, err, "cannot prepare", home, f"--set run_dir={home.parent} --set name={run.name}")
    assert not (tmp_path / "runs").exists()
    project = tmp_path / "project2"  # a project's own config.yaml beside its own data/ is no run
    (project / "data").mkdir(parents=True)
    shutil.copy(tiny_config(tmp_path, name="mine"), project / "config.yaml")
    code, _, err = cli("prepare", "--config", project / "config.yaml")
    assert code == 0, err
    monkeypatch.chdir(tmp_path / "project")
    code, _, err = cli("train", "--config", config, "--resume", "--set", "train.max_steps=8")
    assert code == 0 and "already at train.max_steps=8" in err, err
    mine = tmp_path / "mine"  # a config of one's own beside a folder of checkpoints is no run
    (mine / "checkpoints").mkdir(parents=True)
    os.link(home / "checkpoints" / "last.pt", mine / "checkpoints" / "step_0000001.pt")
    shutil.copy(config, mine / "my.yaml")
    code, _, err = cli("train", "--config", mine / "my.yaml", "--resume", "--set", "train.max_steps=8")
    assert code == 0 and "already at train.max_steps=8" in err, err


def test_disk_full_while_saving_keeps_the_last_checkpoint(cli, run_copy, monkeypatch):
    copy, options = run_copy
    before, names = snapshot(copy / "checkpoints"), sorted(os.listdir(copy / "checkpoints"))

    def full(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    code, _, err = cli("train", *options, "--resume")
    line = assert_one_error(code, err, "disk full while saving", "step_0000009.pt", "--resume", logs=True)
    assert "last.pt" in line and "intact" in line
    assert not changed(before) and sorted(os.listdir(copy / "checkpoints")) == names  # no temporary file left
    monkeypatch.undo()
    assert torch.load(copy / "checkpoints" / "last.pt", weights_only=True)["step"] == 8


def test_disk_full_while_logging_says_how_to_go_on(cli, run_copy, monkeypatch):
    copy, options = run_copy

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(copy / "tb" / "events.out.tfevents.x"))

    monkeypatch.setattr("translate.trainlog.TensorboardLogger.train", full)
    code, _, err = cli("train", *options, "--set", "train.max_steps=12", "--resume")
    names = [
        "events.out.tfevents.x",
        "the disk is full",
        f"continue with: translate train --config {copy / 'config.yaml'} --resume",
    ]
    assert_one_error(code, err, *names, logs=True)


def test_out_of_memory_while_training_names_the_settings(cli, run_copy, monkeypatch):
    copy, options = run_copy
    before = snapshot(copy / "checkpoints")

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr("translate.train.Trainer.forward_loss", oom)
    code, _, err = cli("train", *options, "--resume")
    assert_one_error(code, err, "out of memory", "step 8", "lower train.max_tokens", "train.accumulate", logs=True)
    assert not changed(before)


def test_an_attention_kernel_torch_cannot_run_is_named(cli, run_copy, monkeypatch):
    """train.attention limits torch to kernels that may not run on this GPU, torch or shape: its
    "No available kernel" RuntimeError becomes the setting's one line."""
    copy, options = run_copy
    before = snapshot(copy / "checkpoints")

    def refused(*args, **kwargs):
        raise RuntimeError("No available kernel. Aborting execution.")

    monkeypatch.setattr("translate.model.Transformer.forward", refused)
    code, _, err = cli("train", *options, "--set", "train.attention=cudnn", "--resume")
    assert_one_error(code, err, "train.attention cudnn", "no such attention kernel", "use auto", logs=True)
    assert not changed(before)


def test_atomic_write_lands_whole_or_not_at_all(tmp_path):
    from translate.textio import atomic_write

    target = tmp_path / "out.txt"
    target.write_text("before\n")
    with pytest.raises(RuntimeError), atomic_write(target) as f:
        f.write("half")
        raise RuntimeError("failed midway")
    assert target.read_text() == "before\n" and os.listdir(tmp_path) == ["out.txt"]
    with atomic_write(target) as f:
        f.write("after\n")
    mask = os.umask(0)
    os.umask(mask)
    assert target.read_text() == "after\n" and os.listdir(tmp_path) == ["out.txt"]
    assert target.stat().st_mode & 0o777 == 0o666 & ~mask  # as a new file would be, not mkstemp's 0600


def test_bf16_on_a_cpu_without_native_bf16_is_refused_before_anything_is_written(tmp_path, files):
    """ATEN_CPU_CAPABILITY=avx2 makes torch report an AVX2-only CPU, as on machines without AVX-512 BF16."""
    cfg = tiny_config(tmp_path, name="nobf16", amp="bf16")
    result = run_cli("train", "--config", cfg, check=False, env={"ATEN_CPU_CAPABILITY": "avx2"})
    assert_one_error(result.returncode, result.stderr, "train.amp bf16", "AVX2", "no native bf16", "auto", "off")
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow  # trains: `make test-all` and CI run it
def test_amp_auto_on_a_cpu_without_native_bf16_trains_in_fp32_and_says_so(tmp_path, files):
    cfg = tiny_config(tmp_path, name="nobf16", amp="auto")
    auto = run_cli("train", "--config", cfg, env={"ATEN_CPU_CAPABILITY": "avx2"})
    assert "amp auto: CPU AVX2 without native bf16 -> fp32" in auto.stderr


def test_a_script_ends_a_user_error_in_one_line(capsys):
    from translate.errors import UserError, run_script

    def main():
        raise UserError("config file not found: x.yaml")

    with pytest.raises(SystemExit) as stop:
        run_script(main)
    assert stop.value.code == 2 and capsys.readouterr().err == "error: config file not found: x.yaml\n"


def test_a_directory_given_for_a_checkpoint_names_the_file_to_try(tmp_path):
    import re

    from translate.checkpoint import load_checkpoint
    from translate.errors import UserError

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    with pytest.raises(UserError, match=re.escape(f"(try {run / 'checkpoints' / 'best.pt'})")):
        load_checkpoint(run)
    with pytest.raises(UserError, match=re.escape(f"(try {run / 'checkpoints' / 'best.pt'})")):
        load_checkpoint(run / "checkpoints")


@pytest.mark.parametrize(
    "message, one_line",
    [
        (
            "[/x/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:43917. This is typically ...",
            True,
        ),
        ("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection reset by peer", True),
        ("size mismatch for embed.weight", False),  # any other error keeps its traceback
    ],
)
def test_a_torchrun_process_whose_peer_ended_says_so_in_one_line(monkeypatch, capsys, message, one_line):
    """Rank 0 killed (or stopped on its own error): the other ranks' collective fails inside gloo."""
    import translate.cli as cli

    def app(**_):
        raise RuntimeError(message)

    monkeypatch.setattr(cli, "app", app)
    monkeypatch.setattr(sys, "argv", ["translate", "train"])
    if not one_line:
        with pytest.raises(RuntimeError, match="size mismatch"):
            cli.main()
        return
    with pytest.raises(SystemExit) as stop:
        cli.main()
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and err.startswith("error: another process of this training")


@pytest.mark.parametrize("command_fails", [True, False, "bug"])
def test_a_helper_threads_full_disk_is_one_line_with_the_commands_own(monkeypatch, capsys, command_fails):
    """TensorBoard's writer thread meets the full disk first, then the command's own write: one line,
    the command's; where the command ends well, the thread's line and exit 2; a bug's traceback alone."""
    import errno
    import threading

    import translate.cli as cli
    from translate.errors import UserError

    monkeypatch.setattr(cli, "_THREAD_ERRORS", [])

    def app(**_):
        def write():
            raise OSError(errno.ENOSPC, "No space left on device")

        thread = threading.Thread(target=write, name="Thread-4")
        thread.start()
        thread.join()
        if command_fails == "bug":
            raise KeyError("step")
        if command_fails:
            raise UserError("runs/x/checkpoints/step_1.pt: the disk is full (No space left on device)")
        return 0

    monkeypatch.setattr(cli, "app", app)
    monkeypatch.setattr(sys, "argv", ["translate", "train"])
    if command_fails == "bug":
        with pytest.raises(KeyError):
            cli.main()
        assert "error: " not in capsys.readouterr().err
        return
    with pytest.raises(SystemExit) as stop:
        cli.main()
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("error: ") == 1, err
    assert ("step_1.pt" in err) == command_fails and ("Thread-4" in err) != command_fails
