"""Host memory of the training process over a run: each variant's resident memory at update 100 and later.

    python scripts/bench_memory.py                          # configs/bible.yaml, 1,000 updates
    python scripts/bench_memory.py --steps 300 --variant amp=off:train.amp=off
    python scripts/bench_memory.py --variant "cache 64:" --variant "cache 1024:ONEDNN_PRIMITIVE_CACHE_CAPACITY=1024"

It trains CONFIG (default configs/bible.yaml, the default run) from scratch once per variant, the
variants side by side (one `translate train` process each, `--threads` intra-op threads each), so
that their speeds are comparable with each other. The default variants are the config as it is
and the same with `train.pad_to_multiple=1` (batch shapes as they come). Each run logs its
resident memory every `train.log_every` updates (`host memory` in train.log); the script reads
those lines and prints, per variant: the memory at update 100, the highest after it, the growth
over the value at 100, the value at the last update, the process's peak resident memory so far
(`peak` in train.log, Linux's VmHWM) at update 100 and at the end with its growth, and the median
target tokens/s of the logging windows. The validation of the config (`train.eval_every`) runs as in a real run.

Runs go to a temporary directory (the prepared data of the config's run directory is copied in
when it exists, so the corpus is not prepared again) and are removed afterwards (`--keep` keeps them).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from translate.config import load_config  # noqa: E402
from translate.errors import run_script
from translate.hardware import describe_machine  # noqa: E402
from translate.options import count  # noqa: E402

LINE = re.compile(r"step (\d+) .* tokens/s (\d+) host memory (\d+) MiB(?: \(peak (\d+)\))?")


def parse_log(path: Path) -> list[tuple[int, int, int, int | None]]:
    """(step, tokens/s, MiB, peak MiB so far or None) of each logging line of a train.log."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        m = LINE.search(line)
        if m:
            rows.append(tuple(None if g is None else int(g) for g in m.groups()))
    return rows


def summary(name: str, rows: list[tuple[int, int, int, int | None]], base_step: int) -> str:
    at = {row[0]: row for row in rows}
    if base_step not in at:
        return f"{name}: no memory logged at update {base_step} (log_every must divide it)"
    base, last = at[base_step], rows[-1]
    high = max((row[2] for row in rows if row[0] > base_step), default=base[2])
    speed = statistics.median(row[1] for row in rows[1:]) if len(rows) > 1 else float("nan")
    peak = f"{base[3]:>9,} {last[3]:>9,} {last[3] / base[3] - 1:>+8.0%}" if base[3] and last[3] else f"{'-':>9} " * 3
    return (
        f"{name:<24} {base[2]:>8,} {high:>9,} {high / base[2] - 1:>+8.0%} "
        f"{last[2]:>9,} (update {last[0]:,}) {peak} {speed:>9,.0f}"
    )


def start_run(i: int, variant: str, cfg, args, command: list[str], work: Path):
    """Start `translate train` of one variant ('NAME:KEY=VALUE,...') in WORK/run{i}, from a copy of
    the prepared corpus where there is one: (name, run dir, process, its log file)."""
    name, _, sets = variant.partition(":")
    run = work / f"run{i}"
    if (cfg.run_path / "data" / "meta.json").exists():  # the prepared corpus, as prepare left it
        run.mkdir(parents=True)
        for item in ("data", "spm.model", "spm.vocab", "prepare.log"):
            src = cfg.run_path / item
            if src.is_dir():
                shutil.copytree(src, run / item)
            elif src.exists():
                shutil.copy2(src, run / item)
    settings = [x for x in sets.split(",") if x]
    env = {**os.environ, **dict(x.split("=", 1) for x in settings if x.split("=", 1)[0].isupper())}
    overrides = [
        f"run_dir={work}",
        f"name=run{i}",
        f"train.max_steps={args.steps}",
        f"train.threads={args.threads}",
        "train.max_time=null",
        f"train.save_every={args.steps}",
        "decode.tune_length_penalty=[]",  # training's memory only: no length-penalty search at the end
        *[x for x in settings if not x.split("=", 1)[0].isupper()],
    ]
    cmd = [*command, "train", "--config", args.config, *[x for o in overrides for x in ("--set", o)]]
    log = open(work / f"run{i}.out", "w")  # noqa: SIM115 (closed with the process)
    return name, run, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/bible.yaml")
    ap.add_argument(
        "--steps", type=count, default=1000, help="updates of each run (at least 101: memory is judged from update 100)"
    )
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads of each run (they run side by side)")
    ap.add_argument(
        "--variant",
        action="append",
        metavar="NAME:KEY=VALUE[,KEY=VALUE]",
        help="a run with these --set overrides, or environment variables where KEY is upper case "
        "(repeatable; default: the config, and train.pad_to_multiple=1)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the runs' directories")
    args = ap.parse_args()

    variants = args.variant or ["as configured:", "pad_to_multiple 1:train.pad_to_multiple=1"]
    if bad := [v for v in variants if ":" not in v]:
        ap.error(f"--variant {bad[0]!r}: expected NAME:KEY=VALUE[,KEY=VALUE] (NAME: for the config as it is)")
    if args.steps <= 100:
        ap.error(f"--steps {args.steps}: at least 101 (memory is judged from update 100)")
    cfg = load_config(args.config, [])
    translate = Path(sys.executable).with_name("translate")
    command = [str(translate)] if translate.exists() else [sys.executable, "-m", "translate"]
    work = Path(tempfile.mkdtemp(prefix="bench_memory_"))
    print(describe_machine())
    print(f"{args.config}, {args.steps:,} updates, {len(variants)} runs side by side, {args.threads} thread(s) each")
    try:
        procs = [start_run(i, variant, cfg, args, command, work) for i, variant in enumerate(variants)]
        failed = False
        for name, run, proc, log in procs:
            proc.wait()
            log.close()
            if proc.returncode != 0:
                failed = True
                tail = (work / f"{run.name}.out").read_text(encoding="utf-8", errors="replace")[-800:]
                print(f"{name}: translate train exited {proc.returncode}:\n{tail}", file=sys.stderr)
        print(
            f"\n{'run':<24} {'MiB@100':>8} {'max after':>9} {'growth':>8} {'last':>9} {'':>14} "
            f"{'peak@100':>9} {'peak end':>9} {'growth':>8} {'tok/s':>9}"
        )
        for name, run, _, _ in procs:
            log_path = run / "train.log"
            print(summary(name, parse_log(log_path), 100) if log_path.exists() else f"{name}: no train.log")
        if failed:
            sys.exit(1)
    finally:
        if args.keep:
            print(f"runs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    run_script(main)
