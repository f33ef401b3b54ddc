"""Random bytes and random unicode lines through `translate decode` and `translate evaluate`:
nothing crashes, line counts are kept, undecodable input is one `error:` line naming the line.

Seeded (Python's random), so a failure reproduces. stdin goes through the console script in a
subprocess; files go through the same command line in this process (`run_main`, see test_errors.py).
"""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES
from test_errors import assert_one_error as one_error
from test_errors import run_main

SEED = 1234
SHORT = [
    "--beam",
    "1",
    "--max-len-a",
    "0",
    "--max-len-b",
    "3",
]  # a few decoding steps a line: the test is about the I/O

POOLS = [
    "The cat sat on the mat. God said: let there be light",
    "中文句子测试。你好世界",  # another script
    "😀🎉👍🏽‍♀️🇫🇷",  # emoji, skin tone, joiners, flags
    " \t\u00a0\u2028\u2029\x0b\x0c\x1c\x85\u3000",  # every kind of space and line separator but \n
    "!?.,;:«»—…()[]{}\"'`~@#$%^&*_+=|\\/<>",  # punctuation only
    "\x00\x01\x07\x1b\x7f\u200b\u200d\ufeff\ufffd",  # controls, zero-width, BOM, replacement
    "ﬁßİǅÅéèêàçœÆ",  # ligatures, case oddities, accents
    "\U0001d518\U00010348\U0010fffd\ud7ff",  # astral planes, the last code points
]


def random_line(rng: random.Random) -> str:
    """A line of 0..80 characters drawn from one or two pools, or from all of unicode (no \\n, no surrogates)."""
    n = rng.choice([0, 1, 3, 10, 40, 80])
    if rng.random() < 0.15:
        chars = (chr(rng.choice([rng.randrange(0x20, 0xD800), rng.randrange(0xE000, 0x110000)])) for _ in range(n))
        return "".join(chars).replace("\n", " ")
    pools = rng.sample(POOLS, 2)
    return "".join(rng.choice(rng.choice(pools)) for _ in range(n))


def random_lines(rng: random.Random, count: int) -> list[str]:
    return [random_line(rng) for _ in range(count)]


def as_bytes(lines: list[str]) -> bytes:
    return "".join(line + "\n" for line in lines).encode("utf-8")


def first_bad_line(data: bytes) -> int | None:
    """The number of the first line (split at \\n, as the readers do) that is not UTF-8."""
    for number, raw in enumerate(io.BytesIO(data), 1):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return number
    return None


def translate(*args: object, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """The real command line, bytes in and out."""
    return subprocess.run(
        [sys.executable, "-m", "translate", *map(str, args)],
        input=stdin,
        capture_output=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        timeout=600,
    )


SPAN_WARNING = "the model did not place every protected span exactly once"  # private-use characters are spans


def assert_one_error(result: subprocess.CompletedProcess, *names: object) -> None:
    err = result.stderr.decode("utf-8", "replace")
    assert result.returncode == 2 and "Traceback" not in err, err
    lines = [line for line in err.strip().splitlines() if SPAN_WARNING not in line]  # of the lines translated
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    for name in names:
        assert str(name) in lines[0], f"{name!r} not in {lines[0]!r}"


def output_lines(data: bytes) -> list[str]:
    text = data.decode("utf-8")  # the output is always UTF-8
    assert text == "" or text.endswith("\n")
    return text.split("\n")[:-1]


@pytest.fixture
def cli(monkeypatch, capsys):
    return lambda *args: run_main(monkeypatch, capsys, *args)


@pytest.fixture(scope="module")
def ckpt(trained_run) -> Path:
    return trained_run[0] / "checkpoints" / "best.pt"


def test_random_unicode_lines_translate_line_for_line(cli, ckpt, tmp_path):
    rng = random.Random(SEED)
    lines = random_lines(rng, 40) + ["", "   ", "\u3000"]
    src, out = tmp_path / "junk.en", tmp_path / "junk.fr"
    src.write_bytes(as_bytes(lines))
    code, _, err = cli("decode", ckpt, "-i", src, "-o", out, *SHORT, "--beam", "2")
    assert code == 0, err
    hyps = output_lines(out.read_bytes())
    assert len(hyps) == len(lines)
    assert all(hyp == "" for line, hyp in zip(lines, hyps) if not line.strip())  # blank in, blank out

    # the same bytes on stdin (translated as they arrive; the last line lacks its \n), and scored as a hypothesis
    piped = translate("decode", ckpt, *SHORT, stdin=src.read_bytes().removesuffix(b"\n"))
    assert piped.returncode == 0 and len(output_lines(piped.stdout)) == len(lines), piped.stderr.decode()
    ref, scores = tmp_path / "junk.ref", tmp_path / "scores.json"
    ref.write_bytes(as_bytes(random_lines(rng, len(lines))))
    code, out_text, err = cli("evaluate", "--hyp", src, "--ref", ref, "--json", scores)
    assert code == 0 and "BLEU" in out_text, err
    assert json.loads(scores.read_text())["sentences"] == len(lines)


@pytest.mark.parametrize("seed", [SEED, pytest.param(SEED + 1, marks=pytest.mark.slow)])
def test_random_bytes_are_one_error_line_after_the_good_lines(cli, ckpt, tmp_path, seed):
    rng = random.Random(seed)
    good = random_lines(rng, rng.randrange(1, 8))
    data = as_bytes(good) + rng.randbytes(3000)
    bad = first_bad_line(data)
    assert bad is not None and bad > len(good)
    src, out = tmp_path / "junk.en", tmp_path / "junk.fr"
    src.write_bytes(data)

    # from a file: nothing is written; from stdin: the lines before the bad one are translated first
    one_error(*cli("decode", ckpt, "-i", src, "-o", out, *SHORT)[::2], f"junk.en:{bad}:", "not UTF-8")
    assert os.listdir(tmp_path) == ["junk.en"]
    piped = translate("decode", ckpt, *SHORT, stdin=data)
    assert_one_error(piped, f"<stdin>:{bad}:")
    assert len(output_lines(piped.stdout)) == bad - 1
    code, _, err = cli("evaluate", "--hyp", src, "--ref", FIXTURES / "bible.test.fr")
    one_error(code, err, f"junk.en:{bad}:", "not UTF-8")
