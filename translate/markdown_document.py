"""Markdown documents translated with their syntax kept (markup.py does the rest).

The document is parsed with markdown-it-py (CommonMark, with GFM tables and strikethrough) only
to find where its inline text is: the paragraphs, headings and table cells, line by line. Only
that text changes; every other byte is copied: block syntax (`#`, `>`, list markers, table
pipes), fenced and indented code blocks, HTML blocks, link reference definitions, and YAML
front matter (between `---` lines at the top).

Within the inline text, the syntax is carried through the sentence as markup (markup.py):
code spans, autolinks, inline HTML and comments, emphasis delimiters (`*`, `**`, `_` at a word's
edge, `~~`), the brackets and destinations of links and images (`[`, `![`, `](url "title")`,
`][label]`; link text and image descriptions are translated, titles are not), a shortcut
reference (`[label]`) whole, backslash escapes and entities. A hard line break ends a block (the
text before it and the text after it are translated apart) and ends its translation's last line;
each footnote definition (`[^1]:` lines one under the other) is a block of its label's line on;
a paragraph wrapped over several lines comes back wrapped over at most as many (broken at the
spaces nearest the source's proportions),
each with its line's prefix (`> `, indentation). In the translation, characters that would
start Markdown syntax (`* _ [ ] < \\` and a backquote, `|` in a table, `#`, `>`, `-`, `+` or
`1.` at a line's start) are escaped with a backslash.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable

from markdown_it import MarkdownIt
from markdown_it.common.utils import normalizeReference

from translate.markup import Markup, has_no_letter, translate_blocks
from translate.protect import MARKUP, PATTERNS

log = logging.getLogger("translate")

_SYNTAX = [
    r"(`+)[\s\S]*?(?<!`)\1(?!`)",  # a code span
    r"<[A-Za-z][A-Za-z0-9+.-]{1,31}:[^\s<>]*>",  # an autolink
    r"<[\w.!#$%&'*+/=?^`{|}~-]+@[\w-]+(?:\.[\w-]+)*>",  # an e-mail autolink
    r"<!--[\s\S]*?-->",  # an HTML comment
    PATTERNS["tag"],  # inline HTML
    r"\]\((?:[^()\s\\]|\\.|\((?:[^()\\]|\\.)*\))*(?:\s+(?:\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|\((?:[^()\\]|\\.)*\)))?\s*\)",
    r"\]\[[^\]]*\]",  # the end of a full reference link
    r"\[\^[^\]\s]+\](?![(\[])",  # a footnote reference, [^1]: one piece, its label kept
    r"!?\[|\]",
    r"\\[!-/:-@\[-`{-~]",  # a backslash escape
    r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});",  # an entity
    r"\*+|~~+|(?<![^\W_])_+|_+(?![^\W_])",  # emphasis delimiters (an underscore inside a word is text)
]
_ESCAPE = re.compile(r"[`*\[\]<]|\\(?=[!-/:-@\[-`{-~])|(?<![^\W_])_|_(?![^\W_])|&(?=#?\w+;)")
_LINE_START = re.compile(r"^(?:[-+*](?=\s|$)|>|#{1,6}(?=\s|$)|=+\s*$|(?:[-*_]\s*){3,}$|\d{1,9}(?=[.)](?:\s|$)))")
_CELL = re.compile(r"(?:\\.|[^|\\])+")
_SHORTCUT = r"!?\[(?!\^)[^\[\]]+\](?![(\[])"  # [label]: a shortcut reference if the label is defined
_TASK = re.compile(r"\[[ xX]\][ \t]+")  # a task list item's checkbox: not text
_FOOTNOTE = re.compile(r"\[\^[^\]\s]+\]:[ \t]*")  # a footnote definition's label: not text


@functools.cache
def _parser() -> MarkdownIt:
    return MarkdownIt("commonmark").enable(["table", "strikethrough"])


def _front_matter(lines: list[str]) -> int:
    """How many lines of front matter the document starts with: YAML between two `---` lines (or
    `---` and `...`), TOML between two `+++` lines."""
    fence = lines[0].rstrip() if lines else ""
    if fence in ("---", "+++"):
        for n, line in enumerate(lines[1:], 2):
            if line.rstrip() in ((fence, "...") if fence == "---" else (fence,)):
                return n
    return 0


def _cells(line: str) -> list[tuple[int, int]]:
    """The (start, end) of each cell of a table row, the pipes at its edges left out."""
    cells = [(m.start(), m.end()) for m in _CELL.finditer(line)]
    first, last = line.find("|"), line.rfind("|")
    if cells and not line[slice(*cells[0])].strip() and cells[0][1] <= first:
        cells = cells[1:]
    if cells and not line[slice(*cells[-1])].strip() and cells[-1][0] > last:
        cells = cells[:-1]
    return cells


def _slots(tokens: list, lines: list[str]) -> list[tuple[list[tuple[int, int, int]], bool]]:
    """For each inline token (a paragraph, heading or table cell) with text: the (line, start,
    end) of its text in the source lines, and whether it is a table cell. A token whose text is
    not found in its lines is left out (and so left as it is)."""
    found, cells_seen = [], {}
    for i, token in enumerate(tokens):
        if token.type != "inline" or token.map is None:
            continue
        if i > 0 and tokens[i - 1].type in ("th_open", "td_open"):
            row = token.map[0]
            k = cells_seen[row] = cells_seen.get(row, -1) + 1
            cells = _cells(lines[row])
            if k < len(cells) and lines[row][slice(*cells[k])].strip():
                start, end = cells[k]
                cell = lines[row][start:end]
                start += len(cell) - len(cell.lstrip())
                found.append(([(row, start, start + len(cell.strip()))], True))
            continue
        slots = []
        for n, content in enumerate(token.content.split("\n")):
            line_no = token.map[0] + n
            text, line = content.strip(), lines[line_no].rstrip() if line_no < len(lines) else ""
            in_item = i >= 2 and tokens[i - 2].type == "list_item_open"
            task = _TASK.match(text) if in_item and n == 0 else None
            footnote = _FOOTNOTE.match(text) if tokens[i - 1].type == "paragraph_open" and not in_item else None
            if task or footnote:  # stays where it is, at the start of the block
                text = text[(task or footnote).end() :]
            if footnote and slots:  # footnote definitions one under the other: each a block of its own
                found.append((slots, False))
                slots = []
            start = len(line) - len(text) if line.endswith(text) else line.rfind(text)
            if start < 0:
                slots = []
                break
            if text:
                slots.append((line_no, start, start + len(text)))
        if slots:
            found.append((slots, False))
    return found


def translate_markdown(text: str, translate_batch: Callable[[list[str]], list[str]], **split) -> str:
    """The Markdown document `text` translated (see the module's docstring); `translate_batch`:
    sentences in, translations out, in order; `split`: the options of segment.split_sentences."""
    env: dict = {}
    lines = text.split("\n")
    front = _front_matter(lines)  # parsed as blank lines, so never translated
    tokens = _parser().parse("\n".join([""] * front + lines[front:]), env)
    labels = set(env.get("references", {}))
    syntax = re.compile("|".join([_SHORTCUT, *_SYNTAX]), re.M)
    markup = Markup(text)

    def code(m: re.Match) -> str:
        piece = m.group()
        if re.fullmatch(_SHORTCUT, piece):
            label = piece[piece.index("[") + 1 : -1]
            if normalizeReference(label) not in labels:  # not a reference: its text is translated
                return markup.code([piece[: piece.index("[") + 1]]) + syntax.sub(code, label) + markup.code(["]"])
        return markup.code([piece])

    groups: list[tuple[list[tuple[int, int, int]], bool]] = []  # the slots of each block
    for slots, is_cell in _slots(tokens, lines):
        group: list[tuple[int, int, int]] = []
        for line_no, start, end in slots:
            trailing = end - start - len(lines[line_no][start:end].rstrip("\\"))
            end -= trailing % 2  # a backslash hard break stays where it is
            group.append((line_no, start, end))
            if (trailing % 2 or lines[line_no][end:].startswith("  ")) and line_no != slots[-1][0]:
                groups.append((group, is_cell))  # a hard break ends a block
                group = []
        groups.append((group, is_cell))
    blocks = [syntax.sub(code, "\n".join(lines[n][a:b] for n, a, b in group)) for group, _ in groups]
    translations = translate_blocks(blocks, translate_batch, **split)
    sources = ["\n".join(lines[n][a:b] for n, a, b in group) for group, _ in groups]
    shapes = [_shape(source, env) for source in sources]
    outputs = [_wrap(markup, t, len(g), is_cell) for (g, is_cell), t in zip(groups, translations)]
    broken = [i for i, out in enumerate(outputs) if _shape("\n".join(out), env) != shapes[i]]
    untranslated = 0  # runs of text that stay as they were
    if broken:  # where the model's placement breaks the syntax, the text between it is translated apart
        runs = [re.split(f"({MARKUP.pattern})", blocks[i]) for i in broken]
        done = iter(translate_blocks([run for pieces in runs for run in pieces[::2]], translate_batch, **split))
        for i, pieces in zip(broken, runs):
            args = (markup, pieces, len(groups[i][0]), groups[i][1], env, shapes[i])
            texts, left = pieces[::2], 0
            # each run's translation in turn, kept where the block still has its syntax with it (a
            # run's edges can change a delimiter's flanking) and where it is not empty; else the run
            # stays as it was
            for k in range(len(texts)):
                t = next(done)
                trial = texts[:k] + [t] + texts[k + 1 :]
                if (t.strip() or not texts[k].strip()) and _fits(*args, trial) is not None:
                    texts = trial
                else:
                    left += not has_no_letter(texts[k])
            outputs[i] = _fits(*args, texts) or sources[i].split("\n")  # the source's own runs: it fits
            untranslated += left
    if untranslated:
        log.warning(
            f"markdown: {untranslated} piece{'s' * (untranslated > 1)} of text kept untranslated: the model's "
            "translation would have changed the document's syntax there (emphasis, links, code spans)"
        )
    edits: dict[int, list[tuple[int, int, str | None]]] = {}
    for (group, _), wrapped in zip(groups, outputs):
        if len(wrapped) < len(group):  # lines dropped: a hard break that ended the block ends its new last line
            line_no, _, end = group[-1]
            wrapped = [*wrapped[:-1], wrapped[-1] + _hard_break(lines[line_no][end:])]
        for k, (line_no, start, end) in enumerate(group):
            edits.setdefault(line_no, []).append((start, end, wrapped[k] if k < len(wrapped) else None))
    out = []
    for n, line in enumerate(lines):
        changes = sorted(edits.get(n, []), reverse=True)
        for start, end, new in changes:
            line = line[:start] + (new or "") + line[end:]
        if not any(new is None for *_, new in changes):  # a line the translation did not need
            out.append(line)
    return "\n".join(out)


def _fits(
    markup: Markup, pieces: list[str], n_lines: int, is_cell: bool, env: dict, shape: list, texts: list[str]
) -> list[str] | None:
    """The block of `pieces` (texts and markup characters) with `texts` in place of its texts,
    as Markdown lines, if its syntax tree is `shape`; else None."""
    trial = list(pieces)
    trial[::2] = texts
    lines = _wrap(markup, "".join(trial), n_lines, is_cell)
    return lines if _shape("\n".join(lines), env) == shape else None


def _shape(inline: str, env: dict) -> list[tuple]:
    """The syntax tree of a piece of inline Markdown without its text."""
    tokens = _parser().parseInline(inline, dict(env))[0].children or []
    return [
        (t.type, t.tag, t.nesting, dict(t.attrs) if t.type != "image" else t.attrs.get("src"))
        + ((t.content,) if t.type in ("code_inline", "html_inline") else ())
        for t in tokens
        if t.type not in ("text", "softbreak")
    ]


def _wrap(markup: Markup, translation: str, n_lines: int, is_cell: bool) -> list[str]:
    """A translated block as Markdown on at most `n_lines` lines: text escaped, markup put back,
    broken at the spaces nearest equal shares of its length."""
    text, spaces = "", []
    for part in markup.split(translation):
        if isinstance(part, str):
            part = _ESCAPE.sub(lambda m: "\\" + m.group(), " ".join(part.split("\n")))
            part = part.replace("|", "\\|") if is_cell else part
            spaces += [(len(text) + m.start(), len(text) + m.end()) for m in re.finditer(r" +", part)]
        text += part if isinstance(part, str) else part[0]
    breaks: list[tuple[int, int]] = []
    wanted = n_lines - 1 - text.count("\n")
    for j in range(1, wanted + 1):
        later = [s for s in spaces if s[0] > 0 and s[1] < len(text) and (not breaks or s[0] > breaks[-1][1])]
        if later:
            breaks.append(min(later, key=lambda s: abs(s[0] - len(text) * j / (wanted + 1))))
    for start, end in reversed(breaks):
        text = text[:start] + "\n" + text[end:]
    return [_LINE_START.sub(_escape_start, line) for line in text.split("\n")]


def _hard_break(tail: str) -> str:
    """The hard line break that the rest of a line after its text is (a backslash, two spaces or
    more), or ''."""
    tail = tail.removesuffix("\r")  # a CRLF line's: stays where it is
    return "\\" if tail.startswith("\\") else tail if tail.startswith("  ") and not tail.strip(" ") else ""


def _escape_start(m: re.Match) -> str:
    return m.group() + "\\" if m.group()[0].isdigit() else "\\" + m.group()
