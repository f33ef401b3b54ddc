"""textio.py: reading lines (BOM, CRLF, undecodable bytes) and writing translations atomically."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading

import pytest

from translate.decoding import translate_lines
from translate.errors import UserError
from translate.options import SearchOptions
from translate.textio import check_same_length, read_lines, write_text, write_translations


def test_read_lines(tmp_path):
    path = tmp_path / "in.en"
    path.write_bytes("\ufefffirst\r\nsecond\n\nlast".encode())
    assert list(read_lines(path)) == ["first", "second", "", "last"]
    path.write_bytes(b"good\nbad \xff here\n")
    lines = read_lines(path)
    assert next(lines) == "good"
    with pytest.raises(UserError, match=r"in\.en:2: not UTF-8"):
        next(lines)
    with pytest.raises(UserError, match="not found"):
        read_lines(tmp_path / "missing.en")


def test_write_text_and_tsv(tmp_path):
    translations = [[("le chat", -0.5), ("un chat", -0.75)], [("", 0.0), ("", 0.0)], [("a\nb\tc", -1.0)] * 2]
    out = tmp_path / "out.fr"
    assert write_translations(translations, out) == 3
    assert out.read_text(encoding="utf-8") == "le chat\nun chat\n\n\na b\tc\na b\tc\n"
    assert write_translations(translations, out, nbest_format="tsv") == 3
    assert out.read_text(encoding="utf-8").splitlines() == [
        "0\t-0.5000\tle chat",
        "0\t-0.7500\tun chat",
        "1\t0.0000\t",
        "1\t0.0000\t",
        "2\t-1.0000\ta b c",
        "2\t-1.0000\ta b c",
    ]
    assert [p.name for p in tmp_path.iterdir()] == ["out.fr"]


def test_write_error_leaves_the_old_file(tmp_path):
    out = tmp_path / "out.fr"
    out.write_text("old\n")

    def failing():
        yield [("new", 0.0)]
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        write_translations(failing(), out)
    assert out.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.fr"]


def test_write_stdout(capsys, model, tokenizer):
    n = write_translations(translate_lines(model, tokenizer, ["the cat", "", "dog"], SearchOptions(beam_size=3)), "-")
    lines = capsys.readouterr().out.split("\n")
    assert n == 3 and len(lines) == 4 and lines[1] == "" and lines[3] == ""


def test_a_replaced_file_keeps_its_permissions_and_a_read_only_one_is_refused(tmp_path):
    private, locked = tmp_path / "private.fr", tmp_path / "locked.fr"
    private.write_text("old\n")
    private.chmod(0o600)
    write_translations([[("new", 0.0)]], private)
    assert private.read_text() == "new\n" and stat.S_IMODE(private.stat().st_mode) == 0o600
    locked.write_text("keep\n")
    locked.chmod(0o444)
    with pytest.raises(UserError, match="locked.fr is read-only"):
        write_translations([[("new", 0.0)]], locked)
    assert locked.read_text() == "keep\n" and sorted(p.name for p in tmp_path.iterdir()) == ["locked.fr", "private.fr"]


def test_atomic_path_replaces_whole_or_not_at_all(tmp_path):
    from translate.textio import atomic_path

    target = tmp_path / "curves.png"
    target.write_bytes(b"old picture")
    target.chmod(0o640)
    with pytest.raises(RuntimeError):
        with atomic_path(target, suffix=".tmp.png") as tmp:
            assert tmp.suffix == ".png" and tmp.parent == tmp_path  # a writer may go by the suffix
            tmp.write_bytes(b"half")
            raise RuntimeError("the writer failed")
    assert target.read_bytes() == b"old picture" and len(list(tmp_path.iterdir())) == 1
    with atomic_path(target) as tmp:
        tmp.write_bytes(b"new picture")
    assert target.read_bytes() == b"new picture" and (target.stat().st_mode & 0o777) == 0o640
    assert len(list(tmp_path.iterdir())) == 1


def test_a_fifo_or_a_device_is_written_into_not_replaced(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    write_text(fifo, "une ligne\n")
    reader.join(timeout=30)
    assert got == [b"une ligne\n"] and stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert list(tmp_path.iterdir()) == [fifo]  # no temporary file left beside it
    # /dev/stdout of a process whose stdout is a pipe: a link to a pipe, which has no path
    ref = tmp_path / "ref.fr"
    ref.write_text("Au commencement, Dieu créa les cieux et la terre.\n")
    command = ["evaluate", "--hyp", ref, "--ref", ref, "--json", "/dev/stdout"]
    result = subprocess.run([sys.executable, "-m", "translate", *map(str, command)], capture_output=True, text=True)
    assert result.returncode == 0 and "Traceback" not in result.stderr
    assert json.loads(result.stdout[: result.stdout.rindex("}") + 1])["bleu"] == 100.0
    log = tmp_path / "log.txt"  # ... --json /dev/stdout >> log.txt: the log keeps what it had
    log.write_text("before\n")
    with open(log, "a") as stdout:
        subprocess.run([sys.executable, "-m", "translate", *map(str, command)], stdout=stdout, check=True)
    text = log.read_text()
    assert text.startswith("before\n{") and json.loads(text[7 : text.rindex("}") + 1])["bleu"] == 100.0


def test_a_line_count_mismatch_names_blank_lines_at_the_end():
    with pytest.raises(
        UserError, match=r"^h.fr has 2 lines but r.fr has 3: they must match \(r.fr ends in 1 blank line\)$"
    ):
        check_same_length("h.fr", ["a", "b"], "r.fr", ["a", "b", " "])
    with pytest.raises(UserError, match=r"they must match$"):  # the extra line is not blank
        check_same_length("h.fr", ["a", "b"], "r.fr", ["a", "", "c"])
    check_same_length("h.fr", ["a"], "r.fr", ["b"])
