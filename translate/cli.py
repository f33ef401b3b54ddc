"""The `translate` command line: thin commands that parse, call one library function, print.

Its length (about 500 lines) is the option declarations and their help texts; each command's
body is a few lines. It sets the process-wide state of the command being run: log handlers
(removed after it), glibc's malloc settings for decoding, oneDNN's primitive cache for training.
(The decoding processes of pool.py, processes of their own, set theirs themselves.)
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import typer

try:  # typer >= 0.24 carries its own copy of click and raises its exceptions; no public name for them
    from typer._click import exceptions as click_errors
except ImportError:
    from click import exceptions as click_errors

from translate.errors import DISK_FULL, UserError, os_error_line
from translate.options import ServingLimits

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="English->French Transformer translation: prepare data, train, decode, evaluate.",
)
log = logging.getLogger("translate")

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="Experiment YAML (or a run dir holding config.yaml).")]


def flag(*names: str, help: str) -> Any:
    """A boolean option (a flag): its help shows no value to give it (typer would show <bool>)."""
    return typer.Option(*names, help=help, metavar="")


SetOpt = Annotated[
    Optional[list[str]], typer.Option("--set", "-s", help="Override a config key: section.key=value (repeatable).")
]
Checkpoint = Annotated[
    Path, typer.Argument(help="A checkpoint written by `translate train` (e.g. runs/NAME/checkpoints/best.pt).")
]


def file_name(value: str | Path) -> Path:
    """An output file's name as given: one ending in '/' (or '/.') names a directory (a Path would drop it)."""
    if isinstance(value, str) and os.path.basename(value) in ("", ".", ".."):
        raise typer.BadParameter(f"{value} names a directory; give a file name")
    return Path(value)


def output_name(value: str) -> str:
    """decode's --output: a file name (file_name) or -, kept as given (./- is a file)."""
    file_name(value)
    return value


BeamOpt = Annotated[
    Optional[int],
    typer.Option("--beam", "-b", help="Beam size; 1 = greedy. Default: the checkpoint's decode.beam_size."),
]
LenpenOpt = Annotated[
    Optional[float], typer.Option("--lenpen", help="GNMT length penalty alpha. Default: decode.length_penalty.")
]
BatchOpt = Annotated[
    Optional[int],
    typer.Option(
        "--batch-tokens",
        help="Bound on sentences x beam x longest source (in pieces) over the batches decoded at once. "
        "Default: decode.batch_tokens.",
    ),
]
WorkersOpt = Annotated[
    int,
    typer.Option(
        "--workers",
        help="Batches decoded at once, each on an equal share of the CPU threads and of --batch-tokens. "
        "0 = auto (2 on a CPU with 2+ threads, else 1).",
    ),
]
ServeWorkersOpt = Annotated[
    int,
    typer.Option(
        "--workers",
        help="Decoding workers, each on an equal share of the CPU threads and of --batch-tokens: processes "
        "on a CPU (each loads the model), threads on a GPU. 0 = auto (2 on a CPU with 2+ threads, else 1).",
    ),
]
DeviceOpt = Annotated[
    str, typer.Option("--device", help="auto | cpu | cuda | cuda:N | mps (auto: CUDA, else MPS, else CPU)")
]
DtypeOpt = Annotated[
    str,
    typer.Option(
        "--dtype",
        help="auto | fp32 | bf16 | fp16. auto: bf16 (else fp16) on CUDA, fp32 on CPU and MPS; "
        "bf16 on a CPU only where it is native (AVX-512 BF16 / AMX), fp16 on CUDA only.",
    ),
]
QuantizeOpt = Annotated[
    Optional[str], typer.Option("--quantize", help="int8: dynamic int8 quantization of the linear layers (CPU).")
]
ProtectOpt = Annotated[
    bool,
    flag(
        "--protect/--no-protect",
        help="Copy placeholders, tags, URLs, paths and numbers verbatim (the checkpoint's decode.protect classes), "
        "and characters the vocabulary lacks outside words (emoji, other scripts); a document's markup is kept "
        "either way.",
    ),
]
GlossaryOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--glossary",
        help="A terms.tsv (source term TAB target term, one a line): each term comes out as its target, "
        "where the model places it (default: the checkpoint's decode.glossary).",
    ),
]
SPLIT_HELP = (
    "Translate each sentence of a line apart and join them (a line may be a paragraph); "
    "one-sentence lines are translated as they are."
)
SplitOpt = Annotated[bool, flag("--split/--no-split", help=SPLIT_HELP + " --nbest and --scores take whole lines.")]
EvalSplitOpt = Annotated[bool, flag("--split/--no-split", help=SPLIT_HELP)]


class _TqdmHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        tqdm.write(self.format(record), file=sys.stderr)


def _setup_logging(verbose: bool = False) -> None:
    root = logging.getLogger("translate")
    if not root.handlers:
        handler = _TqdmHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    root.handlers[0].setLevel(logging.DEBUG if verbose else logging.INFO)


InitFromOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--init-from",
        help="Start a new run from this checkpoint's weights and vocabulary, with a fresh optimizer "
        "(domain adaptation; same as train.init_from; prepare: its vocabulary).",
    ),
]


def _load_cfg(config: Path, overrides: Optional[list[str]]):
    from translate.config import load_config

    if config.is_dir():
        config = config / "config.yaml"
    return load_config(config, overrides or [])


def _refuse_run_elsewhere(config: Path, cfg, doing: str = "resume") -> None:
    """--resume (or prepare) with the config.yaml of a run that has trained (or prepared), whose run_dir
    and name (not set on the command line) make another run from this directory (run_dir is relative
    to the working directory, or the run was copied): refused, rather than a new run from step 0,
    another run resumed, or a stray run directory."""
    from translate.checkpoint import newest_checkpoint

    if not config.is_dir() and config.name != "config.yaml":  # not a run's own config
        return
    home = (config if config.is_dir() else config.parent).absolute()
    prepared = (home / "spm.model").is_file()  # a run's vocabulary: a project's own data/ is no run
    used = newest_checkpoint(home / "checkpoints") is not None or (doing == "prepare" and prepared)
    if not used or home.resolve() == cfg.run_path.resolve():
        return
    raise UserError(
        f"cannot {doing}: {home} is the run of this config, but run_dir and name ({cfg.run_dir}, {cfg.name}) make "
        f"{cfg.run_path} from here: run it from the directory it was trained in, or add --set run_dir={home.parent} "
        f"--set name={home.name}"
    )


class _LogFile(logging.FileHandler):
    """A run's log file: a write that fails (a full disk) says so in one line, once, not a traceback
    per message; the command goes on, and fails where its own writes fail."""

    failed = False

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if not isinstance(error, OSError) or (line := os_error_line(error)) is None:
            return super().handleError(record)
        if not self.failed:
            self.failed = True
            print(f"warning: cannot write the log file {self.baseFilename}: {line}", file=sys.stderr)


def _log_to_file(path: Path) -> None:
    if path.parent.exists() and not path.parent.is_dir():
        raise UserError(f"the run directory {path.parent} (run_dir/name) is a file, not a directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create the run directory {path.parent} (run_dir/name): {e.strerror}") from None
    _close_log_files()  # one command's log file at a time, in-process callers included
    handler = _LogFile(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    handler.setLevel(logging.DEBUG)
    logging.getLogger("translate").addHandler(handler)
    logging.getLogger("translate").setLevel(logging.DEBUG)


def _to_log_files(line: str) -> None:
    """A command's error in the run's log file too (train.log, prepare.log): the console's is not kept."""
    record = logging.LogRecord("translate", logging.ERROR, __file__, 0, line, None, None)
    for handler in logging.getLogger("translate").handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def _close_log_files() -> None:
    """Remove and close the log-file handlers that `_log_to_file` added (after each command)."""
    logger = logging.getLogger("translate")
    for handler in [h for h in logger.handlers if isinstance(h, logging.FileHandler)]:
        logger.removeHandler(handler)
        try:
            handler.close()
        except OSError:  # its last buffered lines on a full disk: the command has said what failed
            pass


def _keep_freed_memory() -> None:
    """The decoding commands' one process-wide setting: glibc keeps the memory decoding frees for
    reuse (inference.keep_freed_memory: 1.06x greedy, 1.14x beam 5 on CPU, see docs/performance.md).
    The library never does this by itself; a program that wants it calls keep_freed_memory."""
    from translate.inference import keep_freed_memory

    keep_freed_memory()


@app.command()
def prepare(
    config: ConfigOpt,
    set_: SetOpt = None,
    force: Annotated[bool, flag("--force", help="Rebuild even if the prepared data matches the config.")] = False,
    init_from: InitFromOpt = None,
) -> None:
    """Fetch, clean and split the corpus, train SentencePiece, encode every split to ids."""
    from translate.prepare import prepare as run_prepare
    from translate.rundir import RunLock, check_run_layout, prepare_config

    cfg = _load_cfg(config, [*(set_ or []), *([f"train.init_from={init_from}"] if init_from else [])])
    if not any(o.replace(" ", "").startswith(("run_dir=", "name=")) for o in set_ or []):
        _refuse_run_elsewhere(config, cfg, "prepare")  # before anything is written
    _log_to_file(cfg.run_path / "prepare.log")
    lock = RunLock(cfg.run_path)  # a training of this run reads the data that preparing would replace
    check_run_layout(cfg.run_path)
    try:
        data_dir = run_prepare(prepare_config(cfg), force=force)
    finally:
        lock.release()
    typer.echo(f"prepared data in {data_dir}, vocabulary {cfg.run_path / 'spm.model'} (ready for this config)")


def onednn_primitive_cache() -> str:
    """Set the capacity of oneDNN's primitive cache for this process (read when torch builds its
    first primitive) unless the user has, and say what it is and why.

    bf16 matrix products on a CPU go through oneDNN, which keeps a primitive with its kernels and
    buffers per shape, and the heap grows with the shapes the batches bring (docs/experiments.md,
    "Host memory over a run"). Where they run on AVX-512, oneDNN's default of 1,024 is the
    flatter choice for the default run's batches (packed by rounded lengths): over 1,500 updates on a Zen 5
    its memory grew 8-14 % above update 100, against 16-21 % with 64, at the same speed (16 was
    13-19 % slower). With AMX (Intel) the heap grows more: at 64 the default hour's memory rose 35 %
    on a Xeon; at 16 it stayed within 13 % over 800 to 2,000 updates, 5 % slower."""
    import os

    if "ONEDNN_PRIMITIVE_CACHE_CAPACITY" in os.environ:
        return f"{os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY']}: ONEDNN_PRIMITIVE_CACHE_CAPACITY as set"
    value, why = ("16", "the CPU has AMX") if _cpu_uses_amx() else ("1024", "no AMX on this CPU")
    os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = value
    return f"{value}: {why}"


def _cpu_uses_amx(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether oneDNN may multiply with AMX tiles here: the CPU's flags (Linux's /proc/cpuinfo;
    elsewhere no) have amx_tile and ONEDNN_MAX_CPU_ISA, where set, allows AMX."""
    import os

    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if isa and "AMX" not in isa and isa not in ("ALL", "DEFAULT"):
        return False
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            return any(line.startswith("flags") and "amx_tile" in line.split() for line in f)
    except OSError:
        return False


@app.command()
def train(
    config: ConfigOpt,
    set_: SetOpt = None,
    resume: Annotated[
        bool, flag("--resume", help="Continue the run from its checkpoints/last.pt (none yet: start it).")
    ] = False,
    init_from: InitFromOpt = None,
) -> None:
    """Train a Transformer (prepares the data first if needed). TensorBoard logs in RUN_DIR/NAME/tb."""
    cache = onednn_primitive_cache()  # process-wide, before torch builds its first oneDNN primitive
    import torch

    from translate.distributed import World
    from translate.hardware import choose_amp, resolve_device
    from translate.train import train as run_train

    cfg = _load_cfg(config, [*(set_ or []), *([f"train.init_from={init_from}"] if init_from else [])])
    if resume and not any(o.replace(" ", "").startswith(("run_dir=", "name=")) for o in set_ or []):
        _refuse_run_elsewhere(config, cfg)
    world = World.from_env()
    device = resolve_device(cfg.train.device, "train.device", world.local_rank)
    choose_amp(cfg.train.amp, device)  # a precision the machine cannot run is refused before anything is written
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    if world.main:
        _log_to_file(cfg.run_path / "train.log")
        log.debug(f"oneDNN primitive cache {cache}")  # train.log only: the console keeps to the run
    try:
        metrics = run_train(cfg, resume=resume)
    except OSError as e:  # a full disk where no checkpoint was being saved (TensorBoard's events, the data)
        if e.errno not in DISK_FULL:
            raise
        from translate.train import resume_command

        started = (cfg.run_path / "config.yaml").is_file()
        raise UserError(
            os_error_line(e, f"continue with: {resume_command(cfg, world)}" if started else "run again")
        ) from None
    if metrics and world.main:
        typer.echo(f"last validation: {json.dumps({k: round(v, 3) for k, v in metrics.items()})}")
        typer.echo(f"checkpoints in {cfg.run_path / 'checkpoints'}")


@app.command()
def decode(
    checkpoints: Annotated[
        list[Path], typer.Argument(help="One checkpoint, or several of one vocabulary (an ensemble).")
    ],
    input: Annotated[
        str,
        typer.Option(
            "--input", "-i", help="English text, one paragraph a line (or an HTML or Markdown document); - for stdin."
        ),
    ] = "-",
    output: Annotated[
        str,
        typer.Option("--output", "-o", help="Where the French goes; - for stdout.", parser=output_name),
    ] = "-",
    beam: BeamOpt = None,
    lenpen: LenpenOpt = None,
    nbest: Annotated[int, typer.Option("--nbest", help="Write the K best translations of each line.")] = 1,
    scores: Annotated[bool, flag("--scores", help="Write index<TAB>score<TAB>text (TSV).")] = False,
    batch_tokens: BatchOpt = None,
    workers: WorkersOpt = 0,
    max_len_a: Annotated[
        Optional[float],
        typer.Option(
            help="Max output length = a * source length + b (at most 4x model.max_positions). Default: decode.max_len_a."
        ),
    ] = None,
    max_len_b: Annotated[Optional[int], typer.Option(help="See --max-len-a. Default: decode.max_len_b.")] = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    quantize: QuantizeOpt = None,
    protect: ProtectOpt = True,
    glossary: GlossaryOpt = None,
    split: SplitOpt = True,
    format: Annotated[
        Optional[str],
        typer.Option(
            "--format",
            help="text (one paragraph a line), html or markdown (the whole document, its markup kept); "
            "default: by the extension of --input (.html/.htm/.xhtml, .md/.markdown), else text.",
        ),
    ] = None,
) -> None:
    """Translate a text file (or stdin), an HTML or a Markdown document, with greedy (--beam 1) or beam search."""
    from translate.engine import EngineSpec
    from translate.translator import decode_file

    _keep_freed_memory()
    spec = EngineSpec(
        checkpoints, device=device, dtype=dtype, quantize=quantize, protect=protect, batch_tokens=batch_tokens,
        workers=workers, beam_size=beam, length_penalty=lenpen, max_len_a=max_len_a, max_len_b=max_len_b, nbest=nbest,
        glossary=str(glossary) if glossary else None,
    )  # fmt: skip
    decode_file(spec, input, output, with_scores=scores, format=format, split=split)


@app.command()
def evaluate(
    checkpoints: Annotated[Optional[list[Path]], typer.Argument(help="Checkpoint(s) to translate --src with.")] = None,
    src: Annotated[
        Optional[Path], typer.Option("--src", help="English source file to translate (with --hyp: shown in --report).")
    ] = None,
    ref: Annotated[
        list[Path],
        typer.Option(
            "--ref",
            help="French reference file, one line per source line; repeat it for several references.",
            metavar="FILE",
        ),
    ] = ...,
    hyp: Annotated[
        Optional[Path], typer.Option("--hyp", help="Score this existing output instead of translating.")
    ] = None,
    output: Annotated[
        Optional[Path],
        typer.Option("--output", "-o", help="Also save the translations here.", parser=file_name, metavar="FILE"),
    ] = None,
    beam: BeamOpt = None,
    lenpen: LenpenOpt = None,
    batch_tokens: BatchOpt = None,
    workers: WorkersOpt = 0,
    json_out: Annotated[
        Optional[Path],
        typer.Option("--json", help="Write the scores and signatures as JSON.", parser=file_name, metavar="FILE"),
    ] = None,
    report: Annotated[
        Optional[Path],
        typer.Option(
            "--report",
            help="Write an HTML page: every sentence with its chrF, worst first, and histograms.",
            parser=file_name,
            metavar="FILE",
        ),
    ] = None,
    hyp_b: Annotated[
        Optional[Path],
        typer.Option("--hyp-b", help="A second system's output: scored too, side by side in --report."),
    ] = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    quantize: QuantizeOpt = None,
    protect: ProtectOpt = True,
    glossary: GlossaryOpt = None,
    split: EvalSplitOpt = True,
) -> None:
    """sacreBLEU BLEU and chrF (with signatures) of a checkpoint on --src/--ref, or of --hyp against --ref."""
    from translate.engine import EngineSpec
    from translate.translator import evaluate_files

    _keep_freed_memory()
    spec = EngineSpec(
        checkpoints or [], device=device, dtype=dtype, quantize=quantize, protect=protect, batch_tokens=batch_tokens,
        workers=workers, beam_size=beam, length_penalty=lenpen, glossary=str(glossary) if glossary else None,
    )  # fmt: skip
    for line in evaluate_files(
        ref, spec=spec, src=src, hyp=hyp, hyp_b=hyp_b, output=output, json_out=json_out, report=report, split=split
    ):
        typer.echo(line)


@app.command()
def serve(
    checkpoints: Annotated[list[Path], typer.Argument(help="One checkpoint, or several of one vocabulary.")],
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port (0: any free port, logged).")] = 8080,
    beam: BeamOpt = None,
    lenpen: LenpenOpt = None,
    batch_tokens: BatchOpt = None,
    workers: ServeWorkersOpt = 0,
    batch_window_ms: Annotated[
        float, typer.Option("--batch-window-ms", help="How long a batch waits for more requests.")
    ] = ServingLimits.batch_window_ms,
    max_batch: Annotated[
        int,
        typer.Option(
            "--max-batch",
            help="Most sentences a decoding worker searches at once (a larger request is searched whole).",
        ),
    ] = ServingLimits.max_batch,
    max_queue: Annotated[
        int, typer.Option("--max-queue", help="Sentences waiting; past it: 503 (a request of more sentences: 413).")
    ] = ServingLimits.max_queue,
    max_texts: Annotated[
        Optional[int],
        typer.Option(
            "--max-texts", help="Texts in one request; past it: 413 (default 256, or --max-queue where less)."
        ),
    ] = None,
    max_request_bytes: Annotated[
        int, typer.Option("--max-request-bytes", help="Body size; past it: 413.")
    ] = ServingLimits.max_request_bytes,
    body_timeout_s: Annotated[
        float,
        typer.Option(
            "--body-timeout-s", help="Seconds to receive a request's body; past it: 408 (SIGTERM waits no longer)."
        ),
    ] = ServingLimits.body_timeout_s,
    log_text: Annotated[bool, flag("--log-text", help="Also log each request's sentences.")] = False,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    quantize: QuantizeOpt = None,
    protect: ProtectOpt = True,
    glossary: GlossaryOpt = None,
) -> None:
    """HTTP JSON API: POST /translate {"text": ...} or {"texts": [...]}, GET /health, and a page to try it at / (README, Deploying)."""
    from translate.engine import EngineSpec
    from translate.serve import serve as run_serve

    _keep_freed_memory()
    limits = ServingLimits(
        batch_window_ms, max_batch, max_queue, max_texts, max_request_bytes, body_timeout_s=body_timeout_s
    )
    spec = EngineSpec(
        checkpoints, device=device, dtype=dtype, quantize=quantize, protect=protect, batch_tokens=batch_tokens,
        workers=workers, beam_size=beam, length_penalty=lenpen, limits=limits,
        glossary=str(glossary) if glossary else None,
    )  # fmt: skip
    run_serve(spec, host=host, port=port, log_text=log_text)


@app.command()
def average(
    checkpoints: Annotated[Optional[list[Path]], typer.Argument(help="Checkpoints of one run to average.")] = None,
    output: Annotated[
        Path,
        typer.Option("--output", "-o", help="Where the averaged checkpoint goes.", parser=file_name, metavar="FILE"),
    ] = ...,
    last: Annotated[Optional[int], typer.Option("--last", help="Average the last N step checkpoints of --run.")] = None,
    run: Annotated[Optional[Path], typer.Option("--run", help="Run dir (RUN_DIR/NAME) for --last.")] = None,
) -> None:
    """Average the weights of several checkpoints (often better than any one of them)."""
    from translate.checkpoint import STEP_FILE, atomic_save, average_checkpoints, check_distinct, step_checkpoints
    from translate.textio import check_output_path

    if last is not None:
        if run is None:
            raise UserError("--last N needs --run RUN_DIR/NAME")
        if checkpoints:
            raise UserError("give either checkpoints or --last N --run RUN_DIR/NAME, not both")
        if last < 2:
            raise UserError(f"--last must be at least 2, got {last}")
        if not (run / "checkpoints").is_dir():
            raise UserError(f"--run {run}: not a run directory (it has no checkpoints/)")
        paths = step_checkpoints(run / "checkpoints")[-last:]
        if len(paths) < last:
            raise UserError(
                f"{run / 'checkpoints'} holds {len(paths)} step checkpoint{'s' * (len(paths) != 1)}, fewer than --last {last}"
            )
    else:
        if run is not None:
            raise UserError("--run goes with --last N")
        paths = list(checkpoints or [])
    if len(paths) < 2:
        raise UserError("average needs at least two checkpoints (or --last N --run RUN_DIR/NAME)")
    check_distinct(paths)
    path = check_output_path(output, "--output", paths)  # before the inputs are read: a mistake costs no time
    own = path.name in ("best.pt", "last.pt") or STEP_FILE.fullmatch(path.name)
    where = path.absolute().parent
    if own and where.name == "checkpoints" and (where.parent / "config.yaml").is_file():  # a run's own
        raise UserError(
            f"--output {output}: a checkpoint of the run's own (training and --resume use it); write the average "
            f"beside it, e.g. {path.parent / 'averaged.pt'}"
        )
    atomic_save(average_checkpoints(paths), path)
    typer.echo(f"averaged {len(paths)} checkpoints into {output}")


@app.command()
def tune(
    checkpoint: Checkpoint,
    src: Annotated[Path, typer.Option("--src", help="English held-out source (e.g. runs/NAME/data/valid.en).")] = ...,
    ref: Annotated[Path, typer.Option("--ref", help="Its French references, one line per source line.")] = ...,
    lenpen: Annotated[
        Optional[list[float]],
        typer.Option(
            "--lenpen",
            help="A length penalty to try (repeatable). Default: the checkpoint's decode.tune_length_penalty, "
            "else 0.6 0.8 1.0 1.2.",
        ),
    ] = None,
    dry_run: Annotated[
        bool, flag("--dry-run", help="Print the scores and the choice; leave the checkpoint as it is.")
    ] = False,
    batch_tokens: BatchOpt = None,
    workers: WorkersOpt = 0,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    split: EvalSplitOpt = True,
) -> None:
    """Choose the length penalty with the best BLEU on --src/--ref (the checkpoint's beam) and write it
    into the checkpoint's decode section, the default of every command that translates with it."""
    from translate.engine import EngineSpec
    from translate.textio import check_references, check_same_length, read_all_lines
    from translate.tune import tune_checkpoint

    _keep_freed_memory()
    sources, references = read_all_lines(src, "source"), read_all_lines(ref, "reference")
    check_same_length(src, sources, ref, references)
    check_references(ref, references)
    spec = EngineSpec(
        [checkpoint], device=device, dtype=dtype, protect=True, batch_tokens=batch_tokens, workers=workers
    )
    choice, written = tune_checkpoint(
        checkpoint, sources, references, lenpen, spec=spec, write=not dry_run, split=split
    )
    typer.echo(choice.summary())
    typer.echo(f"written into {', '.join(map(str, written))}" if written else "--dry-run: the checkpoint is unchanged")


@app.command()
def attention(
    checkpoint: Checkpoint,
    sentence: Annotated[str, typer.Argument(help="An English sentence.")],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Picture: .png, .pdf, .svg", parser=file_name, metavar="FILE")
    ] = Path("attention.png"),
    layer: Annotated[
        int, typer.Option("--layer", help="Layer (0-based; -1 = last): decoder, or encoder with --self encoder.")
    ] = -1,
    head: Annotated[Optional[int], typer.Option("--head", help="Attention head (default: mean of all heads).")] = None,
    all_heads: Annotated[bool, flag("--all-heads", help="A grid with every head of the layer.")] = False,
    self_attention: Annotated[
        Optional[Literal["encoder", "decoder"]],
        typer.Option(
            "--self",
            help="Self-attention instead: 'encoder' (source over source) or 'decoder' (output over earlier output).",
        ),
    ] = None,
    beam: BeamOpt = None,
) -> None:
    """Translate one sentence and plot its attention as a heatmap over subword pieces.

    Cross-attention (output over source) by default; --self encoder|decoder for self-attention;
    --all-heads for a grid of every head, --head H for one. The sentence is read as written: spans are
    not protected (no placeholders), so the pieces are those of its own text.
    """
    from translate.translator import plot_attention

    _keep_freed_memory()
    translation = plot_attention(
        checkpoint, sentence, output, layer=layer, head=head, beam=beam, all_heads=all_heads,
        self_attention=self_attention,
    )  # fmt: skip
    typer.echo(f"{translation}\nattention heatmap written to {output}")


@app.command()
def plot(
    runs: Annotated[list[Path], typer.Argument(help="Run directories (RUN_DIR/NAME, or their tb/ folders).")],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Picture: .png, .pdf, .svg ...", parser=file_name, metavar="FILE")
    ] = Path("curves.png"),
) -> None:
    """Training curves of one or several runs from their TensorBoard logs: loss, validation BLEU, learning rate."""
    from translate.plot import plot_curves

    plot_curves(runs, output)
    typer.echo(f"curves of {len(runs)} run{'s' * (len(runs) > 1)} written to {output}")


@app.command()
def export(
    checkpoint: Checkpoint,
    out_dir: Annotated[Path, typer.Argument(help="The directory to write (new, or empty; see --force).")],
    to: Annotated[str, typer.Option("--to", help="ctranslate2 | huggingface (MarianMT; post-norm models only).")] = ...,
    quantize: Annotated[
        Optional[str],
        typer.Option(
            "--quantize",
            help="ctranslate2 only: int8 | int8_float32 | int8_float16 | int8_bfloat16 | int16 | float16 | bfloat16 "
            "| float32 (the default).",
        ),
    ] = None,
    force: Annotated[bool, flag("--force", help="Replace OUT_DIR if it is not empty.")] = False,
) -> None:
    """Write the model for another engine: a CTranslate2 or Hugging Face directory with a README on how to load it.

    Needs ctranslate2 or transformers, the `export` extras (make install has them)."""
    from translate.export import export as run_export

    run_export(checkpoint, to, out_dir, quantize=quantize, force=force)
    typer.echo(f"exported {checkpoint} to {to} in {out_dir} (how to load it: {out_dir / 'README.md'})")


@app.command()
def info(checkpoint: Checkpoint) -> None:
    """Config, parameter count, vocabulary, step and scores of a checkpoint."""
    import yaml

    from translate.checkpoint import checkpoint_config, load_checkpoint
    from translate.model import Transformer, count_parameters

    ckpt = load_checkpoint(checkpoint)
    cfg = checkpoint_config(ckpt)
    n_params = count_parameters(Transformer(cfg.model, ckpt["vocab_size"]))
    typer.echo(f"checkpoint: {checkpoint}")
    typer.echo(f"step: {ckpt.get('step')}  epoch: {ckpt.get('epoch')}  parameters: {n_params:,}")
    typer.echo(f"vocabulary: {ckpt['vocab_size']} SentencePiece pieces ({cfg.vocab.model_type})")
    if ckpt.get("metrics"):
        typer.echo("validation: " + ", ".join(f"{k} {_number(v)}" for k, v in ckpt["metrics"].items()))
    if ckpt.get("progress", {}).get("best") is not None:
        p = ckpt["progress"]
        typer.echo(f"best valid {cfg.train.best_metric}: {_number(p['best'])} at step {p['best_step']}")
    if ckpt.get("hardware"):
        h = ckpt["hardware"]
        typer.echo(f"trained on: {h['device']} x{h['world_size']}, {h['precision']} ({h['reason']})")
    if ckpt.get("progress", {}).get("elapsed"):
        typer.echo(f"time trained: {ckpt['progress']['elapsed'] / 60:.1f} min")
    if ckpt.get("init_from"):
        typer.echo(f"initialised from: {ckpt['init_from']['path']} (step {ckpt['init_from']['step']})")
    if ckpt.get("tune_length_penalty"):
        from translate.tune import Choice

        typer.echo("chosen: " + Choice(**ckpt["tune_length_penalty"]).summary())
    if ckpt.get("averaged_from"):
        typer.echo(f"averaged from: {', '.join(ckpt['averaged_from'])}")
    typer.echo("versions: " + ", ".join(f"{k} {v}" for k, v in ckpt.get("versions", {}).items()))
    typer.echo("config:\n" + yaml.safe_dump(ckpt["config"], sort_keys=False).rstrip())


def _number(value: object) -> str:
    """A metric as info prints it: 3 decimals, or as it is (a hand-made checkpoint may hold anything)."""
    try:
        return f"{float(value):.3f}"  # a number, a numpy or 0-d torch one too
    except (TypeError, ValueError):
        return str(value)


class Terminated(BaseException):
    """SIGTERM, raised where the command is, so that what it was writing is cleaned up as after Ctrl-C
    (`train` and `serve` handle SIGTERM themselves while they run: they save, or drain)."""


def peer_gone(error: RuntimeError) -> str | None:
    """One line for a process of a torchrun run whose peer ended (killed, or stopped on an error of its
    own, which that one printed), instead of gloo's traceback; None for any other error."""
    text = str(error)
    if "gloo" not in text or not any(s in text for s in ("closed by peer", "reset by peer", "Broken pipe")):
        return None
    return (
        "another process of this training ended (killed, or stopped on an error it printed above), so this one "
        "stops too; continue from the last checkpoint with --resume"
    )


def _terminate(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: another SIGTERM (torchrun's, after a job's kill) waits
    raise Terminated


_THREAD_ERRORS: list[str] = []


def _thread_failed(args: threading.ExceptHookArgs) -> None:
    """A helper thread's full disk (TensorBoard's writer, for one): kept for one line at the end, not a
    traceback; the command then fails where its own writes do, and that line says it all (the thread's
    is printed only where the command ends without one of its own)."""
    error = args.exc_value
    if isinstance(error, OSError) and (line := os_error_line(error)) is not None:
        name = args.thread.name if args.thread else "a thread"
        _THREAD_ERRORS.append(f"error: {name}: {line}")
        return
    threading.__excepthook__(args)


def main() -> None:
    """One `error: ...` line and exit 2 for a user mistake (a bad option, a full disk ...),
    one line and exit 130 after Ctrl-C (143 after SIGTERM); real bugs keep their traceback
    (docs/errors.md)."""
    _setup_logging()
    signal.signal(signal.SIGTERM, _terminate)
    threading.excepthook = _thread_failed
    code = returned = None
    try:
        code = app(standalone_mode=False)  # typer returns 130 after Ctrl-C
        returned = True
    except getattr(click_errors, "NoArgsIsHelpError", ()) as e:
        e.show()
        code = e.exit_code
    except click_errors.ClickException as e:  # an unknown command, a missing or malformed option
        see = f" (see {e.ctx.command_path} --help)" if getattr(e, "ctx", None) else ""
        print(f"error: {' '.join(e.format_message().split())}{see}", file=sys.stderr)
        code = e.exit_code
    except typer.Abort:
        print("aborted", file=sys.stderr)
        code = 1
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        _to_log_files(f"error: {e}")
        code = e.exit_code
    except OSError as e:  # the disk or the permissions, not the code: no traceback
        if (line := os_error_line(e)) is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        _to_log_files(f"error: {line}")
        code = UserError.exit_code
    except RuntimeError as e:  # under torchrun: a peer process ended, and gloo says so from inside a collective
        if (line := peer_gone(e)) is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        code = UserError.exit_code
    except KeyboardInterrupt:
        code = 130
    except Terminated:
        code = 143
    finally:
        if _THREAD_ERRORS and returned and not code:  # the command ended well: the thread's line is all there is
            print(_THREAD_ERRORS[0], file=sys.stderr)
            code = UserError.exit_code
        if stopped := {130: "interrupted", 143: "terminated"}.get(code):
            print(stopped, file=sys.stderr)
            _to_log_files(stopped)
        _close_log_files()
    sys.exit(code or 0)


if __name__ == "__main__":
    main()
