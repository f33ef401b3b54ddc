"""engine.py: one object from checkpoint to n-best lists — its settings, shares and options."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import LINES, assert_same
from translate.decoding import translate_lines
from translate.engine import Engine, EngineSpec, first_best
from translate.errors import UserError
from translate.options import SearchOptions

SEARCH = SearchOptions(beam_size=3, length_penalty=0.6, max_len_a=1.0, max_len_b=3)


def test_translate_keeps_input_order_and_blank_lines(model, tokenizer):
    engine = Engine.from_model(model, tokenizer, SEARCH, batch_tokens=60)  # several batches
    lines = [LINES[1], "", LINES[0], "  ", LINES[3]]
    out = list(engine.translate(lines))
    alone = [next(engine.translate([line])) for line in lines]
    assert len(out) == len(lines) and out[1] == out[3] == [("", 0.0)]
    assert_same(out, alone)
    assert len({nbest[0][0] for nbest in out if nbest[0][0]}) == 3  # the lines translate differently


def test_options_of_a_call_replace_the_defaults(model, tokenizer):
    engine = Engine.from_model(model, tokenizer, SEARCH)
    assert all(len(nbest) == 1 for nbest in engine.translate(LINES))
    three = list(engine.translate(LINES, SEARCH.given(nbest=3)))
    assert all(len(nbest) == 3 for nbest in three)
    assert first_best(three) == first_best(engine.translate(LINES))  # the first of the n-best is the 1-best
    greedy = list(engine.translate(LINES, SEARCH.given(beam_size=1)))
    assert greedy == list(translate_lines(model, tokenizer, LINES, SEARCH.given(beam_size=1)))


def test_worker_shares(model, tokenizer):
    engine = Engine.from_model(model, tokenizer, SEARCH, batch_tokens=1001, workers=2)
    assert engine.workers == 2 and engine.worker_tokens == 500
    assert Engine(model, tokenizer, SEARCH, workers=4, threads=6).worker_threads == 1
    assert Engine(model, tokenizer, SEARCH, workers=4, threads=2).worker_threads == 1  # at least one
    assert Engine(model, tokenizer, SEARCH, workers=1, threads=3).worker_threads == 3
    with pytest.raises(UserError, match="workers"):
        Engine.from_model(model, tokenizer, SEARCH, workers=-1)


def test_best_tokens_are_the_first_translation(model, tokenizer):
    engine = Engine.from_model(model, tokenizer, SEARCH)
    for line in LINES[:3]:
        assert tokenizer.decode([engine.best_tokens(line)])[0] == next(engine.translate([line]))[0][0]


def test_load_takes_the_checkpoints_decode_section_and_the_options_given(tiny_checkpoint, tmp_path):
    engine = Engine.load(EngineSpec([tiny_checkpoint], device="cpu"))
    assert (engine.defaults.beam_size, engine.defaults.max_len_b, engine.batch_tokens) == (2, 3, 200)
    copy = shutil.copy(tiny_checkpoint, tmp_path / "copy.pt")  # an ensemble of one file twice is refused
    spec = EngineSpec([tiny_checkpoint, copy], device="cpu", beam_size=3, nbest=2, batch_tokens=50)
    ensemble = Engine.load(spec)
    assert len(ensemble.models) == 2 and ensemble.batch_tokens == 50
    assert (ensemble.defaults.beam_size, ensemble.defaults.nbest, ensemble.defaults.max_len_b) == (3, 2, 3)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"beam_size": 0}, "--beam must be at least 1"),
        ({"nbest": 3}, "--nbest must be between 1 and the beam size"),
        ({"batch_tokens": 0}, "--batch-tokens must be at least 1"),
        ({"max_len_a": -1.0}, "--max-len-a must be at least 0"),
        ({"workers": -2}, "--workers must be at least 0"),
    ],
)
def test_load_names_the_command_lines_options(tiny_checkpoint, options, message):
    with pytest.raises(UserError, match=message):
        Engine.load(EngineSpec([tiny_checkpoint], device="cpu", **options))


@pytest.mark.parametrize(
    "options, error, message",
    [
        (SEARCH.given(beam_size=2000), UserError, "beam_size must be at most the vocabulary's"),
        (SearchOptions(beam_size=1.5), UserError, "beam_size must be a whole number, got 1.5"),
        (SearchOptions(beam_size=2, nbest=True), UserError, "nbest must be a whole number"),
    ],
)
def test_each_calls_options_are_checked_against_the_models(model, tokenizer, options, error, message):
    engine = Engine.from_model(model, tokenizer, SEARCH)
    for call in (
        lambda: engine.translate(LINES, options),
        lambda: engine.translate_in_worker(LINES, options),
        lambda: engine.submit(LINES, options),
        lambda: engine.best_tokens(LINES[0], options),
    ):
        with pytest.raises(error, match=message):
            call()
    engine.stop()


def test_lines_that_are_not_a_list_of_text_are_refused(model, tokenizer):
    engine = Engine.from_model(model, tokenizer, SEARCH)
    with pytest.raises(TypeError, match="not one str"):
        engine.translate(LINES[0])  # at once: its characters are not lines
    with pytest.raises(TypeError, match="not one str"):
        engine.submit(LINES[0])
    with pytest.raises(TypeError, match="line 1 is a NoneType, not a str"):
        list(engine.translate([LINES[0], None]))
    with pytest.raises(TypeError, match="line 0 is a bytes"):
        list(engine.translate([b"Amen."]))
    with pytest.raises(ValueError, match="line 0 holds a lone surrogate"):
        list(engine.translate(["\ud800 Amen."]))
    with pytest.raises(TypeError, match="list of paths"):
        EngineSpec("runs/x/checkpoints/best.pt")
    engine.stop()
