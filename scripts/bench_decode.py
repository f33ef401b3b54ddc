"""Decoding speed of a trained checkpoint: greedy and beam search, with and without the cache.

    python scripts/bench_decode.py                                  # runs/bible/checkpoints/best.pt
    python scripts/bench_decode.py CKPT --vs-nocache                # + the search recomputing the prefix
    python scripts/bench_decode.py CKPT --vs-hf                     # + HF transformers' generate, same weights
    python scripts/bench_decode.py CKPT --batch-sentences 0         # the checkpoint's token budget instead
    python scripts/bench_decode.py CKPT --vs-hf --length-penalty 0  # the same beam search as HF's
    python scripts/bench_decode.py CKPT --vs-ct2                    # + CTranslate2, the C++ engine

It decodes the first --sentences lines of --src (default: the run's data/test.en), sorted by
length into batches of --batch-sentences sentences (64, the reference setting; 0 = a token
budget, --batch-tokens or the checkpoint's decode.batch_tokens, batched for each beam size as
`translate decode` does: greedy gets about --beam times more sentences a batch), greedy and with beam
--beam, with the checkpoint's length penalty (or --length-penalty) and max length a*src+b. Ours
decodes --workers batches at once, as `translate decode` does (by default 2 on 2+ threads, each
on half of them; with a token budget each gets half of it); HF and CTranslate2 one at a time on
every thread, as they ship, or with --workers-all as many as ours (CTranslate2 through its own
inter_threads). The process keeps freed memory for reuse (inference.keep_freed_memory, which
`translate decode` does too), for every system alike. The runs take turns,
repeat after repeat, so that a busy machine slows them alike; it prints the median over the
repeats of:

- sentences/s and generated tokens/s: tokens are the pieces of each system's 1-best outputs
  (EOS not counted; the same count where the outputs are the same); the speed-ups are ratios of
  the median seconds;
- peak RSS of the process during the run (VmHWM, reset before each run);
- with --vs-nocache the same search re-running the decoder over the whole prefix at every step
  (`use_cache=False`), the speed-ups cached / no-cache, and whether the outputs are the same;
- with --vs-hf a `transformers` MarianMTModel of the same shape (post-norm, sinusoidal
  positions, shared or separate embeddings) holding this checkpoint's weights (as `translate
  export --to huggingface` writes it), decoding the same batches
  with `generate`, each sentence stopped at its own max length; the share of outputs equal to
  ours is printed. Its beam search runs with `early_stopping="never"`, the exact stopping rule,
  but with alpha > 0 it divides by len ** alpha where ours uses the GNMT penalty, and bounds
  the open hypotheses with the batch's longest limit where ours uses each sentence's, so some
  beam outputs differ and HF searches a little longer;
  with `--length-penalty 0` both rank by the sum of log-probs and give the same outputs (HF
  stops once no open hypothesis can beat its k-th finished one, ours once none can beat the
  best: for a 1-best output the same answer, found sooner);
- with --vs-ct2 CTranslate2 (`pip install 'translate[export]'`), the same weights in its
  Transformer spec (as `translate export --to ctranslate2` writes them), as many threads as ours, float32 (int8_float32
  with --quantize int8): a C++ engine for reference. Its maximum length is one per batch, so its
  greedy outputs are cut to each sentence's limit afterwards; it divides by len ** alpha too
  (with alpha > 0 it stops after k finished hypotheses, a heuristic), and with alpha 0 it stops
  when its top beam finishes, so with `--length-penalty 0` its outputs are ours.
Timing covers the search only (tokenization and detokenization are left out), in fp32 unless
--quantize int8.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from translate.checkpoint import load_model
from translate.decoding import decode_batches, in_workers, pad_batch
from translate.engine import Engine, EngineSpec
from translate.errors import UserError, run_script
from translate.export import ct2_spec, hf_marian
from translate.hardware import describe_machine, host_memory_peak_mb, reset_host_memory_peak
from translate.inference import keep_freed_memory
from translate.model import Transformer
from translate.options import SearchOptions, count
from translate.search import beam_search, max_output_lengths
from translate.tokenizer import BOS, EOS, PAD, UNK


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "checkpoint",
        nargs="?",
        default="runs/bible/checkpoints/best.pt",
        help="default: runs/bible/checkpoints/best.pt",
    )
    p.add_argument("--src", help="English source file (default: RUN/data/test.en of the checkpoint's run)")
    p.add_argument("--sentences", type=count, default=500, help="first N non-blank lines")
    p.add_argument("--batch-sentences", type=int, default=64, help="sentences per batch; 0 = a token budget")
    p.add_argument(
        "--batch-tokens", type=int, help="with --batch-sentences 0: the token budget (default: decode.batch_tokens)"
    )
    p.add_argument("--beam", type=count, default=5)
    p.add_argument("--length-penalty", type=float, help="GNMT alpha for every system (default: decode.length_penalty)")
    p.add_argument("--repeats", type=count, default=3)
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument(
        "--workers", type=int, default=0, help="batches ours decodes at once, as translate decode (0 = its default)"
    )
    p.add_argument("--workers-all", action="store_true", help="HF and CTranslate2 decode --workers batches at once too")
    p.add_argument("--quantize", choices=["int8"], help="dynamic int8 quantization of the linear layers")
    p.add_argument("--vs-nocache", action="store_true", help="also the no-cache search, interleaved")
    p.add_argument("--vs-hf", action="store_true", help="also HF transformers' generate, interleaved")
    p.add_argument("--vs-ct2", action="store_true", help="also CTranslate2 (the C++ engine), interleaved")
    return p.parse_args(argv)


def read_batches(args: argparse.Namespace, engine: Engine, beam: int) -> list[torch.Tensor]:
    """The first --sentences non-blank source lines as padded id batches (B, S), longest first,
    encoded by the engine (with --batch-sentences 0, batched for this beam size on one worker's
    share of the batch tokens, as `translate decode` would)."""
    src = Path(args.src) if args.src else Path(args.checkpoint).resolve().parent.parent / "data" / "test.en"
    if not src.is_file():
        sys.exit(f"error: source file not found: {src} (give --src)")
    lines = [line for line in src.read_text(encoding="utf-8").splitlines() if line.strip()][: args.sentences]
    sources: list[list[int]] = engine.encode(lines)[1]  # type: ignore[assignment]
    if args.batch_sentences > 0:
        order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))
        groups = [order[i : i + args.batch_sentences] for i in range(0, len(order), args.batch_sentences)]
    else:
        groups = decode_batches([len(s) for s in sources], engine.worker_tokens, beam)
    return [pad_batch([sources[i] for i in group], torch.device("cpu")) for group in groups]


# ---------------------------------------------------------------------------- measuring


def peak_rss_mb() -> float:
    """This process's peak RSS since the last reset (hardware.host_memory_peak_mb), or where Linux's
    /proc is missing the process's lifetime peak."""
    peak = host_memory_peak_mb()
    if peak is not None:
        return peak
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Run:
    """One system under test: a name, its batches and a function from batches to 1-best token lists."""

    def __init__(self, name: str, decode, batches: list[torch.Tensor]) -> None:
        self.name, self.decode, self.batches = name, decode, batches
        self.seconds: list[float] = []
        self.peaks: list[float] = []
        self.outputs: list[list[int]] = []

    def once(self) -> None:
        reset_host_memory_peak()
        start = time.perf_counter()
        self.outputs = self.decode(self.batches)
        self.seconds.append(time.perf_counter() - start)
        self.peaks.append(peak_rss_mb())

    def row(self, n_sentences: int) -> str:
        seconds = statistics.median(self.seconds)
        tokens = sum(map(len, self.outputs))
        return (
            f"{self.name:<18} {n_sentences / seconds:>10.1f} {tokens / seconds:>10.0f} {seconds:>9.2f}"
            f" {statistics.median(self.peaks):>9.0f}"
        )


def in_turn(decode_batch, workers: int = 1):
    """A system's decode over batches from its decode of one batch (1-best token lists), `workers`
    batches at once as `translate decode` runs them (decoding.in_workers)."""

    def decode(batches: list[torch.Tensor]) -> list[list[int]]:
        return [tokens for out in in_workers(decode_batch, batches, workers) for tokens in out]

    return decode


def ours(engine: Engine, beam: int, use_cache: bool = True):
    """The engine's search (its models and options, beam `beam`) on its workers."""
    search = engine.defaults.given(beam_size=beam)

    def decode(src: torch.Tensor) -> list[list[int]]:
        hyps = beam_search(engine.models, src, search, use_cache=use_cache)
        return [h[0].tokens for h in hyps]

    return in_turn(decode, engine.workers)


# ---------------------------------------------------------------------------- HF transformers
# hf_marian (our weights in a MarianMTModel) and ct2_spec (in a CTranslate2 TransformerSpec) are
# translate/export.py's, the code behind `translate export`.


class MaxLengths:
    """An HF logits processor: EOS is the only choice once a row has its sentence's max length
    a*src+b of pieces, so HF stops each sentence where ours does (the pieces are the same; ours
    ends there without an EOS, whose forced log-prob here is 0). Rows with the batch's longest
    limit are stopped by max_new_tokens instead, so HF takes no extra step for the EOS."""

    def __init__(self, max_lens: torch.Tensor, beam: int) -> None:
        self.max_lens = max_lens.repeat_interleave(beam)  # (B * beam,) HF keeps a sentence's beams adjacent

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        full = self.max_lens <= input_ids.size(1) - 1  # pieces so far, without the decoder start
        if full.any():
            scores = scores.clone()
            scores[full] = float("-inf")
            scores[full, EOS] = 0.0
        return scores


def hf_generate(hf, beam: int, o: SearchOptions, workers: int = 1):
    from transformers import LogitsProcessorList

    search = {"length_penalty": o.length_penalty, "early_stopping": "never"} if beam > 1 else {}

    def decode(src: torch.Tensor) -> list[list[int]]:
        max_lens = max_output_lengths(src, o.max_len_a, o.max_len_b)
        with torch.inference_mode():
            gen = hf.generate(
                input_ids=src, attention_mask=src != PAD, num_beams=beam, do_sample=False,
                max_new_tokens=int(max_lens.max()), min_new_tokens=1, suppress_tokens=[PAD, BOS],  # nor EOS first
                logits_processor=LogitsProcessorList([MaxLengths(max_lens, beam)]), **search,
            )  # fmt: skip
        rows = gen[:, 1:].tolist()  # without the decoder start
        return [row[: row.index(EOS)] if EOS in row else [t for t in row if t != PAD] for row in rows]

    return in_turn(decode, workers)


# ---------------------------------------------------------------------------- CTranslate2


def ct2_translator(model: Transformer, threads: int, quantize: str | None, workdir: str, workers: int = 1):
    """A CTranslate2 translator holding `model`'s weights (translate export's TransformerSpec),
    decoding from our BOS. Pieces are named by their ids: the runs exchange ids, not text."""
    import ctranslate2

    names = {PAD: "<pad>", UNK: "<unk>", BOS: "<s>", EOS: "</s>"}
    tokens = [names.get(i, str(i)) for i in range(model.vocab_size)]
    spec = ct2_spec(model, tokens)
    spec.validate()
    spec.optimize(quantization=None)
    spec.save(workdir)
    compute = "int8_float32" if quantize == "int8" else "float32"
    translator = ctranslate2.Translator(
        workdir, device="cpu", compute_type=compute, inter_threads=workers, intra_threads=max(1, threads // workers)
    )
    return translator, tokens


def ct2_translate(translator, tokens: list[str], beam: int, o: SearchOptions, workers: int = 1):
    """CTranslate2's translate_batch on the same batches. Its maximum length is one per batch
    (the batch's longest a*src+b): a greedy output is cut to its sentence's own limit afterwards
    (the same pieces ours stops at; CT2 pays for the extra steps), a beam search is not
    (the limit changes the search). Its length penalty divides by len ** alpha."""
    ids = {t: i for i, t in enumerate(tokens)}

    def decode(src: torch.Tensor) -> list[list[int]]:
        max_lens = max_output_lengths(src, o.max_len_a, o.max_len_b)
        source = [[tokens[t] for t in row if t not in (PAD, EOS)] for row in src.tolist()]  # CT2 adds the EOS
        results = translator.translate_batch(
            source, beam_size=beam, length_penalty=o.length_penalty, max_decoding_length=int(max_lens.max()),
            min_decoding_length=1, suppress_sequences=[["<pad>"], ["<s>"]], max_input_length=0,
        )  # fmt: skip
        limits = max_lens.tolist() if beam == 1 else [None] * len(results)
        return [[ids[t] for t in r.hypotheses[0]][:m] for r, m in zip(results, limits, strict=True)]

    return in_turn(decode, workers)


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not Path(args.checkpoint).is_file():
        sys.exit(f"error: checkpoint not found: {args.checkpoint} (train one: make train)")
    keep_freed_memory()  # as `translate decode` does, before it loads (the library itself never does)
    engine = Engine.load(
        EngineSpec(
            [args.checkpoint], device="cpu", dtype="fp32", quantize=args.quantize, protect=False,
            batch_tokens=args.batch_tokens, workers=args.workers, length_penalty=args.length_penalty,
        )
    )  # fmt: skip
    search = engine.defaults  # the checkpoint's, with --length-penalty: every system's
    others = engine.workers if args.workers_all else 1  # HF's and CTranslate2's batches at once
    greedy, beam = (read_batches(args, engine, b) for b in (1, args.beam))
    n = sum(b.size(0) for b in beam)
    runs = [Run("greedy", ours(engine, 1), greedy), Run(f"beam {args.beam}", ours(engine, args.beam), beam)]
    if args.vs_nocache:
        runs += [Run("greedy no-cache", ours(engine, 1, False), greedy)]
        runs += [Run(f"beam {args.beam} no-cache", ours(engine, args.beam, False), beam)]
    model = load_model(args.checkpoint)[0] if args.vs_hf or args.vs_ct2 else None  # fp32 weights to export
    if args.vs_hf:
        try:
            hf = hf_marian(model)
        except ImportError:
            sys.exit("error: --vs-hf needs HF transformers, which is not installed (pip install 'translate[export]')")
        except UserError as e:
            sys.exit(f"error: --vs-hf: {e}")
        runs += [
            Run("HF greedy", hf_generate(hf, 1, search, others), greedy),
            Run(f"HF beam {args.beam}", hf_generate(hf, args.beam, search, others), beam),
        ]
    if args.vs_ct2:
        try:
            import ctranslate2  # noqa: F401
        except ImportError:
            sys.exit("error: --vs-ct2 needs CTranslate2, which is not installed (pip install 'translate[export]')")
        with tempfile.TemporaryDirectory(prefix="ct2-") as workdir:  # the translator holds the model in memory
            threads = torch.get_num_threads()
            translator, tokens = ct2_translator(model, threads, args.quantize, workdir, others)
            torch.set_num_threads(threads)  # CTranslate2 sets this thread's OpenMP count to its own
        runs += [
            Run("CT2 greedy", ct2_translate(translator, tokens, 1, search, others), greedy),
            Run(f"CT2 beam {args.beam}", ct2_translate(translator, tokens, args.beam, search, others), beam),
        ]
    print(describe_machine())
    print(
        f"{args.checkpoint}: {n} sentences, {len(greedy)} greedy / {len(beam)} beam batches, "
        f"{torch.get_num_threads()} threads, ours {engine.workers} batch(es) at once, others {others}, "
        f"torch {torch.__version__}, {'int8' if args.quantize else 'fp32'}, pid {os.getpid()}"
    )
    warm = [b[:4] for b in beam[-1:]]
    for run in runs:
        run.decode(warm)
    for _ in range(args.repeats):
        for run in runs:
            run.once()
    print(f"{'':<18} {'sent/s':>10} {'tok/s':>10} {'seconds':>9} {'peak MB':>9}   (median of {args.repeats})")
    for run in runs:
        print(run.row(n))
    report_ratios(runs, args.beam)


def report_ratios(runs: list[Run], beam: int) -> None:
    by = {run.name: run for run in runs}

    def speedup(slow: str, fast: str) -> str:
        return f"{statistics.median(by[slow].seconds) / statistics.median(by[fast].seconds):.2f}x"

    def same(a: str, b: str) -> str:
        pairs = list(zip(by[a].outputs, by[b].outputs, strict=True))
        return f"{sum(x == y for x, y in pairs) / len(pairs):.1%} outputs identical"

    print(f"greedy / beam {beam}: {speedup(f'beam {beam}', 'greedy')} faster")
    for kind in ("greedy", f"beam {beam}"):
        if f"{kind} no-cache" in by:
            print(f"{kind} cached / no-cache: {speedup(f'{kind} no-cache', kind)} ({same(kind, f'{kind} no-cache')})")
        if f"HF {kind}" in by:
            print(f"{kind} ours / HF generate: {speedup(f'HF {kind}', kind)} ({same(kind, f'HF {kind}')})")
        if f"CT2 {kind}" in by:
            print(f"{kind} ours / CTranslate2: {speedup(f'CT2 {kind}', kind)} ({same(kind, f'CT2 {kind}')})")


if __name__ == "__main__":
    run_script(main)
