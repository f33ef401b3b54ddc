"""Glossaries: the file, the matching rules, and each term coming out exactly once as its target."""

import random

import pytest

from translate.errors import UserError
from translate.glossary import Glossary, glossary_of_request, load_glossary, parse_glossary
from translate.protect import CLASSES, PLACEHOLDER, Protector, find_spans, mask, protected

TERMS = [
    "# product names and terms",
    "",
    "cloud\tnuage",
    "cloud computing\tinformatique en nuage",
    "pull request\tdemande de fusion",
    "US\tÉtats-Unis",
    "Windows 10\tWindows 10 édition française",
    "example\texemple",
    "  build server \t serveur de compilation ",
]
GLOSSARY = parse_glossary(TERMS, "terms.tsv")


def shuffle_words(batch: list[str]) -> list[str]:
    """A fake model that reorders words (a placeholder moves with its word) and uppercases."""
    rng = random.Random(0)
    out = []
    for sentence in batch:
        words = sentence.split(" ")
        rng.shuffle(words)
        out.append(" ".join(w if PLACEHOLDER.search(w) else w.upper() for w in words))
    return out


def test_the_file_format():
    assert GLOSSARY.entries["build server"] == "serveur de compilation"
    assert len(GLOSSARY) == 7 and not Glossary({})


@pytest.mark.parametrize(
    "lines,message",
    [
        (["cloud nuage"], "terms.tsv:1: expected 'source term<TAB>target term', found no TAB"),
        (["# c", "a\tb\tc"], "terms.tsv:2: expected 'source term<TAB>target term', found 2 TABs"),
        (["\tnuage"], "terms.tsv:1: the source term is empty"),
        (["cloud\t "], "terms.tsv:1: the target term is empty"),
    ],
)
def test_a_malformed_file_is_one_line_naming_file_and_line(lines, message):
    with pytest.raises(UserError) as error:
        parse_glossary(lines, "terms.tsv")
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_a_term_given_two_targets_is_refused_but_a_repeat_is_not():
    with pytest.raises(UserError, match=r"terms.tsv:3: 'cloud' already has the target 'nuage' \(line 1\)"):
        parse_glossary(["cloud\tnuage", "cloud\tnuage", "cloud\tnue"], "terms.tsv")


def test_load_glossary_errors_name_the_file(tmp_path):
    with pytest.raises(UserError, match="glossary file not found"):
        load_glossary(tmp_path / "missing.tsv")
    bad = tmp_path / "bad.tsv"
    bad.write_bytes(b"cloud\tnuage\n\xff\tx\n")
    with pytest.raises(UserError, match=r"bad.tsv:2: not UTF-8"):
        load_glossary(bad)
    good = tmp_path / "terms.tsv"
    good.write_text("\ufeffcloud\tnuage\r\n", encoding="utf-8")
    assert load_glossary(good).entries == {"cloud": "nuage"}


def test_a_request_glossary_is_read_as_a_file_is():
    assert glossary_of_request({" pull  request ": "demande de fusion", "Cloud": "Nuage", "cloud": "nuage"}) == (
        parse_glossary(["pull request\tdemande de fusion", "Cloud\tNuage", "cloud\tnuage"], "terms.tsv")
    )
    assert not glossary_of_request({})


@pytest.mark.parametrize(
    "value, message",
    [
        (["cloud", "nuage"], '"glossary" must be an object of source term -> target term (strings)'),
        ({"cloud": 3}, '"glossary" must be an object of source term -> target term (strings)'),
        ({" ": "nuage"}, '"glossary": a source term is empty'),
        ({"cloud": " "}, "\"glossary\": the target of 'cloud' is empty"),
        ({"cloud": "nuage", "cloud ": "nue"}, "\"glossary\": 'cloud ' is given two targets, 'nuage' and 'nue'"),
    ],
)
def test_a_bad_request_glossary_is_one_line(value, message):
    with pytest.raises(ValueError) as e:
        glossary_of_request(value)
    assert str(e.value) == message


@pytest.mark.parametrize(
    "text,terms",
    [
        ("Cloud computing is a cloud.", ["Informatique en nuage", "nuage"]),  # longest first; capitalised
        ("CLOUD and clouds and cloudy", ["NUAGE"]),  # whole words only
        ("The US and us", ["États-Unis"]),  # a term with a capital matches as written
        ("Open a pull\n  request.", ["demande de fusion"]),  # inner whitespace matches any run
        ("Windows 10 and 10 more", ["Windows 10 édition française"]),  # the term starts first: it wins
        ("See www.example.com, an example.", ["exemple"]),  # inside a URL: the URL wins
        ("<b class='example'>", []),  # inside a tag: the tag wins
    ],
)
def test_matching_rules(text, terms):
    spans = find_spans(text, CLASSES, GLOSSARY)
    assert [s.output for s in spans if s.kind == "term"] == terms


SENTENCES = [
    "Our cloud runs in the US.",
    "Open a pull request on the build server, then another pull request.",
    "Cloud computing on Windows 10 is an example of a cloud.",
    "Visit https://example.com/cloud for the cloud docs.",
    "Nothing to see here.",
]


def test_every_term_comes_out_exactly_once_as_its_target():
    outputs = protected(shuffle_words, CLASSES, GLOSSARY)(SENTENCES)
    for sentence, output in zip(SENTENCES, outputs):
        targets = [s.output for s in find_spans(sentence, CLASSES, GLOSSARY) if s.kind == "term"]
        for target in set(targets):
            assert output.count(target) >= targets.count(target), (sentence, output)
        assert "CLOUD" not in output.split() and "⦅" not in output
    assert outputs[3].count("https://example.com/cloud") == 1


def test_an_empty_glossary_changes_nothing():
    for sentence in SENTENCES:
        assert mask(sentence, CLASSES, Glossary({})) == mask(sentence, CLASSES)
    assert protected(shuffle_words, CLASSES, Glossary({}))(SENTENCES) == protected(shuffle_words, CLASSES)(SENTENCES)


class _NoPlaceholders:
    class sp:
        @staticmethod
        def piece_to_id(piece):
            return 1

        @staticmethod
        def unk_id():
            return 1


def test_a_glossary_needs_placeholder_pieces():
    with pytest.raises(UserError, match="placeholder pieces"):
        Protector(CLASSES, _NoPlaceholders(), GLOSSARY)
    assert not Protector(CLASSES, _NoPlaceholders(), Glossary({})).enabled


def test_protected_with_an_empty_glossary_decodes_as_decoding_does(trained_run):
    """protected() around the raw model gives what translate_lines' own protection gives, and an
    empty glossary changes nothing of it (byte-identical on the test split and software strings)."""
    from conftest import FIXTURES

    from translate.decoding import translate_lines
    from translate.inference import load_models

    run, _ = trained_run
    models, tokenizer, cfg = load_models([run / "checkpoints" / "last.pt"], "cpu")
    search = cfg.decode.search_options({}, 1, beam_size=2)
    lines = (FIXTURES / "bible.test.en").read_text().splitlines()[:20]
    lines += (FIXTURES / "software_strings.en").read_text().splitlines()[:20]

    def decode(batch, protect=()):
        return [n[0][0] for n in translate_lines(models, tokenizer, batch, search, workers=1, protect=protect)]

    expected = decode(lines, cfg.decode.protect)
    assert protected(decode, cfg.decode.protect, Glossary({}), tokenizer)(lines) == expected
    assert protected(decode, cfg.decode.protect, tokenizer=tokenizer)(lines) == expected


def test_a_real_model_outputs_every_term_as_its_target_exactly_once(trained_run):
    from conftest import FIXTURES

    from translate.decoding import translate_lines
    from translate.inference import load_models

    run, _ = trained_run
    models, tokenizer, cfg = load_models([run / "checkpoints" / "last.pt"], "cpu")
    search = cfg.decode.search_options({}, 1, beam_size=2)
    glossary = load_glossary(FIXTURES / "glossary" / "terms.tsv")
    sentences = (FIXTURES / "glossary" / "sentences.en").read_text(encoding="utf-8").splitlines()

    def decode(batch):
        return [n[0][0] for n in translate_lines(models, tokenizer, batch, search, workers=1)]

    outputs = protected(decode, cfg.decode.protect, glossary)(sentences)
    terms = found = 0
    for sentence, output in zip(sentences, outputs):
        targets = [s.output for s in find_spans(sentence, cfg.decode.protect, glossary) if s.kind == "term"]
        terms += len(targets)
        found += sum(output.count(t) >= targets.count(t) for t in targets)
    assert terms >= 15 and found == terms


def test_decode_with_a_glossary_from_the_command_line(trained_run, tmp_path, monkeypatch, capsys):
    """`translate decode --glossary`: an empty glossary changes no byte of the test split's
    translation; a glossary's terms come out as their targets."""
    from conftest import FIXTURES, run_main

    run, _ = trained_run
    ckpt = run / "checkpoints" / "last.pt"
    empty = tmp_path / "empty.tsv"
    empty.write_text("# no terms yet\n", encoding="utf-8")
    for name, extra in (("plain", []), ("empty", ["--glossary", empty])):
        code, _, err = run_main(
            monkeypatch, capsys, "decode", ckpt, "-i", FIXTURES / "bible.test.en", "-o", tmp_path / f"{name}.fr", *extra
        )
        assert code in (0, None), err
    assert (tmp_path / "empty.fr").read_bytes() == (tmp_path / "plain.fr").read_bytes()

    terms, sentences = FIXTURES / "glossary" / "terms.tsv", FIXTURES / "glossary" / "sentences.en"
    code, _, err = run_main(
        monkeypatch, capsys, "decode", ckpt, "-i", sentences, "-o", tmp_path / "t.fr", "--glossary", terms
    )
    assert code in (0, None), err
    glossary, protect = load_glossary(terms), load_checkpoint_protect(ckpt)
    outputs = (tmp_path / "t.fr").read_text(encoding="utf-8").splitlines()
    found = total = 0
    for sentence, output in zip(sentences.read_text(encoding="utf-8").splitlines(), outputs, strict=True):
        targets = [s.output for s in find_spans(sentence, protect, glossary) if s.kind == "term"]
        total += len(targets)
        found += sum(output.count(t) >= targets.count(t) for t in targets)
    assert total >= 15 and found == total
    code, _, err = run_main(monkeypatch, capsys, "decode", ckpt, "-i", sentences, "--glossary", tmp_path / "none.tsv")
    assert code == 2 and "glossary file not found" in err and "Traceback" not in err


def load_checkpoint_protect(ckpt) -> list[str]:
    from translate.checkpoint import load_checkpoint

    return load_checkpoint(ckpt)["config"]["decode"]["protect"]


def test_a_term_inside_inline_markup_stays_inside_it():
    """`<b>cloud</b>`: the tags and the term are one placeholder, so a model that moves placeholders
    apart (here: spaced, then its words shuffled) cannot take the term out of its tags."""
    from translate.html_document import translate_html
    from translate.markdown_document import translate_markdown

    def apart(batch: list[str]) -> list[str]:
        return shuffle_words([PLACEHOLDER.sub(lambda m: f" {m.group()} ", s).replace("  ", " ") for s in batch])

    translate = protected(apart, CLASSES, GLOSSARY)
    assert "<b>nuage</b>" in translate_html("<p>Open the <b>cloud</b> console.</p>", translate)
    assert "**nuage**" in translate_markdown("The **cloud** is here.\n", translate)
