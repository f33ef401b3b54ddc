"""Training internals: schedules, accumulation, precision selection, skipped updates, checkpoint policy."""

import logging
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml
from conftest import run_cli, run_main, tiny_config

from translate import hardware
from translate.batching import round_up
from translate.checkpoint import CHECKPOINT_FORMAT, load_checkpoint, load_model, step_checkpoints
from translate.config import config_from_dict, load_config
from translate.errors import UserError
from translate.rundir import RunLock
from translate.syncs import SyncCounter
from translate.tokenizer import PAD
from translate.train import Trainer, lr_lambda


def cfg_for(tmp_path, name="t", model=None, **train):
    return load_config(tiny_config(tmp_path, name=name, model=model, **train))


@pytest.mark.parametrize("schedule", ["noam", "inverse_sqrt", "cosine"])
def test_schedules_warm_up_then_decay(schedule):
    cfg = config_from_dict({"train": {"schedule": schedule, "warmup_steps": 100, "max_steps": 1000, "lr": 1e-3}})
    f = lr_lambda(cfg, cfg.train.lr)
    lrs = [f(s) * cfg.train.lr for s in range(1000)]
    peak = int(np.argmax(lrs))
    assert 95 <= peak <= 100
    assert all(a < b for a, b in zip(lrs[:peak], lrs[1 : peak + 1]))  # warmup rises
    assert all(a >= b for a, b in zip(lrs[peak:], lrs[peak + 1 :]))  # then never rises
    if schedule == "noam":
        assert lrs[peak] == pytest.approx(256**-0.5 * 100**-0.5, rel=0.02)
    else:
        assert lrs[peak] == pytest.approx(1e-3, rel=0.02)
    if schedule == "cosine":
        assert lrs[-1] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("schedule", ["inverse_sqrt", "cosine"])
def test_cooldown_takes_the_lr_linearly_to_zero_over_the_last_share_of_the_run(schedule):
    train = {"schedule": schedule, "warmup_steps": 100, "max_steps": 1000, "lr": 1e-3}
    plain = lr_lambda(config_from_dict({"train": train}), 1e-3)
    f = lr_lambda(config_from_dict({"train": {**train, "cooldown": 0.25}}), 1e-3)
    assert [f(s) for s in range(750)] == [plain(s) for s in range(750)]  # untouched before the last quarter
    cooled = [plain(s) * (1000 - s) / 250 for s in range(750, 1000)]
    assert [f(s) for s in range(750, 1000)] == pytest.approx(cooled)
    assert f(999) > 0 or schedule == "cosine"  # the last update still learns (cosine is at min_lr 0 there)

    # With a time budget the run's end is the budget's where it comes first: the share of it trained.
    spent = 0.0
    timed = lr_lambda(config_from_dict({"train": {**train, "cooldown": 0.25}}), 1e-3, lambda: spent)
    assert timed(300) == plain(300)
    spent = 0.875
    assert timed(300) == pytest.approx(plain(300) * 0.5)
    spent = 1.2
    assert timed(300) == 0.0


def test_the_trainer_cools_down_by_the_time_budget_it_has_spent(tmp_path, monkeypatch):
    t = Trainer(cfg_for(tmp_path, max_steps=1000, max_time="1h", cooldown=0.5), resume=False)
    monkeypatch.setattr(t, "trained_time", lambda: 0.75 * 3600)  # three quarters of the hour trained
    t.update([t.collate(t.epoch_batches(0)[0])])
    shape = lr_lambda(cfg_for(tmp_path, "plain", max_steps=1000), 2e-3)
    assert t.time_spent == 0.75
    assert t.scheduler.get_last_lr()[0] == pytest.approx(2e-3 * shape(1) * 0.5)
    t.close()


@pytest.mark.filterwarnings("ignore:Detected call of")
def test_accumulating_two_batches_equals_one_batch_of_both(tmp_path):
    """Update on [b1, b2] with accumulate 2 == update on the batch b1+b2 (losses summed over tokens)."""
    a = Trainer(cfg_for(tmp_path, "a", model={"dropout": 0.0}, accumulate=2), resume=False)
    b = Trainer(cfg_for(tmp_path, "b", model={"dropout": 0.0}), resume=False)
    b.model.load_state_dict(a.model.state_dict())
    for t in (a, b):  # plain SGD: Adam would blow numerical noise (e.g. key biases' ~0 gradients) up to full steps
        t.optimizer = torch.optim.SGD(t.model.parameters(), lr=1.0)
    batches = a.epoch_batches(0)[:2]
    a.update([a.collate(idx) for idx in batches])
    b.update([b.collate(np.concatenate(batches))])
    for (name, pa), pb in zip(a.model.named_parameters(), b.model.parameters()):
        torch.testing.assert_close(pa, pb, atol=1e-6, rtol=1e-5, msg=name)
    for t in (a, b):
        t.close()


def test_padding_to_a_multiple_changes_neither_loss_nor_gradient(tmp_path):
    """train.pad_to_multiple only adds padding: lengths rounded up, and the extra projected rows count for nothing."""
    runs, idx = {}, None
    for pad in (1, 8):
        t = Trainer(cfg_for(tmp_path, f"p{pad}", model={"dropout": 0.0}, pad_to_multiple=pad), resume=False)
        if runs:
            t.model.load_state_dict(runs[1][0].model.state_dict())
        idx = t.epoch_batches(0)[0] if idx is None else idx  # the same sentences in both
        batch = t.collate(idx)
        loss, nll = t.forward_loss(batch)
        loss.backward()
        runs[pad] = (t, batch, loss.detach(), nll, [p.grad.clone() for p in t.model.parameters()])
    (a, ba, la, na, ga), (b, bb, lb, nb, gb) = runs[1], runs[8]
    assert bb.src.size(1) == round_up(ba.src.size(1), 8) and bb.tgt_in.size(1) == round_up(ba.tgt_in.size(1), 8)
    assert len(ba.keep) == ba.ntokens and len(bb.keep) == min(round_up(bb.ntokens, 64), bb.tgt_out.numel())
    torch.testing.assert_close(lb, la, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(nb, na, rtol=1e-5, atol=1e-4)
    for g1, g8 in zip(ga, gb):
        torch.testing.assert_close(g8, g1, rtol=1e-4, atol=1e-6)
    for t in (a, b):
        t.close()


def test_the_validation_loss_projects_positions_as_training_does(tmp_path):
    """The validation loss's batches are shaped as training's, the count of projected positions
    rounded too (no new shapes for oneDNN to build at every validation), and the loss is the same
    as with nothing padded."""
    losses, rows, weights = {}, {}, None
    for pad in (1, 8):
        t = Trainer(cfg_for(tmp_path, f"v{pad}", pad_to_multiple=pad), resume=False)
        if weights is None:
            weights = {k: v.clone() for k, v in t.model.state_dict().items()}
        t.model.load_state_dict(weights)
        seen = rows.setdefault(pad, [])
        hook = t.model.register_forward_hook(
            lambda m, args, out, seen=seen: seen.append((out.shape, int((args[1] != PAD).sum()), args[1].numel()))
        )
        t.model.eval()
        losses[pad] = t.validator.loss(t.model)
        hook.remove()
        t.close()
    assert rows[1] and len(rows[1]) == len(rows[8])  # per batch: logits' shape, target tokens, B x T positions
    assert all(len(shape) == 2 and shape[0] == ntokens for shape, ntokens, _ in rows[1])  # the non-pad positions
    assert all(shape[0] == min(round_up(ntokens, 64), positions) for shape, ntokens, positions in rows[8])
    for key in ("loss", "nll"):
        assert losses[8][key] == pytest.approx(losses[1][key], rel=1e-5)


def test_pad_to_multiple_auto_in_fp32_takes_the_same_batches_unpadded(tmp_path, caplog):
    """In fp32 on a CPU, auto packs the sentences as pad_to_multiple 8 does (the same batches, the
    same order) but leaves the tensors at the batch's own longest lengths; the validation loss's
    batches too. The log says which it chose."""
    with caplog.at_level(logging.INFO):
        auto = Trainer(cfg_for(tmp_path, "auto", amp="off", pad_to_multiple="auto"), resume=False)
    eight = Trainer(cfg_for(tmp_path, "eight", amp="off", pad_to_multiple=8), resume=False)
    assert (auto.padding.pack, auto.padding.pad) == (8, 1)
    a_batches, e_batches = auto.epoch_batches(0), eight.epoch_batches(0)
    assert len(a_batches) == len(e_batches) and all(np.array_equal(a, e) for a, e in zip(a_batches, e_batches))
    lens = auto.train_data.src_lens, auto.train_data.tgt_lens
    for idx in a_batches:
        batch = auto.collate(idx)
        assert batch.src.size(1) == lens[0][idx].max() and batch.tgt_in.size(1) == lens[1][idx].max()  # EOS counted
        assert len(batch.keep) == batch.ntokens  # no projected padding rows either
        assert eight.collate(idx).src.size(1) % 8 == 0
    assert auto.validator.padding == auto.padding
    assert "pad_to_multiple auto: fp32 on a CPU -> packed by lengths rounded to 8, not padded" in caplog.text
    for t in (auto, eight):
        t.close()


def test_max_tokens_by_precision_takes_the_entry_of_the_precision_chosen(tmp_path, monkeypatch, caplog):
    """train.max_tokens as a mapping: the trainer forms its batches (and the validation loss's) with
    the entry of the precision train.amp chose, as a plain number of that size would, and logs it."""
    monkeypatch.setattr(hardware, "_cpu_info", hardware.CpuInfo("AVX512", True, "mocked", 2))  # bf16 allowed
    by_precision = {"fp32": 300, "bf16": 1000, "fp16": 2000}
    with caplog.at_level(logging.INFO):
        fp32 = Trainer(cfg_for(tmp_path, "fp32", amp="off", max_tokens=by_precision), resume=False)
    bf16 = Trainer(cfg_for(tmp_path, "bf16", amp="bf16", max_tokens=by_precision), resume=False)
    plain = Trainer(cfg_for(tmp_path, "plain", amp="off", max_tokens=300), resume=False)
    assert (fp32.max_tokens, bf16.max_tokens, plain.max_tokens) == (300, 1000, 300)
    assert fp32.validator.max_tokens == 300 and bf16.validator.max_tokens == 1000
    ours, theirs = fp32.epoch_batches(0), plain.epoch_batches(0)
    assert len(ours) == len(theirs) and all(np.array_equal(a, b) for a, b in zip(ours, theirs))
    assert len(bf16.epoch_batches(0)) < len(ours)  # larger batches, fewer of them
    assert "max_tokens 300: by precision: fp32 -> 300" in caplog.text
    assert "by precision: bf16 -> 1000" in bf16.hardware()["max_tokens"]
    for t in (fp32, bf16, plain):
        t.close()


def test_lr_by_precision_takes_the_entry_of_the_precision_chosen(tmp_path, monkeypatch, caplog):
    """train.lr as a mapping: the optimizer and the schedule peak at the entry of the precision
    train.amp chose, as a plain number would, and the log says which and why."""
    monkeypatch.setattr(hardware, "_cpu_info", hardware.CpuInfo("AVX512", True, "mocked", 2))  # bf16 allowed
    by_precision = {"fp32": 3e-3, "bf16": 1e-3, "fp16": 5e-4}
    still = {"dropout": 0.0}  # updates that draw nothing from the shared random state
    with caplog.at_level(logging.INFO):
        fp32 = Trainer(cfg_for(tmp_path, "fp32", model=still, amp="off", lr=by_precision, warmup_steps=2), resume=False)
    bf16 = Trainer(cfg_for(tmp_path, "bf16", model=still, amp="bf16", lr=by_precision, warmup_steps=2), resume=False)
    plain = Trainer(cfg_for(tmp_path, "plain", model=still, amp="off", lr=3e-3, warmup_steps=2), resume=False)
    for t in (fp32, bf16, plain):
        t.update([t.collate(t.epoch_batches(0)[0])])  # the next update ends the warmup: the peak
    peaks = [t.scheduler.get_last_lr()[0] for t in (fp32, bf16, plain)]
    assert peaks == pytest.approx([3e-3, 1e-3, 3e-3])
    pairs = zip(fp32.model.parameters(), plain.model.parameters())
    assert all(torch.equal(a, b) for a, b in pairs)  # the same updates as the plain number
    assert "lr 0.003: by precision: fp32 -> 0.003" in caplog.text
    assert "by precision: bf16 -> 0.001" in bf16.hardware()["lr"]
    for t in (fp32, bf16, plain):
        t.close()


def test_a_post_norm_decoder_shallower_than_its_encoder_is_warned_of(tmp_path, caplog):
    """Post-norm with fewer decoder than encoder layers stalled in measured runs: the log says so and
    names the fix; pre-norm, or the layers of the default shape, say nothing."""
    shapes = {"post32": ("post", 3, 2), "pre32": ("pre", 3, 2), "post22": ("post", 2, 2), "post23": ("post", 2, 3)}
    warned = {}
    for name, (norm, enc, dec) in shapes.items():
        caplog.clear()
        with caplog.at_level(logging.INFO):
            model = {"norm": norm, "encoder_layers": enc, "decoder_layers": dec}
            Trainer(cfg_for(tmp_path, name, model=model, amp="off"), resume=False).close()
        warned[name] = [r.getMessage() for r in caplog.records if "post-norm decoder shallower" in r.getMessage()]
    assert {name: len(w) for name, w in warned.items()} == {"post32": 1, "pre32": 0, "post22": 0, "post23": 0}
    assert "(3 + 2 layers)" in warned["post32"][0] and "model.norm: pre" in warned["post32"][0]


def test_d_ff_by_precision_builds_the_precisions_model_and_a_continued_run_keeps_its_checkpoints(
    tmp_path, monkeypatch, caplog
):
    """model.d_ff as a mapping: a new run builds the width of the precision train.amp chose, and its
    checkpoints hold that one number (they load anywhere); --resume and train.init_from keep the
    checkpoint's width on any precision, and a mapping without it is refused as a plain number would be."""
    monkeypatch.setattr(hardware, "_cpu_info", hardware.CpuInfo("AVX512", True, "mocked", 2))  # bf16 allowed
    widths = {"fp32": 48, "bf16": 64, "fp16": 80}
    with caplog.at_level(logging.INFO):
        fp32 = Trainer(cfg_for(tmp_path, "w", model={"d_ff": widths}, amp="off", max_steps=2), resume=False)
        fp32.fit()
    bf16 = Trainer(cfg_for(tmp_path, "other", model={"d_ff": widths}, amp="bf16"), resume=False)
    assert fp32.model.encoder[0].ffn.linear1.out_features == 48
    assert bf16.model.encoder[0].ffn.linear1.out_features == 64
    bf16.close()
    assert "d_ff 48: by precision: fp32 -> 48" in caplog.text
    last = tmp_path / "runs" / "w" / "checkpoints" / "last.pt"
    assert load_checkpoint(last)["config"]["model"]["d_ff"] == 48
    assert load_model(last)[0].encoder[0].ffn.linear1.out_features == 48
    saved = yaml.safe_load((tmp_path / "runs" / "w" / "config.yaml").read_text())
    assert saved["model"]["d_ff"] == 48  # the run's config: its model

    elsewhere = {"fp32": 64, "bf16": 48, "fp16": 80}  # as on hardware of another precision
    resumed = Trainer(cfg_for(tmp_path, "w", model={"d_ff": elsewhere}, amp="off", max_steps=3), resume=True)
    assert resumed.model.encoder[0].ffn.linear1.out_features == 48 and resumed.state.step == 2
    assert "the checkpoint's width" in resumed.hardware()["d_ff"]
    resumed.fit()
    started = Trainer(
        cfg_for(tmp_path, "init", model={"d_ff": elsewhere}, amp="off", max_steps=1, init_from=str(last)), resume=False
    )
    assert started.model.encoder[0].ffn.linear1.out_features == 48
    started.close()
    with pytest.raises(UserError, match="model.d_ff"):
        Trainer(cfg_for(tmp_path, "w", model={"d_ff": {**widths, "fp32": 96}}, amp="off", max_steps=4), resume=True)
    with pytest.raises(UserError, match="model.d_ff"):
        Trainer(cfg_for(tmp_path, "init2", model={"d_ff": 96}, amp="off", init_from=str(last)), resume=False)


def test_a_run_resumed_with_another_lr_goes_on_at_the_new_peak(tmp_path):
    """train.lr may change on --resume (or another precision's entry apply): the schedule goes on
    from the step it reached, scaled to the new peak; unchanged, nothing moves (exact resume)."""
    Trainer(cfg_for(tmp_path, "r", max_steps=6), resume=False).fit()
    same = Trainer(cfg_for(tmp_path, "r", max_steps=8), resume=True)
    lr, base = same.optimizer.param_groups[0]["lr"], same.scheduler.base_lrs
    same.close()
    assert base == [2e-3] and lr == same.scheduler.get_last_lr()[0]
    doubled = Trainer(cfg_for(tmp_path, "r", max_steps=8, lr=4e-3), resume=True)
    assert doubled.optimizer.param_groups[0]["lr"] == pytest.approx(2 * lr)
    assert doubled.scheduler.get_last_lr()[0] == pytest.approx(2 * lr)
    doubled.update([doubled.collate(doubled.epoch_batches(0)[0])])
    shape = lr_lambda(doubled.cfg, 4e-3)
    assert doubled.scheduler.get_last_lr()[0] == pytest.approx(4e-3 * shape(doubled.scheduler.last_epoch))
    doubled.close()


def test_a_run_resumed_with_other_batches_goes_on_at_the_same_share_of_the_epoch(tmp_path, caplog):
    """train.max_tokens may change on --resume (or another precision's entry apply): the epoch is then
    packed into another number of batches, which the saved position does not index; the run goes on
    at the same share of it. Unchanged, the position is the one saved (exact resume)."""
    Trainer(cfg_for(tmp_path, "b", max_steps=4, max_tokens=1024), resume=False).fit()
    saved = load_checkpoint(tmp_path / "runs" / "b" / "checkpoints" / "last.pt")["progress"]
    assert saved["position"] == 4 and saved["epoch_batches"] > 8
    same = Trainer(cfg_for(tmp_path, "b", max_steps=5, max_tokens=1024), resume=True)
    same.fit()
    assert (same.state.position, same.state.epoch_batches) == (5, saved["epoch_batches"])
    smaller = Trainer(cfg_for(tmp_path, "b", max_steps=6, max_tokens=512), resume=True)
    n = len(smaller.epoch_batches(0))
    assert n > saved["epoch_batches"]
    with caplog.at_level(logging.WARNING, logger="translate"):
        smaller.fit()
    assert (smaller.state.position, smaller.state.epoch_batches) == (round(5 * n / saved["epoch_batches"]) + 1, n)
    assert "it goes on at the same share of it" in caplog.text


def test_bf16_autocast_on_cpu_trains(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware, "_cpu_info", hardware.CpuInfo("AVX512", True, "mocked", 2))  # emulated if not
    t = Trainer(cfg_for(tmp_path, "bf16", amp="bf16"), resume=False)
    batch = t.collate(t.epoch_batches(0)[0])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = t.net(batch.src, batch.tgt_in)
    assert logits.dtype == torch.bfloat16
    before = [p.detach().clone() for p in t.model.parameters()]
    result = t.update([batch])
    assert not result.skipped and math.isfinite(float(result.loss))
    assert all(p.dtype == torch.float32 for p in t.model.parameters())  # master weights stay fp32
    assert any(not torch.equal(a, p) for a, p in zip(before, t.model.parameters()))
    t.close()


def test_non_finite_updates_are_skipped_then_stop(tmp_path, monkeypatch):
    """A non-finite update leaves the weights and the optimizer's moments as they were (on the
    device: no synchronisation); the loop counts such updates when it next logs (every 2 updates
    here) and stops once train.max_bad_steps or more came in a row."""
    t = Trainer(cfg_for(tmp_path, "nan", max_bad_steps=3, log_every=2), resume=False)
    batches = [t.collate(idx) for idx in t.epoch_batches(0)[:2]]
    assert not bool(t.update(batches[:1]).skipped)  # one good update: the moments exist
    weights = {k: v.clone() for k, v in t.model.state_dict().items()}
    moments = {k: v.clone() for k, v in t.optimizer.state_dict()["state"][0].items()}
    forward = t.forward_loss
    monkeypatch.setattr(t, "forward_loss", lambda batch: tuple(x * float("nan") for x in forward(batch)))
    assert bool(t.update(batches[1:]).skipped)
    for k, v in t.optimizer.state_dict()["state"][0].items():
        assert torch.equal(v, moments[k]), k
    with pytest.raises(UserError, match=r"^4 updates in a row had a non-finite loss or gradient at step 4"):
        t.fit()  # 2 in a row at the log of step 2, 4 at step 4
    RunLock(t.run).release()  # the run's lock was freed with the error, not left to the Trainer's collection
    assert t.state.skipped == t.state.step == 4
    for k, v in t.model.state_dict().items():
        assert torch.equal(v, weights[k]), k


def test_a_run_stopped_by_patience_resumes_to_no_further_update(tmp_path):
    """--resume of a run that train.patience stopped stops at once, as one at train.max_steps does
    (it trained and saved one more update each time)."""
    options = dict(max_steps=40, eval_every=2, save_every=2, patience=2, best_metric="bleu", lr=1e-7, warmup_steps=1)
    first = Trainer(cfg_for(tmp_path, "patient", **options), resume=False)
    first.fit()
    stopped = first.state.step
    assert stopped < 40
    again = Trainer(cfg_for(tmp_path, "patient", **options), resume=True)
    again.fit()
    assert again.state.step == stopped
    assert (
        max(int(p.stem.split("_")[1]) for p in (tmp_path / "runs" / "patient" / "checkpoints").glob("step_*.pt"))
        == stopped
    )


def test_a_trainer_refused_in_setup_frees_the_run_for_the_corrected_config(tmp_path):
    """In one process (a library user, a notebook): the mistake is refused after the run's lock was taken
    (here the data are missing), and the corrected config trains the same run at once."""
    wrong = load_config(tiny_config(tmp_path, name="fix", data={"train": str(tmp_path / "missing")}))
    with pytest.raises(UserError, match="missing") as refused:
        Trainer(wrong, resume=False)
    t = Trainer(cfg_for(tmp_path, "fix", max_steps=2), resume=False)  # the refused one still alive in its traceback
    t.fit()
    assert t.state.step == 2 and refused.traceback


@pytest.mark.slow  # trains end to end: `make test-all` and CI run it
def test_checkpoint_policy_keep_last_best_and_patience(tmp_path):
    cfg = tiny_config(
        tmp_path,
        name="policy",
        max_steps=40,
        eval_every=2,
        save_every=2,
        keep_last=2,
        patience=2,
        best_metric="bleu",
        lr=1e-7,
        warmup_steps=1,
    )
    run_cli("train", "--config", cfg)
    ckpts = tmp_path / "runs" / "policy" / "checkpoints"
    steps = step_checkpoints(ckpts)
    assert len(steps) == 2  # keep_last
    last = load_checkpoint(ckpts / "last.pt")
    assert last["step"] == 6  # lr 1e-7 leaves the output (and BLEU) unchanged: 2 evaluations without progress
    best = load_checkpoint(ckpts / "best.pt")
    assert best["step"] == 2 and last["progress"]["bad_evals"] == 2
    assert "patience" in (tmp_path / "runs" / "policy" / "train.log").read_text()


def test_average_of_identical_checkpoints_is_identity(trained_run, tmp_path):
    run, _ = trained_run
    last = run / "checkpoints" / "last.pt"
    copy = tmp_path / "copy.pt"
    shutil.copy(last, copy)
    avg = tmp_path / "avg.pt"
    run_cli("average", last, copy, "-o", avg)
    a, b = load_checkpoint(avg)["model"], load_checkpoint(last)["model"]
    for k in a:
        torch.testing.assert_close(a[k], b[k])
    model, tokenizer, _ = load_model(avg)
    assert tokenizer.vocab_size == model.vocab_size
    step_4 = sorted((run / "checkpoints").glob("step_*.pt"))[0]
    run_cli("average", last, step_4, "-o", avg)  # the newest first: the average says its step, no input's scores
    averaged, newest = load_checkpoint(avg), load_checkpoint(last)
    assert averaged["step"] == newest["step"] > load_checkpoint(step_4)["step"] and "metrics" not in averaged
    assert averaged["averaged_from"] == [
        f"{last.absolute()} (step {newest['step']})",
        f"{step_4} (step {load_checkpoint(step_4)['step']})",
    ]

    tuned = load_checkpoint(step_4)  # a length penalty chosen for step 4's weights is not the average's
    tuned["config"]["decode"]["length_penalty"] = 3.0
    tuned["tune_length_penalty"] = {"chosen": 3.0, "before": 0.7, "bleu": {3.0: 1.0}, "beam_size": 2, "lines": 1}
    torch.save(tuned, tmp_path / "tuned.pt")
    run_cli("average", tmp_path / "tuned.pt", last, "-o", avg)
    averaged = load_checkpoint(avg)
    assert averaged["config"]["decode"]["length_penalty"] == 0.7 and "tune_length_penalty" not in averaged

    resumable = tmp_path / "resumable"
    shutil.copytree(run, resumable / run.name)
    os.replace(avg, resumable / run.name / "checkpoints" / "last.pt")  # an average where last.pt was
    result = run_cli(
        "train", "--config", resumable / run.name / "config.yaml", "--set", f"run_dir={resumable}", "--resume",
        check=False,
    )  # fmt: skip
    error = [line for line in result.stderr.splitlines() if "error" in line.lower() or "Traceback" in line]
    assert result.returncode == 2 and len(error) == 1 and error[0].startswith("error: cannot resume")
    assert "an average of checkpoints" in error[0]


def test_checkpoint_format_and_foreign_files_are_refused(trained_run, tmp_path, monkeypatch, capsys):
    run, _ = trained_run
    ckpt = load_checkpoint(run / "checkpoints" / "last.pt")
    assert ckpt["versions"]["torch"] == str(torch.__version__) and ckpt["format"] == CHECKPOINT_FORMAT
    old = tmp_path / "old.pt"
    torch.save({**ckpt, "format": CHECKPOINT_FORMAT + 1}, old)
    code, _, err = run_main(monkeypatch, capsys, "info", old)
    assert code == 2 and "format" in err and "Traceback" not in err
    source = tmp_path / "in.en"
    source.write_text("hi\n")
    foreign = tmp_path / "foreign.pt"
    torch.save({"state_dict": {"w": torch.zeros(2)}}, foreign)
    code, _, err = run_main(monkeypatch, capsys, "decode", foreign, "-i", source)
    assert code == 2 and "not a translate checkpoint" in err
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes((run / "checkpoints" / "last.pt").read_bytes()[:5000])
    code, _, err = run_main(monkeypatch, capsys, "decode", truncated, "-i", source)
    assert code == 2 and "truncated or corrupt" in err


def test_resume_refuses_a_changed_model(trained_run, tmp_path):
    run, config = trained_run
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    cfg = yaml.safe_load((copy / "config.yaml").read_text())
    cfg["run_dir"], cfg["name"], cfg["model"]["d_ff"] = str(tmp_path), "copy", 96
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(cfg))
    result = run_cli("train", "--config", changed, "--resume", check=False)
    assert result.returncode == 2 and "model.d_ff" in result.stderr


@pytest.mark.slow  # trains end to end: `make test-all` and CI run it
def test_torchrun_two_processes_match_one_process_on_the_same_global_batch(tmp_path):
    """2 ranks x 1 batch (gloo) == 1 process x accumulate 2: same update, written once; the length
    penalty is then chosen once, by rank 0, after the ranks have left the process group."""
    common = dict(max_steps=1, eval_every=1, save_every=1, log_every=1, threads=1, model={"dropout": 0.0})
    common.update(max_time="1h", cooldown=0.5)  # the ranks agree on the time spent in the same collective
    single = tiny_config(tmp_path, name="single", accumulate=2, **common)
    ddp = tiny_config(tmp_path, name="ddp", **common)
    raw = yaml.safe_load(ddp.read_text())
    raw["decode"]["tune_length_penalty"] = [0.6, 1.0]
    ddp.write_text(yaml.safe_dump(raw))
    run_cli("train", "--config", single)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    result = subprocess.run(
        [*torchrun, "-m", "translate", "train", "--config", str(ddp)], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    a = load_checkpoint(tmp_path / "runs" / "single" / "checkpoints" / "last.pt")
    b = load_checkpoint(tmp_path / "runs" / "ddp" / "checkpoints" / "last.pt")
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], atol=1e-5, rtol=1e-4, msg=k)
    assert a["metrics"]["loss"] == pytest.approx(b["metrics"]["loss"], rel=1e-4)
    assert len(b["rng"]) == 2  # each rank's random state, for an exact resume
    assert not torch.equal(b["rng"][0]["torch"], b["rng"][1]["torch"])  # each rank its own dropout masks
    run = tmp_path / "runs" / "ddp"
    assert len(list((run / "tb").glob("events.*"))) == 1
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best.pt", "last.pt", "step_0000001.pt"]
    assert (run / "train.log").read_text().count("training stopped") == 1
    assert (run / "train.log").read_text().count("chose length penalty") == 1
    assert sorted(b["tune_length_penalty"]["bleu"]) == [0.6, 1.0]  # last.pt is best.pt here: both re-linked
    # the same command again: rank 0 refuses (no --resume) and every rank ends at once, rank 0 saying why (rank 1
    # waited in the process group's start until torchrun killed it, 30 s later)
    again = subprocess.run(
        [*torchrun, "-m", "translate", "train", "--config", str(ddp)], capture_output=True, text=True, timeout=600
    )
    assert again.returncode != 0 and again.stderr.count("error: ") == 1, again.stderr[-3000:]
    assert "already holds a training run" in again.stderr and "forcefully" not in again.stderr
    steps = dict(max_steps=8, eval_every=100, save_every=100, cooldown=0.0, warmup_steps=1)
    diverged = tiny_config(tmp_path, name="diverged", max_bad_steps=2, lr=1e30, **{**common, **steps})
    diverging = subprocess.run(
        [*torchrun, "-m", "translate", "train", "--config", str(diverged)], capture_output=True, text=True, timeout=600
    )  # every rank stops at the same update, rank 0 alone saying why
    assert diverging.stderr.count("error: ") == 1 and "non-finite" in diverging.stderr, diverging.stderr[-3000:]


@pytest.mark.slow  # trains end to end: `make test-all` and CI run it
def test_time_budget_stops_on_time_with_a_last_validation_and_checkpoint(tmp_path):
    cfg = tiny_config(tmp_path, name="budget", max_steps=100_000, max_time="3s", eval_every=100_000, save_every=100_000)
    result = run_cli("train", "--config", cfg)
    run = tmp_path / "runs" / "budget"
    last = load_checkpoint(run / "checkpoints" / "last.pt")
    assert 0 < last["step"] < 100_000
    assert last["metrics"]["bleu"] >= 0  # the stop ran a validation
    assert 3 <= last["progress"]["elapsed"] < 60
    log = (run / "train.log").read_text()
    assert "reached train.max_time=3s" in log and "time: " in log and "updates" in log
    assert "last validation" in result.stdout

    # Resumed with the same budget: the time already trained counts, so nothing more is done.
    run_cli("train", "--config", run / "config.yaml", "--resume")
    again = load_checkpoint(run / "checkpoints" / "last.pt")
    assert again["step"] == last["step"] and "already past train.max_time" in (run / "train.log").read_text()

    # With a budget 3 s past the time trained it trains about 3 s more, not the whole budget again
    # (the budget from the time trained, which a busy machine stretches past the first 3 s).
    budget = math.ceil(last["progress"]["elapsed"]) + 3
    run_cli("train", "--config", run / "config.yaml", "--resume", "--set", f"train.max_time={budget}")
    more = load_checkpoint(run / "checkpoints" / "last.pt")
    assert more["step"] > last["step"]
    assert budget <= more["progress"]["elapsed"] < last["progress"]["elapsed"] + budget


@pytest.mark.slow  # compiles the model (about a minute on 2 cores): `make test-all` and CI run it
def test_compiled_training_computes_the_eager_updates_and_saves_the_plain_model(tmp_path):
    """train.compile: the updates of the torch.compile'd model compute the eager ones (no dropout
    here: compiled code draws its own random numbers); checkpoints hold the plain model's weights,
    which decode and resume."""
    model = {"dropout": 0.0}
    eager = Trainer(cfg_for(tmp_path, "eager", model=model, max_steps=3), resume=False)
    compiled = Trainer(cfg_for(tmp_path, "compiled", model=model, max_steps=3, compile=True), resume=False)
    assert compiled.net is not compiled.model and eager.net is eager.model
    for indices in eager.epoch_batches(0)[:3]:  # batches of three shapes: a graph, then a dynamic one
        a, b = eager.update([eager.collate(indices)]), compiled.update([compiled.collate(indices)])
        assert float(b.loss) == pytest.approx(float(a.loss), rel=1e-4)
    eager.close()
    compiled.close()

    Trainer(cfg_for(tmp_path, "fit", model=model, max_steps=3, compile=True), resume=False).fit()
    last = tmp_path / "runs" / "fit" / "checkpoints" / "last.pt"
    ckpt = load_checkpoint(last)
    assert not any("_orig_mod" in key for key in ckpt["model"])
    load_model(last)  # the plain Transformer takes them as they are
    resumed = Trainer(cfg_for(tmp_path, "fit", model=model, max_steps=5, compile=True), resume=True)
    assert resumed.state.step == 3
    resumed.fit()
    assert resumed.state.step == 5 and load_checkpoint(last)["step"] == 5


def test_info_says_what_the_run_trained_on(trained_run):
    run, _ = trained_run
    out = run_cli("info", run / "checkpoints" / "last.pt").stdout
    assert "trained on: cpu x1, fp32 (train.amp off: train.amp off -> fp32)" in out and "time trained:" in out
    assert (run / "config.yaml").read_text().startswith("# precision fp32: train.amp off")


def test_the_sync_counter_sees_what_makes_the_host_wait():
    x = torch.randn(4, 5)
    with SyncCounter() as counter:
        x.sum().item()
        bool((x > 0).any())
        x[x > 0]
        torch.where(x > 0)
        x[torch.tensor([0, 1])]  # an index of positions: no wait
        with counter.paused():
            x.sum().item()
    assert counter.syncs == {"_local_scalar_dense": 2, "index": 1, "nonzero": 1}


@pytest.mark.parametrize("steps", [3, 6])
def test_training_updates_make_no_synchronisation(tmp_path, steps):
    """Two runs that differ only in max_steps, with a time budget and accumulation: outside
    logging, validation and checkpoints, the loop makes no device->host synchronisation."""
    cfg = cfg_for(tmp_path, f"s{steps}", max_steps=steps, max_time="1h", accumulate=2, log_every=2, eval_every=100)
    t = Trainer(cfg, resume=False)
    counter = SyncCounter()
    for name in ("validate", "save", "log_train"):
        setattr(t, name, counter.uncounted(getattr(t, name)))
    updates = []
    update = t.update
    t.update = lambda *args, **kwargs: updates.append(1) or update(*args, **kwargs)
    with counter:
        t.fit()
    assert len(updates) == steps and t.state.step == steps
    assert counter.syncs == {}, counter.syncs
    assert counter.attention  # the counter saw the updates' operations


def test_the_resume_command_says_where_to_run_it_when_the_config_names_relative_paths(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from translate.config import load_config
    from translate.train import Trainer, relative_paths

    monkeypatch.chdir(tmp_path)
    absolute = load_config(tiny_config(tmp_path))  # every path absolute
    assert relative_paths(absolute) == []
    hint = Trainer.resume_command(SimpleNamespace(cfg=absolute, run=absolute.run_path, distributed=False))
    assert hint == f"translate train --config {absolute.run_path / 'config.yaml'} --resume"
    relative = load_config(tiny_config(tmp_path), ["run_dir=runs", "data.train=corpus/train"])
    assert relative_paths(relative) == ["runs", "corpus/train"]
    hint = Trainer.resume_command(SimpleNamespace(cfg=relative, run=relative.run_path, distributed=False))
    assert hint == f"cd {tmp_path} && translate train --config runs/e2e/config.yaml --resume"


def test_average_last_beyond_keep_last_is_said_when_training_starts(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="translate"):
        t = Trainer(cfg_for(tmp_path, "avg", average_last=4, keep_last=2), resume=False)
    t.close()
    assert "train.average_last 4 but train.keep_last 2: the run will average the 2 step checkpoints" in caplog.text


def test_a_log_window_of_only_skipped_updates_has_no_loss_rather_than_zero():
    from translate.trainstate import Speedometer, UpdateResult

    speed = Speedometer(torch.device("cpu"))
    nan = torch.tensor(float("nan"))
    speed.add(UpdateResult(nan, nan, nan, torch.tensor(True), 100, 100, False, False), 0.1)
    stats = speed.read()
    assert math.isnan(stats.loss) and math.isnan(stats.ppl) and math.isnan(stats.grad_norm) and stats.skipped == 1
    speed.add(
        UpdateResult(
            torch.tensor(250.0), torch.tensor(200.0), torch.tensor(2.0), torch.tensor(False), 100, 100, False, False
        ),
        0.1,
    )
    stats = speed.read()
    assert stats.loss == 2.5 and stats.grad_norm == 2.0 and stats.skipped == 0
