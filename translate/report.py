"""A self-contained HTML page for people: corpus scores, then every sentence with its chrF.

`build_report` returns one page with no network asset at all (inline CSS, JS and SVG, and a
Content-Security-Policy that forbids anything else): the corpus scores and signatures, the
histograms of sentence chrF and of length ratio (hypothesis words / reference words), then
every sentence (source when known, reference, hypothesis) with the words where hypothesis and
reference differ marked, sortable and filterable, worst first. With a second system the table
shows both side by side, the sentences where their chrF differs most first.
"""

from __future__ import annotations

import bisect
import difflib
import html
import re
from collections.abc import Sequence
from pathlib import Path

from translate.errors import UserError
from translate.evaluate import score, sentence_chrf
from translate.textio import write_text

CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:; base-uri 'none'"
COLOURS = ("#3b6fb6", "#d9822b")  # system A, system B
_TOKEN = re.compile(r"(\w+|[^\w\s])(\s*)")


def length_ratio(hypothesis: str, reference: str) -> float | None:
    """Words of the hypothesis / words of the reference; None for an empty reference."""
    n_ref = len(reference.split())
    return round(len(hypothesis.split()) / n_ref, 3) if n_ref else None


def _tokens(text: str) -> tuple[str, list[tuple[str, str]]]:
    """Leading whitespace and (word or punctuation mark, the whitespace after it) pairs."""
    lead = text[: len(text) - len(text.lstrip())]
    return lead, _TOKEN.findall(text, len(lead))


def _render(lead: str, pieces: list[tuple[str, str]], marked: list[bool], cls: str) -> str:
    out, i = [html.escape(lead)], 0
    while i < len(pieces):
        j = i
        while j < len(pieces) and marked[j] == marked[i]:
            j += 1
        inner = "".join(t + s for t, s in pieces[i : j - 1]) + pieces[j - 1][0]
        text = html.escape(inner)
        out.append((f'<mark class="{cls}">{text}</mark>' if marked[i] else text) + html.escape(pieces[j - 1][1]))
        i = j
    return "".join(out)


def diff_html(hypothesis: str, reference: str) -> tuple[str, str]:
    """Escaped HTML of both texts with word-level differences marked: in the hypothesis the words
    that are not in the reference (class x), in the reference the words it missed (class m)."""
    h_lead, h = _tokens(hypothesis)
    r_lead, r = _tokens(reference)
    h_marked, r_marked = [True] * len(h), [True] * len(r)
    matcher = difflib.SequenceMatcher(None, [t for t, _ in h], [t for t, _ in r], autojunk=False)
    for block in matcher.get_matching_blocks():
        h_marked[block.a : block.a + block.size] = [False] * block.size
        r_marked[block.b : block.b + block.size] = [False] * block.size
    return _render(h_lead, h, h_marked, "x"), _render(r_lead, r, r_marked, "m")


def histogram_svg(
    series: Sequence[Sequence[float | None]],
    edges: Sequence[float],
    title: str,
    xlabel: str,
    keys: Sequence[str],
    overflow: bool = False,
) -> str:
    """Inline SVG histogram of one or two series (overlaid) over the bins [edges[i], edges[i+1]),
    the last bin closed; with `overflow` it also holds every value above the last edge. A click on
    a bar of series s filters the table on column keys[s] to its bin (see the page's script)."""
    n_bins = len(edges) - 1
    counts = []
    for values in series:
        c = [0] * n_bins
        for v in values:
            i = bisect.bisect_right(edges, v) - 1 if v is not None else -1
            if i >= n_bins and (overflow or v == edges[-1]):
                i = n_bins - 1
            if 0 <= i < n_bins:
                c[i] += 1
        counts.append(c)
    top = max(1, *(max(c) for c in counts))
    width, height, left, bottom, top_pad = 450, 170, 34, 34, 22
    bar_w = (width - left - 16) / n_bins
    scale = (height - bottom - top_pad) / top
    parts = [
        f'<svg class="hist" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="{html.escape(title)}">',
        f'<text x="{width / 2}" y="14" class="t">{html.escape(title)}</text>',
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - 16}" y2="{height - bottom}" class="axis"/>',
        f'<text x="{left - 4}" y="{top_pad + 4}" class="yl">{top}</text>',
        f'<text x="{left - 4}" y="{height - bottom}" class="yl">0</text>',
        f'<text x="{width / 2}" y="{height - 4}" class="xl">{html.escape(xlabel)}</text>',
    ]
    for s, c in enumerate(counts):
        for i, n in enumerate(c):
            x, h = left + i * bar_w, n * scale
            hi = "" if overflow and i == n_bins - 1 else f"{edges[i + 1]:g}"
            label = f"{edges[i]:g}–{hi}: {n} sentence{'s' * (n != 1)}"
            parts.append(
                f'<rect x="{x + 1:.1f}" y="{height - bottom - h:.1f}" width="{bar_w - 2:.1f}" height="{h:.1f}" '
                f'fill="{COLOURS[s]}" fill-opacity="{0.85 if len(counts) == 1 else 0.55}" data-key="{keys[s]}" '
                f'data-count="{n}" data-lo="{edges[i]:g}" data-hi="{hi}"><title>{html.escape(label)}</title></rect>'
            )
    for i in range(0, n_bins + 1, max(1, n_bins // 5)):
        label = f"{edges[i]:g}" + ("+" if overflow and i == n_bins else "")
        parts.append(f'<text x="{left + i * bar_w:.1f}" y="{height - bottom + 14}" class="xt">{label}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _scores_table(names: Sequence[str], all_scores: Sequence[dict]) -> str:
    rows = "".join(
        f'<tr><td><span class="dot" style="background:{COLOURS[i]}"></span>{html.escape(name)}</td>'
        f"<td>{s['bleu']:.2f}</td><td>{s['chrf']:.2f}</td><td>{s['sentences']}</td>"
        f"<td><code>{html.escape(s['bleu_detail'])}</code></td></tr>"
        for i, (name, s) in enumerate(zip(names, all_scores, strict=True))
    )
    sigs = (
        f"<p class=sig>BLEU signature <code>{html.escape(all_scores[0]['bleu_signature'])}</code><br>"
        f"chrF signature <code>{html.escape(all_scores[0]['chrf_signature'])}</code></p>"
    )
    head = "<tr><th>system</th><th>BLEU</th><th>chrF</th><th>sentences</th><th>BLEU detail</th></tr>"
    return f'<table class="scores">{head}{rows}</table>{sigs}'


def _rows(
    references: Sequence[str], systems: Sequence[Sequence[str]], sources: Sequence[str] | None
) -> tuple[list[str], dict[str, list]]:
    """The table rows in their default order (worst first / largest difference first) and the
    per-sentence figures (chrf_a, ratio_a, ...)."""
    figures: dict[str, list] = {}
    for s, hyps in zip("ab", systems):
        figures[f"chrf_{s}"] = sentence_chrf(hyps, references)
        figures[f"ratio_{s}"] = [length_ratio(h, r) for h, r in zip(hyps, references, strict=True)]
    if len(systems) == 2:
        figures["delta"] = [round(b - a, 2) for a, b in zip(figures["chrf_a"], figures["chrf_b"], strict=True)]
        order = sorted(range(len(references)), key=lambda i: (-abs(figures["delta"][i]), i))
    else:
        order = sorted(range(len(references)), key=lambda i: (figures["chrf_a"][i], i))
    columns = ["chrf_a", "chrf_b", "delta"] if len(systems) == 2 else ["chrf_a", "ratio_a"]
    rows = []
    for i in order:
        data = " ".join(
            f'data-{k.replace("_", "-")}="{"" if figures[k][i] is None else figures[k][i]}"' for k in figures
        )
        cells = "".join(f"<td class=num>{_number(k, figures[k][i])}</td>" for k in columns)
        lines = []
        if sources is not None:
            lines.append(f'<div class="src"><b>source</b>{html.escape(sources[i])}</div>')
        marked = [diff_html(hyps[i], references[i]) for hyps in systems]
        ref_html = marked[0][1] if len(systems) == 1 else html.escape(references[i])
        lines.append(f'<div class="ref"><b>reference</b>{ref_html}</div>')
        for s, (hyp_html, _) in enumerate(marked):
            label = "hypothesis" if len(systems) == 1 else f"system {'AB'[s]}"
            lines.append(f'<div class="hyp"><b style="color:{COLOURS[s]}">{label}</b>{hyp_html}</div>')
        rows.append(f'<tr data-i="{i + 1}" {data}><td class=num>{i + 1}</td>{cells}<td>{"".join(lines)}</td></tr>')
    return rows, figures


def _number(key: str, value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.2f}" if key.startswith("ratio") else f"{value:+.1f}" if key == "delta" else f"{value:.1f}"


def build_report(
    references: Sequence[str],
    hypotheses: Sequence[str],
    *,
    sources: Sequence[str] | None = None,
    hypotheses_b: Sequence[str] | None = None,
    names: Sequence[str] = ("hypothesis", "system B"),
    inputs: Sequence[str] = (),
    title: str = "translation report",
    scores: Sequence[dict] | None = None,
) -> str:
    """The HTML page (a string). One reference, hypothesis (and source) per sentence; `names` are
    the systems' labels, `inputs` lines describing where the texts came from, `scores` each
    system's evaluate.score() when already known."""
    systems = [list(hypotheses)] + ([list(hypotheses_b)] if hypotheses_b is not None else [])
    for what, lines in [("hypotheses", hypotheses), ("sources", sources), ("second hypotheses", hypotheses_b)]:
        if lines is not None and len(lines) != len(references):
            raise UserError(f"{len(lines)} {what} but {len(references)} references: line counts must match")
    names = list(names[: len(systems)]) if len(systems) == 1 else [f"{x}: {n}" for x, n in zip("AB", names)]
    all_scores = list(scores) if scores is not None else [score(hyps, list(references)) for hyps in systems]
    rows, figures = _rows(references, systems, sources)
    hists = _histograms(figures, "ab"[: len(systems)])
    headers, filters, order, default_key = _columns(len(systems))
    head = "".join(
        f'<th><button type="button" data-key="{k}" aria-sort="none">{html.escape(label)}</button></th>'
        for k, label in headers
    )
    options = "".join(f'<option value="{k}">{html.escape(label)}</option>' for k, label in filters)
    legend = (
        '<p class="legend"><mark class="x">marked</mark> in a hypothesis: words not in the reference; '
        '<mark class="m">marked</mark> in the reference: words the hypothesis missed.</p>'
    )
    inputs_html = "".join(f"<li>{html.escape(line)}</li>" for line in inputs)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{_CSS}</style></head>
<body data-default-key="{default_key}">
<h1>{html.escape(title)}</h1>
<ul class="inputs">{inputs_html}</ul>
{_scores_table(names, all_scores)}
<div class="hists">{hists}</div>
<div class="controls">
<label>search <input id="q" type="search" placeholder="words in any text"></label>
<label>filter <select id="fkey">{options}</select></label>
<label>from <input id="fmin" type="number" step="any"></label>
<label>to <input id="fmax" type="number" step="any"></label>
<button type="button" id="reset">show all</button>
<span id="count">{len(rows)} of {len(rows)} sentences</span>
</div>
<p class="order">Order: {order}. Click a column to sort, a histogram bar to filter.</p>
{legend if len(systems) == 1 else ""}
<table id="sentences"><thead><tr>{head}<th>sentence</th></tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody></table>
<script>{_JS}</script>
</body></html>
"""


def _histograms(figures: dict[str, list[float]], letters: str) -> str:
    """The sentence chrF and length ratio histograms (SVG) of each system."""
    chrf_edges = [5.0 * k for k in range(21)]
    ratio_edges = [round(0.1 * k, 6) for k in range(21)]
    return histogram_svg(
        [figures[f"chrf_{s}"] for s in letters], chrf_edges, "sentence chrF", "chrF", [f"chrf-{s}" for s in letters]
    ) + histogram_svg(
        [figures[f"ratio_{s}"] for s in letters], ratio_edges, "length ratio (hypothesis / reference words)",
        "hypothesis words / reference words", [f"ratio-{s}" for s in letters], overflow=True,
    )  # fmt: skip


def _columns(n_systems: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]], str, str]:
    """The sortable columns, the filterable ones, the order described, and the default sort key."""
    if n_systems == 2:
        headers = [("i", "#"), ("chrf-a", "chrF A"), ("chrf-b", "chrF B"), ("delta", "B − A")]
        filters = headers[1:] + [("ratio-a", "length ratio A"), ("ratio-b", "length ratio B")]
        return headers, filters, "largest chrF difference between the two systems first", "delta-abs"
    headers = [("i", "#"), ("chrf-a", "chrF"), ("ratio-a", "length ratio")]
    return headers, headers[1:], "lowest sentence chrF first", "chrf-a"


def write_report(path: str | Path, page: str) -> None:
    """Write the page atomically: a temporary file in the same directory, renamed at the end."""
    write_text(path, page, "--report")


_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:1.5em auto;max-width:1200px;padding:0 1em;color:#222}
h1{font-size:1.4em;margin:0 0 .3em}
.inputs{color:#555;margin:0 0 1em;padding-left:1.2em}
table.scores{border-collapse:collapse;margin-bottom:.4em}
table.scores td,table.scores th{border-bottom:1px solid #ddd;padding:.2em .8em;text-align:left}
.sig{font-size:.85em;color:#555}
.dot{display:inline-block;width:.7em;height:.7em;border-radius:50%;margin-right:.4em}
.hists{display:flex;flex-wrap:wrap;gap:1em;margin:.5em 0}
.hist text{font-size:10px;fill:#444}.hist .t{font-size:12px;text-anchor:middle;fill:#222}
.hist .xl,.hist .xt{text-anchor:middle}.hist .yl{text-anchor:end}
.hist .axis{stroke:#888}.hist rect{cursor:pointer}.hist rect:hover{fill-opacity:1}
.controls{display:flex;flex-wrap:wrap;gap:.8em;align-items:center;margin:.6em 0;position:sticky;top:0;
background:#fff;padding:.4em 0;border-bottom:1px solid #ddd}
.controls input[type=number]{width:5em}
.order,.legend{color:#555;margin:.3em 0}
#sentences{border-collapse:collapse;width:100%}
#sentences th{text-align:left;border-bottom:2px solid #aaa;white-space:nowrap}
#sentences th button{font:inherit;font-weight:bold;border:0;background:none;cursor:pointer;padding:.2em .3em}
#sentences th button[aria-sort=ascending]::after{content:" \\25B2"}
#sentences th button[aria-sort=descending]::after{content:" \\25BC"}
#sentences td{border-bottom:1px solid #e4e4e4;padding:.35em .5em;vertical-align:top}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td div{margin:.1em 0;white-space:pre-wrap;word-break:break-word}
td div b{display:inline-block;width:7em;font-weight:600;color:#777;font-size:.85em}
.src{color:#555}
mark.x{background:#f8c9c4}mark.m{background:#c8ecc4}
"""

_JS = """
(function () {
  const body = document.querySelector('#sentences tbody');
  const rows = Array.from(body.rows);
  const buttons = document.querySelectorAll('#sentences th button');
  const q = document.getElementById('q'), fkey = document.getElementById('fkey');
  const fmin = document.getElementById('fmin'), fmax = document.getElementById('fmax');
  const value = (row, key) => {
    if (key === 'delta-abs') return Math.abs(parseFloat(row.dataset.delta));
    const v = parseFloat(row.dataset[key.replace(/-([a-z])/g, (m, c) => c.toUpperCase())]);
    return Number.isNaN(v) ? null : v;
  };
  function sortBy(key, descending) {
    const sign = descending ? -1 : 1;
    rows.sort((a, b) => {
      const x = value(a, key), y = value(b, key);
      if (x === null || y === null) return (x === null) - (y === null) || value(a, 'i') - value(b, 'i');
      return sign * (x - y) || value(a, 'i') - value(b, 'i');
    });
    body.append(...rows);
    buttons.forEach(b => b.setAttribute('aria-sort', b.dataset.key !== key ? 'none' :
      (descending ? 'descending' : 'ascending')));
  }
  buttons.forEach(b => b.addEventListener('click', () => {
    const current = b.getAttribute('aria-sort');
    const descending = current === 'none' ? b.dataset.key === 'delta' : current === 'ascending';
    sortBy(b.dataset.key, descending);
  }));
  function filter() {
    const words = q.value.trim().toLowerCase(), key = fkey.value;
    const lo = fmin.value === '' ? -Infinity : parseFloat(fmin.value);
    const hi = fmax.value === '' ? Infinity : parseFloat(fmax.value);
    let shown = 0;
    rows.forEach(r => {
      const v = value(r, key);
      const ok = (!words || r.textContent.toLowerCase().includes(words)) &&
        (lo === -Infinity && hi === Infinity || (v !== null && v >= lo && v <= hi));
      r.hidden = !ok;
      shown += ok;
    });
    document.getElementById('count').textContent = shown + ' of ' + rows.length + ' sentences';
  }
  [q, fkey, fmin, fmax].forEach(el => el.addEventListener('input', filter));
  fkey.addEventListener('change', filter);
  document.getElementById('reset').addEventListener('click', () => {
    q.value = fmin.value = fmax.value = '';
    filter();
  });
  document.querySelectorAll('.hist rect').forEach(bar => bar.addEventListener('click', () => {
    fkey.value = bar.dataset.key;
    fmin.value = bar.dataset.lo;
    fmax.value = bar.dataset.hi;
    filter();
  }));
  const key = document.body.dataset.defaultKey;
  if (key === 'chrf-a') document.querySelector('button[data-key="chrf-a"]').setAttribute('aria-sort', 'ascending');
})();
"""
