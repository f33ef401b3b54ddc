"""scripts/bench_train.py: the CPU comparison against the reference trainer and the steady-state
measurement (the GPU's, run here on a CPU), on the tiny config; a bad variant is one line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tiny_config

SCRIPT = Path(__file__).parent.parent / "scripts" / "bench_train.py"


def bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    cfg = tiny_config(tmp_path)
    cmd = [sys.executable, str(SCRIPT), "--config", str(cfg), "--run-dir", str(tmp_path / "bench"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def table(stdout: str, header: str) -> dict[str, list[str]]:
    """The rows under the table whose header line starts with `header`: label -> the columns after it."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header)) + 1
    rows = {}
    for line in lines[start:]:
        if not line.strip() or line.startswith(("translate fp32 /", "peak RSS")):
            break
        label, _, rest = line.partition("  ")
        rows[label.strip()] = rest.split()
    return rows


def test_steady_state_counts_no_synchronisation_in_an_update(tmp_path):
    # torch's CPU attention is its flash kernel (attention settings are for GPUs): that variant is the configured run
    flash = ("--variant", "flash=train.attention=flash")
    out = bench(tmp_path, "--steady-state", "--updates", "3", "--variant", "acc 2=train.accumulate=2", *flash)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("machine: CPU capability")
    rows = table(out.stdout, "variant")
    assert set(rows) == {"as configured", "acc 2"}, out.stdout
    assert rows["as configured"][-1] == "flash_attention_for_cpu"
    assert "== flash: skipped, the configured run's kernel already (flash_attention_for_cpu)" in out.stdout
    for cols in rows.values():
        assert float(cols[0].replace(",", "")) > 0  # target tokens/s
        assert cols[5] == "0"  # synchronisations per update: the trainer's update waits on nothing
    assert "1,024 tokens x 2" in out.stdout  # the variant's accumulation was the one timed


@pytest.mark.slow
def test_cpu_comparison_times_every_trainer_on_the_same_batches(tmp_path):
    out = bench(
        tmp_path,
        *"--vs-reference --precisions fp32 --threads 1 --warmup 1 --window 2 --windows 2".split(),
        *("--variant", "pad 8=train.pad_to_multiple=8", "--variant", "ff 32=model.d_ff=32"),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = table(out.stdout, "trainer")
    names = {"translate fp32", "translate fp32 pad 8", "translate fp32 ff 32", "reference nn.Transformer fp32"}
    assert set(rows) == names, out.stdout
    models = next(line for line in out.stdout.splitlines() if line.startswith("models: "))  # two widths

    def size(name: str) -> int:
        return int(re.search(re.escape(name) + r" ([\d,]+)", models).group(1).replace(",", ""))

    assert size("translate fp32 ff 32") < size("translate fp32") == size("reference nn.Transformer fp32")
    for cols in rows.values():
        assert float(cols[0].replace(",", "")) >= float(cols[1].replace(",", "")) > 0  # all tokens >= target tokens
    assert "translate fp32 / reference fp32:" in out.stdout and "translate fp32 pad 8 / reference fp32:" in out.stdout


@pytest.mark.parametrize(
    "variant, message",
    [
        ("bad=train.no_such_key=1", "unknown config key 'train.no_such_key'"),
        ("label only", "expected 'LABEL=key=value"),
    ],
)
def test_a_bad_variant_is_one_line_before_anything_runs(tmp_path, variant, message):
    out = bench(tmp_path, "--steady-state", "--variant", variant)
    assert out.returncode != 0
    assert out.stderr.strip().count("\n") == 0 and message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
    assert not (tmp_path / "bench").exists()  # nothing prepared or timed
