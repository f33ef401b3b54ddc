"""Files in, files out: lines of text -> batches by length -> search -> text, in input order.

`translate_lines` streams: it reads its lines lazily in chunks (up to `chunk_lines`, or with
`stream=True` whatever has already arrived, so a pipe or a terminal gets each translation at
once), sorts each chunk by source length into token-budget batches, decodes them with
search.py, restores the input order and yields one n-best list of (text, score) per input line.
Blank lines give empty translations without running the model; a source longer than the model
can hold is cut to its first `max_positions - 1` pieces. `read_lines` and `write_translations`
are the file ends that the CLI calls.
"""

from __future__ import annotations

import copy
import ctypes
import itertools
import logging
import os
import queue
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Literal, TypeVar

import torch

from translate.checkpoint import load_model
from translate.config import Config
from translate.errors import UserError, atomic_write, check_output_path, is_out_of_memory, text_lines
from translate.hardware import DTYPES, choose_decode_dtype, resolve_device
from translate.model import EOS, PAD, Transformer
from translate.protect import Protector
from translate.search import Hypothesis, beam_search
from translate.tokenizer import Tokenizer

log = logging.getLogger("translate")

Translation = list[tuple[str, float]]  # one input line's n-best list: (text, score), best first


def translate_lines(
    models: Sequence[Transformer] | Transformer,
    tokenizer: Tokenizer,
    lines: Iterable[str],
    *,
    beam_size: int = 5,
    length_penalty: float = 0.6,
    max_len_a: float = 1.2,
    max_len_b: float = 10,
    batch_tokens: int = 8000,
    nbest: int = 1,
    device: torch.device | str | None = None,
    stream: bool = False,
    chunk_lines: int = 2000,
    workers: int = 0,
    protect: Sequence[str] = (),
) -> Iterator[Translation]:
    """Translate `lines` (an ensemble when several models are given): an iterator that yields, per
    input line and in input order, its `nbest` (text, score) pairs, best first (score: log-prob /
    length penalty). Bad arguments raise UserError at once; the work happens as it is iterated.

    batch_tokens bounds sentences x beam_size x padded source length of the batches in flight;
    `workers` batches decode at once (0: `decode_workers` chooses), each with an equal share of
    batch_tokens and of torch's threads. The models must already be on `device` (default: the
    first model's). Spans of the `protect` classes are copied verbatim (translate/protect.py).
    """
    models = [models] if isinstance(models, torch.nn.Module) else list(models)
    if beam_size < 1 or batch_tokens < 1 or chunk_lines < 1:
        raise UserError("beam size, batch tokens and chunk lines must be at least 1")
    check_workers(workers)
    if not 1 <= nbest <= beam_size:
        raise UserError(f"nbest must be between 1 and the beam size ({beam_size}), got {nbest}")
    device = torch.device(device) if device is not None else next(models[0].parameters()).device
    workers = workers or decode_workers(device)
    max_pieces = min(m.cfg.max_positions for m in models) - 1  # + EOS = the model's capacity
    search = dict(beam_size=beam_size, length_penalty=length_penalty, max_len_a=max_len_a, max_len_b=max_len_b)
    protector = Protector(protect, tokenizer)
    chunks = (arrived_chunks if stream else fixed_chunks)(protector.mask_lines(lines), chunk_lines)
    return protector.restore(
        translation
        for chunk in chunks
        for translation in translate_sources(
            models,
            tokenizer,
            encode_sources(tokenizer, chunk, max_pieces),
            search,
            batch_tokens,
            nbest,
            device,
            workers,
        )
    )


def fixed_chunks(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    """Consecutive chunks of up to `size` lines."""
    it = iter(lines)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


_END = object()


def arrived_chunks(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    """Chunks of the lines that have already arrived (at least one, at most `size`).

    A thread reads `lines` into a bounded queue; each chunk takes what is there without waiting
    for more, so a line typed at a terminal is translated at once and a pipe still gets batches.
    An error raised while reading (e.g. undecodable bytes) is raised here after the lines before it.
    """
    q: queue.Queue = queue.Queue(maxsize=size)
    stop = threading.Event()

    def put(item: object) -> None:
        while not stop.is_set():
            try:
                return q.put(item, timeout=0.1)
            except queue.Full:
                continue

    def reader() -> None:
        try:
            for line in lines:
                if stop.is_set():
                    return
                put(line)
        except BaseException as e:  # handed to the consumer
            put(e)
        put(_END)

    threading.Thread(target=reader, daemon=True, name="translate-reader").start()
    try:
        while True:
            item = _wait(q)  # wait for one line, then take what is already there
            chunk: list[str] = []
            while item is not _END and not isinstance(item, BaseException):
                chunk.append(item)  # type: ignore[arg-type]
                if len(chunk) == size:
                    item = None
                    break
                try:
                    item = q.get_nowait()
                except queue.Empty:
                    item = None
                    break
            if chunk:
                yield chunk
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
    finally:
        stop.set()


def _wait(q: queue.Queue) -> object:
    """q.get() in short waits: Ctrl-C may be delivered to another thread (the blocked reader, a
    torch worker), and an endless wait would never see it; between waits Python handles it."""
    while True:
        try:
            return q.get(timeout=0.2)
        except queue.Empty:
            continue


def encode_sources(tokenizer: Tokenizer, lines: list[str], max_pieces: int) -> list[list[int] | None]:
    """Each line's source ids (pieces cut to max_pieces, + EOS); None for a blank line."""
    texts = [line.strip() for line in lines]
    todo = [i for i, text in enumerate(texts) if text]
    sources: list[list[int] | None] = [None] * len(lines)
    for i, pieces in zip(todo, tokenizer.encode([texts[i] for i in todo]) if todo else [], strict=True):
        sources[i] = pieces[:max_pieces] + [EOS]
    return sources


def token_batches(lengths: list[int], batch_tokens: int, beam_size: int = 1) -> list[list[int]]:
    """Indices grouped into batches, longest first, so that sentences x beam_size x the longest
    length stays within batch_tokens (a longer sentence gets a batch of its own)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * beam_size * lengths[batches[-1][0]] <= batch_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def pad_batch(sources: list[list[int]], device: torch.device) -> torch.Tensor:
    """Right-pad with PAD: (B, S)."""
    src = torch.full((len(sources), max(map(len, sources))), PAD, dtype=torch.long)
    for row, ids in enumerate(sources):
        src[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return src.to(device)


def translate_sources(
    models: list[Transformer],
    tokenizer: Tokenizer,
    sources: list[list[int] | None],
    search: dict,
    batch_tokens: int,
    nbest: int,
    device: torch.device,
    workers: int = 1,
) -> list[Translation]:
    """Decode every non-blank source in token-budget batches, `workers` at once; results in the
    order of `sources`."""
    results: list[Translation] = [[("", 0.0)] * nbest for _ in sources]
    todo = [i for i, ids in enumerate(sources) if ids is not None]
    lengths = [len(sources[i]) for i in todo]  # type: ignore[arg-type]
    batches = [
        [todo[j] for j in batch] for batch in token_batches(lengths, batch_tokens // workers, search["beam_size"])
    ]

    def decode(rows: list[int]) -> list[list[Hypothesis]]:
        src = pad_batch([sources[i] for i in rows], device)  # type: ignore[misc]
        try:
            return beam_search(models, src, nbest=nbest, **search)
        except (RuntimeError, MemoryError) as e:
            if not is_out_of_memory(e):
                raise
            raise UserError(
                f"out of memory on {device} decoding {len(rows)} sentences of up to {src.size(1)} tokens: "
                f"lower --batch-tokens (decode.batch_tokens), now {batch_tokens}"
            ) from None

    with eval_mode(models):
        for rows, hyps in zip(batches, in_workers(decode, batches, workers), strict=True):
            texts = iter(tokenizer.decode([h.tokens for hs in hyps for h in hs]))
            for i, hs in zip(rows, hyps, strict=True):
                best = [(next(texts), h.score) for h in hs] or [("", float("-inf"))]
                results[i] = (best + best[-1:] * nbest)[:nbest]  # always nbest entries
    return results


def decode_workers(device: torch.device) -> int:
    """How many batches decode at once by default: 2 on a CPU where torch has 2 threads or more
    (each then runs on half of them; small matrix products scale poorly across threads, so two
    batches side by side are 1.1-1.3x faster on 2 cores, see README), else 1."""
    return 2 if device.type == "cpu" and torch.get_num_threads() >= 2 else 1


T = TypeVar("T")
R = TypeVar("R")


def in_workers(fn: Callable[[T], R], items: list[T], workers: int) -> Iterator[R]:
    """fn over items, results in order; with workers > 1 in that many threads, each with an equal
    share of torch's threads (restored afterwards). torch releases the GIL inside its ops."""
    if workers <= 1 or len(items) <= 1:
        yield from map(fn, items)
        return
    threads = torch.get_num_threads()
    pool = ThreadPoolExecutor(workers, "translate-decode", torch.set_num_threads, (max(1, threads // workers),))
    try:
        yield from pool.map(fn, items)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        torch.set_num_threads(threads)


@contextmanager
def eval_mode(models: list[Transformer]) -> Iterator[None]:
    """Dropout off while decoding; each model's train/eval mode is restored afterwards."""
    was_training = [m.training for m in models]
    for m in models:
        m.eval()
    try:
        yield
    finally:
        for m, training in zip(models, was_training, strict=True):
            m.train(training)


# ---------------------------------------------------------------------------- the file ends


def read_lines(path: str | Path = "-") -> Iterator[str]:
    """The lines of a UTF-8 text file, or stdin for '-', without line ends, read lazily.

    A missing file or undecodable bytes raise UserError naming the file (and line).
    """
    if str(path) == "-":
        return text_lines(_stdin(), "<stdin>")
    path = Path(path)
    if not path.exists():
        raise UserError(f"input file not found: {path}")
    if path.is_dir():
        raise UserError(f"input {path} is a directory; give a text file")
    return text_lines(path.open("rb"), str(path))


def _stdin() -> IO[bytes]:
    """stdin's bytes through a file object of our own (a duplicate of its descriptor): a reader
    thread still blocked in it at exit then holds no lock that Python's shutdown needs."""
    try:
        return open(os.dup(sys.stdin.fileno()), "rb")
    except (AttributeError, OSError, ValueError):  # no real descriptor (e.g. replaced by a test)
        return sys.stdin.buffer


def format_translation(index: int, translation: Translation, nbest_format: Literal["text", "tsv"]) -> str:
    """The output lines of one input line: its texts one a line ('text'), or
    index<TAB>score<TAB>text ('tsv'); texts never break a line (or a TSV field)."""
    out = []
    for text, score in translation:
        text = " ".join(text.splitlines())
        if nbest_format == "tsv":
            out.append(f"{index}\t{score:.4f}\t{text.replace(chr(9), ' ')}\n")
        else:
            out.append(text + "\n")
    return "".join(out)


def write_translations(
    translations: Iterable[Translation], output: str | Path = "-", *, nbest_format: Literal["text", "tsv"] = "text"
) -> int:
    """Write translations (from translate_lines) to a file or stdout ('-'); returns the line count.

    'text': each hypothesis's text on its own line (K lines per input line for K-best lists);
    'tsv': index<TAB>score<TAB>text, index counting input lines from 0. stdout is flushed after
    every input line (pipes and terminals see each translation at once); a file is written
    under a temporary name and renamed at the end, so an error never leaves a half-written file.
    """
    if nbest_format not in ("text", "tsv"):
        raise UserError(f"n-best format must be 'text' or 'tsv', got {nbest_format!r}")
    if str(output) == "-":
        return _write(translations, sys.stdout, nbest_format, flush=True)
    path = check_output_path(output, "--output")
    with atomic_write(path) as f:
        return _write(translations, f, nbest_format, flush=False)


def _write(translations: Iterable[Translation], f: IO[str], nbest_format: Literal["text", "tsv"], flush: bool) -> int:
    count = 0
    for count, translation in enumerate(translations, start=1):
        f.write(format_translation(count - 1, translation, nbest_format))
        if flush:
            f.flush()
    return count


# ---------------------------------------------------------------------------- checkpoints in (the CLI's calls)


def load_models(
    checkpoints: Sequence[str | Path],
    device: torch.device | str = "cpu",
    *,
    dtype: str = "auto",
    quantize: str | None = None,
) -> tuple[list[Transformer], Tokenizer, Config]:
    """The models of one or more checkpoints (an ensemble: one vocabulary), in eval mode on
    `device` at the given precision (see `for_inference`), the tokenizer and the first
    checkpoint's config (its decode defaults)."""
    if not checkpoints:
        raise UserError("give at least one checkpoint")
    dtype = check_precision(torch.device(device), dtype, quantize)
    models, tokenizers, configs = zip(*(load_model(path, device) for path in checkpoints), strict=True)
    for path, tokenizer in zip(checkpoints[1:], tokenizers[1:], strict=True):
        if tokenizer.model_bytes != tokenizers[0].model_bytes:
            raise UserError(f"{path}: its vocabulary differs from {checkpoints[0]}'s; an ensemble needs one vocabulary")
    return [for_inference(m, dtype, quantize) for m in models], tokenizers[0], configs[0]


def check_precision(device: torch.device, dtype: str = "auto", quantize: str | None = None) -> str:
    """--dtype and --quantize against the device: the precision to decode at (see
    hardware.choose_decode_dtype); int8 runs on CPU, in place of a half precision."""
    if quantize not in (None, "int8"):
        raise UserError(f"--quantize must be int8, got {quantize!r}")
    if quantize is not None and device.type != "cpu":
        raise UserError(f"--quantize {quantize} is for CPU; on {device.type} use --dtype auto, bf16 or fp16")
    if quantize is not None and dtype not in ("auto", "fp32"):
        raise UserError(f"--quantize {quantize} replaces --dtype {dtype}: give one of them")
    chosen, reason = choose_decode_dtype(dtype, device)
    log.debug(f"decoding in {chosen}: {reason}")
    return chosen


class PackedLinear(torch.nn.Module):
    """An nn.Linear for fp32 inference on CPU whose weight is packed once into oneDNN's blocked
    layout and multiplied with oneDNN's GEMM (the op torch.compile's CPU backend uses for linear
    layers). At a decoding step's 64-320 rows it is 1.1-1.8x faster than torch's default
    (`scripts/bench_decode.py`); results agree with F.linear to float rounding, not bit for bit."""

    def __init__(self, linear: torch.nn.Linear, rows: int = 64) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), rows)
        self.bias = None if linear.bias is None else linear.bias.detach().clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def can_pack_linear() -> bool:
    """Whether this torch build has oneDNN's packed fp32 linear (x86 builds usually do)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def for_inference(model: Transformer, dtype: str = "fp32", quantize: str | None = None) -> Transformer:
    """The model ready to decode. quantize="int8": a copy whose linear layers (output projection
    included) are dynamically quantized to int8: weights int8, activations quantized per batch
    (torch.ao.quantization.quantize_dynamic, fbgemm/x86). fp32 on CPU: a copy whose linear layers
    are `PackedLinear` (where the build has oneDNN). Otherwise the model cast to `dtype` in place
    (search keeps its scores in fp32). On CPU it also calls `keep_freed_memory`."""
    if next(model.parameters()).device.type == "cpu":
        keep_freed_memory()
    if quantize is None:
        if dtype == "fp32" and next(model.parameters()).device.type == "cpu" and can_pack_linear():
            return pack_linears(model)
        return model.to(DTYPES[dtype])
    with warnings.catch_warnings():
        # torch.ao.quantization is deprecated in favour of torchao, whose int8 path is slower than fp32 on CPU
        # without torch.compile; quantize_dynamic is about 1.7x faster than fp32 there.
        warnings.filterwarnings("ignore", message=r"torch\.ao\.quantization is deprecated")
        warnings.filterwarnings("ignore", message=r"torch\.quantize_per_tensor")
        try:
            from torch.ao.quantization import quantize_dynamic
        except ImportError:
            raise UserError(
                f"--quantize int8 needs torch.ao.quantization, gone from torch {torch.__version__}"
            ) from None
        return quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep freed memory for reuse: large blocks come from the heap, not from
    mmap, and the heap is not trimmed. A decoding step allocates and frees blocks of several MB
    (logits, the beams' reordered caches); handed back to the system, each returns as fresh pages
    that the kernel must map and zero again, which cost beam search about a fifth of its time on
    this machine (`scripts/bench_decode.py`). The process keeps what it has used at its peak.
    Process-wide; False where the C library is not glibc (nothing changes)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library the process already uses
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # malloc.h
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, 2**30) == 1


def pack_linears(model: Transformer) -> Transformer:
    """A copy of the model (fp32, CPU, eval) with every nn.Linear replaced by a PackedLinear."""
    packed = copy.deepcopy(model).float().eval()
    for module in list(packed.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(module, name, PackedLinear(child))
    return packed


def decode_options(
    cfg: Config,
    beam: int | None = None,
    length_penalty: float | None = None,
    batch_tokens: int | None = None,
    max_len_a: float | None = None,
    max_len_b: float | None = None,
) -> dict:
    """Search options for translate_lines: the ones given, else the checkpoint's decode section."""
    given = dict(
        beam_size=beam,
        length_penalty=length_penalty,
        batch_tokens=batch_tokens,
        max_len_a=max_len_a,
        max_len_b=max_len_b,
    )
    for option, value, low in [("--beam", beam, 1), ("--batch-tokens", batch_tokens, 1)] + [
        ("--max-len-a", max_len_a, 0),
        ("--max-len-b", max_len_b, 0),
    ]:
        if value is not None and value < low:
            raise UserError(f"{option} must be at least {low}, got {value}")
    return {key: getattr(cfg.decode, key) if value is None else value for key, value in given.items()}


def check_workers(workers: int) -> None:
    if workers < 0:
        raise UserError(f"--workers must be at least 0 (0 = auto), got {workers}")


def decode_file(
    checkpoints: Sequence[str | Path],
    input: str | Path = "-",
    output: str | Path = "-",
    *,
    beam: int | None = None,
    length_penalty: float | None = None,
    nbest: int = 1,
    with_scores: bool = False,
    batch_tokens: int | None = None,
    workers: int = 0,
    max_len_a: float | None = None,
    max_len_b: float | None = None,
    device: str = "auto",
    dtype: str = "auto",
    quantize: str | None = None,
) -> int:
    """`translate decode`: a file (or stdin, translated line by line as it arrives) to a file or
    stdout; K lines per input line for --nbest K, TSV with --scores. Returns the input line count."""
    check_workers(workers)
    if str(input) != "-" and str(output) != "-" and Path(input).resolve() == Path(output).resolve():
        raise UserError(f"--output {output} is the input file; choose another file")
    if str(output) != "-":
        check_output_path(output, "--output", checkpoints)
    lines = read_lines(input)
    models, tokenizer, cfg = load_models(checkpoints, resolve_device(device), dtype=dtype, quantize=quantize)
    options = decode_options(cfg, beam, length_penalty, batch_tokens, max_len_a, max_len_b)
    translations = translate_lines(
        models,
        tokenizer,
        lines,
        nbest=nbest,
        stream=str(input) == "-",
        workers=workers,
        protect=cfg.decode.protect,
        **options,
    )
    return write_translations(translations, output, nbest_format="tsv" if with_scores else "text")


def translate_file_lines(
    checkpoints: Sequence[str | Path],
    sources: list[str],
    *,
    beam: int | None = None,
    length_penalty: float | None = None,
    batch_tokens: int | None = None,
    workers: int = 0,
    device: str = "auto",
    output: str | Path | None = None,
    dtype: str = "auto",
    quantize: str | None = None,
) -> list[str]:
    """`translate evaluate`: the 1-best translation of each source line (also written to `output`)."""
    check_workers(workers)
    models, tokenizer, cfg = load_models(checkpoints, resolve_device(device), dtype=dtype, quantize=quantize)
    options = decode_options(cfg, beam, length_penalty, batch_tokens)
    hypotheses = [
        nbest[0][0]
        for nbest in translate_lines(models, tokenizer, sources, workers=workers, protect=cfg.decode.protect, **options)
    ]
    if output is not None:
        write_translations([[(h, 0.0)] for h in hypotheses], output)
    return hypotheses


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
    (model,), tokenizer, cfg = load_models([checkpoint], resolve_device("auto"))
    stack = "encoder" if kind == "encoder" else "decoder"
    n_layers, n_heads = getattr(model.cfg, f"{stack}_layers"), model.cfg.n_heads
    if not -n_layers <= layer < n_layers:
        layers = f"{n_layers} layer{'s' * (n_layers != 1)}"
        raise UserError(f"--layer {layer}: the {stack} has {layers} (0..{n_layers - 1}, or -1 for the last)")
    if head is not None and not 0 <= head < n_heads:
        raise UserError(f"--head {head}: the model has {n_heads} heads (0..{n_heads - 1})")
    if not sentence.strip():
        raise UserError("the sentence to translate is empty")
    if not Path(output).parent.is_dir():
        raise UserError(f"output directory not found: {Path(output).parent}")
    options = decode_options(cfg, beam)
    device = next(model.parameters()).device
    src = pad_batch([encode_sources(tokenizer, [sentence], model.cfg.max_positions - 1)[0]], device)  # (1, S)
    search = {k: v for k, v in options.items() if k != "batch_tokens"}
    tokens = beam_search([model], src, **search)[0][0].tokens
    weights, cols, rows = attention_maps(model, tokenizer, sentence.strip(), tokens, kind, layer)  # (H, R, C)
    name = "cross-attention" if kind == "cross" else f"{kind} self-attention"
    xlabel, ylabel = AXES[kind]
    if all_heads:
        fig = heads_figure(weights, cols, rows, f"{name}, layer {layer % n_layers}", xlabel, ylabel)
    else:
        which = f"layer {layer % n_layers}, " + ("mean of heads" if head is None else f"head {head}")
        w = weights.mean(0) if head is None else weights[head]
        fig = attention_figure(w, cols, rows, title=f"{name}, {which}", xlabel=xlabel, ylabel=ylabel)
    save_figure(fig, output)
    return tokenizer.decode([tokens])[0]
