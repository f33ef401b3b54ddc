"""HTML and Markdown documents: the output parses to the input's tree but for the translated text
and attributes, code is byte-identical, and no source text is left untranslated."""

import random
import re
from html.parser import HTMLParser

import pytest
from conftest import FIXTURES

from translate.documents import format_of, format_of_request, translate_document
from translate.errors import UserError
from translate.html_document import ATTRIBUTES, translate_html
from translate.markdown_document import _parser, translate_markdown
from translate.markup import restore_markup
from translate.protect import CLASSES, PLACEHOLDER, find_spans, protected

HTML = (FIXTURES / "documents" / "page.html").read_text(encoding="utf-8")
MARKDOWN = (FIXTURES / "documents" / "readme.md").read_text(encoding="utf-8")


def upper(batch: list[str]) -> list[str]:
    return [s.upper() for s in batch]


def reverse_words(batch: list[str]) -> list[str]:
    """A model that turns each sentence around (placeholders move with their words)."""
    return [" ".join(reversed(s.upper().split(" "))) for s in batch]


def lose_placeholders(batch: list[str]) -> list[str]:
    """A model that drops every placeholder and repeats one."""
    return [PLACEHOLDER.sub("", s).upper() + (" ⦅0⦆ ⦅0⦆" if "⦅" in s else "") for s in batch]


MODELS = [upper, reverse_words, lose_placeholders]


# ---------------------------------------------------------------------------- HTML

OPAQUE = {"script", "style", "pre", "code", "kbd"}


class Tree(HTMLParser):
    """An element tree as nested lists: [tag, attrs, children...]; text as strings."""

    VOID = {"meta", "img", "input", "br", "hr", "link"}

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.root: list = ["#root", {}]
        self.stack = [self.root]
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        node = [tag, dict(attrs)]
        self.stack[-1].append(node)
        if tag not in self.VOID:
            self.stack.append(node)

    def handle_endtag(self, tag):
        if self.stack[-1][0] == tag:
            self.stack.pop()

    def handle_data(self, data):
        self.stack[-1].append(data)

    def handle_comment(self, data):
        self.stack[-1].append(("comment", data))


def shape(node) -> object:
    """The tree without its text (comments kept), translatable attributes by name only."""
    if isinstance(node, str):
        return None
    if isinstance(node, tuple):
        return node
    tag, attrs, *children = node
    kept = {k: (v if k not in ATTRIBUTES else "translated") for k, v in attrs.items()}
    return [tag, kept, *(s for s in map(shape, children) if s is not None)]


def texts(node, opaque: bool = False):
    """(text, whether it is inside an element that is not translated) for every text node."""
    if isinstance(node, str):
        yield node, opaque
    elif isinstance(node, list):
        tag, attrs, *children = node
        opaque = opaque or tag in OPAQUE or attrs.get("translate") == "no" or "notranslate" in attrs.get("class", "")
        for child in children:
            yield from texts(child, opaque)


def untranslated(text: str) -> str:
    """The lower-case letters of `text` outside its protected spans."""
    spans = find_spans(text)
    kept = "".join(c for i, c in enumerate(text) if not any(s.start <= i < s.end for s in spans))
    return "".join(c for c in kept if c.islower())


@pytest.mark.parametrize("model", MODELS)
def test_html_keeps_its_tree_and_code(model):
    out = translate_html(HTML, protected(model, CLASSES))
    assert shape(Tree(out).root) == shape(Tree(HTML).root)
    for block in re.finditer(
        r"<(script|style|pre|code|kbd)\b.*?</\1>|<!--.*?-->|<p translate=\"no\">.*?</p>", HTML, re.S
    ):
        assert block.group() in out
    for line in HTML.splitlines():
        if line.startswith(("<!DOCTYPE", "<html", "<head", "<meta", "</")):
            assert line in out.splitlines()


def test_html_text_and_attributes_are_translated():
    out = translate_html(HTML, protected(upper, CLASSES))
    tree = Tree(out).root
    for text, opaque in texts(tree):
        assert opaque or not untranslated(text), text
    assert 'alt="A BLACK CAT &quot;TOM&quot;"' in out and "placeholder='YOUR NAME HERE'" in out
    assert 'title="HELP"' in out and 'title="THE MAIN TITLE"' in out
    assert "<title>TOOLS &amp; TIPS FOR NEW USERS</title>" in out
    assert "NOW&nbsp;PLEASE" in out and "&euro;5 &copy; 2024, OR 3&#8239;EUROS" in out  # entities as written
    assert "help@example.com" in out and 'href="https://example.com/a?b=1&amp;c=2"' in out
    assert "<b>BOLD AND <i>NESTED</i></b> TEXT" in out


def test_html_attributes_of_elements_copied_whole_are_translated_unless_translate_no():
    """A <textarea>, <pre> or <code> keeps its content but not its title or placeholder; an
    element marked translate="no" (or class notranslate) keeps its attributes too."""
    page = (
        '<textarea placeholder="Type here" title="Message box">keep this</textarea>'
        '<pre title="Example">keep this</pre><p>See <code title="The command">ls -l</code> now.</p>'
        '<div translate="no" title="Brand">Name</div><span class="notranslate" title="Brand">Name</span>'
    )
    assert translate_html(page, protected(upper, CLASSES)) == (
        '<textarea placeholder="TYPE HERE" title="MESSAGE BOX">keep this</textarea>'
        '<pre title="EXAMPLE">keep this</pre><p>SEE <code title="THE COMMAND">ls -l</code> NOW.</p>'
        '<div translate="no" title="Brand">Name</div><span class="notranslate" title="Brand">Name</span>'
    )


def test_html_inline_markup_keeps_its_order_and_spacing():
    out = translate_html("<p>Click <b>Save</b> now.</p>", protected(reverse_words, CLASSES))
    assert out == "<p>NOW. <b>SAVE</b> CLICK</p>"
    out = translate_html("<p>Click <b>Save</b> now.</p>", protected(lose_placeholders, CLASSES))
    assert out == "<p>CLICK SAVE NOW. <b></b></p>"  # lost: put back at the end, once


@pytest.mark.parametrize("tail", ["<!-- an unclosed comment", '<a href="x', '<img alt="unclosed', "<"])
def test_html_left_open_at_the_end_is_copied_not_translated(tail):
    """Markup the document leaves open at its end (a browser drops it) is copied byte for byte."""
    assert translate_html("<p>Go home.</p>" + tail, protected(upper, CLASSES)) == "<p>GO HOME.</p>" + tail


def test_html_entities_come_back_in_the_first_spelling_of_each_character():
    out = translate_html("<p>&copy; 2024 &#169; &#x00A9;, a&nbsp;b &lt;c&gt;</p>", protected(upper, CLASSES))
    assert out == "<p>&copy; 2024 &copy; &copy;, A&nbsp;B &lt;c&gt;</p>"  # <c> is a protected tag


def test_html_escapes_the_translation():
    out = translate_html('<p title="x">a</p>', protected(lambda b: ['Tom & "Jerry" <3'] * len(b), CLASSES))
    assert out == '<p title="Tom &amp; &quot;Jerry&quot; &lt;3">Tom &amp; "Jerry" &lt;3</p>'


def test_restore_markup_puts_each_piece_back_once_in_order():
    a, b, c = "\ue000\ue001\ue002"
    source = f"Click {a}Save{b} now."
    assert restore_markup(source, f"{a} Enregistrer {b} maintenant.") == f"{a}Enregistrer{b} maintenant."
    assert restore_markup(source, f"Cliquez {b}maintenant{a} enregistrer.") == f"Cliquez {a}maintenant{b} enregistrer."
    assert restore_markup(source, f"{a}{a}x{b}{c}y.") == f"{a}x{b} y."
    assert restore_markup(source, "Cliquez maintenant.") == f"Cliquez maintenant {a}{b}."
    assert restore_markup("plain", "plain") == "plain"


# ---------------------------------------------------------------------------- Markdown


def md_shape(text: str) -> list:
    """The token tree without text: types, tags, attributes (not alt), code verbatim."""

    def one(t) -> tuple:
        code = t.content if t.type in ("fence", "code_block", "code_inline", "html_block", "html_inline") else None
        attrs = {k: v for k, v in t.attrs.items() if k != "alt"}
        kids = tuple(one(c) for c in t.children or () if c.type not in ("text", "softbreak"))
        return (t.type, t.tag, t.nesting, t.info, attrs, code, kids)

    return [one(t) for t in _parser().parse(text)]


def md_texts(text: str) -> list[str]:
    return [c.content for t in _parser().parse(text) for c in t.children or () if c.type == "text"]


@pytest.mark.parametrize("model", MODELS)
def test_markdown_keeps_its_tree_and_code(model):
    out = translate_markdown(MARKDOWN, protected(model, CLASSES))
    assert md_shape(out) == md_shape(MARKDOWN)
    assert len(out.splitlines()) == len(MARKDOWN.splitlines())  # wrapped paragraphs keep their lines
    for kept in [
        '```python\nprint("do not translate")\n```',
        "    indented code block",
        "<div>\nRaw html block.\n</div>",
    ]:
        assert kept in out
    assert '[ref]: https://example.org "Ref title"' in out and "|------|:-----:|" in out


def test_markdown_text_is_translated():
    out = translate_markdown(MARKDOWN, protected(upper, CLASSES))
    for text in md_texts(out):
        if text == "ref":  # a shortcut reference's label is the reference: kept
            continue
        assert not untranslated(text.replace("snake_case", "").replace("Raw html block.", "")), text
    assert '[LINK](https://example.com "Title here")' in out and "![A BLACK CAT](cat.png)" in out
    assert "[ref] and" in out.replace("[ref] AND", "[ref] and")  # a shortcut reference is kept whole
    assert "| ALICE | LIKES *GREEN TEA* |" in out and "# GETTING *STARTED* WITH `tool`" in out


def test_markdown_front_matter_is_kept():
    text = "---\ntitle: A title\n---\n\nSome text.\n"
    assert translate_markdown(text, protected(upper, CLASSES)) == "---\ntitle: A title\n---\n\nSOME TEXT.\n"


def test_markdown_toml_front_matter_task_boxes_and_footnotes_stay_as_they_are():
    text = (
        '+++\ntitle = "A title"\n+++\n\n- [ ] Buy the bread.\n- [x] Feed the dog.\n\n'
        "See the note[^1] here.\n\n[^1]: The note is long.\n"
    )
    assert translate_markdown(text, protected(reverse_words, CLASSES)) == (
        '+++\ntitle = "A title"\n+++\n\n- [ ] BREAD. THE BUY\n- [x] DOG. THE FEED\n\n'
        "HERE. NOTE[^1] THE SEE\n\n[^1]: LONG. IS NOTE THE\n"
    )  # a model that moves every word keeps the boxes first, and the footnote's label whole
    # outside a list item the brackets are text, and a link's text starting with ^ is translated
    assert translate_markdown("[x] starts a paragraph.\n", protected(upper, CLASSES)) == "[X] STARTS A PARAGRAPH.\n"
    link = translate_markdown("See [^caret](https://example.com) here.\n", protected(upper, CLASSES))
    assert link == "SEE [^CARET](https://example.com) HERE.\n"


def test_markdown_footnote_definitions_one_under_the_other_keep_their_labels():
    """Footnotes written as usual, one definition a line (one paragraph to CommonMark): each is a
    block of its own, its label kept at its line's start whatever the model does."""
    text = "A note[^1].\n\n[^1]: The first note is short.\n[^2]: The second note\ngoes on here.\n[^3]: Third.\n"
    assert translate_markdown(text, protected(reverse_words, CLASSES)) == (
        "NOTE A[^1].\n\n[^1]: SHORT. IS NOTE FIRST THE\n[^2]: HERE. ON GOES\nNOTE SECOND THE\n[^3]: THIRD.\n"
    )


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
@pytest.mark.parametrize("hard_break", ["\\", "  "])
def test_markdown_hard_break_stays_when_the_translation_takes_fewer_lines(hard_break, newline):
    """A block ending in a hard break (a backslash or two spaces) whose translation fills fewer
    lines than its source: the break ends the translation's last line, not lost with the line."""
    text = f"> First line here{newline}> second line{hard_break}{newline}> third line.{newline}"
    out = translate_markdown(text, protected(lambda b: ["Amen"] * len(b), CLASSES))
    assert out == f"> Amen{hard_break}{newline}> Amen{newline}"
    assert md_shape(out) == md_shape(text)


def test_markdown_runs_translated_apart_are_kept_while_the_block_keeps_its_syntax(caplog):
    """Where the model's placement breaks a block's syntax, the text between its markup is
    translated apart, and each run's translation kept while the block keeps its syntax with the
    runs kept before it: here each alone fits, both together would not (a closing ** between
    punctuation and a letter), so the first is kept and the second stays as it was, rather than
    the whole block."""

    def colon_moves(batch: list[str]) -> list[str]:
        return [s.replace("Word", "WORD:").replace(": then more.", "THEN MORE.") for s in batch]

    assert translate_markdown("**Word**: then more.\n", protected(colon_moves, CLASSES)) == "**WORD:**: then more.\n"
    assert "markdown: 1 piece of text kept untranslated" in caplog.text  # the user is told


def test_markdown_escapes_what_the_translation_would_make_syntax():
    out = translate_markdown("Some text here.\n", protected(lambda b: ["- a *b* [c] 1. d"] * len(b), CLASSES))
    assert md_shape(out) == md_shape("Some text here.\n")
    assert md_texts(out) == ["- a *b* [c] 1. d"]


# ---------------------------------------------------------------------------- formats, a real model


def test_format_of():
    assert format_of("page.HTML") == "html" and format_of("README.md") == "markdown"
    assert format_of("in.en") == "text" and format_of("x.html", "text") == "text"
    with pytest.raises(UserError, match="--format must be one of text, html, markdown"):
        format_of("x", "pdf")


def test_text_documents_are_translated_paragraph_by_paragraph():
    assert translate_document("One. Two.\n\nThree", "text", upper) == "ONE. TWO.\n\nTHREE"


def test_a_real_model_keeps_the_documents_trees(trained_run):
    from translate.decoding import translate_lines
    from translate.inference import load_models
    from translate.protect import has_placeholders

    run, _ = trained_run
    models, tokenizer, cfg = load_models([run / "checkpoints" / "last.pt"], "cpu")
    assert has_placeholders(tokenizer)
    search = cfg.decode.search_options({}, 1, beam_size=1)

    def model(batch: list[str]) -> list[str]:
        return [nbest[0][0] for nbest in translate_lines(models, tokenizer, batch, search, workers=1)]

    translate = protected(model, cfg.decode.protect)
    assert shape(Tree(translate_html(HTML, translate)).root) == shape(Tree(HTML).root)
    assert md_shape(translate_markdown(MARKDOWN, translate)) == md_shape(MARKDOWN)


def test_sentences_of_a_document_go_in_one_call():
    calls = []
    translate_html("<p>One. Two.</p><p>Three <b>four</b>.</p>", lambda b: calls.append(b) or b)
    assert len(calls) == 1 and len(calls[0]) == 3


# ---------------------------------------------------------------------------- random documents

WORDS = "the cat sat on a mat . and then , it ran away ! Why ? see http://x.org/a now 42 times".split()


def random_html(rng: random.Random, depth: int = 0) -> str:
    out = []
    for _ in range(rng.randint(1, 6)):
        r = rng.random()
        if r < 0.5 or depth > 2:
            out.append(" ".join(rng.choices(WORDS, k=rng.randint(1, 4))))
        elif r < 0.75:
            out.append(rng.choice(["<br>", "<code>x &lt; y</code>", "<!-- c -->", "<img alt='a cat' src=c.png>"]))
        else:
            tag = rng.choice(["b", "i", "em", "a href='u'", "span title='a tip'"])
            out.append(f"<{tag}>{random_html(rng, depth + 1)}</{tag.split()[0]}>")
    return rng.choice(["", " "]).join(out)


def random_markdown(rng: random.Random, depth: int = 0) -> str:
    out = []
    for _ in range(rng.randint(1, 6)):
        r = rng.random()
        if r < 0.5 or depth > 2:
            out.append(" ".join(rng.choices(WORDS, k=rng.randint(1, 4))))
        elif r < 0.7:
            out.append(rng.choice(["`code`", "[link text](http://x.org)", "![a cat](c.png)", "<b>"]))
        else:
            delimiter = rng.choice(["*", "**", "_", "~~"])
            out.append(f"{delimiter}{random_markdown(rng, depth + 1).strip()}{delimiter}")
    return " ".join(out)


@pytest.mark.parametrize("model", MODELS)
def test_random_documents_keep_their_trees(model):
    """Nested inline markup drawn at random (seeded): under every fake model the HTML keeps its
    tree and all its text is translated; the Markdown keeps its tree, falling back to translating
    the text between the syntax where the model's placement breaks it."""
    translate = protected(model, CLASSES)
    for seed in range(40):
        rng = random.Random(seed)
        page = "\n".join(f"<p>{random_html(rng)}</p>" for _ in range(3))
        out = translate_html(page, translate)
        assert shape(Tree(out).root) == shape(Tree(page).root), (page, out)
        assert not any(untranslated(t) for t, opaque in texts(Tree(out).root) if not opaque)
        readme = "\n\n".join(random_markdown(rng) for _ in range(3)) + "\n"
        out = translate_markdown(readme, translate)
        assert md_shape(out) == md_shape(readme), (readme, out)
        if model is upper:
            assert not any(untranslated(t) for t in md_texts(out))


@pytest.mark.parametrize(
    "value, shown",
    [("pdf", '"pdf"'), ("HTML", '"HTML"'), (None, "null"), (3, "3"), (["html"], "a list"), ({}, "an object")],
)
def test_a_request_format_is_one_of_three(value, shown):
    assert [format_of_request(f) for f in ("text", "html", "markdown")] == ["text", "html", "markdown"]
    with pytest.raises(ValueError) as e:
        format_of_request(value)
    assert str(e.value) == f'"format" must be one of "text", "html", "markdown", got {shown}'


def test_decode_translates_documents_from_the_command_line(trained_run, tmp_path, monkeypatch, capsys):
    """`translate decode -i page.html` (the format from the extension) and `--format markdown`
    from stdin: the trees are kept; --nbest with a document is one error line."""
    import io
    import sys

    from conftest import run_main

    run, _ = trained_run
    ckpt = run / "checkpoints" / "last.pt"
    page = tmp_path / "page.html"
    page.write_text(HTML, encoding="utf-8")
    code, _, err = run_main(monkeypatch, capsys, "decode", ckpt, "-i", page, "-o", tmp_path / "page.fr.html")
    assert code in (0, None), err
    out = (tmp_path / "page.fr.html").read_text(encoding="utf-8")
    assert shape(Tree(out).root) == shape(Tree(HTML).root) and out != HTML
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(MARKDOWN.encode("utf-8"))))
    code, out, err = run_main(monkeypatch, capsys, "decode", ckpt, "--format", "markdown")
    assert code in (0, None), err
    assert md_shape(out) == md_shape(MARKDOWN) and out != MARKDOWN
    code, _, err = run_main(monkeypatch, capsys, "decode", ckpt, "-i", page, "--nbest", "2", "--beam", "2")
    assert code == 2 and "not with --format html" in err
