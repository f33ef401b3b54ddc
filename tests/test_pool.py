"""pool.py: the decoding processes behind one TranslationEngine answer as an in-process Engine does."""

from __future__ import annotations

import pytest

from tests.conftest import LINES
from translate.batcher import QueueFull, TooManySentences
from translate.engine import Engine, EngineSpec, first_best
from translate.errors import UserError
from translate.options import ServingLimits
from translate.pool import ProcessEngine, open_engine, resolve_spec


def test_processes_answer_as_the_engine_does(tiny_checkpoint):
    spec = resolve_spec(EngineSpec([tiny_checkpoint], device="cpu", workers=2, limits=ServingLimits(max_queue=8)))
    assert (spec.device, spec.workers) == ("cpu", 2) and spec.threads >= 1
    local = Engine.load(spec)
    pool = ProcessEngine(spec)
    try:
        pool.start()
        assert pool.defaults == local.defaults
        futures = [pool.submit([line, ""]) for line in LINES[:4]]
        assert [first_best(f.result(timeout=120)) for f in futures] == [
            first_best(local.translate([line, ""])) for line in LINES[:4]
        ]
        assert first_best(pool.translate(LINES * 3)) == first_best(local.translate(LINES * 3))  # in requests of 8
        with pytest.raises(TooManySentences, match="9 sentences in one request; at most 8"):
            pool.submit(["a line"] * 9)
    finally:
        pool.stop()
    with pytest.raises(QueueFull, match="shutting down"):
        pool.submit(["a line"])


def test_a_checkpoint_that_cannot_be_loaded_is_one_user_error(tmp_path):
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="broken.pt"):
        open_engine(EngineSpec([broken], device="cpu", workers=2))
