"""Paragraphs against lines: every GROUP consecutive source lines (Bible verses) joined into one
line, translated (1) line by line and joined, (2) as paragraphs split into sentences
(translate/segment.py), (3) as paragraphs whole, each scored with sacreBLEU against the
references joined the same way. Acceptance: (2) within 1 BLEU of (1).

    python scripts/bench_paragraphs.py runs/bible/checkpoints/best.pt \\
        --src runs/bible/data/test.en --ref runs/bible/data/test.fr [--group 4] [--beam 5] [--limit N]
"""

from __future__ import annotations

import argparse
import json
import time

from translate.decoding import translate_lines
from translate.evaluate import score
from translate.hardware import resolve_device
from translate.inference import load_models
from translate.segment import split_sentences, translate_paragraphs
from translate.textio import read_all_lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("--src", required=True)
    parser.add_argument("--ref", required=True)
    parser.add_argument("--group", type=int, default=4, help="lines joined into one paragraph (default 4)")
    parser.add_argument("--beam", type=int, default=None, help="beam size (default: the checkpoint's)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N paragraphs")
    parser.add_argument("--max-tokens", type=int, default=None, help="sentence budget in pieces (default: positions)")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    if args.limit is not None and args.limit < 1 or args.group < 1:
        parser.error("--limit and --group must be at least 1")

    sources, references = read_all_lines(args.src, "source"), read_all_lines(args.ref, "reference")
    n = len(sources) // args.group * args.group
    if args.limit is not None:
        n = min(n, args.limit * args.group)
    models, tokenizer, cfg = load_models([args.checkpoint], resolve_device(args.device))
    search = cfg.decode.search_options({}, 1, beam_size=args.beam)
    max_tokens = args.max_tokens or min(m.cfg.max_positions for m in models) - 1

    def translate_batch(lines: list[str]) -> list[str]:
        return [nbest[0][0] for nbest in translate_lines(models, tokenizer, lines, search, protect=cfg.decode.protect)]

    def join(lines: list[str]) -> list[str]:
        return [" ".join(lines[i : i + args.group]) for i in range(0, n, args.group)]

    paragraphs, refs = join(sources[:n]), join(references[:n])
    sentences = sum(len(split_sentences(p)[0]) for p in paragraphs)
    results = {}
    for name, run in [
        ("lines, joined", lambda: join(translate_batch(sources[:n]))),
        (
            "paragraphs, split",
            lambda: translate_paragraphs(
                paragraphs, translate_batch, max_tokens=max_tokens, count_tokens=lambda s: len(tokenizer.encode([s])[0])
            ),
        ),
        ("paragraphs, whole", lambda: translate_batch(paragraphs)),
    ]:
        start = time.perf_counter()
        hypotheses = run()
        scores = score(hypotheses, refs)
        bp = float(scores["bleu_detail"].split("BP = ")[1].split()[0])
        results[name] = {
            "bleu": scores["bleu"],
            "chrf": scores["chrf"],
            "bp": bp,
            "seconds": time.perf_counter() - start,
        }
        print(
            f"{name:18} BLEU {scores['bleu']:6.2f}  BP {bp:.3f}  chrF {scores['chrf']:6.2f}  {results[name]['seconds']:.1f} s"
        )
    print(f"{len(paragraphs)} paragraphs of {args.group} lines, {sentences} sentences found by the segmenter")
    print(json.dumps({"paragraphs": len(paragraphs), "sentences": sentences, **results}))


if __name__ == "__main__":
    main()
