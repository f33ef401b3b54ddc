"""pool.py: the decoding processes behind one TranslationEngine answer as an in-process Engine does."""

from __future__ import annotations

import pytest

from tests.conftest import LINES
from translate.batcher import QueueFull, TooManySentences
from translate.engine import Engine, EngineSpec, first_best
from translate.errors import UserError
from translate.options import ServingLimits
from translate.pool import ProcessEngine, open_engine, resolve_spec
from translate.translator import sentence_budget, translate_texts


def test_processes_answer_as_the_engine_does(tiny_checkpoint):
    spec = resolve_spec(EngineSpec([tiny_checkpoint], device="cpu", workers=2, limits=ServingLimits(max_queue=8)))
    assert (spec.device, spec.workers) == ("cpu", 2) and spec.threads >= 1
    local = Engine.load(spec)
    pool = ProcessEngine(spec)
    try:
        pool.start()
        assert pool.defaults == local.defaults
        # a sentence too long for the models is cut into parts as in-process (decode), not truncated
        n = 1
        while len(local.tokenizer.encode([" ".join([LINES[0].rstrip(".")] * n)])[0]) <= local.max_pieces:
            n += 1
        long = " ".join([LINES[0].rstrip(".")] * n) + "."  # just over the limit: a few parts (max_queue 8)
        budget, pool_budget = sentence_budget(local), sentence_budget(pool)
        assert pool_budget["max_tokens"] == budget["max_tokens"] == local.max_pieces
        assert pool_budget["count_tokens"](long) == budget["count_tokens"](long)
        assert translate_texts(pool, [long], submit=True) == translate_texts(local, [long])
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
