"""The page of `translate serve` (GET /): self-contained, installed with the package, and in a real
browser a typed sentence gets the translation `translate decode` gives it."""

import json
import re
import struct
from html.parser import HTMLParser
from pathlib import Path

import pytest
from browser import open_browser, problems
from conftest import run_cli

from translate.page import page_html

ROOT = Path(__file__).resolve().parents[1]


class Tags(HTMLParser):
    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def test_the_page_asks_nothing_of_another_machine():
    html = page_html()
    tags = Tags(html).tags
    csp = [a["content"] for t, a in tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert csp and "default-src 'none'" in csp[0] and "connect-src 'self'" in csp[0]
    for tag, attrs in tags:
        for name, value in attrs.items():
            assert not re.search(r"(https?:)?//", value or ""), (tag, name, value)
            assert name not in ("src", "srcset", "action", "xmlns") and (name != "href" or value == "data:,")
    code = "".join(body for _, body in re.findall(r"<(style|script)>(.*?)</\1>", html, flags=re.S))
    assert not re.search(r"https?:|url\(|@import|@font-face|XMLHttpRequest|import\(|\.(src|href)\s*=", code)
    assert sorted(set(re.findall(r"fetch\(([^,)]*)", code))) == ['"/health"', '"/translate"']
    ids = set(re.findall(r'id="([^"]+)"', html))
    assert {"source", "format", "beam", "length-penalty", "nbest", "glossary", "translate", "output", "time"} <= ids


def test_the_page_is_package_data():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'\[tool\.setuptools\.package-data\]\s*\ntranslate = \[[^\]]*"page\.html"', pyproject)


# ---------------------------------------------------------------------------- the real server

pytest.importorskip("starlette", reason="translate serve needs the [serve] extra (starlette, uvicorn)")
pytest.importorskip("uvicorn", reason="translate serve needs the [serve] extra (starlette, uvicorn)")

from test_serve import SENTENCES, Server  # noqa: E402

OUTPUT = "document.getElementById('output').innerText"
TIME = "document.getElementById('time').textContent"


@pytest.fixture(scope="module")
def decoded(checkpoint, tmp_path_factory):
    src = tmp_path_factory.mktemp("page") / "test.en"
    src.write_text("\n".join(SENTENCES[:3]) + "\n", encoding="utf-8")
    out = run_cli("decode", checkpoint, "-i", src).stdout.splitlines()
    assert len(out) == 3
    return out


@pytest.fixture(scope="module")
def server(checkpoint):
    server = Server(checkpoint)
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    yield from open_browser(tmp_path_factory)


@pytest.fixture
def page(browser, server):
    """The page freshly opened, its defaults read from /health; the events of its loading checked."""
    events = browser.open(server.url + "/")
    browser.wait_for("document.getElementById('beam').value")
    assert problems(events, own=server.url + "/") == {"requests": [], "errors": []}
    return browser


def test_get_root_is_the_page(server):
    status, body = server.get("/")
    assert status == 200 and body == page_html()


def test_a_typed_sentence_gets_what_decode_gives(page, server, decoded, tmp_path):
    # the checkpoint's decode.beam_size and length_penalty, from /health
    assert page.run("['beam', 'length-penalty'].map(id => document.getElementById(id).value)") == ["3", "0.6"]
    since = len(page.events)
    page.type("#source", SENTENCES[0])
    page.click("#translate")
    took = page.wait_for(TIME)
    assert re.fullmatch(r"[\d,]+ ms", took)
    assert page.run(OUTPUT) == decoded[0]
    assert page.run("document.getElementById('error').hidden")
    posts = [
        e["params"]["request"]
        for e in page.events[since:]
        if e.get("method") == "Network.requestWillBeSent" and e["params"]["request"]["method"] == "POST"
    ]
    assert [p["url"] for p in posts] == [server.url + "/translate"]
    assert json.loads(posts[0]["postData"]) == {"text": SENTENCES[0], "beam_size": 3, "length_penalty": 0.6}
    assert problems(page.events[since:], own=server.url + "/") == {"requests": [], "errors": []}
    png = page.screenshot()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24])[0] >= 1000
    (tmp_path / "page.png").write_bytes(png)


def test_lines_and_nbest_lists(page, decoded):
    page.type("#source", "\n".join(SENTENCES[:3]))
    page.click("#translate")
    page.wait_for(TIME)
    assert page.run(OUTPUT).split("\n") == decoded
    assert page.run(TIME).endswith("· 3 lines")
    page.run("document.getElementById('nbest').value = '2'")
    page.click("#translate")
    page.wait_for("document.querySelectorAll('#output li').length")
    items = page.run("Array.from(document.querySelectorAll('#output ol')).map(l => l.children.length)")
    firsts = page.run("Array.from(document.querySelectorAll('#output li:first-child')).map(l => l.firstChild.data)")
    assert items == [2, 2, 2] and firsts == decoded


def test_format_and_glossary_go_only_when_set(page):
    build = "JSON.stringify(buildRequest())"
    page.type("#source", "The cloud.")
    assert json.loads(page.run(build)) == {"text": "The cloud.", "beam_size": 3, "length_penalty": 0.6}
    page.run("document.getElementById('format').value = 'html'")
    page.run("document.getElementById('glossary-box').open = true")
    page.type("#glossary", "cloud\tnuage\n# a comment\n\npull  request \t demande de fusion\nconstructor\tconstructeur")
    assert page.run("document.getElementById('glossary-count').textContent") == "(3 terms)"
    assert json.loads(page.run(build)) == {
        "text": "The cloud.",
        "format": "html",
        "beam_size": 3,
        "length_penalty": 0.6,
        "glossary": {"cloud": "nuage", "pull request": "demande de fusion", "constructor": "constructeur"},
    }  # a term named like a property of JavaScript's objects is a term like any other


def test_a_document_with_a_glossary_gets_what_decode_gives(page, checkpoint, tmp_path):
    document, terms = "<p>The <b>cloud</b> is near.</p>", tmp_path / "terms.tsv"
    terms.write_text("cloud\tnuage\n", encoding="utf-8")
    (tmp_path / "doc.html").write_text(document, encoding="utf-8")
    expected = run_cli("decode", checkpoint, "-i", tmp_path / "doc.html", "--glossary", terms).stdout
    assert expected.startswith("<p>") and expected.count("<b>") == 1 and "nuage" in expected
    page.type("#source", document)
    page.run(value("format", "html"))
    page.run("document.getElementById('glossary-box').open = true")
    page.type("#glossary", "cloud\tnuage")
    page.click("#translate")
    page.wait_for(TIME)
    assert page.run(OUTPUT) == expected
    assert page.run("document.getElementById('error').hidden")


def value(id: str, text: str) -> str:
    return f"document.getElementById({json.dumps(id)}).value = {json.dumps(text)}"


@pytest.mark.parametrize(
    "setup, message",
    [
        (value("glossary", "cloud nuage"), "glossary line 1: expected 'source term<Tab>target term', found no Tab"),
        (value("glossary", "a\tb\n\nc\td\te"), "glossary line 3: expected 'source term<Tab>target term', found 2 Tabs"),
        (value("glossary", "cloud\t "), "glossary line 1: the target term is empty"),
        (value("glossary", "cloud\tnuage\ncloud\tnue"), "glossary line 2: 'cloud' already has the target 'nuage'"),
        (value("source", " \n "), "Type some English text first."),
        (value("beam", "2.5"), "Beam size: not an integer: 2.5"),
        (value("nbest", "2") + ";" + value("format", "markdown"), "N-best lists are for the Text format only"),
    ],
)
def test_the_pages_own_problems_are_shown_and_nothing_sent(page, setup, message):
    page.type("#source", SENTENCES[0])
    page.run(setup)
    since = len(page.events)
    page.click("#translate")
    shown = page.wait_for("!document.getElementById('error').hidden && document.getElementById('error').textContent")
    assert shown == message
    page.run("new Promise(r => setTimeout(r, 100))")
    assert not [e for e in page.events[since:] if e.get("method") == "Network.requestWillBeSent"]
    assert page.run(OUTPUT) == ""


def test_what_the_browser_cannot_read_as_a_number_is_said_not_sent_as_the_default(page):
    page.type("#source", SENTENCES[0])
    page.run("document.getElementById('length-penalty').value = ''")
    page.type("#length-penalty", "1e")  # the field's value reads "" (a letter alone cannot be typed in Chrome)
    assert page.run("document.getElementById('length-penalty').validity.badInput")
    since = len(page.events)
    page.click("#translate")
    shown = page.wait_for("!document.getElementById('error').hidden && document.getElementById('error').textContent")
    assert shown == "Length penalty: not a number"
    assert not [e for e in page.events[since:] if e.get("method") == "Network.requestWillBeSent"]


def test_tab_types_a_tab_in_the_glossary_and_esc_then_tab_moves_on(page):
    page.click("#glossary-box summary")  # the box opened, as a user opens it
    page.type("#glossary", "cloud")
    page.press("Tab", 9)
    page.type("#glossary", "nuage")
    assert page.run("document.getElementById('glossary').value") == "cloud\tnuage"
    assert page.run("document.activeElement.id") == "glossary"
    page.press("Escape", 27)
    page.press("Tab", 9)
    assert page.run("document.activeElement.id") != "glossary"
    assert page.run("document.getElementById('glossary').value") == "cloud\tnuage"


def test_a_refused_request_shows_the_servers_error(page, decoded):
    page.type("#source", SENTENCES[0])
    page.click("#translate")
    page.wait_for(TIME)
    assert page.run(OUTPUT) == decoded[0]
    page.run("document.getElementById('beam').value = '65'")
    page.click("#translate")
    shown = page.wait_for("!document.getElementById('error').hidden && document.getElementById('error').textContent")
    assert shown == '400: "beam_size" must be an integer from 1 to 64, got 65'
    assert page.run(OUTPUT) == "" and page.run("document.getElementById('copy').hidden")  # not the earlier answer
