"""`translate decode -i FILE` and `translate evaluate` show a progress bar on a terminal only."""

import io
import sys

from tests.conftest import FIXTURES, run_cli
from translate.engine import EngineSpec
from translate.translator import decode_file, translate_file_lines

SRC, REF = FIXTURES / "bible.test.en", FIXTURES / "bible.test.fr"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_nothing_extra_in_a_pipe(trained_run, tmp_path):
    run, _ = trained_run
    checkpoint = run / "checkpoints" / "best.pt"
    decoded = run_cli("decode", checkpoint, "-i", SRC)
    assert decoded.stderr == "" and len(decoded.stdout.splitlines()) == 40
    evaluated = run_cli("evaluate", checkpoint, "--src", SRC, "--ref", REF)
    assert evaluated.stderr == "" and evaluated.stdout.startswith("BLEU ")


def test_a_bar_on_a_terminal(trained_run, tmp_path, monkeypatch):
    run, _ = trained_run
    spec = EngineSpec([run / "checkpoints" / "best.pt"], device="cpu")
    for translate in (
        lambda: decode_file(spec, SRC, tmp_path / "out.fr"),
        lambda: translate_file_lines(spec, SRC.read_text(encoding="utf-8").splitlines()),
    ):
        monkeypatch.setattr(sys, "stderr", Terminal())
        translate()
        shown = sys.stderr.getvalue()
        assert "/40 [" in shown and "sentences/s" in shown
