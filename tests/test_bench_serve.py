"""scripts/bench_serve.py on the tiny trained run: the server, decode and the decoding processes without HTTP agree."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="translate serve needs the [serve] extra (starlette, uvicorn)")
pytest.importorskip("uvicorn", reason="translate serve needs the [serve] extra (starlette, uvicorn)")

SCRIPT = Path(__file__).parent.parent / "scripts" / "bench_serve.py"


@pytest.mark.slow
def test_bench_serve_with_and_without_http(trained_run, capsys):
    spec = importlib.util.spec_from_file_location("bench_serve", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    run, _ = trained_run
    args = ["--sentences", "6", "--clients", "1,3", "--repeats", "1", "--without-http"]
    bench.main([str(run / "checkpoints" / "best.pt"), *args])
    out = capsys.readouterr().out
    assert "6 sentences of" in out  # the run's data/test.en by default
    for name in ("translate decode", "serve, 1 client", "serve, 3 clients", "  ... without HTTP"):
        row = next(line for line in out.splitlines() if line.startswith(name + " "))
        assert float(row[len(name) :].split()[0]) > 0
    assert "outputs equal to decode's: 100.0%" in out  # the server's and the direct calls' answers alike
    assert "the decoding processes without HTTP at 3 clients:" in out
