"""translator.py: the bodies of decode, evaluate and attention, on a checkpoint of the tiny model."""

from __future__ import annotations

import shutil

import pytest

from translate.engine import Engine, EngineSpec
from translate.errors import UserError
from translate.translator import decode_file, plot_attention, translate_file_lines, translate_texts


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint


def spec(*checkpoints, **options) -> EngineSpec:
    return EngineSpec(checkpoints, device="cpu", **options)


def test_decode_file_nbest_tsv(checkpoint, tmp_path):
    src, out = tmp_path / "in.en", tmp_path / "out.fr"
    src.write_text("the cat sees a bird\n\ndog\n", encoding="utf-8")
    assert decode_file(spec(checkpoint, nbest=2), src, out, with_scores=True) == 3
    rows = [line.split("\t") for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r[0] for r in rows] == ["0", "0", "1", "1", "2", "2"] and rows[2][2] == ""
    copy = shutil.copy(checkpoint, tmp_path / "copy.pt")  # (one file twice is refused)
    assert decode_file(spec(checkpoint, copy, beam_size=1), src, out) == 3  # an ensemble, greedy
    assert len(out.read_text(encoding="utf-8").split("\n")) == 4


def test_decode_file_refuses_to_overwrite_its_input(checkpoint, tmp_path):
    src = tmp_path / "in.en"
    src.write_text("dog\n", encoding="utf-8")
    with pytest.raises(UserError, match="input file"):
        decode_file(spec(checkpoint), src, src)
    assert src.read_text(encoding="utf-8") == "dog\n"


def test_translate_file_lines(checkpoint, tmp_path):
    out = tmp_path / "hyp.fr"
    hyps = translate_file_lines(spec(checkpoint), ["the cat", "", "dog"], output=out)
    assert len(hyps) == 3 and hyps[1] == ""
    assert out.read_text(encoding="utf-8").split("\n")[:3] == hyps


def test_plot_attention(checkpoint, tmp_path):
    out = tmp_path / "attn.png"
    text = plot_attention(checkpoint, "the cat sees a bird", out, layer=0, head=1)
    assert isinstance(text, str) and out.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(UserError, match="layer"):
        plot_attention(checkpoint, "the cat", out, layer=5)


def test_translate_texts_refuses_an_unknown_format_and_one_string(model, tokenizer):
    engine = Engine.from_model(model, tokenizer)
    with pytest.raises(UserError, match="format must be one of text, html, markdown, got 'HTML'"):
        translate_texts(engine, ["<p>Amen.</p>"], format="HTML")
    with pytest.raises(TypeError, match="not one str"):
        translate_texts(engine, "Amen.")


def test_a_url_too_long_for_the_model_is_one_protected_span_not_cut():
    """The budget that cuts a sentence too long for the model counts what the model gets: a URL of
    more pieces than its positions is one placeholder, so the sentence is not cut and the URL comes
    back whole (cut, its second half went through the model as text)."""
    import random

    from tests.conftest import WORDS, tiny_model
    from translate.protect import CLASSES, placeholder_symbols
    from translate.tokenizer import Tokenizer

    rng = random.Random(0)
    sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(300)]
    tokenizer = Tokenizer.train(sentences, vocab_size=60, user_symbols=placeholder_symbols())
    engine = Engine.from_model(tiny_model(tokenizer.vocab_size, max_positions=32), tokenizer, protect=CLASSES)
    url = "https://example.com/" + "".join(rng.choice("abcxyz019") for _ in range(120))
    assert len(tokenizer.encode([url])[0]) > engine.max_pieces
    for line in (url, f"the cat sees {url} now"):
        (out,) = translate_texts(engine, [line])
        assert out.count(url) == 1, out
    engine.protect = ()  # --no-protect: the URL is text, cut until its parts fit
    (out,) = translate_texts(engine, [url])
    assert url not in out
