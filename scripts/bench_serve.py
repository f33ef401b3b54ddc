"""Throughput and latency of `translate serve` against `translate decode` on the same sentences.

    python scripts/bench_serve.py CKPT                       # first 200 lines of RUN/data/test.en
    python scripts/bench_serve.py CKPT --src FILE --sentences 500 --clients 1,4,16

It starts `translate serve CKPT --port 0` in a subprocess and, for each number of clients,
sends the sentences one per request (`{"text": ..., "split": false}`: each line searched whole,
as the baseline does) from that many client threads, each on
its own keep-alive connection, each sending the next sentence not yet sent as soon as its last
request is answered, so that all of them stay busy until the last sentences are in flight
(`--per-request N`: N consecutive sentences a request, as `{"texts": [...]}`).
It prints sentences/s (sentences / wall time) and the median and 99th percentile of the
request latencies. The baseline is what `translate decode` runs, an Engine with the checkpoint's
options, over the same sentences in this process (the model loaded first, as
the server's is), with the server idle. Every server answer is checked against it. A second
baseline runs the same search over the sentences in consecutive rounds of C (the most clients)
in input order: what a server whose C clients each have one sentence in flight could feed it at
best, with no HTTP, no waiting and no overlap of rounds. A third feeds it rounds of C sentences
that end at about the same step (grouped by the length of their translation): about the best a
batch of C sentences refilled as they finish (the server's continuous batching) can do. The last line is the server's
sentences/s at the most clients as a share of both. With --without-http the server's decoding processes are also
started in this process and called by the same client threads without HTTP (`ProcessEngine.submit`), at the most
clients: what the search and its batching reach with no HTTP, JSON or event loop. On a machine
busy with other work the figures are noisy: run with --repeats 3 (medians are printed).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from translate.engine import Engine, EngineSpec, first_best
from translate.errors import run_script
from translate.hardware import describe_machine
from translate.inference import keep_freed_memory
from translate.options import SearchOptions, ServingLimits, count, counts
from translate.pool import ProcessEngine, resolve_spec


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "checkpoint",
        nargs="?",
        default="runs/bible/checkpoints/best.pt",
        help="default: runs/bible/checkpoints/best.pt",
    )
    p.add_argument("--src", help="English source file (default: RUN/data/test.en of the checkpoint's run)")
    p.add_argument("--sentences", type=count, default=200, help="first N non-blank lines")
    p.add_argument("--clients", type=counts, default="1,4,16", help="comma-separated numbers of concurrent clients")
    p.add_argument("--batch-window-ms", type=float, default=5.0, help="the server's --batch-window-ms")
    p.add_argument("--workers", type=int, default=0, help="the server's --workers (0: its default)")
    p.add_argument("--per-request", type=count, default=1, help='sentences in each request (1: {"text": ...})')
    p.add_argument("--repeats", type=count, default=1, help="runs of everything, taking turns; medians printed")
    p.add_argument(
        "--without-http",
        action="store_true",
        help="also call the server's decoding processes from this process, without HTTP, at the most clients",
    )
    return p.parse_args(argv)


class Server:
    """`translate serve` in a subprocess on a free port of 127.0.0.1."""

    def __init__(self, checkpoint: str, window: float, workers: int = 0) -> None:
        command = [sys.executable, "-m", "translate", "serve", checkpoint, "--port", "0"]
        self.proc = subprocess.Popen(
            [*command, "--batch-window-ms", str(window), "--device", "cpu", "--workers", str(workers)],
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        for line in self.proc.stderr:
            if m := re.search(r"on http://127\.0\.0\.1:(\d+)", line):
                self.port = int(m.group(1))
                break
        else:
            raise SystemExit("the server did not start")
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()  # drain its log

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)


def decoding_processes(checkpoint: str, window_ms: float, workers: int = 0) -> ProcessEngine:
    """The decoding processes `translate serve CHECKPOINT --device cpu` starts, with its defaults, in this process."""
    limits = ServingLimits(batch_window_ms=window_ms, max_queue=1 << 20)
    engine = ProcessEngine(resolve_spec(EngineSpec([checkpoint], device="cpu", workers=workers, limits=limits)))
    engine.start()
    return engine


class HttpClient:
    """One client of the server: a keep-alive connection that posts `{"text": ...}` or `{"texts": [...]}`."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)

    def translate(self, texts: list[str]) -> list[str]:
        body = {"text": texts[0]} if len(texts) == 1 else {"texts": texts}
        body["split"] = False  # each line one sentence, as the baseline searches it
        self.conn.request("POST", "/translate", json.dumps(body), {"Content-Type": "application/json"})
        response = self.conn.getresponse()
        answer = response.read()
        if response.status != 200:
            raise SystemExit(f"the server answered {response.status}: {answer.decode()}")
        got = json.loads(answer)
        return [got["translation"]] if len(texts) == 1 else got["translations"]

    def close(self) -> None:
        self.conn.close()


class DirectClient:
    """One client of the server's decoding processes called in this process, without HTTP."""

    def __init__(self, engine: ProcessEngine, search: SearchOptions) -> None:
        self.engine, self.search = engine, search

    def translate(self, texts: list[str]) -> list[str]:
        return first_best(self.engine.submit(texts, self.search).result())

    def close(self) -> None:
        pass


def run_clients(
    connect: Callable[[], HttpClient | DirectClient], sentences: list[str], clients: int, per_request: int = 1
) -> tuple[float, list[float], list[str]]:
    """(seconds, per-request latencies, translations in input order) with `clients` threads, each
    with its own `connect()`, each request carrying `per_request` consecutive sentences, each
    thread taking the next request not yet sent."""
    results: list[str] = [""] * len(sentences)
    latencies: list[float] = []
    starts = list(range(0, len(sentences), per_request))

    todo, lock = iter(starts), threading.Lock()

    def next_start() -> int | None:
        with lock:
            return next(todo, None)

    def client(_: int) -> None:
        me = connect()
        while (i := next_start()) is not None:
            texts = sentences[i : i + per_request]
            start = time.perf_counter()
            results[i : i + len(texts)] = me.translate(texts)
            latencies.append(time.perf_counter() - start)
        me.close()

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    return time.perf_counter() - start, latencies, results


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def time_baselines(engine: Engine, sentences: list[str], size: int) -> tuple[list[str], list[float]]:
    """The engine's translations of the sentences and the seconds of its three baselines: all at
    once (`translate decode`), in input-order rounds of `size`, and in rounds of `size` whose
    sentences end together (grouped by the length of their translation: about what a continuously
    refilled batch of that many sentences can reach at best)."""
    start = time.perf_counter()
    expected = first_best(engine.translate(sentences))
    seconds = [time.perf_counter() - start]
    out_lens = [len(ids) for ids in engine.tokenizer.encode(expected)]
    ending = sorted(range(len(sentences)), key=lambda i: out_lens[i])
    for order in (range(len(sentences)), ending):
        start = time.perf_counter()
        for i in range(0, len(sentences), size):
            list(engine.translate([sentences[j] for j in order[i : i + size]]))
        seconds.append(time.perf_counter() - start)
    return expected, seconds


def row(name: str, n: int, runs: list[tuple[float, list[float]]]) -> tuple[str, float]:
    """A table row (sentences/s, median p50 and p99 latencies) of `runs` (seconds, latencies), and the rate."""
    rate = n / statistics.median(s for s, _ in runs)
    p50 = statistics.median(percentile(lat, 0.5) for _, lat in runs) * 1000
    p99 = statistics.median(percentile(lat, 0.99) for _, lat in runs) * 1000
    return f"{name:<22} {rate:>9.1f} {p50:>9.1f} {p99:>9.1f}", rate


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    clients = args.clients
    src = Path(args.src) if args.src else Path(args.checkpoint).parent.parent / "data" / "test.en"
    sentences = [line for line in src.read_text(encoding="utf-8").splitlines() if line.strip()][: args.sentences]
    size = clients[-1] * args.per_request  # the sentences in flight at the most clients
    keep_freed_memory()  # as `translate decode` and `translate serve` do
    engine = Engine.load(EngineSpec([args.checkpoint], device="cpu"))  # what `translate decode` holds
    print(describe_machine())
    print(
        f"{len(sentences)} sentences of {src}, {args.per_request} per request; beam {engine.defaults.beam_size}, "
        f"batch window {args.batch_window_ms:g} ms, server workers {args.workers or 'default'}; "
        f"medians of {args.repeats} repeat(s)"
    )
    server = Server(args.checkpoint, args.batch_window_ms, args.workers)
    direct = None
    baselines: list[list[float]] = []
    runs: dict[str, list[tuple[float, list[float]]]] = {}  # row name -> (seconds, latencies) of each repeat
    same = []
    try:
        if args.without_http:
            direct = decoding_processes(args.checkpoint, args.batch_window_ms, args.workers)
        run_clients(lambda: HttpClient(server.port), sentences[:4], 1)  # warm up
        for _ in range(args.repeats):
            expected, seconds = time_baselines(engine, sentences, size)
            baselines.append(seconds)
            systems = [(f"serve, {c} client" + "s" * (c > 1), lambda: HttpClient(server.port), c) for c in clients]
            if direct is not None:
                systems.append(("  ... without HTTP", lambda: DirectClient(direct, engine.defaults), clients[-1]))
            for name, connect, c in systems:
                seconds, latencies, got = run_clients(connect, sentences, c, args.per_request)
                runs.setdefault(name, []).append((seconds, latencies))
                same.append(sum(a == b for a, b in zip(got, expected)) / len(sentences))
    finally:
        server.stop()
        if direct is not None:
            direct.stop()
    report(len(sentences), clients, size, baselines, runs, same)


def report(n: int, clients: list[int], size: int, baselines, runs, same: list[float]) -> None:
    decode_rate, rounds_rate, ending_rate = (n / statistics.median(b[i] for b in baselines) for i in range(3))
    print(f"{'':<22} {'sent/s':>9} {'p50 ms':>9} {'p99 ms':>9}")
    print(f"{'translate decode':<22} {decode_rate:>9.1f} {'':>9} {'':>9}")
    print(f"{f'decode, rounds of {size}':<22} {rounds_rate:>9.1f} {'':>9} {'':>9}")
    print(f"{'  ... ending together':<22} {ending_rate:>9.1f} {'':>9} {'':>9}")
    rates = {}
    for name, measured in runs.items():
        line, rates[name] = row(name, n, measured)
        print(line)
    rate = rates[f"serve, {clients[-1]} client" + "s" * (clients[-1] > 1)]
    print(f"outputs equal to decode's: {100 * min(same):.1f}%")
    print(
        f"serve at {clients[-1]} clients / decode: {100 * rate / decode_rate:.0f}% of decode's sentences/s, "
        f"{100 * rate / rounds_rate:.0f}% of decode's in rounds of {size} sentences, "
        f"{100 * rate / ending_rate:.0f}% of its rounds of sentences that end together"
    )
    if direct_rate := rates.get("  ... without HTTP"):
        print(
            f"the decoding processes without HTTP at {clients[-1]} clients: {100 * direct_rate / decode_rate:.0f}% of "
            f"decode's sentences/s (the server with HTTP: {100 * rate / direct_rate:.0f}% of that)"
        )


if __name__ == "__main__":
    run_script(main)
