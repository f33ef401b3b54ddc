"""How many protected spans (placeholders, tags, URLs, paths, numbers ...) a checkpoint carries
through translation byte for byte, exactly once, with and without protection.

    python scripts/bench_protect.py CKPT                                   # tests/fixtures/software_strings.en
    python scripts/bench_protect.py CKPT --input my_strings.en --beam 5 --output out.tsv

For each line it finds the spans of the checkpoint's decode.protect classes (all classes if that
is empty) and translates the line twice: with protection (spans masked as ⦅i⦆, restored after
decoding, placeholders the model lost or doubled repaired) and without (the raw line). A span is
kept when its text occurs in the output exactly as many times as among the line's spans. It
prints the share kept, overall and per class, for both, and how many lines needed a repair (where
the model itself did not place every placeholder exactly once).
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import torch

from translate.checkpoint import load_checkpoint, load_model
from translate.decoding import translate_sources
from translate.engine import Engine, first_best
from translate.protect import CLASSES, find_spans


def kept_spans(line: str, output: str, classes) -> list[tuple[str, bool]]:
    """(class, kept) for each protected span of `line`."""
    spans = find_spans(line, classes)
    counts = Counter(s.text for s in spans)
    return [(s.kind, output.count(s.text) == counts[s.text]) for s in spans]


def summary(results: list[tuple[str, bool]]) -> str:
    by_class: dict[str, list[bool]] = {}
    for kind, ok in results:
        by_class.setdefault(kind, []).append(ok)
    parts = [f"{k} {sum(v)}/{len(v)}" for k, v in sorted(by_class.items())]
    kept = sum(ok for _, ok in results)
    return f"{kept}/{len(results)} = {100 * kept / max(len(results), 1):.1f}% ({', '.join(parts)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--input", type=Path, default=Path(__file__).parents[1] / "tests/fixtures/software_strings.en")
    parser.add_argument("--beam", type=int, default=None, help="default: the checkpoint's decode.beam_size")
    parser.add_argument("--output", type=Path, help="write source<TAB>protected<TAB>unprotected per line")
    args = parser.parse_args()

    torch.set_grad_enabled(False)
    model, tokenizer, cfg = load_model(args.checkpoint)
    classes = cfg.decode.protect or list(CLASSES)
    lines = [line.rstrip("\n") for line in args.input.read_text(encoding="utf-8").splitlines() if line.strip()]
    search = cfg.decode.search_options(beam_size=args.beam)
    plain = first_best(Engine.from_model(model, tokenizer, search).translate(lines))  # no class protected
    engine = Engine.from_model(model, tokenizer, search, protect=classes)
    protector, sources = engine.encode(lines)  # as engine.translate does, its Protector here to count its repairs
    if not protector.enabled:
        print("this checkpoint's vocabulary has no placeholder pieces: protection cannot be measured")
    translations = translate_sources(engine.models, tokenizer, sources, search, engine.batch_tokens, engine.device)
    protected = first_best(protector.restore(translations))
    with_p = [r for line, out in zip(lines, protected) for r in kept_spans(line, out, classes)]
    without = [r for line, out in zip(lines, plain) for r in kept_spans(line, out, classes)]
    step = load_checkpoint(args.checkpoint)["step"]
    print(f"checkpoint: {args.checkpoint} (step {step}), {len(lines)} lines of {args.input}")
    print(f"spans kept byte-identical exactly once, with protection:    {summary(with_p)}")
    print(f"spans kept byte-identical exactly once, without protection: {summary(without)}")
    print(
        f"lines whose placeholders the model did not place exactly once (repaired): {protector.repaired}/{len(lines)}"
    )
    if args.output:
        args.output.write_text(
            "".join(f"{s}\t{p}\t{u}\n" for s, p, u in zip(lines, protected, plain)), encoding="utf-8"
        )


if __name__ == "__main__":
    main()
