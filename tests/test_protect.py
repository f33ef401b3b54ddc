"""Protected spans: the span finder, masking, repair, training augmentation, and decoding with protection."""

import random
import re
from collections import Counter

import pytest
import yaml
from conftest import FIXTURES, run_cli, run_main, tiny_config

from translate.protect import (
    CLASSES,
    MAX_PLACEHOLDERS,
    PLACEHOLDER,
    Masked,
    Protector,
    augment_pair,
    augment_pairs,
    find_spans,
    has_placeholders,
    mask,
    mask_sentence,
    placeholder,
    placeholder_symbols,
    protected,
    repair,
    unmask,
)
from translate.tokenizer import Tokenizer

CASES = [  # text, the protected spans (texts, left to right)
    ("Unable to open '%s'.", ["%s"]),
    ("%d of %i, %5.2f, %-3s, %x and %@", ["%d", "%i", "%5.2f", "%-3s", "%x", "%@"]),
    ("Error %1$s in %2$d", ["%1$s", "%2$d"]),
    ("Hello %(name)s, %(count)05d left", ["%(name)s", "%(count)05d"]),
    ("100%% sure, 50%% off", ["100", "50"]),  # %% is an escape, not a placeholder
    ("%%s is literal", []),
    ("50% of it and/or more", ["50"]),
    (
        "{count} files, {0} and {} and {name!r:>10} {user.name} {0:.2f}",
        ["{count}", "{0}", "{}", "{name!r:>10}", "{user.name}", "{0:.2f}"],
    ),
    ("{{literal}} but {real}", ["{real}"]),  # {{ }} are escapes
    ("{{{{x}}}}", []),
    ("{count, number} likes", ["{count, number}"]),
    ("Click <b>Save</b> now<br/><br />", ["<b>", "</b>", "<br/>", "<br />"]),
    ("<a href=\"https://x.org/a?b=1\" class='c'>here</a>", ["<a href=\"https://x.org/a?b=1\" class='c'>", "</a>"]),
    ('<img src="logo.png" alt="Logo"/>', ['<img src="logo.png" alt="Logo"/>']),
    ("a < b and c > d", []),
    ("See https://example.com/path.", ["https://example.com/path"]),
    ("(https://example.com/a_(b)), or www.example.org/x!", ["https://example.com/a_(b)", "www.example.org/x"]),
    ("See http://en.wikipedia.org/wiki/Foo_(bar) (or not).", ["http://en.wikipedia.org/wiki/Foo_(bar)"]),
    ("(see http://x.org/a) and http://x.org/b(c d", ["http://x.org/a", "http://x.org/b(c"]),  # the sentence's bracket
    ("(http://x.org/a([b]))", ["http://x.org/a([b])"]),
    (
        "https://x.org/a_(b_(c)) https://x.org/q=(foo https://x.org/a)b [https://x.org/a[1]]",
        ["https://x.org/a_(b_(c))", "https://x.org/q=(foo", "https://x.org/a)b", "https://x.org/a[1]"],
    ),
    (
        "Is it http://localhost:8080/status? Yes: ftp://f.example.com/pub;",
        ["http://localhost:8080/status", "ftp://f.example.com/pub"],
    ),
    (
        "Mail me@example.com, or first.last+tag@mail.example.co.uk.",
        ["me@example.com", "first.last+tag@mail.example.co.uk"],
    ),
    (
        "Saved to /home/user/report.pdf. Then ~/notes.txt and ./run.sh",
        ["/home/user/report.pdf", "~/notes.txt", "./run.sh"],
    ),
    (r"Open C:\Users\me\file.txt. Or \\server\share\data.csv", [r"C:\Users\me\file.txt", r"\\server\share\data.csv"]),
    ("Pay 1,299.99 for 3 items, v1.2.3 and 2.", ["1,299.99", "3", "2"]),
    ("Version 1.2.3 is out", ["1.2.3"]),
    # dates, times, telephone numbers, ranges and signs whole; a hyphen after a word is no sign
    (
        "On 2024-01-15 (15/01/2024) at 10:30, call 555-1234: -5 to +3.5",
        ["2024-01-15", "15/01/2024", "10:30", "555-1234", "-5", "+3.5"],
    ),
    ("COVID-19, a 5-year plan, pages 10-20", ["19", "5", "10-20"]),
    (
        "Call +33 1 23 45 67 89 or (555) 123-4567, in 2020 15 came",
        ["+33 1 23 45 67 89", "(555) 123-4567", "2020", "15"],
    ),
    ("10:30am, 2024-01-15T10:30:00Z, 3.5kg", []),  # a number that runs into letters: whole or not at all
    ("<b>{name}</b>%s%d", ["<b>", "{name}", "</b>", "%s", "%d"]),  # adjacent spans
    ("<i>%s</i>", ["<i>", "%s", "</i>"]),
    ('<a href="http://x.org/3">3</a>', ['<a href="http://x.org/3">', "3", "</a>"]),  # nested: the tag holds the URL
    ("http://x.org/a/b/c", ["http://x.org/a/b/c"]),  # not a path inside the URL
    ("plain prose with nothing to keep", []),
]


@pytest.mark.parametrize("text, spans", CASES)
def test_span_finder(text, spans):
    assert [s.text for s in find_spans(text)] == spans


def test_spans_do_not_overlap_and_point_into_the_text():
    for text, _ in CASES:
        spans = find_spans(text)
        assert all(text[s.start : s.end] == s.text for s in spans)
        assert all(a.end <= b.start for a, b in zip(spans, spans[1:]))


def test_classes_can_be_switched_off():
    text = "Open %s at https://x.org in 5 s"
    assert [s.text for s in find_spans(text, ["url"])] == ["https://x.org"]
    assert [s.kind for s in find_spans(text)] == ["printf", "url", "number"]
    assert find_spans(text, []) == []


def software_strings():
    return (FIXTURES / "software_strings.en").read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("classes", [CLASSES, ["tag"], ["number", "url"], []])
def test_mask_then_unmask_is_the_identity(classes):
    for text in [t for t, _ in CASES] + software_strings():
        masked, spans = mask(text, classes)
        assert len(PLACEHOLDER.findall(masked)) == len(spans)
        assert unmask(masked, spans) == text


def test_unmask_follows_the_order_the_model_chose():
    masked, spans = mask("Copy %s to %d")
    assert masked == "Copy ⦅0⦆ to ⦅1⦆"
    assert unmask("Copier ⦅1⦆ vers ⦅0⦆", spans) == "Copier %d vers %s"


def test_a_placeholder_written_in_the_input_comes_back_as_written():
    """The text of a placeholder in the input is a span of its own: not read as the number inside it."""
    masked, spans = mask("Keep ⦅1⦆ and 42 as ⦅12⦆.")
    assert masked == "Keep ⦅0⦆ and ⦅1⦆ as ⦅2⦆." and spans == ["⦅1⦆", "42", "⦅12⦆"]
    assert unmask("Garder ⦅0⦆ et ⦅1⦆ comme ⦅2⦆.", spans) == "Garder ⦅1⦆ et 42 comme ⦅12⦆."


def test_at_most_max_placeholders_are_masked():
    text = " ".join(str(i) for i in range(MAX_PLACEHOLDERS + 5))
    masked, spans = mask(text)
    assert len(spans) == MAX_PLACEHOLDERS and masked.endswith(
        " ".join(str(i) for i in range(MAX_PLACEHOLDERS, MAX_PLACEHOLDERS + 5))
    )
    assert unmask(masked, spans) == text


@pytest.mark.parametrize(
    "output, n, expected, changed",
    [
        ("a ⦅0⦆ b ⦅1⦆.", 2, "a ⦅0⦆ b ⦅1⦆.", False),
        ("a ⦅1⦆ b ⦅0⦆ ⦅1⦆.", 2, "a ⦅1⦆ b ⦅0⦆.", True),  # duplicate dropped
        ("a ⦅0⦆ b.", 2, "a ⦅0⦆ b ⦅1⦆.", True),  # missing one added before the final punctuation
        ("a ⦅7⦆ b", 1, "a b ⦅0⦆", True),  # a placeholder of no span dropped
        ("", 1, "⦅0⦆", True),
        ("le roi ", 1, "le roi ⦅0⦆", True),  # no space left at the end
        ("le roi !  ", 1, "le roi ⦅0⦆ !", True),
    ],
)
def test_repair(output, n, expected, changed):
    assert repair(output, n) == (expected, changed)


def test_spans_that_touch_share_one_placeholder_which_repair_keeps_whole():
    source, spans = mask("Click <b>%s</b> in the console, then %s %d.")
    assert source == "Click ⦅0⦆ in the console, then ⦅1⦆ ⦅2⦆." and spans == ["<b>%s</b>", "%s", "%d"]
    # a unit with markup begins and ends with it: the text before or after it is a unit of its own
    assert mask("see http://x.org\ue000\ue001 %s\ue002%d\ue003%x") == (
        "see ⦅0⦆⦅1⦆ ⦅2⦆⦅3⦆⦅4⦆",
        ["http://x.org", "\ue000\ue001", "%s", "\ue002%d\ue003", "%x"],
    )
    fixed, changed = repair("Cliquez dans la console.", len(spans))
    assert changed and fixed == "Cliquez dans la console ⦅0⦆ ⦅1⦆ ⦅2⦆."
    assert unmask(fixed, spans) == "Cliquez dans la console <b>%s</b> %s %d."
    assert repair("Cliquez ⦅1⦆ dans la console.", len(spans))[0] == "Cliquez ⦅1⦆ dans la console ⦅0⦆ ⦅2⦆."


def test_markup_around_the_whole_sentence_is_put_back_around_its_translation():
    """A link (or an image, a heading's emphasis) that holds all of a sentence's text: the model gets
    the text alone; markup inside the text keeps its placeholders."""
    link, end = "\ue000", "\ue001"
    whole = mask_sentence(f"{link}Home{end}")
    assert (whole.text, whole.spans) == ("Home", []) and whole.restore("Accueil") == (f"{link}Accueil{end}", False)
    dot = mask_sentence(f" {link}see 42{end}.")  # a final full stop after the wrapping goes with it
    assert (dot.text, dot.head, dot.tail) == ("see ⦅0⦆", f" {link}", f"{end}.")
    assert mask_sentence(f"{link}see{end}, and").text == "⦅0⦆see⦅1⦆, and"  # a comma: text follows
    inner = mask_sentence(f"{link}Note:{end} the cat")
    assert (inner.text, inner.head, inner.tail) == ("⦅0⦆Note:⦅1⦆ the cat", "", "")
    assert mask_sentence(f"{link}{end}").text == "⦅0⦆"  # nothing to translate: no wrapping taken off
    assert mask_sentence("Home").restore("Accueil") == ("Accueil", False)


def test_repair_leaves_each_placeholder_exactly_once():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(0, 5)
        output = " ".join(
            rng.choice(["le", "chat", ".", placeholder(rng.randint(0, 7))]) for _ in range(rng.randint(0, 8))
        )
        fixed, _ = repair(output, n)
        assert sorted(int(i) for i in PLACEHOLDER.findall(fixed)) == list(range(n))


def test_augmentation_uses_the_same_placeholders_on_both_sides():
    rng = random.Random(1)
    pairs = [
        ("David went to 3 cities.", "David alla dans 3 villes."),
        ("In the beginning God created the heaven.", "Au commencement, Dieu créa les cieux."),
        ("Open %s now", "Ouvrez %s maintenant"),
    ]
    for src, tgt in pairs * 20:
        a, b = augment_pair(src, tgt, CLASSES, rng)
        assert sorted(PLACEHOLDER.findall(a)) == sorted(PLACEHOLDER.findall(b)) != []
        assert len(set(PLACEHOLDER.findall(a))) == len(PLACEHOLDER.findall(a))
    out = list(augment_pairs(pairs * 100, CLASSES, 0.25, seed=1))
    originals = [pair for pair in out if PLACEHOLDER.search(pair[0]) is None]
    assert originals == pairs * 100  # every original pair stays, in order
    copies = len(out) - len(originals)
    assert 0.15 < copies / 300 < 0.35  # the share is of the original pairs
    assert out == list(augment_pairs(pairs * 100, CLASSES, 0.25, seed=1))  # reproducible
    assert list(augment_pairs(pairs, CLASSES, 0.0, seed=1)) == pairs


def test_placeholders_are_single_pieces_of_the_vocabulary():
    sentences = [s for pair in zip(software_strings(), software_strings()) for s in pair] * 5
    tok = Tokenizer.train(sentences, 200, user_symbols=placeholder_symbols())
    assert has_placeholders(tok)
    for i in range(MAX_PLACEHOLDERS):
        assert tok.pieces(f"a{placeholder(i)}b")[-2:-1] == [placeholder(i)] or placeholder(i) in tok.pieces(
            f"a{placeholder(i)}b"
        )
    assert tok.decode(tok.encode(["Copy ⦅3⦆ to ⦅12⦆."])) == ["Copy ⦅3⦆ to ⦅12⦆."]
    assert not has_placeholders(Tokenizer.train(sentences, 200))


class _Tok:
    def __init__(self, ok: bool) -> None:
        self.tok = Tokenizer.train(software_strings() * 3, 150, user_symbols=placeholder_symbols() if ok else ())
        self.sp = self.tok.sp
        self.encode = self.tok.encode


def test_protector_restores_every_span_exactly_once_even_when_the_model_does_not():
    lines = ["Copy %s to %d.", "Visit https://x.org now", "no spans"]
    model_outputs = {  # what a bad model makes of the masked lines
        "Copy ⦅0⦆ to ⦅1⦆.": [("Copier ⦅1⦆ ⦅1⦆ vers", -1.0)],
        "Visit ⦅0⦆ now": [("Visitez maintenant.", -1.0)],
        "no spans": [("pas ⦅4⦆ de", -1.0)],
    }
    protector = Protector(CLASSES, _Tok(True))
    out = list(protector.restore(model_outputs[m] for m in list(protector.mask_lines(lines))))
    assert [n[0][0] for n in out] == ["Copier %d vers %s", "Visitez maintenant https://x.org.", "pas de"]
    assert protector.repaired == 3 and protector.lines == 3


def test_an_nbest_list_restored_holds_each_text_once():
    """Hypotheses that differ only in their placeholders (one twice, a space between two) restore to
    one text: kept once, with the best score, the list still as long as asked (the last repeated)."""
    protector = Protector(CLASSES, _Tok(True))
    (masked,) = protector.mask_lines(["12345"])
    assert masked == "⦅0⦆"
    nbest = [("⦅0⦆", -1.5), ("⦅0⦆⦅0⦆", -1.8), ("⦅0⦆ ⦅0⦆", -2.1), ("le ⦅0⦆", -2.5)]
    (out,) = protector.restore([nbest])
    assert out == [("12345", -1.5), ("le 12345", -2.5), ("le 12345", -2.5), ("le 12345", -2.5)]


def test_without_classes_markup_and_typed_placeholders_are_still_protected():
    """--no-protect (no classes) leaves URLs and numbers to the model, not a document's markup
    (markup.py's private-use characters) nor a placeholder typed in the input."""
    protector = Protector([], _Tok(True))
    line = "Say \ue000hello\ue001 to https://x.org and ⦅7⦆"
    (masked,) = protector.mask_lines([line])
    assert "\ue000" not in masked and "https://x.org" in masked and "⦅7⦆" not in masked
    (out,) = protector.restore([[(masked, -1.0)]])
    assert out[0][0] == line


def test_characters_the_vocabulary_lacks_come_back_as_they_are_where_they_stand_apart():
    """A run of characters with no piece (emoji, another script) apart from words is a span: the
    model would make up words for its unknown pieces. Inside a word it is left to the model, and
    --no-protect (no classes) leaves it too."""
    tok = _Tok(True)
    assert tok.sp.unk_id() in tok.sp.encode("😀") and tok.sp.unk_id() not in tok.sp.encode("a")
    lines = ["Save 😀😀 now", "שלום עולם", "l😀l", "(😀)", "Save the file"]
    protector = Protector(CLASSES, tok)
    masked = list(protector.mask_lines(lines))
    assert masked == ["Save ⦅0⦆ now", "⦅0⦆", "l😀l", "(⦅0⦆)", "Save the file"]
    outputs = ["Enregistrer ⦅0⦆ maintenant", "⦅0⦆", "l l", "(⦅0⦆)", "Enregistrer le fichier"]
    restored = [n[0][0] for n in protector.restore([[(out, -1.0)] for out in outputs])]
    assert restored == ["Enregistrer 😀😀 maintenant", "שלום עולם", "l l", "(😀)", "Enregistrer le fichier"]
    assert list(Protector([], tok).mask_lines(lines)) == lines


def test_unknown_characters_apart_by_spaces_are_one_span_and_give_way_to_the_classes():
    """Runs of unknown characters with spaces between them take one placeholder; where a line has
    more spans than placeholders, those runs are left unmasked before a URL or a number is."""
    tok = _Tok(True)
    (masked,) = Protector(CLASSES, tok).mask_lines(["😀 😀  😀 now 😀"])
    assert masked == "⦅0⦆ now ⦅1⦆"
    line = " x ".join(["😀"] * 25) + " see https://x.org at 10:30"
    (masked,) = Protector(CLASSES, tok).mask_lines([line])
    assert masked.count("⦅") == MAX_PLACEHOLDERS and "https" not in masked and "10:30" not in masked
    assert masked.endswith(f"see ⦅{MAX_PLACEHOLDERS - 2}⦆ at ⦅{MAX_PLACEHOLDERS - 1}⦆")


def test_typographic_punctuation_the_vocabulary_lacks_is_read_as_its_plain_form():
    """A vocabulary of straight quotes and hyphens reads ’ “ ” — as ' " " - (not as unknown pieces,
    nor as spans of unknown characters); one that has a typographic form keeps it."""
    tok = _Tok(True)
    assert tok.sp.unk_id() in tok.sp.encode("’") and tok.sp.unk_id() not in tok.sp.encode("'")
    assert tok.encode(["Can’t “open” it — now"]) == tok.encode(['Can\'t "open" it - now'])
    assert list(Protector(CLASSES, tok).mask_lines(["“Save” ’it’"])) == ["“Save” ’it’"]
    curly = Tokenizer.train(["l’eau « claire » et l'air"] * 50, 19)
    assert curly.sp.unk_id() not in curly.encode(["l’eau « claire »"])[0]
    assert curly.encode(["l’eau"]) != curly.encode(["l'eau"])  # ’ is its own piece there: left as it is


def test_unknown_characters_beside_a_number_go_with_it_and_a_word_it_reads_is_left_whole():
    """With a vocabulary of letters alone (no digit, no € or %): a symbol touching a number shares
    its placeholder (€25.99, 3.2%), a number with an en dash is one span, and a word with letters the
    vocabulary knows (10:30am) is left to the model whole, as the number class leaves it."""
    words = ["the price rose last week and the rent is due now", "le prix a monté la semaine dernière"]
    tok = Tokenizer.train(words * 40, 54, user_symbols=placeholder_symbols())
    assert tok.sp.unk_id() in tok.encode(["5"])[0]
    lines = ["the price €25.99 rose 3.2% now", "at 10:30am", "won 3–1 now", "(€) ½"]
    assert list(Protector(CLASSES, tok).mask_lines(lines)) == [
        "the price ⦅0⦆ rose ⦅1⦆ now",
        "at 10:30am",
        "won ⦅0⦆ now",
        "⦅0⦆",
    ]


def test_a_placeholder_run_into_the_next_word_is_parted_from_it_where_the_sources_was_not():
    masked = mask_sentence("It costs 20 now and %sfoo")
    assert masked.text == "It costs ⦅0⦆ now and ⦅1⦆foo"
    assert masked.restore("Il coûte ⦅0⦆maintenant et ⦅1⦆bar")[0] == "Il coûte 20 maintenant et %sbar"


def test_unknown_characters_are_found_outside_the_spans_that_win_and_stray_brackets_are_masked():
    tok = _Tok(True)
    protector = Protector(CLASSES, tok)
    # a URL inside a format spec loses to it, and covers nothing: the emoji touching the spec goes with it
    assert list(protector.mask_lines(["{x:www.a.com}😀 now", "Use ⦅ and ⦆ here, ⦅3⦆ kept"])) == [
        "⦅0⦆ now",
        "Use ⦅0⦆ and ⦅1⦆ here, ⦅2⦆ kept",
    ]
    restored = protector.restore([[("⦅0⦆ maintenant", -1.0)], [("Utilisez ⦅0⦆ et ⦅1⦆ ici, ⦅2⦆ gardé", -1.0)]])
    assert [n[0][0] for n in restored] == ["{x:www.a.com}😀 maintenant", "Utilisez ⦅ et ⦆ ici, ⦅3⦆ gardé"]


def test_markup_put_back_in_order_is_parted_from_a_word_as_its_source_was():
    """The parting of a placeholder from the next word reads the placeholders as they come back
    (markup in the source's order), not as the model numbered them."""
    masked = Masked("⦅0⦆Hello⦅1⦆ world", ["\ue000", "\ue001"])
    assert masked.restore("⦅1⦆Bonjour⦅0⦆ monde")[0] == "\ue000Bonjour\ue001 monde"


def test_protector_is_off_for_a_vocabulary_without_placeholders():
    protector = Protector(CLASSES, _Tok(False))
    assert not protector.enabled
    assert list(protector.mask_lines(["Copy %s"])) == ["Copy %s"]


def test_unknown_span_class_is_refused(tmp_path):
    config = tiny_config(tmp_path)
    result = run_cli("prepare", "--config", config, "--set", "data.protect=[url, html]", check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: data.protect: unknown span class 'html'")


def test_decoding_with_protection_outputs_each_span_exactly_once(trained_run, tmp_path):
    """The tiny run trains with placeholder augmentation (the default); whatever its 8 steps taught
    it, every protected span of every line comes out byte-identical, once per occurrence."""
    run, _ = trained_run
    assert yaml.safe_load((run / "config.yaml").read_text())["data"]["protect_share"] > 0
    lines = software_strings()
    src = tmp_path / "in.en"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = run_cli("decode", run / "checkpoints" / "last.pt", "--input", src, "--beam", "2")
    outputs = result.stdout.splitlines()
    assert len(outputs) == len(lines)
    for line, out in zip(lines, outputs):
        for span, n in Counter(s.text for s in find_spans(line)).items():
            assert out.count(span) >= n, (line, out, span)
        assert "⦅" not in out


def test_repaired_placeholders_are_said_once_for_a_file_of_many_chunks(trained_run, tmp_path, monkeypatch, capsys):
    """A file is translated CHUNK_LINES lines at a time: one warning at the end counts them all."""
    run, _ = trained_run
    lines = software_strings()
    src = tmp_path / "in.en"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    monkeypatch.setattr("translate.translator.CHUNK_LINES", 4)
    code, out, err = run_main(monkeypatch, capsys, "decode", run / "checkpoints" / "last.pt", "--input", src)
    assert code == 0 and len(out.splitlines()) == len(lines)
    warnings = [line for line in err.splitlines() if "did not place every protected span" in line]
    assert len(warnings) == 1, err
    repaired, total = map(int, re.search(r"(\d+) of (\d+) translations", warnings[0]).groups())
    assert 0 < repaired <= total and total >= len(lines)  # every chunk's sentences


def test_no_protect_decodes_the_text_as_it_is(trained_run, tmp_path, monkeypatch, capsys):
    """--no-protect: no span is masked, so no line needs a repair and none is warned about; the
    output is that of a checkpoint whose decode.protect is empty."""
    run, _ = trained_run
    src = tmp_path / "in.en"
    src.write_text("\n".join(software_strings()[:8]) + "\n", encoding="utf-8")
    ckpt = run / "checkpoints" / "last.pt"
    code, plain, err = run_main(monkeypatch, capsys, "decode", ckpt, "--input", src, "--beam", "2", "--no-protect")
    assert code == 0 and "protected span" not in err and len(plain.splitlines()) == 8
    import torch

    saved = torch.load(ckpt, weights_only=True)
    saved["config"]["decode"]["protect"] = []
    torch.save(saved, tmp_path / "off.pt")
    assert run_main(monkeypatch, capsys, "decode", tmp_path / "off.pt", "--input", src, "--beam", "2")[1] == plain


def test_units_with_markup_come_back_in_the_sources_order_each_whole():
    """markup.py puts markup back in the source's order: a model that swaps `<b>%s</b>` and `<i>%d</i>`
    gets them back in order, each argument inside its own tags; other placeholders stay where it put them."""
    from translate.documents import translate_document

    swap = lambda batch: [s.replace("⦅0⦆", "@").replace("⦅1⦆", "⦅0⦆").replace("@", "⦅1⦆") for s in batch]  # noqa: E731
    translate = protected(swap, CLASSES)
    assert translate_document("<p><b>%s</b> of <i>%d</i> files</p>", "html", translate) == (
        "<p><b>%s</b> of <i>%d</i> files</p>"
    )
    assert translate_document("Use **%s** or *%d* here.\n", "markdown", translate) == "Use **%s** or *%d* here.\n"
    assert translate(["%s of %d"]) == ["%d of %s"]  # no markup: the model's order
