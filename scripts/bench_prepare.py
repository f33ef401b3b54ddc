"""How `translate prepare` scales: wall time, pairs/s and peak memory on 0.5M, 1M and 2M pairs,
then the time from `translate train` start to the first training step on the largest run.

    python scripts/bench_prepare.py                       # sizes 500000,1000000,2000000, once each
    python scripts/bench_prepare.py --repeats 3 --sizes 500000,2000000

The corpora come from scripts/make_synthetic.py (Bible clauses recombined; a smaller corpus is
the first lines of the largest, which is what make_synthetic would write for that size). Each
run is the real CLI in a subprocess on a `files` config (train only, so valid and test are held
out of it; vocab 8000, defaults otherwise). While it runs, /proc is polled every 0.1 s for the
whole process tree (the CLI and its encoding workers) and two sums are kept:

  RSS  resident pages of each process, summed: an upper bound, since pages that forked workers
       share with the parent (its imported libraries) count once per process;
  PSS  proportional set size (/proc/PID/smaps_rollup): shared pages split among the processes
       sharing them, so the sum is what the tree really occupies.

The acceptance figure is the peak of the RSS sum (the stricter one). Stage times come from the
timestamps in RUN/prepare.log. Time to first step: `translate train --set train.max_steps=1`
on the largest prepared run, from process start to the timestamp of the "step 1" line that the
training loop writes to RUN/train.log (default model and train.max_tokens).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import yaml

from translate.options import count, counts

ROOT = Path(__file__).resolve().parent.parent


def tree_memory(root: int) -> tuple[int, int, int]:
    """(sum of RSS, sum of PSS, processes) over `root` and its descendants, in bytes."""
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(f"/proc/{entry.name}/stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    tree, frontier = {root}, [root]
    while frontier:
        frontier = [pid for pid, ppid in parents.items() if ppid in frontier and pid not in tree]
        tree.update(frontier)
    rss = pss = 0
    for pid in tree:
        try:
            rss += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1]) * 1024
        except (OSError, IndexError, ValueError):
            pass
    return rss, pss, len(tree)


def run_measured(cmd: list[str], log_path: Path) -> dict[str, float]:
    """Run `cmd`, polling its process tree's memory; wall time and peaks (MB)."""
    peak = {"rss": 0, "pss": 0, "procs": 0}
    start = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        done = threading.Event()

        def poll() -> None:
            while not done.is_set():
                rss, pss, procs = tree_memory(proc.pid)
                peak.update(rss=max(peak["rss"], rss), pss=max(peak["pss"], pss), procs=max(peak["procs"], procs))
                done.wait(0.1)

        watcher = threading.Thread(target=poll, daemon=True)
        watcher.start()
        code = proc.wait()
        done.set()
        watcher.join()
    if code != 0:
        sys.exit(f"error: {' '.join(cmd)} failed ({code}); see {log_path}")
    return {"start": start, "wall": time.time() - start, "rss": peak["rss"] / 2**20, "pss": peak["pss"] / 2**20}


def log_times(path: Path, marks: list[str]) -> list[float | None]:
    """The timestamp of the first line of a `translate` log that contains each mark."""
    found: list[float | None] = [None] * len(marks)
    for line in path.read_text(encoding="utf-8").splitlines():
        for i, mark in enumerate(marks):
            if found[i] is None and mark in line:
                found[i] = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return found


def make_corpora(sizes: list[int], work: Path, seed: int) -> dict[int, Path]:
    """WORK/syn/N.{en,fr} for each size: the largest made once, the others its first lines."""
    largest = work / "syn" / str(max(sizes))
    if not Path(f"{largest}.fr").is_file():
        cmd = [sys.executable, "scripts/make_synthetic.py", str(max(sizes)), str(largest), "--seed", str(seed)]
        subprocess.run(cmd, check=True, cwd=ROOT)
    out = {}
    for n in sizes:
        prefix = work / "syn" / str(n)
        for lang in ("en", "fr"):
            if not Path(f"{prefix}.{lang}").is_file():
                with open(f"{largest}.{lang}", "rb") as src, open(f"{prefix}.{lang}", "wb") as dst:
                    for _, line in zip(range(n), src):
                        dst.write(line)
        out[n] = prefix
    return out


def write_config(work: Path, n: int, prefix: Path, args: argparse.Namespace) -> Path:
    data = {"source": "files", "train": str(prefix)}
    if args.workers is not None:
        data["num_workers"] = args.workers
    cfg = {"name": f"syn{n}", "run_dir": str(work / "runs"), "data": data, "vocab": {"size": args.vocab}}
    path = work / f"syn{n}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def bench_prepare(n: int, config: Path, work: Path, repeats: int) -> dict[str, float]:
    rows = []
    for r in range(repeats):
        run = work / "runs" / f"syn{n}"
        shutil.rmtree(run, ignore_errors=True)
        m = run_measured(
            [sys.executable, "-m", "translate", "prepare", "--config", str(config)], work / f"prepare{n}.out"
        )
        sample, encode = log_times(run / "prepare.log", ["training SentencePiece", "encoding with"])
        row = {"wall": m["wall"], "pairs_s": n / m["wall"], "rss": m["rss"], "pss": m["pss"]}
        row |= {"clean_s": sample - m["start"], "spm_s": encode - sample, "encode_s": m["start"] + m["wall"] - encode}
        rows.append(row)
        print(
            f"  {n:>9,} pairs, run {r + 1}: {row['wall']:6.1f} s  {row['pairs_s']:8,.0f} pairs/s  "
            f"peak RSS sum {row['rss']:6,.0f} MB  PSS sum {row['pss']:6,.0f} MB  "
            f"(start+clean+split {row['clean_s']:.1f} s, SentencePiece {row['spm_s']:.1f} s, "
            f"encode {row['encode_s']:.1f} s)",
            flush=True,
        )
    return {k: statistics.median(row[k] for row in rows) for k in rows[0]}


def bench_first_step(n: int, config: Path, work: Path, repeats: int) -> list[tuple[float, float]]:
    run = work / "runs" / f"syn{n}"
    sets = ["train.max_steps=1", "train.log_every=1", "train.eval_every=1000000", "train.save_every=1000000"]
    times = []
    for r in range(repeats):
        for old in ("checkpoints", "tb"):
            shutil.rmtree(run / old, ignore_errors=True)
        (run / "train.log").unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "translate", "train", "--config", str(config)]
        m = run_measured(cmd + [a for s in sets for a in ("--set", s)], work / "train.out")
        (step,) = log_times(run / "train.log", ["step 1 "])
        first = step - m["start"] if step else float("nan")
        times.append((first, m["wall"]))
        print(f"  train run {r + 1}: first step after {first:.1f} s (process {m['wall']:.1f} s in all)", flush=True)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", type=counts, default="500000,1000000,2000000", help="comma-separated corpus sizes (pairs)"
    )
    parser.add_argument("--repeats", type=count, default=1, help="runs of each size; medians are reported")
    parser.add_argument("--workers", type=int, default=None, help="data.num_workers (default: the config default)")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "translate_bench_prepare")
    parser.add_argument("--no-train", action="store_true", help="skip the time-to-first-step measurement")
    args = parser.parse_args()
    sizes = sorted(args.sizes)
    args.workdir.mkdir(parents=True, exist_ok=True)
    corpora = make_corpora(sizes, args.workdir, args.seed)
    print(f"prepare on {os.cpu_count()} CPUs, workers: {args.workers if args.workers is not None else 'default'}")
    results, configs = {}, {}
    for n in sizes:
        configs[n] = write_config(args.workdir, n, corpora[n], args)
        results[n] = bench_prepare(n, configs[n], args.workdir, args.repeats)
    print(
        f"\n{'pairs':>10} {'wall s':>8} {'pairs/s':>9} {'w/o SentencePiece':>18} {'peak RSS sum MB':>16} {'PSS sum MB':>11}"
    )
    for n, r in results.items():
        rest = n / (r["wall"] - r["spm_s"])  # SentencePiece trains on a fixed-size sample: a constant
        print(f"{n:>10,} {r['wall']:8.1f} {r['pairs_s']:9,.0f} {rest:18,.0f} {r['rss']:16,.0f} {r['pss']:11,.0f}")
    small, big = sizes[0], sizes[-1]
    ratio = results[big]["pairs_s"] / results[small]["pairs_s"]
    print(f"pairs/s at {big:,} / pairs/s at {small:,} = {ratio:.2f} (target >= 0.80)")
    print(f"largest peak RSS sum {max(r['rss'] for r in results.values()):,.0f} MB (target < 2048)")
    if not args.no_train:
        times = bench_first_step(big, configs[big], args.workdir, args.repeats)
        first = statistics.median(t for t, _ in times)
        print(f"time to first training step on {big:,} pairs: {first:.1f} s (median of {len(times)}; target < 20)")


if __name__ == "__main__":
    main()
