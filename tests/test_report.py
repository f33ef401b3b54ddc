"""The HTML report: escaping, counts, orders, histograms, no network, and a real browser."""

import json
import re
import struct
from html.parser import HTMLParser

import pytest
from browser import open_browser, problems
from conftest import FIXTURES, run_cli
from typer.testing import CliRunner

from translate.cli import app
from translate.errors import UserError
from translate.evaluate import sentence_chrf
from translate.report import build_report, diff_html, histogram_svg, length_ratio, write_report

NASTY = [
    "<script>alert('x')</script> & \"quotes\" </td></tr>",
    'Voir <img src="https://example.com/x.png"> et http://example.org/a?b=1&c=2',
    "L'été à Noël — « déjà » 中文 🙂 عربى",
    "  espaces   multiples\tet tabulation  ",
    "",
]


class Page(HTMLParser):
    """Every tag with its attributes, the texts of the sentence table's rows, and text outside tags."""

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.rows: list[dict] = []  # {"attrs": ..., "src"/"ref"/"hyp": [text ...]}
        self.div: str | None = None
        self.in_label = False
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if tag == "tr" and "data-i" in attrs:
            self.rows.append({"attrs": attrs, "src": [], "ref": [], "hyp": []})
        elif tag == "div" and attrs.get("class") in ("src", "ref", "hyp") and self.rows:
            self.div = attrs["class"]
            self.rows[-1][self.div].append("")
        elif tag == "b" and self.div:
            self.in_label = True

    def handle_endtag(self, tag):
        if tag == "div":
            self.div = None
        elif tag == "b":
            self.in_label = False

    def handle_data(self, data):
        if self.div and not self.in_label:
            self.rows[-1][self.div][-1] += data


def make_texts(n: int = 12):
    refs = (FIXTURES / "bible.test.fr").read_text(encoding="utf-8").splitlines()[:n]
    srcs = (FIXTURES / "bible.test.en").read_text(encoding="utf-8").splitlines()[:n]
    hyps = [" ".join(r.split()[: max(1, len(r.split()) - k % 4)]) for k, r in enumerate(refs)]
    hyps[: len(NASTY)] = NASTY
    refs[2], hyps[5] = NASTY[2], refs[5]  # two perfect matches
    return srcs, refs, hyps


def test_every_text_is_escaped_and_comes_back_whole():
    srcs, refs, hyps = make_texts()
    srcs[0] = "<b>bold</b> & <!-- comment -->"
    page = Page(build_report(refs, hyps, sources=srcs))
    assert len(page.rows) == len(refs)
    for row in page.rows:
        i = int(row["attrs"]["data-i"]) - 1
        assert row["src"] == [srcs[i]] and row["ref"] == [refs[i]] and row["hyp"] == [hyps[i]]
    assert [t for t, _ in page.tags].count("script") == 1  # the page's own script only
    assert not any(t == "img" for t, _ in page.tags)


def test_no_external_url_anywhere_but_in_the_texts():
    srcs, refs, hyps = make_texts()
    html = build_report(refs, hyps, sources=srcs, hypotheses_b=list(reversed(hyps)))
    page = Page(html)
    for _tag, attrs in page.tags:
        for name, value in attrs.items():
            assert not re.search(r"(https?:)?//", value or ""), (name, value)
            assert name not in ("src", "href", "srcset", "action", "xmlns")
    csp = [a["content"] for t, a in page.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert csp and "default-src 'none'" in csp[0]
    code = "".join(body for _, body in re.findall(r"<(style|script)>(.*?)</\1>", html, flags=re.S))
    assert len(code) > 1000
    assert not re.search(r"https?:|url\(|@import|fetch\(|XMLHttpRequest|import\(|\.(src|href)\s*=", code)
    # the URLs in the texts are there, escaped, as text only
    assert any(NASTY[1] in row["hyp"] for row in page.rows) and not any(t == "img" for t, _ in page.tags)


def test_worst_sentence_first_and_counts():
    srcs, refs, hyps = make_texts()
    page = Page(build_report(refs, hyps, sources=srcs))
    chrf = [float(r["attrs"]["data-chrf-a"]) for r in page.rows]
    index = [int(r["attrs"]["data-i"]) for r in page.rows]
    assert sorted(index) == list(range(1, len(refs) + 1))
    assert chrf == sorted(chrf)
    assert dict(zip(index, chrf)) == {i + 1: c for i, c in enumerate(sentence_chrf(hyps, refs))}
    perfect = [i + 1 for i, (h, r) in enumerate(zip(hyps, refs)) if h == r]
    assert 3 in perfect and 6 in perfect
    assert index[-len(perfect) :] == perfect and set(chrf[-len(perfect) :]) == {100.0}  # last, in file order
    assert all(row["hyp"] == row["ref"] for row in page.rows[-len(perfect) :])
    ties = [(c, i) for c, i in zip(chrf, index)]
    assert ties == sorted(ties)  # equal scores keep the file order


def test_two_systems_largest_difference_first():
    srcs, refs, hyps = make_texts()
    hyps_b = list(refs)
    hyps_b[5] = ""
    page = Page(build_report(refs, hyps, sources=srcs, hypotheses_b=hyps_b, names=["one", "two"]))
    a = [float(r["attrs"]["data-chrf-a"]) for r in page.rows]
    b = [float(r["attrs"]["data-chrf-b"]) for r in page.rows]
    delta = [float(r["attrs"]["data-delta"]) for r in page.rows]
    assert delta == pytest.approx([y - x for x, y in zip(a, b)], abs=0.011)
    assert [abs(d) for d in delta] == sorted((abs(d) for d in delta), reverse=True)
    assert all(len(r["hyp"]) == 2 for r in page.rows)
    assert max(abs(d) for d in delta) > 0


def test_histograms_count_every_sentence():
    srcs, refs, hyps = make_texts()
    refs[7] = ""  # no length ratio for an empty reference
    html = build_report(refs, hyps, sources=srcs)
    page = Page(html)
    bars = [a for t, a in page.tags if t == "rect"]
    chrf = sum(int(a["data-count"]) for a in bars if a["data-key"] == "chrf-a")
    ratio = sum(int(a["data-count"]) for a in bars if a["data-key"] == "ratio-a")
    assert html.count("<svg") == 2 and chrf == len(refs) and ratio == len(refs) - 1
    assert length_ratio("a b c", "a b") == 1.5 and length_ratio("a", "  ") is None


def test_histogram_bins():
    svg = histogram_svg([[0, 4.9, 5, 100, None, -1, 250]], [0, 5, 10, 100], "t", "x", ["k"], overflow=False)
    counts = [int(c) for c in re.findall(r'data-count="(\d+)"', svg)]
    assert counts == [2, 1, 1]  # 100 falls in the closed last bin; -1, 250 and None fall nowhere
    svg = histogram_svg([[0.5, 3.0, 9.0]], [0, 1, 2], "t", "x", ["k"], overflow=True)
    assert [int(c) for c in re.findall(r'data-count="(\d+)"', svg)] == [1, 2]


def test_diff_marks_the_differing_words():
    hyp, ref = diff_html("Le chat dort.", "Le chien dort.")
    assert hyp == 'Le <mark class="x">chat</mark> dort.' and ref == 'Le <mark class="m">chien</mark> dort.'
    assert diff_html("a b", "a b") == ("a b", "a b")
    hyp, ref = diff_html("", "tout manque")
    assert hyp == "" and ref == '<mark class="m">tout manque</mark>'
    hyp, _ = diff_html(" <a> &  b ", "b")
    assert re.sub(r"</?mark[^>]*>", "", hyp) == " &lt;a&gt; &amp;  b "


def test_line_counts_must_match_and_writes_are_atomic(tmp_path):
    with pytest.raises(UserError, match="line counts must match"):
        build_report(["a", "b"], ["a"])
    with pytest.raises(UserError, match="directory .*missing does not exist"):
        write_report(tmp_path / "missing" / "r.html", "x")
    write_report(tmp_path / "r.html", "<p>é</p>")
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]
    assert (tmp_path / "r.html").read_text(encoding="utf-8") == "<p>é</p>"


def test_evaluate_report_from_files_and_from_a_checkpoint(trained_run, tmp_path):
    srcs, refs, hyps = make_texts(40)
    for name, lines in [("ref.fr", refs), ("a.fr", hyps), ("b.fr", refs[:-1] + ["x"])]:
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    runner = CliRunner()
    args = ["evaluate", "--hyp", str(tmp_path / "a.fr"), "--ref", str(tmp_path / "ref.fr")]
    both = [
        "--hyp-b",
        str(tmp_path / "b.fr"),
        "--report",
        str(tmp_path / "two.html"),
        "--json",
        str(tmp_path / "s.json"),
    ]
    result = runner.invoke(app, [*args, *both])
    assert result.exit_code == 0, result.output
    assert "report written" in result.output and result.output.count("BLEU =") == 2
    scores = json.loads((tmp_path / "s.json").read_text())
    assert scores["hyp_b"]["sentences"] == 40 and scores["hyp_b"]["bleu"] != scores["bleu"]
    assert scores["inputs"]["hyp_b"] == str(tmp_path / "b.fr") and "search" not in scores  # nothing translated
    assert len(Page((tmp_path / "two.html").read_text(encoding="utf-8")).rows) == 40

    ckpt = trained_run[0] / "checkpoints" / "best.pt"
    (tmp_path / "src.en").write_text("\n".join(srcs[:5]) + "\n", encoding="utf-8")
    (tmp_path / "ref5.fr").write_text("\n".join(refs[:5]) + "\n", encoding="utf-8")
    report = tmp_path / "ckpt.html"
    args = ["evaluate", str(ckpt), "--src", str(tmp_path / "src.en"), "--ref", str(tmp_path / "ref5.fr")]
    result = runner.invoke(app, [*args, "--beam", "1", "--report", str(report)])
    assert result.exit_code == 0, result.output
    rows = Page(report.read_text(encoding="utf-8")).rows
    assert sorted(r["src"][0] for r in rows) == sorted(srcs[:5]) and all(len(r["hyp"]) == 1 for r in rows)


def test_evaluate_report_mistakes_are_one_line(tmp_path):
    ref, short = tmp_path / "ref.fr", tmp_path / "short.fr"
    ref.write_text("a\nb\n")
    short.write_text("a\n")
    bad = run_cli(
        "evaluate", "--hyp", ref, "--ref", ref, "--hyp-b", short, "--report", tmp_path / "r.html", check=False
    )
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        f"error: {short} has 1 line but {ref} has 2: they must match"
    ]
    assert not (tmp_path / "r.html").exists()
    missing = CliRunner().invoke(app, ["evaluate", "--hyp", str(ref), "--ref", str(ref), "--report", "no/r.html"])
    assert isinstance(missing.exception, UserError) and "directory no does not exist" in str(missing.exception)


# ---------------------------------------------------------------------------- in a real browser


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    yield from open_browser(tmp_path_factory)


def test_the_watchdog_sees_a_request_and_an_error(browser, tmp_path):
    page = tmp_path / "control.html"
    page.write_text(
        "<!DOCTYPE html><meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; "
        "script-src 'unsafe-inline'\"><img src='https://example.com/x.png'><script>nope();</script>"
    )
    found = problems(browser.open(page.as_uri()))
    assert found["requests"] == ["https://example.com/x.png"] and found["errors"]


def test_report_renders_offline_without_errors(browser, tmp_path):
    srcs, refs, hyps = make_texts(40)
    for name, page in [
        ("one.html", build_report(refs, hyps, sources=srcs)),
        ("two.html", build_report(refs, hyps, sources=srcs, hypotheses_b=refs[1:] + refs[:1])),
    ]:
        write_report(tmp_path / name, page)
        assert problems(browser.open((tmp_path / name).as_uri())) == {"requests": [], "errors": []}
        assert browser.run("document.querySelectorAll('#sentences tbody tr').length") == 40
        assert browser.run("document.querySelectorAll('svg.hist rect').length") > 0
        png = browser.screenshot()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", png[16:24])
        assert width >= 1000 and height > 900  # the whole page, longer than the window
        (tmp_path / name).with_suffix(".png").write_bytes(png)


def rows_in_dom(browser, key: str) -> list[float]:
    return browser.run(
        f"Array.from(document.querySelectorAll('#sentences tbody tr')).filter(r => !r.hidden)"
        f".map(r => parseFloat(r.getAttribute('data-{key}')))"
    )


def test_sorting_and_filtering_in_the_browser(browser, tmp_path):
    srcs, refs, hyps = make_texts(40)
    write_report(tmp_path / "r.html", build_report(refs, hyps, sources=srcs))
    browser.open((tmp_path / "r.html").as_uri())
    chrf = rows_in_dom(browser, "chrf-a")
    assert chrf == sorted(chrf) and chrf[0] < chrf[-1]  # worst first
    click = "document.querySelector('#sentences th button[data-key=\"{}\"]').click()"
    browser.run(click.format("chrf-a"))
    assert rows_in_dom(browser, "chrf-a") == sorted(chrf, reverse=True)
    browser.run(click.format("i"))
    assert rows_in_dom(browser, "i") == list(range(1, 41))
    browser.run(click.format("ratio-a"))
    ratios = rows_in_dom(browser, "ratio-a")
    assert ratios == sorted(ratios)
    browser.run(click.format("chrf-a"))
    assert rows_in_dom(browser, "chrf-a") == sorted(chrf)

    browser.run("const f = document.getElementById('fmax'); f.value = '50'; f.dispatchEvent(new Event('input'))")
    shown = rows_in_dom(browser, "chrf-a")
    assert shown == [c for c in sorted(chrf) if c <= 50] and 0 < len(shown) < 40
    assert browser.run("document.getElementById('count').textContent") == f"{len(shown)} of 40 sentences"
    browser.run("document.getElementById('reset').click()")
    browser.run("const q = document.getElementById('q'); q.value = 'NOËL'; q.dispatchEvent(new Event('input'))")
    expected = sum("noël" in (s + r + h).lower() for s, r, h in zip(srcs, refs, hyps))
    assert expected > 0 and len(rows_in_dom(browser, "chrf-a")) == expected
    browser.run("document.getElementById('reset').click()")
    bar = "Array.from(document.querySelectorAll('svg.hist rect')).find(b => +b.dataset.count > 0)"
    lo, hi = browser.run(
        f"(() => {{ const b = {bar}; b.dispatchEvent(new Event('click')); return [b.dataset.lo, b.dataset.hi]; }})()"
    )
    shown = rows_in_dom(browser, "chrf-a")
    assert shown and all(float(lo) <= c <= float(hi) for c in shown)


def test_several_references_score_together(tmp_path):
    """--ref repeated: sacreBLEU's multi-reference BLEU and chrF (nrefs:2); a hypothesis that matches
    the second reference scores 100 though it differs from the first; the report shows the first."""
    first, second, hyp = tmp_path / "a.fr", tmp_path / "b.fr", tmp_path / "h.fr"
    first.write_text("le chat dort sur le tapis rouge .\nil pleut depuis trois jours .\n")
    second.write_text("le chat dort sur la natte rouge .\nil pleut depuis trois jours déjà .\n")
    hyp.write_text(second.read_text())
    scores, report = tmp_path / "s.json", tmp_path / "r.html"
    one = run_cli("evaluate", "--hyp", hyp, "--ref", first).stdout
    both = run_cli("evaluate", "--hyp", hyp, "--ref", first, "--ref", second, "--json", scores, "--report", report)
    assert "BLEU 100.00  (nrefs:2|" in both.stdout and "chrF 100.00  (nrefs:2|" in both.stdout
    assert "(nrefs:1|" in one and "BLEU 100.00" not in one
    saved = json.loads(scores.read_text())
    assert saved["bleu"] == 100 and saved["inputs"]["ref"] == [str(first), str(second)]
    assert "tapis" in report.read_text() and str(second) in report.read_text()
