"""train --init-from: a new run from a checkpoint's weights and vocabulary, with a fresh optimizer."""

import pytest
import torch
import yaml
from conftest import run_cli, tiny_config

from translate.checkpoint import load_checkpoint, load_model
from translate.config import load_config
from translate.data import collate, load_split
from translate.train import Trainer

pytestmark = pytest.mark.slow  # every test trains: `make test-all` and CI run them


def test_init_from_starts_from_the_checkpoints_weights_and_vocabulary(trained_run, tmp_path):
    run, _ = trained_run
    source = run / "checkpoints" / "last.pt"
    config = tiny_config(tmp_path, name="adapted")
    cfg = load_config(config, [f"train.init_from={source}", "vocab.size=200"])  # vocab.size is ignored
    trainer = Trainer(cfg, resume=False)
    try:
        ckpt = load_checkpoint(source)
        assert trainer.tokenizer.model_bytes == ckpt["spm_model"]
        assert (trainer.run / "spm.model").read_bytes() == ckpt["spm_model"]
        assert trainer.cfg.vocab.size == ckpt["config"]["vocab"]["size"]
        assert trainer.state.step == 0 and not trainer.optimizer.state
        assert trainer.init_from == {"path": str(source.resolve()), "step": ckpt["step"]}
        reference, _, _ = load_model(source)
        batch = collate(load_split(trainer.run / "data", "train"), list(range(8)))
        trainer.model.eval()
        with torch.no_grad():
            assert torch.equal(trainer.model(batch.src, batch.tgt_in), reference(batch.src, batch.tgt_in))
    finally:
        trainer.close()


def test_init_from_on_the_command_line_is_recorded_and_shown(trained_run, tmp_path):
    run, _ = trained_run
    source = run / "checkpoints" / "last.pt"
    config = tiny_config(tmp_path, name="adapted", max_steps=2, eval_every=2, save_every=2)
    run_cli("prepare", "--config", config, "--init-from", source)  # the data of that vocabulary, made ahead
    spm = tmp_path / "runs" / "adapted" / "spm.model"
    assert spm.read_bytes() == load_checkpoint(source)["spm_model"]
    made = spm.stat().st_mtime_ns
    assert "nothing to do" in run_cli("train", "--config", config, "--init-from", source).stderr
    assert spm.stat().st_mtime_ns == made
    last = tmp_path / "runs" / "adapted" / "checkpoints" / "last.pt"
    ckpt = load_checkpoint(last)
    assert ckpt["step"] == 2 and ckpt["init_from"]["path"] == str(source.resolve())
    saved = yaml.safe_load((tmp_path / "runs" / "adapted" / "config.yaml").read_text())
    assert saved["train"]["init_from"] == str(source)
    info = run_cli("info", last).stdout
    assert f"initialised from: {source.resolve()} (step {load_checkpoint(source)['step']})" in info


def test_resume_of_an_adapted_run_needs_no_longer_the_checkpoint_it_came_from(trained_run, tokenizer, tmp_path):
    """The run has its own weights (last.pt) and vocabulary (spm.model): the source may be moved or replaced."""
    run, _ = trained_run
    source = tmp_path / "source.pt"
    source.write_bytes((run / "checkpoints" / "last.pt").read_bytes())
    config = tiny_config(tmp_path, name="adapted", max_steps=2, eval_every=2, save_every=2)
    run_cli("train", "--config", config, "--init-from", source)
    adapted = tmp_path / "runs" / "adapted"
    data = {p.name: p.read_bytes() for p in [adapted / "spm.model", *sorted((adapted / "data").glob("*.npy"))]}
    source.unlink()
    run_cli("train", "--config", adapted / "config.yaml", "--resume", "--set", "train.max_steps=4")
    ckpt = load_checkpoint(adapted / "checkpoints" / "last.pt")
    assert ckpt["step"] == 4 and ckpt["init_from"]["path"] == str(source.resolve())
    assert {p.name: p.read_bytes() for p in [adapted / "spm.model", *sorted((adapted / "data").glob("*.npy"))]} == data

    other = load_checkpoint(run / "checkpoints" / "last.pt")  # another checkpoint, another vocabulary, at its path
    other["spm_model"] = tokenizer.model_bytes
    torch.save(other, source)
    (adapted / "spm.model").unlink()  # prepared again: from the run's own checkpoints, not from the source
    run_cli("train", "--config", adapted / "config.yaml", "--resume", "--set", "train.max_steps=6")
    assert load_checkpoint(adapted / "checkpoints" / "last.pt")["step"] == 6
    assert {p.name: p.read_bytes() for p in [adapted / "spm.model", *sorted((adapted / "data").glob("*.npy"))]} == data

    given = run / "checkpoints" / "last.pt"  # --init-from given to a run under way: not used, said, not recorded
    result = run_cli(
        "train", "--config", adapted / "config.yaml", "--resume", "--init-from", given, "--set", "train.max_steps=8"
    )
    assert f"train.init_from {given} is not used: {adapted} has trained, starting from {source.resolve()}" in (
        result.stderr
    )
    assert load_checkpoint(adapted / "checkpoints" / "last.pt")["step"] == 8
    saved = yaml.safe_load((adapted / "config.yaml").read_text())
    assert saved["train"]["init_from"] == str(source.resolve())

    # the config it started with, without the --init-from it was given (and a vocab section, ignored): it goes on
    run_cli("train", "--config", config, "--resume", "--set", "train.max_steps=10", "--set", "vocab.size=200")
    assert load_checkpoint(adapted / "checkpoints" / "last.pt")["step"] == 10


def test_init_from_refusals(trained_run, tmp_path):
    run, _ = trained_run
    source = run / "checkpoints" / "last.pt"
    config = tiny_config(tmp_path, name="other", model={"d_model": 64, "encoder_layers": 2})
    result = run_cli("train", "--config", config, "--init-from", source, check=False)
    assert result.returncode == 2
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: cannot initialise from {source}: the model settings differ")
    assert "model.d_model (64 here, 32 there)" in line and "model.encoder_layers (2 here, 1 there)" in line
    assert not (tmp_path / "runs" / "other" / "checkpoints").exists()

    result = run_cli("train", "--config", tiny_config(tmp_path, name="x"), "--init-from", config, check=False)
    assert result.returncode == 2
    assert (
        result.stderr.strip().splitlines()[-1]
        == f"error: train.init_from (--init-from): {config}: not a checkpoint (not a file written by PyTorch)"
    )
    result = run_cli(
        "train", "--config", tiny_config(tmp_path, name="y"), "--init-from", tmp_path / "no.pt", check=False
    )
    last = result.stderr.strip().splitlines()[-1]  # the config may name it: the line says where it comes from
    assert last == f"error: train.init_from (--init-from): checkpoint not found: {tmp_path / 'no.pt'}"
