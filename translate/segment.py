"""Paragraphs -> sentences -> translations -> paragraphs.

A line of input may hold a paragraph of several sentences; the model was trained on single
sentences (the Bible's verses) and drops whole sentences of a long line. `translate_paragraphs`
splits every line into sentences, translates all the sentences of all the lines in one call of
`translate_batch` (so they share batches), and joins each line's translations back with the
whitespace that separated its sentences.

The segmenter is `sentencex` (Wikimedia, MIT, a Rust core, maintained): on English prose it
agrees with pysbd on abbreviations ("Mr.", "Dr.", "e.g.", "p.m.", "U.S."), numbers ("3.5",
"1.2.3"), quotes and Bible verses, keeps URLs whole where pysbd cuts them at "?", runs about
1000 times faster, and returns pieces whose concatenation is the text, so no whitespace is lost.
pysbd has had no release since 2021. On top of it, these rules:

- quotation marks do not hold sentences together: sentencex never cuts between a pair of them,
  and a quotation of several sentences, or one opened before the line (a verse that goes on a
  quotation of the one before), made everything up to the next mark one sentence; it is given
  the text with its quotation marks (not an apostrophe within a word) hidden, the cuts are put
  back before an opening mark and after a closing one, and a cut after a quotation followed by
  a lower-case word (`"Why?" she asked.`) is dropped;
- English sentence ends that sentencex takes for abbreviations are cut too: a lower-case word
  of two letters or more (but a few lower-case abbreviations: `et al.`, `vs.`, `fig.` ...) or
  "I" after one, then `.`, `?` or `!`, then a capital (`follow me. I give`: "me." is Maine's
  abbreviation to it; `nearer than I. Stay`: "I." an initial);
- and the other way: no cut after a title (`Dr. Who`, `Mr.`, `St.` ...) or after one of those
  lower-case abbreviations before what is not a capital (`approx. 5`, `approx. ten`);
- a sentence ends at whitespace: a cut the segmenter makes between a full stop and the next
  non-space character (`word.</b> Next`, `"Go."Then`) moves to the following whitespace, but
  before a document's markup that runs into the next sentence's first word (`here.<br>The`:
  the markup starts the next sentence), and a cut inside a protected span (a URL, an e-mail
  address, a number: translate/protect.py) is dropped;
- a sentence longer than `max_tokens` (counted by `count_tokens`, e.g. the model's pieces) is cut
  in two at the clause punctuation (`,;:` and dashes, followed by a space) nearest its middle, or
  else at the space nearest its middle, or else (a part without any space) at its middle
  character, again until every part fits; the parts join back without a space where there was none.

A line of one sentence (within the budget) is translated exactly as without splitting.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence

import sentencex

from translate.protect import MARKUP, find_spans

_SPACE = re.compile(r"\s+")
_MARKUP_RUN = re.compile(f"(?:{MARKUP.pattern})+")
_CLAUSE = re.compile(r"[,;:\u2013\u2014](?=\s)|\s[-\u2013\u2014](?=\s)")
# Quotation marks, hidden from the segmenter (an apostrophe within a word is not one)
_QUOTE = re.compile(r"(?<!\w)['\u2019]|['\u2019](?!\w)|[\"\u00ab\u00bb\u2018\u201a-\u201f\u2039\u203a\u300a-\u300d]")
_FIRST_LETTER = re.compile(r"[^\W\d_]")
# English sentence ends the segmenter misses: after a lower-case word (not an abbreviation of
# these) or "I" after one, a full stop, ? or !, and a capital: "... follow me. I give ...",
# "... with me. Father ...", "... nearer than I. Stay ..." (group 1: the whitespace after it)
_LOWER_ABBREVIATIONS = "|".join(
    "al approx ca cf ch cit dept ed eds esp est fig figs ibid incl no nos op pp resp sec viz vol vols vs".split()
)
# Cuts the segmenter makes after an abbreviation that no sentence ends with: a title before a name
# (`Dr. Who`), or a lower-case abbreviation before what is not a capital (`approx. 5`)
_TITLES = "Capt Col Dr Gen Hon Jr Lt Mr Mrs Ms Mt Prof Rev Sgt Sr St"
_ABBREVIATION = re.compile(rf"(?<![^\W\d_])(?:(?P<title>{'|'.join(_TITLES.split())})|(?:{_LOWER_ABBREVIATIONS}))[.]$")
_MISSED_END = re.compile(
    rf"(?<![^\W\d_])(?!(?:{_LOWER_ABBREVIATIONS})[.])(?:[a-z]{{2,}}|[a-z]+ I)[.!?]"
    r"['\"\u2019\u201d)\]]*(\s+)(?=['\"\u2018\u201c(\[]*[A-Z])"
)


def sentence_cuts(text: str, language: str = "en") -> list[int]:
    """Offsets at which `text` is cut into sentences (each cut after the whitespace that ends a
    sentence); [] for one sentence."""
    unquoted = _QUOTE.sub(" ", text)  # one character for one: the offsets are the text's
    pieces = list(sentencex.segment(language, unquoted))
    if "".join(pieces) != unquoted:  # never expected: then the line is one sentence
        return []
    found = []  # (where the segmenter's sentence ends, the whitespace after it)
    offset = 0
    for piece in pieces[:-1]:
        offset += len(piece)
        found.append((offset, range(offset - (len(piece) - len(piece.rstrip())), offset)))
    if language == "en":
        found += [(m.start(1), range(m.start(1), m.end(1))) for m in _MISSED_END.finditer(text)]
    spans = find_spans(text)
    cuts = []
    for offset, blank in sorted(found, key=lambda f: f[0]):
        # the blank may hold quotation marks: a closing one stays with this sentence, an opening
        # one goes with the next (the cut is after the blank's last real whitespace)
        if spaces := [i for i in blank if text[i].isspace()]:
            cut = spaces[-1] + 1
        elif (run := _MARKUP_RUN.match(text, offset)) and run.end() < len(text) and not text[run.end()].isspace():
            cut = offset  # markup between two sentences, no space (`here.<br>The`): the next sentence's start
        elif not text[offset - 1].isspace():
            space = _SPACE.search(text, offset)
            if space is None:
                continue
            cut = space.end()
        else:
            cut = offset
        if any(s.start < offset < s.end for s in spans) or (cuts and cut <= cuts[-1]) or cut >= len(text):
            continue
        if (abbreviation := _ABBREVIATION.search(text, 0, blank.start)) and (
            abbreviation.group("title") or not text[cut].isupper()
        ):
            continue
        if _QUOTE.search(text, blank.start, cut) and (start := _FIRST_LETTER.search(text, cut)):
            if start.group().islower():  # `"Why?" she asked.`: the quotation goes on the sentence
                continue
        cuts.append(cut)
    return cuts


def split_sentences(
    text: str,
    *,
    max_tokens: int | None = None,
    count_tokens: Callable[[str], int] | None = None,
    protected_spans: Callable[[str], list[tuple[int, int]]] | None = None,
    language: str = "en",
) -> tuple[list[str], list[str]]:
    """The sentences of `text` (stripped, none empty) and the whitespace around them: `gaps` has
    one more item than `sentences`, and gaps[0] + s[0] + gaps[1] + ... + s[-1] + gaps[-1] == text.
    A blank text has no sentences and gaps == [text]."""
    bounds, last = [], 0
    for cut in [*sentence_cuts(text, language), len(text)]:
        part = text[last:cut]
        if part.strip():
            start = last + len(part) - len(part.lstrip())
            end = start + len(part.strip())
            if max_tokens is None:
                bounds.append((start, end))
            else:
                parts = fit_budget(text[start:end], max_tokens, count_tokens, protected_spans)
                bounds += [(start + a, start + b) for a, b in parts]
        last = cut
    ends = [0] + [end for _, end in bounds]
    starts = [start for start, _ in bounds] + [len(text)]
    return [text[a:b] for a, b in bounds], [text[a:b] for a, b in zip(ends, starts)]


def _words(text: str) -> int:
    return len(text.split())


def _joined(text: str, i: int) -> bool:
    """Whether text[i] belongs with the character before it: a combining mark or a zero-width joiner's."""
    return unicodedata.category(text[i]).startswith("M") or "\u200d" in text[i - 1 : i + 1]


def fit_budget(
    sentence: str,
    max_tokens: int,
    count_tokens: Callable[[str], int] | None = None,
    protected_spans: Callable[[str], list[tuple[int, int]]] | None = None,
) -> list[tuple[int, int]]:
    """The (start, end) offsets of the parts of `sentence` (stripped) of at most `max_tokens`
    each (see the module's docstring); words by default. Never inside a span of `protected_spans`
    (a URL, a glossary's term: what the model gets as one placeholder)."""
    count_tokens = count_tokens or _words
    if count_tokens(sentence) <= max_tokens:
        return [(0, len(sentence))]
    inside = bytearray(len(sentence) + 1)  # 1 where a cut would part a protected span
    for a, b in protected_spans(sentence) if protected_spans else []:
        inside[a + 1 : b] = b"\x01" * max(b - a - 1, 0)

    def free(i: int) -> bool:
        return not inside[i]

    middle = len(sentence) / 2
    clauses = [m.end() for m in _CLAUSE.finditer(sentence) if free(m.end())]
    cuts = clauses or [m.start() for m in _SPACE.finditer(sentence) if free(m.start())]
    if not cuts:  # no space at all (a long token, a language written without spaces): the middle character
        cut = next(
            (i for i in [*range(len(sentence) // 2, 0, -1), *range(len(sentence) // 2 + 1, len(sentence))]
             if not _joined(sentence, i) and free(i)),  # not between a letter and its mark (an accent, a vowel sign)
            None,
        )  # fmt: skip
        if cut is None:
            return [(0, len(sentence))]
        cuts = [cut]
    cut = min(cuts, key=lambda i: abs(i - middle))
    left = sentence[:cut].rstrip()
    space = _SPACE.match(sentence, cut)
    right_start = space.end() if space else cut
    right = sentence[right_start:]
    return fit_budget(left, max_tokens, count_tokens, protected_spans) + [
        (right_start + a, right_start + b) for a, b in fit_budget(right, max_tokens, count_tokens, protected_spans)
    ]


def join_sentences(translations: Sequence[str], gaps: Sequence[str], outer: bool = True) -> str:
    """The inverse of split_sentences with each sentence replaced by its translation; without the
    whitespace before the first and after the last sentence when `outer` is False."""
    if not translations:
        return gaps[0] if outer else ""
    parts = [gaps[0] if outer else ""]
    for translation, gap in zip(translations, gaps[1:]):
        parts += [translation, gap]
    if not outer:
        parts[-1] = ""
    return "".join(parts)


def translate_texts(
    texts: Sequence[str],
    translate_batch: Callable[[list[str]], list[str]],
    *,
    outer: bool = True,
    skip: Callable[[str], bool] | None = None,
    **split,
) -> list[str]:
    """Each text split into sentences, every sentence of every text translated in one call of
    `translate_batch`, and joined back (`outer`: keep the whitespace around the first and last
    sentence). Sentences for which `skip` is true are kept as they are. `split`: the options
    of split_sentences."""
    splits = [split_sentences(text, **split) for text in texts]
    todo = [s for sentences, _ in splits for s in sentences if not (skip and skip(s))]
    done = iter(translate_batch(todo) if todo else [])
    out = []
    for sentences, gaps in splits:
        translations = [s if skip and skip(s) else next(done) for s in sentences]
        out.append(join_sentences(translations, gaps, outer))
    return out


def translate_paragraphs(
    lines: Sequence[str],
    translate_batch: Callable[[list[str]], list[str]],
    *,
    max_tokens: int | None = None,
    count_tokens: Callable[[str], int] | None = None,
    protected_spans: Callable[[str], list[tuple[int, int]]] | None = None,
    language: str = "en",
) -> list[str]:
    """One translation per line: each line split into sentences, all sentences translated in one
    call of `translate_batch` (sentences in, translations out, in order), and joined with the
    whitespace that separated them. Blank lines give empty lines without a call; the whitespace
    around a line is dropped, as when translating it whole."""
    return translate_texts(
        lines, translate_batch, outer=False, max_tokens=max_tokens, count_tokens=count_tokens,
        protected_spans=protected_spans, language=language,
    )  # fmt: skip
