"""A run killed at any moment and resumed ends bitwise equal to a run never interrupted.

The runs carry a time budget (train.max_time) that max_steps reaches first: where the budget
stops a run depends on the machine, but with it set the rest of the promise holds."""

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import run_cli, tiny_config
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

pytestmark = pytest.mark.slow  # each test trains and kills runs: `make test-all` and CI run them

STEPS = dict(
    max_steps=40, save_every=5, eval_every=20, log_every=5, eval_max_sentences=4, max_time="1h", dropout_check=None
)


def config(tmp_path, name):
    train = {k: v for k, v in STEPS.items() if k != "dropout_check"}
    return tiny_config(tmp_path, name=name, threads=1, **train)


def weights(run):
    return torch.load(run / "checkpoints" / "last.pt", weights_only=True)["model"]


def assert_bitwise_equal(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reference")
    run_cli("train", "--config", config(tmp, "ref"))
    return tmp / "runs" / "ref"


def start_training(cfg):
    return subprocess.Popen(
        [sys.executable, "-m", "translate", "train", "--config", str(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def interrupt_after_first_checkpoint(cfg, run, signum):
    """Start a run, send `signum` at a random moment after its first checkpoint; retry if it was over."""
    for _ in range(5):
        for path in [run / "checkpoints", run / "tb"]:
            if path.exists():
                subprocess.run(["rm", "-rf", str(path)], check=True)
        proc = start_training(cfg)
        deadline = time.time() + 120
        while not (run / "checkpoints" / "last.pt").exists():
            assert proc.poll() is None, proc.stderr.read()
            assert time.time() < deadline
            time.sleep(0.01)
        time.sleep(random.uniform(0.0, 0.4))
        if proc.poll() is None:
            proc.send_signal(signum)
            _, err = proc.communicate(timeout=120)
            step = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["step"]
            if step < STEPS["max_steps"]:
                return proc.returncode, err, step
        else:
            proc.communicate()
    pytest.fail("the run always finished before it could be interrupted")


def resume_and_compare(cfg, run, reference):
    run_cli("train", "--config", cfg, "--resume")
    assert_bitwise_equal(weights(run), weights(reference))
    events = EventAccumulator(str(run / "tb")).Reload()
    steps = [e.step for e in events.Scalars("train/loss")]
    assert steps == list(range(5, STEPS["max_steps"] + 1, 5)), "TensorBoard steps duplicated or missing"
    assert [e.step for e in events.Scalars("valid/bleu")] == [20, 40]
    logged = EventAccumulator(str(reference / "tb")).Reload()
    for tag in ("train/loss", "train/grad_norm"):  # the window across the stop sums as if none had been
        assert [e.value for e in events.Scalars(tag)] == [e.value for e in logged.Scalars(tag)], tag


def test_sigkill_then_resume_is_bitwise_identical(tmp_path, uninterrupted):
    cfg, run = config(tmp_path, "killed"), tmp_path / "runs" / "killed"
    code, _, step = interrupt_after_first_checkpoint(cfg, run, signal.SIGKILL)
    assert code == -signal.SIGKILL and step % STEPS["save_every"] == 0
    torch.load(run / "checkpoints" / "last.pt", weights_only=True)  # intact despite the kill
    resume_and_compare(cfg, run, uninterrupted)


def test_sigint_saves_says_how_to_resume_and_resumes_identically(tmp_path, uninterrupted):
    cfg, run = config(tmp_path, "interrupted"), tmp_path / "runs" / "interrupted"
    code, err, step = interrupt_after_first_checkpoint(cfg, run, signal.SIGINT)
    assert code == 128 + signal.SIGINT
    assert "--resume" in err and f"step {step}" in err and "Traceback" not in err
    log = (run / "train.log").read_text().splitlines()  # the log tells what the console told
    assert f"stopped by SIGINT at step {step}; checkpoint saved. Resume with: " in log[-1]
    resume_and_compare(cfg, run, uninterrupted)


def test_resume_of_a_finished_run_changes_nothing(uninterrupted):
    before = weights(uninterrupted)
    run_cli("train", "--config", uninterrupted / "config.yaml", "--resume")
    assert_bitwise_equal(weights(uninterrupted), before)


def workers_of(cfg) -> list[int]:
    """Pids of the processes whose command line names this config (torchrun's workers)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if proc.name.isdigit() and str(cfg) in cmdline and "torch.distributed.run" not in cmdline:
            pids.append(int(proc.name))
    return pids


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the workers through /proc")
def test_workers_stop_when_torchrun_is_killed_and_the_run_resumes_exactly(tmp_path):
    """torchrun SIGKILLed mid-run: its 2 workers stop within seconds (with a checkpoint), the run's
    lock is free, and --resume ends bitwise equal to an uninterrupted 2-process run."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    steps = dict(max_steps=200, save_every=5, eval_every=100, log_every=5, eval_max_sentences=4, max_time="1h")
    ref_cfg, cfg = (tiny_config(tmp_path, name=name, threads=1, **steps) for name in ("ddp_ref", "ddp"))
    done = subprocess.run([*torchrun, "-m", "translate", "train", "--config", str(ref_cfg)], capture_output=True)
    assert done.returncode == 0, done.stderr[-2000:]
    run = tmp_path / "runs" / "ddp"
    launcher = subprocess.Popen([*torchrun, "-m", "translate", "train", "--config", str(cfg)], stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while not (run / "checkpoints" / "last.pt").exists():
        assert launcher.poll() is None and time.time() < deadline, "the run ended before it could be interrupted"
        time.sleep(0.05)
    assert len(workers_of(cfg)) == 2
    launcher.kill()
    launcher.wait()
    deadline = time.time() + 30
    while workers_of(cfg) and time.time() < deadline:
        time.sleep(0.2)
    assert workers_of(cfg) == [], "workers outlived their launcher"
    step = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["step"]
    assert step < steps["max_steps"], "the run finished before the kill: nothing was tested"
    resumed = subprocess.run(
        [*torchrun, "-m", "translate", "train", "--config", str(cfg), "--resume"], capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_bitwise_equal(weights(run), weights(tmp_path / "runs" / "ddp_ref"))


def test_a_second_sigterm_changes_nothing_and_a_second_sigint_stops_at_once():
    """A batch system's kill reaches every process of a job and torchrun sends its own SIGTERM:
    the update finishing and the checkpoint win. A second Ctrl-C still stops at once."""
    from translate.trainstate import StopRequest

    previous = signal.getsignal(signal.SIGTERM)
    stopper = StopRequest()
    try:
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)
        assert stopper.signum == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        stopper.restore()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN  # stopping: a later SIGTERM cannot cut the exit
    signal.signal(signal.SIGTERM, previous)


def test_a_save_killed_midway_leaves_no_temp_file_and_an_older_checkpoint_resumes(tmp_path):
    cfg = tiny_config(tmp_path, name="stale", max_steps=2, save_every=1, eval_every=100)
    run_cli("train", "--config", cfg)
    stale = tmp_path / "runs" / "stale" / "checkpoints" / ".step_0000003.pt.x1y2z3.tmp"  # kill -9 mid-save
    stale.write_bytes(b"partial")
    last = stale.parent / "last.pt"
    old = torch.load(last, weights_only=True)
    del old["hardware"]  # as checkpoints of earlier versions, which resume all the same
    torch.save(old, last)
    run_cli("train", "--config", cfg, "--resume", "--set", "train.max_steps=3")
    assert not stale.exists() and (stale.parent / "step_0000003.pt").is_file()


def test_the_window_logged_across_a_stop_sums_as_if_none_had_been(tmp_path):
    """A run stopped between two log lines (at update 7 of windows of 5) logs at update 10 the sums of
    updates 6 to 10, as the run never stopped does: the window's sums are in the checkpoint."""
    steps = dict(log_every=5, save_every=100, eval_every=100, eval_max_sentences=4, threads=1)
    whole = tiny_config(tmp_path, name="whole", max_steps=10, **steps)
    run_cli("train", "--config", whole)
    cut = tiny_config(tmp_path, name="cut", max_steps=7, **steps)
    run_cli("train", "--config", cut)
    run_cli("train", "--config", cut, "--set", "train.max_steps=10", "--resume")
    logged = {name: EventAccumulator(str(tmp_path / "runs" / name / "tb")).Reload() for name in ("whole", "cut")}
    for tag in ("train/loss", "train/grad_norm"):
        whole_values, cut_values = ([(e.step, e.value) for e in logged[n].Scalars(tag)] for n in ("whole", "cut"))
        assert [step for step, _ in cut_values] == [5, 10] and cut_values == whole_values, tag
