"""scripts/bench_memory.py: two real trainings side by side, their memory read back from train.log."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tiny_config

SCRIPT = Path(__file__).parent.parent / "scripts" / "bench_memory.py"


@pytest.mark.slow
def test_bench_memory_runs_both_variants_and_reports_growth(tmp_path):
    cfg = tiny_config(tmp_path, log_every=25, eval_every=100, max_steps=100)
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--config", str(cfg), "--steps", "125"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {line.split("  ")[0]: line for line in out.stdout.splitlines() if "(update 125)" in line}
    assert set(rows) == {"as configured", "pad_to_multiple 1"}, out.stdout
    for line in rows.values():
        at_100, high = (int(x.replace(",", "")) for x in line.split()[-10:-8])
        assert 0 < at_100 <= high  # resident MiB at update 100, then the highest after it
        peak_100, peak_end = (int(x.replace(",", "")) for x in line.split()[-4:-2])
        assert at_100 <= peak_100 <= peak_end  # the process's peak so far, at 100 and at the end
    assert not list(tmp_path.glob("runs/*"))  # the runs went to a temporary directory, removed


def test_log_lines_are_parsed(tmp_path):
    sys.path.insert(0, str(SCRIPT.parent))
    import bench_memory

    log = tmp_path / "train.log"
    log.write_text(
        "2026-12-01 18:57:08,176 step 100 loss 8.8684 lr 6.500e-05 tokens/s 1999 host memory 1000 MiB\n"
        "2026-12-01 18:57:09,176 amp auto: something else\n"
        "2026-12-01 18:57:29,160 step 200 loss 8.2779 lr 1.275e-04 tokens/s 2273 host memory 1300 MiB\n"
        "2026-12-01 18:57:39,160 step 300 loss 8.2779 lr 1.275e-04 tokens/s 2000 host memory 1100 MiB\n"
    )
    rows = bench_memory.parse_log(log)
    assert rows == [(100, 1999, 1000, None), (200, 2273, 1300, None), (300, 2000, 1100, None)]
    line = bench_memory.summary("x", rows, 100)
    assert "1,000" in line and "1,300" in line and "+30%" in line and "(update 300)" in line
    assert "no memory logged" in bench_memory.summary("x", rows, 50)
    log.write_text(
        "2026-12-05 08:00:00,000 step 100 loss 8.8 lr 6.5e-05 tokens/s 1999 host memory 500 MiB (peak 800)\n"
        "2026-12-05 08:00:09,000 step 200 loss 8.2 lr 1.2e-04 tokens/s 2273 host memory 520 MiB (peak 880)\n"
    )
    rows = bench_memory.parse_log(log)
    assert rows == [(100, 1999, 500, 800), (200, 2273, 520, 880)]
    assert "+10%" in bench_memory.summary("x", rows, 100)  # the peak's growth
