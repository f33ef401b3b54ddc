"""The length penalty chosen on held-out pairs: `translate tune` and decode.tune_length_penalty."""

import os
import shutil

import pytest
import yaml
from conftest import LINES, run_cli, run_main, save_checkpoint, tiny_config

from translate.checkpoint import load_checkpoint
from translate.engine import Engine, EngineSpec, first_best
from translate.errors import UserError
from translate.evaluate import score
from translate.tune import Choice, check_grid, choose, search_length_penalty, write_choice

SOURCES = [line for line in LINES if line]


def test_choose_takes_the_best_bleu_and_among_equals_the_value_nearest_the_configured_one():
    assert choose({0.6: 10.0, 1.0: 12.5, 1.2: 12.0}, before=0.6) == 1.0
    assert choose({0.6: 12.0, 0.8: 12.0, 1.2: 12.0}, before=1.0) == 0.8
    assert choose({0.6: 12.0, 1.2: 12.0}, before=1.2) == 1.2
    assert check_grid([1.0, 0.6, 1.0], "x") == [0.6, 1.0]
    for bad, message in (([], "at least one"), ([0.6, -0.2], ">= 0")):
        with pytest.raises(UserError, match=message):
            check_grid(bad, "x")


def test_each_value_scores_what_the_engine_translates_at_it(tiny_checkpoint):
    engine = Engine.load(EngineSpec([tiny_checkpoint], device="cpu"))
    outputs = {a: first_best(engine.translate(SOURCES, engine.defaults.given(length_penalty=a))) for a in (0.0, 2.0)}
    references = outputs[2.0]  # the model's own output at alpha 2: BLEU 100 there
    seen = []
    choice = search_length_penalty(
        engine, SOURCES, references, [0.0, 2.0], split=False, on_alpha=lambda a, b: seen.append((a, b))
    )
    assert choice.bleu == {a: score(outputs[a], references)["bleu"] for a in (0.0, 2.0)}
    assert seen == list(choice.bleu.items())
    assert choice.bleu[2.0] == 100.0 and choice.chosen == choose(choice.bleu, engine.defaults.length_penalty)
    assert (choice.before, choice.beam_size, choice.lines) == (engine.defaults.length_penalty, 2, len(SOURCES))
    with pytest.raises(UserError, match="line counts must match"):
        search_length_penalty(engine, SOURCES, references[1:], [1.0])


def test_write_choice_updates_the_file_and_its_other_names_only(model, tokenizer, tmp_path):
    step = save_checkpoint(model, tokenizer, tmp_path / "step_0000004.pt", length_penalty=0.6, beam_size=2)
    for name in ("best.pt", "last.pt"):
        os.link(step, tmp_path / name)
    other = save_checkpoint(model, tokenizer, tmp_path / "step_0000002.pt", length_penalty=0.6)
    before = other.read_bytes()
    choice = Choice(chosen=1.0, before=0.6, bleu={0.6: 10.0, 1.0: 11.0}, beam_size=2, lines=3)
    written = write_choice(tmp_path / "best.pt", choice)
    assert sorted(p.name for p in written) == ["best.pt", "last.pt", "step_0000004.pt"]
    assert all(p.samefile(tmp_path / "best.pt") for p in written)
    ckpt = load_checkpoint(step)
    assert ckpt["config"]["decode"]["length_penalty"] == 1.0 and Choice(**ckpt["tune_length_penalty"]) == choice
    assert other.read_bytes() == before
    assert Engine.load(EngineSpec([tmp_path / "last.pt"], device="cpu")).defaults.length_penalty == 1.0


def test_write_choice_writes_through_a_link_and_passes_over_broken_ones(model, tokenizer, tmp_path):
    real = tmp_path / "run" / "best.pt"
    real.parent.mkdir()
    save_checkpoint(model, tokenizer, real, length_penalty=0.6, beam_size=2)
    (real.parent / "gone.pt").symlink_to("step_0000001.pt")  # a link to a checkpoint deleted since
    link = tmp_path / "mine.pt"
    link.symlink_to(real)
    choice = Choice(chosen=1.0, before=0.6, bleu={0.6: 10.0, 1.0: 11.0}, beam_size=2, lines=3)
    (real.parent / "current.pt").symlink_to("best.pt")  # a link beside it stays a link
    assert write_choice(link, choice) == [real]
    assert link.is_symlink() and link.samefile(real)  # still the link; the file it names is tuned
    assert (real.parent / "current.pt").is_symlink() and (real.parent / "current.pt").samefile(real)
    assert load_checkpoint(real)["config"]["decode"]["length_penalty"] == 1.0
    again = Choice(chosen=1.4, before=1.0, bleu={1.0: 11.0, 1.4: 12.0}, beam_size=2, lines=3)
    write_choice(real, again)  # tuned twice: `before` stays the configured value, which an average goes back to
    assert load_checkpoint(real)["tune_length_penalty"]["before"] == 0.6


def test_tune_command_writes_the_choice_that_decoding_then_takes(
    checkpoint, trained_run, tmp_path, monkeypatch, capsys
):
    run, _ = trained_run
    ckpt = tmp_path / "best.pt"
    shutil.copy(checkpoint, ckpt)
    valid = [run / "data" / "valid.en", run / "data" / "valid.fr"]
    lines = len(valid[0].read_text(encoding="utf-8").splitlines())

    args = ["tune", ckpt, "--src", valid[0], "--ref", valid[1], "--lenpen", "1.2", "--lenpen", "0.4"]
    original = ckpt.read_bytes()
    code, out, err = run_main(monkeypatch, capsys, *args, "--dry-run")
    assert code == 0 and "--dry-run: the checkpoint is unchanged" in out and ckpt.read_bytes() == original
    assert "length penalty 0.4: BLEU" in err and "length penalty 1.2: BLEU" in err

    code, out, _ = run_main(monkeypatch, capsys, *args)
    assert code == 0 and f"written into {ckpt}" in out
    kept = Choice(**load_checkpoint(ckpt)["tune_length_penalty"])
    assert sorted(kept.bleu) == [0.4, 1.2] and kept.lines == lines and kept.chosen == choose(kept.bleu, kept.before)
    assert load_checkpoint(ckpt)["config"]["decode"]["length_penalty"] == kept.chosen
    assert "chosen: length penalty" in run_cli("info", ckpt).stdout

    short = tmp_path / "short.fr"
    short.write_text("Une ligne.\n", encoding="utf-8")
    blank = tmp_path / "blank.fr"
    blank.write_text("\n" * lines, encoding="utf-8")
    for bad, message in (
        (["--ref", valid[1], "--lenpen", "-1"], "length penalty must be a finite number >= 0"),
        (
            ["--ref", valid[1], "--lenpen", "1.0", "--lenpen", "nan"],
            "length penalty must be a finite number >= 0, got nan",
        ),
        (["--ref", short], "they must match"),
        (["--ref", blank], "has only blank lines: nothing to score against"),
    ):
        code, _, err = run_main(monkeypatch, capsys, "tune", ckpt, "--src", valid[0], *bad)
        assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1 and message in err
    written = ckpt.read_bytes()
    ckpt.chmod(0o444)  # a checkpoint the user locked: refused before the search, not after it
    code, _, err = run_main(monkeypatch, capsys, "tune", ckpt, "--src", valid[0], "--ref", valid[1])
    assert code == 2 and "is read-only" in err and "length penalty 0.6: BLEU" not in err
    assert ckpt.read_bytes() == written


def test_training_chooses_the_length_penalty_once(tmp_path, monkeypatch, capsys):
    config = tiny_config(tmp_path, name="lp")
    raw = yaml.safe_load(config.read_text())
    raw["decode"]["tune_length_penalty"] = [0.6, 1.4]
    config.write_text(yaml.safe_dump(raw))
    run = tmp_path / "runs" / "lp"
    code, _, err = run_main(monkeypatch, capsys, "train", "--config", config)
    assert code == 0, err
    best = run / "checkpoints" / "best.pt"
    kept = load_checkpoint(best)["tune_length_penalty"]
    valid_lines = len((run / "data" / "valid.en").read_text(encoding="utf-8").splitlines())
    assert sorted(kept["bleu"]) == [0.6, 1.4] and kept["lines"] == valid_lines and kept["beam_size"] == 3
    assert load_checkpoint(best)["config"]["decode"]["length_penalty"] == kept["chosen"]
    step = run / "checkpoints" / f"step_{load_checkpoint(best)['step']:07d}.pt"
    assert step.samefile(best)
    assert "chose length penalty" in (run / "train.log").read_text(encoding="utf-8")

    inode = best.stat().st_ino
    code, _, err = run_main(monkeypatch, capsys, "train", "--config", config, "--resume")  # a finished run again
    assert code == 0, err
    assert best.stat().st_ino == inode and "already chosen" in (run / "train.log").read_text(encoding="utf-8")
