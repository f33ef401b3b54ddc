"""batcher.py: continuous batching behind Engine.submit — the same answers as Engine.translate."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import LINES
from translate.batcher import QueueFull, TooManySentences
from translate.engine import Engine, first_best
from translate.options import SearchOptions, ServingLimits

SEARCH = SearchOptions(beam_size=3, length_penalty=0.6, max_len_a=1.0, max_len_b=3)


@pytest.fixture
def engine(model, tokenizer):
    engine = Engine(model, tokenizer, SEARCH, workers=2, limits=ServingLimits(batch_window_ms=1, max_batch=5))
    yield engine
    engine.stop()


def test_submitted_sentences_get_what_translate_gives(engine):
    """Requests of several options at once, joining running searches of up to 5 sentences between
    steps: each answer is translate's with the same options (texts; scores up to float noise)."""
    options = [SEARCH, SEARCH.given(beam_size=1), SEARCH.given(beam_size=2, nbest=2)]
    asks = [([random.Random(i).choice(LINES) for _ in range(i % 3 + 1)], options[i % 3]) for i in range(24)]
    with ThreadPoolExecutor(8) as pool:
        futures = list(pool.map(lambda ask: engine.submit(*ask), asks))
    for (texts, o), future in zip(asks, futures, strict=True):
        got, expected = future.result(timeout=60), list(engine.translate(texts, o))
        assert [[t for t, _ in n] for n in got] == [[t for t, _ in n] for n in expected]
        assert [s for n in got for _, s in n] == pytest.approx([s for n in expected for _, s in n], abs=1e-4)


def test_blank_sentences_and_default_options(engine):
    got = engine.submit(["", LINES[0], " "]).result(timeout=60)
    assert got[0] == got[2] == [("", 0.0)] and first_best(got)[1] == first_best(engine.translate([LINES[0]]))[0]
    assert engine.submit([""]).result(timeout=60) == [[("", 0.0)]]  # nothing to search: answered at once


def test_a_full_queue_refuses_at_once_and_keeps_what_it_holds(model, tokenizer):
    limits = ServingLimits(batch_window_ms=600_000, max_batch=10, max_queue=3)  # the window outlasts the test
    engine = Engine(model, tokenizer, SEARCH, workers=1, limits=limits)
    try:
        held = engine.submit(LINES[:2])
        time.sleep(0.2)  # the thread wakes, then waits out its window for more
        queued = engine.submit([LINES[2]])
        with pytest.raises(QueueFull, match="max-queue 3") as busy:
            engine.submit([LINES[3]])
        assert not isinstance(busy.value, TooManySentences)  # busy: retrying later can help
        with pytest.raises(TooManySentences, match="4 sentences in one request; at most 3"):
            engine.submit(LINES[:4])  # never fits, even an empty queue
        assert engine.queued == 3  # the refused sentences were not queued
    finally:
        engine.stop()  # hurries: what is held and queued is decoded
    assert first_best(held.result(timeout=60)) == first_best(engine.translate(LINES[:2]))
    assert len(queued.result(timeout=60)) == 1
    with pytest.raises(QueueFull, match="shutting down"):
        engine.submit([LINES[0]])


def test_a_failing_search_fails_its_request_and_the_engine_goes_on(engine, monkeypatch):
    def broken(texts, options=None, glossary=None):
        raise RuntimeError("broken greedy")

    monkeypatch.setattr(engine, "translate_in_worker", broken)
    with pytest.raises(RuntimeError, match="broken greedy"):
        engine.submit([LINES[0]], SEARCH.given(beam_size=1)).result(timeout=60)
    assert len(engine.submit([LINES[0]]).result(timeout=60)) == 1  # beam search still answers


@pytest.mark.parametrize("where", ["step", "select"])
def test_a_failing_beam_search_step_fails_its_requests_and_the_threads_go_on(model, tokenizer, monkeypatch, where):
    """Every request in a search whose step raises gets the error (requests gathered by identity),
    whether the step fails at once or after the sentences it finished left the search (`select`:
    the short request's); nothing stays in flight, the decoding threads live on, answer the next
    request and stop."""
    from translate import search as search_module

    owner, name = (search_module.BeamSearch, "step") if where == "step" else (search_module.Finished, "select")
    real, calls = getattr(owner, name), []

    def failing_once(self, *args):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("broken step")
        return real(self, *args)

    monkeypatch.setattr(owner, name, failing_once)
    limits = ServingLimits(batch_window_ms=300, max_batch=5)  # one thread: both requests join one search
    engine = Engine(model, tokenizer, SEARCH, workers=1, limits=limits)
    try:
        first, second = engine.submit([LINES[0]]), engine.submit([LINES[1]])
        for future in (first, second):
            with pytest.raises(RuntimeError, match="broken step"):
                future.result(timeout=60)
        assert len(engine.submit([LINES[2]]).result(timeout=60)) == 1
        assert all(t.is_alive() for t in engine._batcher.threads) and engine._batcher.in_flight == [0]
    finally:
        stopping = threading.Thread(target=engine.stop, daemon=True)
        stopping.start()
        stopping.join(timeout=60)
        assert not stopping.is_alive(), "the engine did not stop"
