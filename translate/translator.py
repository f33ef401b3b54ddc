"""The bodies of the decoding commands: `decode` (a file or stdin to a file or stdout),
`evaluate`'s translation and scoring, `attention`. Each holds one engine (engine.py), loaded
from the command's EngineSpec; files are read and written by textio.py.

What a command translates is text as people have it (`translate_texts`): a line may be a
paragraph, split into sentences that are translated in the same batches and joined back
(segment.py; one-sentence lines are translated as they are), or a whole HTML or Markdown
document (documents.py). The n-best lists and scores of `--nbest`/`--scores` are those of
whole lines, one sentence a line."""

from __future__ import annotations

import dataclasses
import sys
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Literal

from translate.decoding import arrived_chunks, check_workers, fixed_chunks
from translate.documents import FORMATS, format_of, translate_document
from translate.engine import Engine, EngineSpec, TranslationEngine, first_best
from translate.errors import UserError
from translate.options import SearchOptions
from translate.protect import Terms, find_spans, has_placeholders, mask_sentence, repairs_counted, warn_repairs
from translate.segment import translate_paragraphs
from translate.textio import (
    atomic_write,
    check_output_path,
    check_references,
    check_same_length,
    read_all_lines,
    read_lines,
    read_text,
    write_json,
    write_translations,
)


def sentence_budget(engine: TranslationEngine, glossary: Terms | None = None) -> dict:
    """How segment.py cuts a sentence too long for the models: their source positions, counted in
    the engine's pieces (an Engine's, or a ProcessEngine's copy of its processes' vocabulary) of the
    sentence as the models get it, each protected span (URL, tag, a term of `glossary` or the engine's)
    one placeholder: a long URL is no reason to cut, and no protected span is cut in two."""
    tokenizer = getattr(engine, "tokenizer", None)
    if tokenizer is None:
        return {}
    masking = has_placeholders(tokenizer)  # as the engine's Protector does
    terms = glossary or engine.glossary

    def count(sentence: str) -> int:  # exact where it matters: near or over the budget
        bound = len(unicodedata.normalize("NFKC", sentence)) + 1  # a piece holds a character, but for a leading ▁
        if bound <= engine.max_pieces:
            return bound
        return len(tokenizer.encode([mask_sentence(sentence, engine.protect, terms).text if masking else sentence])[0])

    def spans(sentence: str) -> list[tuple[int, int]]:
        return [(s.start, s.end) for s in find_spans(sentence, engine.protect, terms)] if masking else []

    return {"max_tokens": engine.max_pieces, "count_tokens": count, "protected_spans": spans}


def translate_texts(
    engine: TranslationEngine,
    texts: list[str],
    options: SearchOptions | None = None,
    *,
    format: str = "text",
    split: bool = True,
    glossary: Terms | None = None,
    submit: bool | Callable[[list[str]], Future] = False,
) -> list[str]:
    """The 1-best translation of each text: a document in `format`, or a line of text (with
    `split`, each of its sentences translated, all in one call of the engine); `submit`: through
    the engine's continuous batching (serve), by engine.submit or by the function given (serve's,
    which can cancel what it submitted)."""

    if submit is True:
        submit = lambda sentences: engine.submit(sentences, options, glossary)  # noqa: E731

    def translate_batch(sentences: list[str]) -> list[str]:
        if not sentences:
            return []
        if submit:
            return first_best(submit(sentences).result())
        return first_best(engine.translate(sentences, options, glossary=glossary))

    if format not in FORMATS:
        raise UserError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if isinstance(texts, (str, bytes)):
        raise TypeError(f"texts must be a list of str, not one {type(texts).__name__}")
    if format != "text":
        return [
            translate_document(text, format, translate_batch, **sentence_budget(engine, glossary)) for text in texts
        ]
    if split:
        return translate_paragraphs(texts, translate_batch, **sentence_budget(engine, glossary))
    return translate_batch(texts)


def decode_file(
    spec: EngineSpec,
    input: str | Path = "-",
    output: str | Path = "-",
    *,
    with_scores: bool = False,
    format: str | None = None,
    split: bool = True,
) -> int:
    """`translate decode`: a file (or stdin, translated line by line as it arrives) to a file or
    stdout; spec.nbest lines per input line, TSV with_scores; `format` (default: by the input's
    extension) html or markdown: the whole document. Returns the input line count."""
    check_workers(spec.workers)
    format = format_of(input, format) if str(input) != "-" or format else "text"
    whole_lines = spec.nbest > 1 or with_scores
    if format != "text" and whole_lines:
        raise UserError(f"--nbest and --scores give one line per input line: not with --format {format}")
    if str(input) != "-" and str(output) != "-" and Path(input).resolve() == Path(output).resolve():
        raise UserError(f"--output {output} is the input file; choose another file")
    if str(output) != "-":
        source = input if str(input) != "-" else "/dev/stdin"  # `< FILE` makes stdin that file
        check_output_path(output, "--output", [source, *spec.checkpoints, spec.glossary])
    if format != "text":
        return decode_document(spec, input, output, format)
    lines = read_lines(input)
    engine = Engine.load(spec)
    stream = str(input) == "-"
    with progress_bar(lambda: count_lines(input)) if not stream else nullcontext() as update:
        if split and not whole_lines:
            return write_translations(paragraphs(engine, lines, stream, update), output)
        translations = engine.translate(lines, stream=stream, on_progress=update)
        return write_translations(translations, output, nbest_format="tsv" if with_scores else "text")


CHUNK_LINES = 1000  # lines split and translated together (their sentences share batches)


def paragraphs(
    engine: Engine, lines: Iterable[str], stream: bool = False, on_progress: Callable[[int], object] | None = None
) -> Iterator[list[tuple[str, float]]]:
    """Each line's translation, its sentences translated apart (as 1-best lists), CHUNK_LINES
    lines at a time (from stdin: the lines that have arrived); `on_progress(n)` as n lines are done.
    The placeholders the model did not place are counted over all chunks, and said once at the end."""
    tally = [0, 0]
    try:
        for chunk in (arrived_chunks if stream else fixed_chunks)(lines, CHUNK_LINES):
            with repairs_counted(tally):
                texts = translate_texts(engine, chunk)
            for text in texts:
                yield [(text, 0.0)]
            if on_progress:
                on_progress(len(chunk))
    finally:
        warn_repairs(tally)


def decode_document(spec: EngineSpec, input: str | Path, output: str | Path, format: str) -> int:
    """An HTML or Markdown document, read whole, translated with its markup kept; returns its line count."""
    text = read_text(input, "input")
    engine = Engine.load(spec)
    (translated,) = translate_texts(engine, [text], format=format)
    if str(output) == "-":
        sys.stdout.write(translated)
        sys.stdout.flush()
    else:
        with atomic_write(check_output_path(output, "--output")) as f:
            f.write(translated)
    return text.count("\n") + (not text.endswith("\n"))


@contextmanager
def progress_bar(total: Callable[[], int]) -> Iterator[Callable[[int], object] | None]:
    """A tqdm bar on stderr (lines done of `total()`, sentences/s, ETA) and its update function
    when stderr is a terminal; None otherwise, and nothing extra is written."""
    if not sys.stderr.isatty():
        yield None
        return
    from tqdm import tqdm

    with tqdm(total=total(), unit=" sentences", file=sys.stderr, leave=False, dynamic_ncols=True) as bar:
        yield bar.update


def count_lines(path: str | Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def translate_file_lines(
    spec: EngineSpec,
    sources: list[str],
    output: str | Path | None = None,
    split: bool = True,
    settings: dict[str, Any] | None = None,
) -> list[str]:
    """`translate evaluate`: the 1-best translation of each source line (also written to `output`);
    `split`: a line's sentences translated apart. `settings`, if given, gets the search's."""
    check_workers(spec.workers)
    engine = Engine.load(spec)
    if settings is not None:
        dtype = str(next(engine.models[0].parameters()).dtype).removeprefix("torch.")
        settings.update(
            dataclasses.asdict(engine.defaults), split=split, protect=list(engine.protect),
            glossary_terms=len(engine.glossary or ()), device=str(engine.device), dtype=dtype,
            quantize=spec.quantize, batch_tokens=engine.batch_tokens,
        )  # fmt: skip
    with progress_bar(lambda: len(sources)) as update:
        if split:
            hypotheses = [nbest[0][0] for nbest in paragraphs(engine, sources, on_progress=update)]
        else:
            hypotheses = first_best(engine.translate(sources, on_progress=update))
    if output is not None:
        write_translations([[(h, 0.0)] for h in hypotheses], output)
    return hypotheses


def evaluate_files(
    ref: Path | Sequence[Path],
    *,
    spec: EngineSpec = EngineSpec(()),
    src: Path | None = None,
    hyp: Path | None = None,
    hyp_b: Path | None = None,
    output: Path | None = None,
    json_out: Path | None = None,
    report: Path | None = None,
    split: bool = True,
) -> list[str]:
    """`translate evaluate`: score `hyp`, or the translation of `src` by the engine of `spec`,
    against `ref` (several: multi-reference scores; the report shows the first); `hyp_b` too, side
    by side. Writes --json and --report; returns the lines to print (the scores with their signatures)."""
    checkpoints = spec.checkpoints
    refs = [Path(ref)] if isinstance(ref, (str, Path)) else [Path(r) for r in ref]
    ref = refs[0]
    from translate.evaluate import format_scores, score
    from translate.report import build_report, write_report

    if hyp is not None and output is not None:
        raise UserError("--output writes the translation of --src; with --hyp there is nothing to translate")
    if hyp is not None:
        _refuse_decoding_options(spec, split)
    named = (("--report", report), ("--output", output), ("--json", json_out))
    outputs = [(option, Path(path)) for option, path in named if path is not None]
    for i, (option, path) in enumerate(outputs):
        check_output_path(path, option, [*refs, src, hyp, hyp_b, *checkpoints, spec.glossary])
        for other, earlier in outputs[:i]:
            if path.resolve() == earlier.resolve():
                raise UserError(f"{other} and {option} are the same file {path}; give each its own")
    references, more, sources, hypotheses, hypotheses_b = _evaluation_inputs(refs, checkpoints, src, hyp, hyp_b)
    search: dict[str, Any] = {}
    if hypotheses is None:
        hypotheses = translate_file_lines(spec, sources, output, split, search)  # type: ignore[arg-type]
    scores = [score(hypotheses, references, *more)]
    printed = [format_scores(scores[0])]
    if hypotheses_b is not None:
        scores.append(score(hypotheses_b, references, *more))
        printed.append(f"\n--hyp-b {hyp_b}:\n" + format_scores(scores[1]))
    if json_out:  # the scores, and what was scored: enough to tell where a saved score came from
        given = {"ref": refs if more else ref, "src": src, "hyp": hyp, "hyp_b": hyp_b,
                 "checkpoints": list(checkpoints) or None, "glossary": spec.glossary}  # fmt: skip
        scored = {key: [str(p) for p in v] if isinstance(v, list) else str(v) for key, v in given.items() if v}
        write_json({**scores[0], "inputs": scored, **({"search": search} if search else {}),
                    **({"hyp_b": scores[1]} if hypotheses_b is not None else {})}, json_out)  # fmt: skip
    if report:
        system = str(hyp) if hyp is not None else " + ".join(map(str, checkpoints))
        inputs = [f"reference: {ref}"] + [f"source: {src}"] * (src is not None)
        if more:  # the corpus scores are against every reference; the sentences' figures against the first
            inputs[0] += (
                f" (scores also against {', '.join(map(str, refs[1:]))}; each sentence's chrF against it alone)"
            )
        page = build_report(
            references, hypotheses, sources=sources, hypotheses_b=hypotheses_b, names=[system, str(hyp_b)],
            inputs=inputs, title=f"translation report: {system}", scores=scores,
        )  # fmt: skip
        write_report(report, page)
        printed.append(f"report written to {report}")
    return printed


def _refuse_decoding_options(spec: EngineSpec, split: bool) -> None:
    """With --hyp nothing is translated: an option that says how to translate would be ignored."""
    options = {
        "--beam": "beam_size", "--lenpen": "length_penalty", "--batch-tokens": "batch_tokens", "--workers": "workers",
        "--device": "device", "--dtype": "dtype", "--quantize": "quantize", "--no-protect": "protect",
        "--glossary": "glossary",
    }  # fmt: skip
    defaults = EngineSpec(())
    given = [option for option, field in options.items() if getattr(spec, field) != getattr(defaults, field)]
    given += ["--no-split"] * (not split)
    if given:
        raise UserError(
            f"{', '.join(given)}: how --src is translated; with --hyp nothing is translated, drop {'them' if len(given) > 1 else 'it'}"
        )


def _evaluation_inputs(
    refs: list[Path], checkpoints: Sequence[str | Path], src: Path | None, hyp: Path | None, hyp_b: Path | None
) -> tuple[list[str], list[list[str]], list[str] | None, list[str] | None, list[str] | None]:
    """The references (the first --ref's, and those of the further ones), sources, hypotheses (None:
    to translate) and second hypotheses, read and checked: as many lines each, no reference blank or
    given twice, and either --hyp or a checkpoint with --src."""
    ref = refs[0]
    references = read_all_lines(ref, "reference")

    def read_matching(path: Path | None, what: str) -> list[str] | None:
        if path is None:
            return None
        lines = read_all_lines(path, what)
        check_same_length(path, lines, ref, references)
        return lines

    more = [read_matching(path, "reference") for path in refs[1:]]
    for i, (path, lines) in enumerate(zip(refs, [references, *more])):
        check_references(path, lines)
        if any(path.resolve() == earlier.resolve() for earlier in refs[:i]):
            raise UserError(f"--ref {path} is given twice; each --ref is another reference of the same sentences")

    sources = read_matching(src, "source")
    hypotheses_b = read_matching(hyp_b, "second hypothesis")
    if hyp is not None and checkpoints:
        raise UserError("give either --hyp (score existing output) or a checkpoint with --src, not both")
    if hyp is None and (not checkpoints or sources is None):
        raise UserError("evaluate needs a checkpoint and --src, or --hyp (see translate evaluate --help)")
    return references, more, sources, read_matching(hyp, "hypothesis"), hypotheses_b  # type: ignore[return-value]


def plot_attention(
    checkpoint: str | Path,
    sentence: str,
    output: str | Path,
    *,
    layer: int = -1,
    head: int | None = None,
    beam: int | None = None,
    all_heads: bool = False,
    self_attention: Literal["encoder", "decoder"] | None = None,
) -> str:
    """`translate attention`: translate one sentence, save a heatmap (PNG) of its attention at
    `output` and return the translation. Cross-attention by default, or the encoder's or the
    decoder's self-attention; one head, the mean of the heads, or (all_heads) a grid of every head."""
    from translate.plot import AXES, attention_figure, attention_maps, heads_figure, save_figure

    kind = self_attention or "cross"
    if kind not in AXES:
        raise UserError(f"--self must be 'encoder' or 'decoder', got {kind!r}")
    if all_heads and head is not None:
        raise UserError("give either --head H or --all-heads, not both")
    engine = Engine.load(EngineSpec([checkpoint], protect=False, beam_size=beam))
    model = engine.models[0]
    stack = "encoder" if kind == "encoder" else "decoder"
    n_layers, n_heads = getattr(model.cfg, f"{stack}_layers"), model.cfg.n_heads
    if not -n_layers <= layer < n_layers:
        layers = f"{n_layers} layer{'s' * (n_layers != 1)}"
        raise UserError(f"--layer {layer}: the {stack} has {layers} (0..{n_layers - 1}, or -1 for the last)")
    if head is not None and not 0 <= head < n_heads:
        raise UserError(f"--head {head}: the model has {n_heads} heads (0..{n_heads - 1})")
    if not sentence.strip():
        raise UserError("the sentence to translate is empty")
    pieces = len(engine.tokenizer.encode([sentence.strip()])[0])
    if pieces > engine.max_pieces:  # decode cuts such a line into parts; one plot is of one input
        raise UserError(
            f"the sentence has {pieces:,} pieces, more than the model reads at once ({engine.max_pieces:,}); "
            "plot a shorter one"
        )
    check_output_path(output, "--output", [checkpoint])
    tokens = engine.best_tokens(sentence)
    weights, cols, rows = attention_maps(model, engine.tokenizer, sentence.strip(), tokens, kind, layer)  # (H, R, C)
    name = "cross-attention" if kind == "cross" else f"{kind} self-attention"
    xlabel, ylabel = AXES[kind]
    if all_heads:
        fig = heads_figure(weights, cols, rows, f"{name}, layer {layer % n_layers}", xlabel, ylabel)
    else:
        which = f"layer {layer % n_layers}, " + ("mean of heads" if head is None else f"head {head}")
        w = weights.mean(0) if head is None else weights[head]
        fig = attention_figure(w, cols, rows, title=f"{name}, {which}", xlabel=xlabel, ylabel=ylabel)
    save_figure(fig, output)
    return engine.tokenizer.decode([tokens])[0]
