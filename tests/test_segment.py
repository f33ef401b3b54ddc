"""Paragraphs split into sentences, translated together and joined (translate/segment.py)."""

import pytest

from translate.segment import fit_budget, join_sentences, split_sentences, translate_paragraphs

PROSE = [
    ("Mr. Smith went to Washington. He arrived at 3.5 p.m. on Monday.", 2),
    ("Use a tool, e.g. a hammer. It costs $3.50 today! Really? Yes.", 4),
    ('He said, "Stop right there." Then he left.', 2),
    ("The U.S. economy grew 2.5% in Q1. The U.K. did not.", 2),
    ("See https://example.com/a.b?c=d for details. Then write to j.doe@example.org today.", 2),
    ("Version 1.2.3 is out. i.e. this is fine.", 2),
    ("And God said, Let there be light: and there was light. And God saw the light, that it was good.", 2),
    ("One sentence without end", 1),
]


@pytest.mark.parametrize("text,n", PROSE)
def test_sentences_of_english_prose(text, n):
    sentences, gaps = split_sentences(text)
    assert len(sentences) == n
    assert join_sentences(sentences, gaps) == text
    assert all(s == s.strip() and s for s in sentences)


# Quotations do not hold their sentences together (a quotation of several sentences, or one
# whose other mark is outside the line, would merge everything between two marks), and the
# English sentence ends the segmenter takes for abbreviations ("me." is Maine's, "I." an initial).
QUOTED = [
    ('me." When she saw it, she stopped. Is this Naomi? She said, "Don\'t call me Naomi.',
     ['me."', "When she saw it, she stopped.", "Is this Naomi?", 'She said, "Don\'t call me Naomi.']),
    ('He said, "Wait. I come." And so.', ['He said, "Wait.', 'I come."', "And so."]),
    ("It ended. \"Go now,\" he said. \u00abBon.\u00bb \u201cFin.\u201d", ["It ended.", '"Go now," he said.', "\u00abBon.\u00bb", "\u201cFin.\u201d"]),
    ("He said, 'Hello there. How are you?' and left.", ["He said, 'Hello there.", "How are you?' and left."]),
    ('He asked "Why?" and she said "Because." Then.', ['He asked "Why?" and she said "Because."', "Then."]),
    ("They follow me. I give them life. Stay with me. Father, go.", ["They follow me.", "I give them life.", "Stay with me.", "Father, go."]),
    ("One is nearer than I. Stay here. John I. Smith and J. I. Packer came.", ["One is nearer than I.", "Stay here.", "John I. Smith and J. I. Packer came."]),
    ("Smith et al. Found it. Cats vs. Dogs is on. Don't go.", ["Smith et al. Found it.", "Cats vs. Dogs is on.", "Don't go."]),
    ("He met Dr. Who. It weighs approx. 5 kg, approx. ten. He said no. Then left.",
     ["He met Dr. Who.", "It weighs approx. 5 kg, approx. ten.", "He said no.", "Then left."]),
]  # fmt: skip


@pytest.mark.parametrize("text,expected", QUOTED)
def test_quotations_and_missed_sentence_ends(text, expected):
    sentences, gaps = split_sentences(text)
    assert sentences == expected
    assert join_sentences(sentences, gaps) == text


@pytest.mark.parametrize(
    "text", ["  First.  Second.\tThird.  ", "", "   ", "x", "Hello.\ue001 Next one.", "a.b. C", 'Stop."Go on." Now.']
)
def test_the_whitespace_is_kept(text):
    sentences, gaps = split_sentences(text)
    assert len(gaps) == len(sentences) + 1
    assert join_sentences(sentences, gaps) == text
    assert all(not g.strip() for g in gaps)


def test_a_sentence_ends_at_whitespace_or_before_the_markup_that_starts_the_next():
    """A cut between a full stop and what follows it without a space moves to the next space; where
    markup (a document's `<br>`, `<b>`) runs into the next sentence's first word, before the markup:
    no word goes with the sentence before it. The text joins back whole."""
    assert split_sentences("\ue000Hello world.\ue001 Next sentence.")[0] == [
        "\ue000Hello world.\ue001",
        "Next sentence.",
    ]
    for text, expected in (
        ("The first one is here.\ue000The second is there.", ["The first one is here.", "\ue000The second is there."]),
        ("It is important\ue001.\ue002Bold\ue003 is next.", ["It is important\ue001.", "\ue002Bold\ue003 is next."]),
    ):
        sentences, gaps = split_sentences(text)
        assert sentences == expected and "".join(g + s for g, s in zip(gaps, sentences + [""])) == text


def test_a_long_sentence_is_cut_at_clause_punctuation_then_spaces():
    sentence = "one two three four, five six seven eight nine ten; eleven twelve"
    parts = [sentence[a:b] for a, b in fit_budget(sentence, 6)]
    assert parts == ["one two three four,", "five six seven eight nine ten;", "eleven twelve"]
    words = " ".join(["word"] * 20)
    parts = [words[a:b] for a, b in fit_budget(words, 6)]
    assert all(len(p.split()) <= 6 for p in parts) and " ".join(parts) == words
    assert fit_budget("x" * 50, 20, len) == [(0, 12), (12, 25), (25, 37), (37, 50)]  # no space: at the middle
    for joined in (
        "e\u0301" * 10,
        "\u0e01\u0e34" * 5,
        "\U0001f468\u200d\U0001f469" * 4,
    ):  # an accent, a Thai vowel, ZWJ
        parts = fit_budget(joined, 5, len)
        assert all(joined[a] == joined[0] for a, _ in parts) and parts[-1][1] == len(joined), (joined, parts)
    assert fit_budget("x", 0, len) == [(0, 1)] and fit_budget("e\u0301", 0, len) == [(0, 2)]  # kept whole
    sentences, gaps = split_sentences(f"Short one. {sentence}", max_tokens=6)
    assert sentences[0] == "Short one." and len(sentences) == 4
    assert join_sentences(sentences, gaps) == f"Short one. {sentence}"


def test_a_sentence_is_never_cut_inside_a_protected_span():
    """A glossary's term with a space, a URL in a space-less run: the cut goes beside them."""
    import re

    def spans(text: str) -> list[tuple[int, int]]:
        return [m.span() for m in re.finditer(r"pull request|https://\S+", text)]

    words = "one two three four five open a pull request six seven eight nine ten"
    parts = [words[a:b] for a, b in fit_budget(words, 8, protected_spans=spans)]
    assert " ".join(parts) == words and any("pull request" in p for p in parts), parts
    token = "x" * 30 + "https://example.com/" + "y" * 40
    parts = [token[a:b] for a, b in fit_budget(token, 30, len, spans)]
    assert "".join(parts) == token and sum("https://example.com/" in p for p in parts) == 1, parts
    assert fit_budget("https://" + "z" * 60, 10, len, spans) == [(0, 68)]  # one span: kept whole


def test_paragraphs_translated_in_one_call_and_joined():
    calls = []

    def upper(batch):
        calls.append(list(batch))
        return [s.upper() for s in batch]

    lines = ["First one. Second one!  Third?", "", "  Only one sentence.  ", "No stop"]
    assert translate_paragraphs(lines, upper) == ["FIRST ONE. SECOND ONE!  THIRD?", "", "ONLY ONE SENTENCE.", "NO STOP"]
    assert calls == [["First one.", "Second one!", "Third?", "Only one sentence.", "No stop"]]


def test_one_sentence_lines_are_translated_as_they_are():
    """What the translator receives for a one-sentence line is the line (as it would strip it)."""
    lines = ["In the beginning God created the heaven and the earth.", "Mr. Smith arrived at 3.5 p.m."]
    seen = []
    translate_paragraphs(lines, lambda batch: seen.extend(batch) or batch)
    assert seen == lines


def test_nothing_to_translate_makes_no_call():
    def fail(batch):
        raise AssertionError("called")

    assert translate_paragraphs(["", "  "], fail) == ["", ""]


def test_one_sentence_lines_come_out_as_without_splitting(trained_run):
    from conftest import FIXTURES

    from translate.decoding import translate_lines
    from translate.inference import load_models

    run, _ = trained_run
    models, tokenizer, cfg = load_models([run / "checkpoints" / "last.pt"], "cpu")
    search = cfg.decode.search_options({}, 1, beam_size=2)

    def decode(batch):
        return [
            n[0][0] for n in translate_lines(models, tokenizer, batch, search, workers=1, protect=cfg.decode.protect)
        ]

    lines = [
        line for line in (FIXTURES / "bible.test.en").read_text().splitlines() if len(split_sentences(line)[0]) == 1
    ]
    assert len(lines) >= 10
    assert translate_paragraphs(lines, decode) == decode(lines)
