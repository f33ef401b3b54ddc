"""Protected spans: text that must come out of translation byte for byte (placeholders, markup,
URLs, numbers ...).

Before encoding, `mask` replaces each protected span by a placeholder piece `⦅0⦆`, `⦅1⦆` ...
(U+2985/U+2986, unchanged by SentencePiece's NFKC normalisation; they are user-defined
symbols of the vocabulary, so each is one piece). After decoding, `unmask` puts the original
spans back where the model put their placeholders. `repair` first makes sure every placeholder
of the source appears exactly once in the output: duplicates are dropped, missing ones are
inserted at the end (before the final punctuation).

The classes of spans (config `data.protect` for training, `decode.protect` for decoding):

    printf   %s  %d  %5.2f  %1$s  %(name)s  %@          (not the escape %%)
    format   {}  {0}  {count}  {name!r:>10}  {0:.2f}  {count, number}   (not the escapes {{ }})
    tag      <b>  </b>  <br/>  <a href="...">  <img src='x' />
    url      https://example.com/a?b=c  ftp://...  www.example.org  (trailing .,;:!?)]} left out, but for a
             closing bracket the URL opened: wiki/Foo_(bar))
    email    someone@example.com
    path     /usr/local/bin  ~/notes.txt  ./run.sh  C:\\Users\\me\\file.txt  \\\\server\\share
    number   42  3.14  1,000,000  1.2.3  -5  +3.5  2024-01-15  15/01/2024  10:30  555-1234  10-20
             +33 1 23 45 67 89  (555) 123-4567   (whole or not at all: 10:30am is left to the model)

Where spans overlap, the one starting first wins, then the longest (a URL inside a tag
attribute is part of the tag; a number inside a URL part of the URL). Spans that touch share one
placeholder (`<b>%s</b>`: the model cannot part them; a unit with markup begins and ends with it, and
such units come back in the source's order, as markup.py puts markup back), and markup that wraps a
whole sentence with no other markup inside (a link, an image's text; a final . ! ? after it stays
outside) is taken off before and put back around the translation (`mask_sentence`).

Three more kinds of span are protected whatever the classes:

    markup   a private-use character (U+E000-U+F8FF, planes 15 and 16): markup.py stands one for each inline
             tag or piece of Markdown syntax within a sentence; no other span runs across one
    term     an entry of a glossary (glossary.py): it comes back as the entry's target term
    literal  a placeholder's own text in the input (`⦅1⦆`): it comes back as it was, not as a span of its own

and, with the classes (not with `--no-protect`), at decoding:

    unknown  a run of characters the vocabulary has no piece for (emoji, a script it never saw), outside
             the other spans and words it can read (`Hello 😀 world`, the `€` of `€25.99`, not the ’ of
             `don’t`): copied, where the model would have made up words for unknown pieces
             (UnknownCharacters)

A glossary's terms compete with the classes' spans by the same rule (the first to start wins,
then the longest): a term inside a URL or a tag is part of it and left alone, a term that
starts before a number it contains ("Windows 10") wins over the number.

Training (`augment_pairs`): a share `data.protect_share` of the train pairs is added a second
time, with placeholders: spans of the classes above, and capitalised names, that occur verbatim
and once on both sides are replaced by the same placeholder on both sides; pairs without any get
a synthetic one inserted at the same relative word position on both sides. The original pairs
all stay, so the model loses none of the prose it learns from. Placeholder numbers are drawn at
random, so every one of them is trained.
"""

from __future__ import annotations

import itertools
import logging
import random
import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol

from translate.errors import UserError

log = logging.getLogger("translate")

CLASSES = ("printf", "format", "tag", "url", "email", "path", "number")
MAX_PLACEHOLDERS = 20  # spans beyond these in one line are left as they are
OPEN, CLOSE = "\u2985", "\u2986"
PLACEHOLDER = re.compile(f"{OPEN}(\\d+){CLOSE}")
_RUN_IN = re.compile(f"{PLACEHOLDER.pattern}(?=[^\\W\\d_])")  # a placeholder followed by a letter

_END = r"[^\s<>\"'.,;:!?)\]}]"  # the last character of a URL: no trailing punctuation (a closing bracket: see _closed)
PATTERNS: dict[str, str] = {
    "printf": r"%\([A-Za-z_]\w*\)[-+0#]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa]"
    r"|%(?:\d+\$)?[-+0#']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|q|j|z|t)?[diouxXeEfFgGaAcspn@]",
    # the spec and the ICU parts bounded: an unclosed brace followed by commas is not searched again from each one
    "format": r"\{(?:[A-Za-z_]\w*(?:\.\w+|\[\w+\])*|\d*)(?:![rsa])?(?::[^{}]{0,64})?(?:,\s*\w+(?:,[^{}]{0,64})?)?\}",
    "tag": r"</?[A-Za-z][\w:.-]*(?:\s+[\w:.-]+(?:\s*=\s*(?:\"[^\"]*\"|'[^']*'|[^\s\"'=<>`]+))?)*\s*/?>",
    "url": rf"\b(?:https?|ftp|file)://[^\s<>\"']*{_END}|\bwww\.[^\s<>\"']*{_END}",
    # the parts no longer than RFC 5321's: a long run of these characters is not scanned again from each of its letters
    "email": r"\b[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63})*\.[A-Za-z]{2,63}\b",
    "path": r"(?<![\w/:.\\])(?:~|\.\.?)?(?:/[\w.-]*[\w-])+/?"
    r"|\b[A-Za-z]:\\(?:[\w.-]*[\w-]\\?)*|\\\\[\w.-]+(?:\\[\w.-]*[\w-])+",
    # a sign, groups of digits joined by . , - : / (3.14, 1,000, 2024-01-15, 10:30, 555-1234, 15/01/2024), taken
    # whole or not at all (10:30am: none of it, not 10); a telephone number in groups (+33 1 23 45 67 89, (555) 123-4567)
    "number": r"(?<![\w.,])(?:(?:\+\d{1,3}|\(\d{1,4}\))(?:[ .\-]\d{1,4}){2,6}(?![\w.,]?\d)"
    r"|(?=([+\-\u2212]?\d+(?:[.,:/\-\u2013]\d+)*))\1)(?![\w])",
}
_ESCAPES = {"printf": r"%%", "format": r"\{\{|\}\}"}  # consumed, never protected
_COMPILED = {name: re.compile(p) for name, p in PATTERNS.items()}
_ESCAPES_COMPILED = {name: re.compile(p) for name, p in _ESCAPES.items()}
_NAME = re.compile(r"\b[A-Z][\w'-]{2,}\b")


PRIVATE_USE = ((0xE000, 0xF8FF), (0xF0000, 0xFFFFD), (0x100000, 0x10FFFD))  # Unicode's three areas
MARKUP = re.compile("[" + "".join(f"{chr(a)}-{chr(b)}" for a, b in PRIVATE_USE) + "]")


class Terms(Protocol):
    """What masking needs of a glossary (glossary.Glossary): its terms' spans in a text."""

    def find(self, text: str) -> list[Span]: ...

    def __bool__(self) -> bool: ...


@dataclass(frozen=True)
class Span:
    start: int
    end: int
    text: str
    kind: str  # a class of CLASSES, "markup", "literal", "term", "unknown" or "escape"
    output: str | None = None  # what comes back in its place (None: the text itself)


def placeholder(i: int) -> str:
    return f"{OPEN}{i}{CLOSE}"


def placeholder_symbols() -> list[str]:
    """The user-defined SentencePiece symbols: one piece per placeholder."""
    return [placeholder(i) for i in range(MAX_PLACEHOLDERS)]


def check_classes(classes: Sequence[str], key: str) -> str | None:
    """Why `classes` is not a list of known span classes, or None."""
    unknown = [c for c in classes if c not in CLASSES]
    if unknown:
        return f"{key}: unknown span class {unknown[0]!r}; known: {', '.join(CLASSES)}"
    return None


def find_spans(
    text: str,
    classes: Sequence[str] = CLASSES,
    glossary: Terms | None = None,
    unknown: UnknownCharacters | None = None,
) -> list[Span]:
    """The protected spans of `text`, left to right, not overlapping (leftmost, then longest wins):
    the classes' spans, the markup characters, the glossary's terms, and the runs of characters the
    vocabulary lacks outside them (`unknown`)."""
    shadow = MARKUP.sub(" ", text)  # no class's span runs across markup
    found = [
        Span(m.start(), end, text[m.start() : end], kind)
        for kind in classes
        for m in _COMPILED[kind].finditer(shadow)
        if (end := _closed(shadow, m.start(), m.end()) if kind == "url" else m.end()) > m.start()
    ]
    found += [
        Span(m.start(), m.end(), m.group(), "escape")
        for kind in classes
        if kind in _ESCAPES_COMPILED
        for m in _ESCAPES_COMPILED[kind].finditer(shadow)
    ]
    found += [Span(m.start(), m.end(), m.group(), "markup") for m in MARKUP.finditer(text)]
    found += [Span(m.start(), m.end(), m.group(), "literal") for m in PLACEHOLDER.finditer(text)]
    if glossary is not None:
        found += glossary.find(text)
    if unknown is not None:
        found += unknown.find(text, first_then_longest(found))  # outside the spans that win
    return [s for s in first_then_longest(found) if s.kind != "escape"]


def _closed(text: str, start: int, end: int) -> int:
    """The end of the URL text[start:end] with the closing brackets that follow it and close one it
    opened (wiki/Foo_(bar), a[1]); a bracket the URL did not open is the sentence's."""
    unclosed = {close: text.count(open_, start, end) - text.count(close, start, end) for open_, close in ("()", "[]")}
    while end < len(text) and unclosed.get(text[end], 0) > 0:
        unclosed[text[end]] -= 1
        end += 1
    return end


def first_then_longest(spans: Iterable[Span]) -> list[Span]:
    """The spans that do not overlap one chosen before them, taken by start, then longest first
    (an escape that wins is returned too, for the caller to drop)."""
    chosen: list[Span] = []
    taken = 0
    for span in sorted(spans, key=lambda s: (s.start, -s.end, s.kind != "escape")):
        if span.start >= taken:
            chosen.append(span)
            taken = span.end
    return chosen


def mask(
    text: str,
    classes: Sequence[str] = CLASSES,
    glossary: Terms | None = None,
    unknown: UnknownCharacters | None = None,
) -> tuple[str, list[str]]:
    """Replace the protected spans by ⦅0⦆, ⦅1⦆ ... (left to right); return the text and what
    comes back in place of each (a span's original text, a term's target), item i for ⦅i⦆.
    Spans that touch share one placeholder (`<b>cloud</b>` with a glossary's term: the model cannot
    move the term out of its tags), but for those before the first markup or after the last markup
    of such a run: a unit that holds markup begins and ends with it (`x</b>` would carry the text
    into the slot of other markup, see Masked.restore). At most MAX_PLACEHOLDERS placeholders are made: the
    runs of characters the vocabulary lacks are left unmasked first, then the last spans."""
    touching: list[list[Span]] = []
    for span in find_spans(text, classes, glossary, unknown):
        if touching and touching[-1][-1].end == span.start:
            touching[-1].append(span)
        else:
            touching.append([span])
    runs = []
    for run in touching:
        marks = [i for i, span in enumerate(run) if span.kind == "markup"]
        cuts = [0, marks[0], marks[-1] + 1, len(run)] if marks else [0, len(run)]
        runs += [run[a:b] for a, b in zip(cuts, cuts[1:]) if b > a]
    if len(runs) > MAX_PLACEHOLDERS:  # the characters a vocabulary lacks give way first, then the last spans
        spare = MAX_PLACEHOLDERS - sum(any(s.kind != "unknown" for s in run) for run in runs)
        runs = [run for run in runs if any(s.kind != "unknown" for s in run) or (spare := spare - 1) >= 0]
        runs = runs[:MAX_PLACEHOLDERS]
    parts, last = [], 0
    for i, run in enumerate(runs):
        parts += [text[last : run[0].start], placeholder(i)]
        last = run[-1].end
    parts.append(text[last:])
    return "".join(parts), ["".join(s.text if s.output is None else s.output for s in run) for run in runs]


_HEAD = re.compile(rf"(?:\s|{MARKUP.pattern})*")
_END_PUNCTUATION = ".!?…"  # may follow the wrapping markup and stay outside it: [Read the docs](/d).


def _wrapping(text: str) -> tuple[str, str, str]:
    """(head, inner, tail): the markup (and spaces) that open and close `text`, a final full stop,
    question or exclamation mark after the closing markup going with the tail."""
    start = _HEAD.match(text).end()
    end = len(text.rstrip())
    while end > start and text[end - 1] in _END_PUNCTUATION:
        end -= 1
    punctuated = end
    while end > start and (text[end - 1].isspace() or MARKUP.match(text, end - 1)):
        end -= 1
    if end == punctuated:  # no markup closes it: the punctuation is the text's
        end = len(text)
        while end > start and (text[end - 1].isspace() or MARKUP.match(text, end - 1)):
            end -= 1
    return text[:start], text[start:end], text[end:]


@dataclass(frozen=True)
class Masked:
    """A sentence as the model gets it (`text`), and what makes its translation whole again."""

    text: str
    spans: list[str]  # what comes back in place of ⦅i⦆
    head: str = ""  # markup around the whole sentence, put back around the translation
    tail: str = ""

    def restore(self, output: str) -> tuple[str, bool]:
        """The translation of the sentence from the model's `output`; and whether a placeholder was repaired.
        The placeholders of spans that hold markup come back in the source's order, each whole (markup.py
        puts markup back in that order: a unit `<b>%s</b>` moved before `<i>%d</i>` would otherwise lend
        its tags to the other's text); the others where the model put them."""
        fixed, changed = repair(output, len(self.spans))
        marked = {i for i, span in enumerate(self.spans) if MARKUP.search(span)}
        if marked:
            order = iter(sorted(int(m.group(1)) for m in PLACEHOLDER.finditer(fixed) if int(m.group(1)) in marked))
            fixed = PLACEHOLDER.sub(
                lambda m: placeholder(next(order)) if int(m.group(1)) in marked else m.group(), fixed
            )
        # a placeholder the model ran into the next word (⦅0⦆vêtez) is parted from it, where the source's was not
        joined = {m.group(1) for m in PLACEHOLDER.finditer(self.text) if self.text[m.end() : m.end() + 1].isalnum()}
        fixed = _RUN_IN.sub(lambda m: m.group() if m.group(1) in joined else m.group() + " ", fixed)
        return self.head + unmask(fixed, self.spans) + self.tail, changed


def mask_sentence(
    text: str,
    classes: Sequence[str] = CLASSES,
    glossary: Terms | None = None,
    unknown: UnknownCharacters | None = None,
) -> Masked:
    """`mask`, after taking off the markup that wraps the whole sentence where no other markup is
    inside it (a link, a heading's emphasis, an image whose text is the whole sentence): the model
    translates the text alone, and the wrapping goes back around its translation (given the link
    as two placeholders around one word, a model may leave the word out)."""
    head, inner, tail = _wrapping(text)
    if not MARKUP.search(head + tail) or MARKUP.search(inner) or not inner.strip():
        head, inner, tail = "", text, ""
    return Masked(*mask(inner, classes, glossary, unknown), head, tail)


def unmask(output: str, spans: Sequence[str]) -> str:
    """Put each span back in place of its placeholder, wherever the model put it. Placeholders of
    no span (a number the source did not have) are removed."""
    return PLACEHOLDER.sub(lambda m: spans[int(m.group(1))] if int(m.group(1)) < len(spans) else "", output)


def repair(output: str, n_spans: int) -> tuple[str, bool]:
    """Make each of ⦅0⦆..⦅n-1⦆ appear exactly once in `output`: keep the first of duplicates, drop
    placeholders of no span, add the missing ones at the end (before the final punctuation).
    Returns the repaired output and whether anything had to change."""
    seen: set[int] = set()

    def keep(m: re.Match) -> str:
        i = int(m.group(2))
        if i >= n_spans or i in seen:
            return "" if m.group(1) or m.end() == len(output) else m.group(1)
        seen.add(i)
        return m.group(0)

    text = re.sub(f"( ?){PLACEHOLDER.pattern}", keep, output)
    missing = [i for i in range(n_spans) if i not in seen]
    if missing:
        body, end = re.match(r"(.*?)([\s.!?:;…]*)$", text, re.S).groups()
        added = " ".join(placeholder(i) for i in missing)
        text = " ".join([body, added]).strip() + end.rstrip()  # no space left at the end
    return text, text != output


# ---------------------------------------------------------------------------- decoding


def has_placeholders(tokenizer) -> bool:
    """Whether the vocabulary holds every placeholder as one piece (it was trained with data.protect)."""
    return all(tokenizer.sp.piece_to_id(s) != tokenizer.sp.unk_id() for s in placeholder_symbols())


class UnknownCharacters:
    """The runs of characters a vocabulary has no piece for (emoji, a script it never saw, digits in a
    vocabulary of words alone) outside the other spans, in a word of no letter or digit it knows
    (`😀`, `(😀)`, `€` of `€25.99` beside its number): the model would see unknown pieces and make up
    words for them; as a span they come back as they are (and one that touches a number goes with
    it). Runs with only spaces between them are one span (each would take one of a line's
    placeholders). A word with letters the vocabulary knows (`don’t` where ’ is unknown, `10:30am`)
    is left to the model whole."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer  # its encode: a character it reads as another (’ as ') is known
        self.unknown: dict[str, bool] = {}  # by character, as met

    def _learn(self, text: str) -> bool:
        """Whether `text` has a character the vocabulary lacks; those not met before are looked up in
        one call of the tokenizer."""
        chars = set(text)
        if new := [c for c in chars if c not in self.unknown]:
            unk = self.tokenizer.sp.unk_id()
            for char, ids in zip(new, self.tokenizer.encode(new), strict=True):
                self.unknown[char] = not MARKUP.match(char) and unk in ids  # markup: spans of its own
        return any(self.unknown[c] for c in chars)

    def find(self, text: str, taken: Iterable[Span] = ()) -> list[Span]:
        """The spans of `text`'s runs of unknown characters outside the spans `taken`."""
        if not self._learn(text):
            return []
        unknown = self.unknown
        depth = [0] * (len(text) + 1)
        for span in taken:
            depth[span.start] += 1
            depth[span.end] -= 1
        covered = list(itertools.accumulate(depth))  # > 0 inside a span taken
        runs: list[list[int]] = []
        for word in re.finditer(r"\S+", text):
            a, b = word.span()
            free = [i for i in range(a, b) if not covered[i]]
            if any(text[i].isalnum() and not unknown[text[i]] for i in free):
                continue  # a word the model reads: left to it
            for i in free:
                if not unknown[text[i]]:
                    continue
                if runs and (runs[-1][1] == i or text[runs[-1][1] : i].isspace()):
                    runs[-1][1] = i + 1  # the run goes on, or the one before it across spaces
                else:
                    runs.append([i, i + 1])
        return [Span(a, b, text[a:b], "unknown") for a, b in runs]


class Protector:
    """Masks the lines going into translation and restores the translations coming out, in order
    (a FIFO of the lines' spans: translations come back in input order)."""

    warned = False  # about a vocabulary without placeholders, once per process

    def __init__(self, classes: Sequence[str], tokenizer, glossary: Terms | None = None) -> None:
        self.classes = list(classes)
        self.glossary = glossary if glossary else None
        # on without classes too: a document's markup and a typed placeholder are protected whatever the classes
        self.enabled = has_placeholders(tokenizer)
        if self.glossary and not self.enabled:
            raise UserError(NO_PLACEHOLDERS_FOR_GLOSSARY)
        if self.classes and not self.enabled and not Protector.warned:
            Protector.warned = True
            log.warning("this vocabulary has no placeholder pieces (data.protect_share was 0): spans not protected")
        # with the classes (not with --no-protect): the characters the vocabulary lacks, outside words
        self.unknown = UnknownCharacters(tokenizer) if self.classes and self.enabled else None
        self.pending: deque[Masked] = deque()
        self.lines = self.repaired = 0

    def mask_lines(self, lines: Iterable[str]) -> Iterator[str]:
        if not self.enabled:
            yield from lines
            return
        for line in lines:
            masked = mask_sentence(line, self.classes, self.glossary, self.unknown)
            self.pending.append(masked)
            yield masked.text

    def restore(self, translations: Iterable[list[tuple[str, float]]]) -> Iterator[list[tuple[str, float]]]:
        if not self.enabled:
            yield from translations
            return
        for nbest in translations:
            masked = self.pending.popleft()
            self.lines += 1
            out, seen = [], set()
            for k, (text, score) in enumerate(nbest):
                restored, changed = masked.restore(text)
                self.repaired += changed and k == 0
                if restored not in seen:  # hypotheses that differ only in their placeholders: one text, the best
                    seen.add(restored)
                    out.append((restored, score))
            yield out + out[-1:] * (len(nbest) - len(out))  # as many as asked, the last repeated (as the search does)
        if (tally := _REPAIRS.get()) is not None:  # said once, for all, by repairs_counted
            tally[0] += self.lines
            tally[1] += self.repaired
        elif self.repaired:
            log.warning(repair_warning(self.lines, self.repaired))


_REPAIRS: ContextVar[list[int] | None] = ContextVar("protect_repairs", default=None)


def repair_warning(lines: int, repaired: int) -> str:
    return (
        f"{repaired} of {lines} translations (sentences, or lines with --no-split): the model did not place every "
        "protected span exactly once; the missing ones were added at the end (before the final punctuation), "
        "duplicates dropped"
    )


@contextmanager
def repairs_counted(tally: list[int]) -> Iterator[None]:
    """The Protectors of this context within it add their counts (lines, repaired) to `tally` rather
    than warn each (a file translated a chunk of lines at a time warns once, see warn_repairs). Not
    to be held open across a generator's yield: the caller's context would keep it."""
    token = _REPAIRS.set(tally)
    try:
        yield
    finally:
        _REPAIRS.reset(token)


def warn_repairs(tally: list[int]) -> None:
    if tally[1]:
        log.warning(repair_warning(*tally))


NO_PLACEHOLDERS_FOR_GLOSSARY = (
    "a glossary needs a model whose vocabulary has placeholder pieces (trained with data.protect_share > 0)"
)


def protected(
    translate_batch: Callable[[list[str]], list[str]],
    classes: Sequence[str] = CLASSES,
    glossary: Terms | None = None,
    tokenizer=None,
) -> Callable[[list[str]], list[str]]:
    """`translate_batch` (sentences in, translations out, placeholders passed through as they are)
    with the spans of `classes`, the markup characters, the glossary's terms and (given the model's
    `tokenizer`, with classes) the characters it has no piece for masked before and restored after,
    as Protector does inside decoding."""
    unknown = UnknownCharacters(tokenizer) if tokenizer is not None and classes else None

    def translate(sentences: list[str]) -> list[str]:
        masked = [mask_sentence(s, classes, glossary, unknown) for s in sentences]
        outputs = translate_batch([m.text for m in masked]) if masked else []
        return [m.restore(out)[0] for out, m in zip(outputs, masked, strict=True)]

    return translate


# ---------------------------------------------------------------------------- training


def _shared(src: str, tgt: str, classes: Sequence[str]) -> list[str]:
    """Texts of spans (and capitalised names) found exactly once on each side."""
    texts = [s.text for s in find_spans(src, classes)] + _NAME.findall(src)
    out = []
    for t in dict.fromkeys(texts):
        edge = rf"(?<!\w){re.escape(t)}(?!\w)"
        if len(re.findall(edge, src)) == 1 and len(re.findall(edge, tgt)) == 1:
            out.append(t)
    return out


def _replace(text: str, spans: dict[str, str]) -> str:
    for old, new in spans.items():
        text = re.sub(rf"(?<!\w){re.escape(old)}(?!\w)", lambda _, new=new: new, text, count=1)
    return text


def _insert(text: str, where: float, symbol: str) -> str:
    words = text.split(" ")
    k = round(where * len(words))
    return " ".join(words[:k] + [symbol] + words[k:])


def augment_pair(src: str, tgt: str, classes: Sequence[str], rng: random.Random) -> tuple[str, str]:
    """One pair with placeholders: shared spans replaced on both sides, or one synthetic inserted."""
    shared = _shared(src, tgt, classes)
    ids = rng.sample(range(MAX_PLACEHOLDERS), MAX_PLACEHOLDERS)
    if shared:
        chosen = rng.sample(shared, rng.randint(1, min(len(shared), 3)))
        names = {t: placeholder(i) for t, i in zip(sorted(chosen, key=len, reverse=True), ids)}
        src, tgt = _replace(src, names), _replace(tgt, names)
    if not shared or rng.random() < 0.3:
        where, symbol = rng.random(), placeholder(ids[-1])
        src, tgt = _insert(src, where, symbol), _insert(tgt, where, symbol)
    return src, tgt


def augment_pairs(
    pairs: Iterable[tuple[str, str]], classes: Sequence[str], share: float, seed: int
) -> Iterator[tuple[str, str]]:
    """The train pairs, each followed, for a `share` of them (drawn with `seed`), by a copy with
    placeholders (`augment_pair`)."""
    rng = random.Random(seed)
    for src, tgt in pairs:
        yield src, tgt
        if share > 0 and rng.random() < share:
            yield augment_pair(src, tgt, classes, rng)
