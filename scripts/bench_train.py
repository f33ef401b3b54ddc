"""Training speed of translate: on a CPU against a plain PyTorch reference, on a GPU in steady state.

    python scripts/bench_train.py                         # CPU: translate fp32 and bf16 (where native)
    python scripts/bench_train.py --vs-reference          # + torch.nn.Transformer reference, interleaved
    python scripts/bench_train.py --bf16-loss-steps 300   # valid loss after N steps, fp32 vs bf16
    python scripts/bench_train.py --config configs/wmt14_base.yaml --set data.source=files \\
        --set data.dataset=null --set data.subset=null --set data.train=/tmp/syn/train --variant "25k x1=train.max_tokens=25000,train.accumulate=1"

Every figure comes from the trainer's own update (`Trainer.update`) on batches collated as
training collates them (`Trainer.collate`); the first line says which machine class it ran on.

On a CPU it trains the model of CONFIG (default configs/bible.yaml) on its train split, after a
warm-up, in windows of --window updates of one batch; the trainers take turns window by window
on the same batches, so that a busy machine slows them alike. It prints medians over the windows:
tokens/s (non-pad source + target; and target alone), padding, peak RSS, and MFU (model FLOP
utilisation) against the machine's matmul peak measured in the same run (`torch.mm`, 2048x2048,
fp32, and bf16 where the CPU multiplies it natively). `--variant` adds trainers at the first
precision with other settings, timed on the same sentences' batches (each collating them as its
settings pad them), e.g. `--variant "pad 8=train.pad_to_multiple=8"`.

On a GPU (train.device cuda, or auto where one is) it measures the steady state, once per
variant (the config as it is, then each --variant's overrides): the first --updates updates of
the epoch with the config's accumulation, their batches collated ahead in a background thread
into pinned memory as `translate train` does, run once to warm up (every batch shape builds its
attention plans and, with train.compile, its graph), then timed from the first update's batches in
hand to the device's end of the last. It prints per update: the host's
time to queue it, the device's time (CUDA events) and the wall time; target tokens/s, model
TFLOP/s and MFU against the GPU's bf16 matmul peak (measured: 8192x8192 torch.mm); the distinct
batch shapes (of the timed updates, and of the whole epoch); the synchronisations one update
makes (translate.syncs.SyncCounter) and the attention kernel it ran.

Model FLOPs are counted analytically over the real (non-pad) tokens of each batch:
  6 * (encoder-layer parameters) per source token
+ 6 * (decoder-layer parameters + output projection V*D) per target token
+ attention: 12 * D * (S^2 * encoder layers + (T^2 + T*S) * decoder layers) per sentence
(6 = 2 FLOPs per multiply-add x 3 for forward + backward; embedding lookups and norms are not counted).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import resource
import statistics
import sys
import time
from pathlib import Path

from translate.cli import onednn_primitive_cache

CACHE = onednn_primitive_cache()  # sized as `translate train` sizes it, before torch builds a primitive

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))

from reference_trainer import ReferenceTrainer  # noqa: E402

from translate.batching import padding_fraction, round_up  # noqa: E402
from translate.config import Config, config_from_dict, config_to_dict, load_config  # noqa: E402
from translate.data import Batch, Prefetcher, collate  # noqa: E402
from translate.errors import UserError  # noqa: E402
from translate.hardware import cpu_info, describe_machine  # noqa: E402
from translate.model import Transformer  # noqa: E402
from translate.syncs import SyncCounter  # noqa: E402
from translate.tokenizer import PAD  # noqa: E402
from translate.train import PREFETCH, Trainer  # noqa: E402


def matmul_peak(dtype: torch.dtype, device: torch.device = torch.device("cpu"), repeats: int = 7) -> float:
    """Median FLOP/s of an n x n matrix product on `device` (n = 2048 on a CPU, 8192 on a GPU)."""
    n = 8192 if device.type == "cuda" else 2048
    a, b = torch.randn(n, n, device=device).to(dtype), torch.randn(n, n, device=device).to(dtype)
    torch.mm(a, b)
    times = []
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        torch.mm(a, b)
        sync(device)
        times.append(time.perf_counter() - t)
    return 2 * n**3 / statistics.median(times)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def model_flops(model: Transformer, batch: Batch) -> float:
    """Training FLOPs of one batch over its real tokens (see the module docstring)."""
    D = model.cfg.d_model
    enc = sum(p.numel() for p in model.encoder.parameters())
    dec = sum(p.numel() for p in model.decoder.parameters())
    out = model.vocab_size * D
    S = (batch.src != PAD).sum(1).double()
    T = (batch.tgt_out != PAD).sum(1).double()
    dense = 6 * (enc * S.sum() + (dec + out) * T.sum())
    attention = (
        12 * D * (S.pow(2).sum() * model.cfg.encoder_layers + (T.pow(2) + T * S).sum() * model.cfg.decoder_layers)
    )
    return float(dense + attention)


def real_tokens(batch: Batch) -> tuple[int, int]:
    return int((batch.src != PAD).sum()), batch.ntokens


def with_overrides(cfg: Config, overrides: list[str]) -> Config:
    return config_from_dict(config_to_dict(cfg), overrides)


def make_trainer(cfg: Config, overrides: list[str]) -> Trainer:
    return Trainer(with_overrides(cfg, overrides), resume=True)  # a scratch run: nothing is saved


# ---------------------------------------------------------------------------- CPU: against the reference


class Timed:
    """One trainer under test: a name, a step function, its batches (as it pads them), the windows it took."""

    def __init__(self, name: str, step, flops_model: Transformer, batches: list[Batch]) -> None:
        self.name, self.step, self.flops_model, self.batches = name, step, flops_model, batches
        self.tok_s: list[float] = []
        self.tgt_s: list[float] = []
        self.flop_s: list[float] = []

    def window(self, start: int, stop: int) -> None:
        batches = self.batches[start:stop]
        tokens = sum(sum(real_tokens(b)) for b in batches)
        targets = sum(b.ntokens for b in batches)
        flops = sum(model_flops(self.flops_model, b) for b in batches)
        t = time.perf_counter()
        for b in batches:
            self.step(b)
        dt = time.perf_counter() - t
        self.tok_s.append(tokens / dt)
        self.tgt_s.append(targets / dt)
        self.flop_s.append(flops / dt)


def bf16_loss(cfg: Config, steps: int) -> None:
    """Valid loss after `steps` updates from the same initial weights, fp32 against bf16 autocast."""
    losses = {}
    for amp in ("off", "bf16"):
        trainer = make_trainer(cfg, [f"train.max_steps={steps}", f"name={cfg.name}_loss_{amp}", f"train.amp={amp}"])
        batches = trainer.epoch_batches(0)
        for i in range(steps):
            trainer.update([trainer.collate(batches[i % len(batches)])])
        losses[amp] = trainer.validate()["loss"]
        print(f"{amp}: valid loss after {steps} updates {losses[amp]:.4f}", flush=True)
    print(
        f"bf16 / fp32 valid loss: {losses['bf16'] / losses['off']:.4f} (relative difference {losses['bf16'] / losses['off'] - 1:+.2%})"
    )


def cpu_benchmark(cfg: Config, args: argparse.Namespace) -> None:
    amp = {"fp32": "off", "bf16": "bf16"}
    native = cpu_info().native_bf16
    precisions = (args.precisions or ("fp32,bf16" if native else "fp32")).split(",")
    trainers = {p: make_trainer(cfg, [f"train.amp={amp[p]}", f"name={cfg.name}_{amp[p]}"]) for p in precisions}
    for i, (label, overrides) in enumerate(map(parse_variant, args.variant)):  # the first precision, these overrides
        a = amp[precisions[0]]
        trainers[f"{precisions[0]} {label}"] = make_trainer(
            cfg, [f"train.amp={a}", f"name={cfg.name}_{a}_{i}", *overrides]
        )
    first = next(iter(trainers.values()))
    device = first.device
    index_batches = first.epoch_batches(0)
    pad = padding_fraction(index_batches, first.train_data.src_lens, first.train_data.tgt_lens)
    need = args.warmup + args.window * args.windows
    # translate's batches as each trainer collates them (padded as its precision wants: train.pad_to_multiple
    # auto); the reference gets the lengths as they come
    contenders = [
        Timed(f"translate {p}", lambda b, t=t: t.update([b]), t.model, [t.collate(b) for b in index_batches[:need]])
        for p, t in trainers.items()
    ]
    padded = contenders[0].batches
    if args.vs_reference:
        torch.manual_seed(cfg.seed)
        ref = ReferenceTrainer(first.cfg, first.tokenizer.vocab_size)  # the model the first trainer built
        plain = [collate(first.train_data, b) for b in index_batches[:need]]
        contenders.append(Timed("reference nn.Transformer fp32", ref.step, first.model, plain))

    peak32 = matmul_peak(torch.float32, device)
    peak16 = matmul_peak(torch.bfloat16, device) if native else None
    for c in contenders:
        for b in c.batches[: args.warmup]:
            c.step(b)
    for w in range(args.windows):
        start = args.warmup + w * args.window
        order = contenders if w % 2 == 0 else contenders[::-1]
        for c in order:
            c.window(start, start + args.window)
        print(
            f"window {w + 1}/{args.windows}: " + ", ".join(f"{c.name} {c.tok_s[-1]:,.0f} tok/s" for c in contenders),
            flush=True,
        )

    peak32 = max(peak32, matmul_peak(torch.float32, device))  # before and after the windows: the less disturbed
    peak16 = max(peak16, matmul_peak(torch.bfloat16, device)) if native else None
    print_cpu_table(cfg, first, contenders, padded, pad, len(index_batches), peak32, peak16, args.vs_reference)
    for t in trainers.values():
        t.close()


def print_cpu_table(cfg, first: Trainer, contenders, padded, pad, n_batches, peak32, peak16, vs_reference) -> None:
    device = first.device
    print()
    sizes = {c.name: sum(p.numel() for p in c.flops_model.parameters()) for c in contenders}
    models = (  # a setting given by precision (model.d_ff) may build another model at each precision
        f"model: {sizes[contenders[0].name]:,} parameters"
        if len(set(sizes.values())) == 1
        else "models: " + ", ".join(f"{name} {n:,}" for name, n in sizes.items()) + " parameters"
    )
    print(f"{models}; batches of train.max_tokens={first.max_tokens}; threads {torch.get_num_threads()}")
    print(f"padding: {pad:.2%} of source + target positions in the epoch's {n_batches} batches")
    positions = sum(b.src.numel() + b.tgt_out.numel() for b in padded)
    print(
        f"{contenders[0].name}'s timed batches, lengths padded to a multiple of {first.padding.pad}: "
        f"{1 - sum(sum(real_tokens(b)) for b in padded) / positions:.2%} padding"
    )
    bf16_peak = f"bf16 {peak16 / 1e9:,.0f} GFLOP/s" if peak16 else "bf16 not native here (no bf16 peak)"
    print(f"matmul peak (torch.mm on {device}, median): fp32 {peak32 / 1e9:,.0f} GFLOP/s, {bf16_peak}")
    mfu16 = f" {'MFU bf16':>9}" if peak16 else ""
    print(f"{'trainer':32} {'tokens/s':>10} {'target tok/s':>13} {'GFLOP/s':>9} {'MFU fp32':>9}{mfu16}")
    for c in contenders:
        flop_s = statistics.median(c.flop_s)
        print(
            f"{c.name:32} {statistics.median(c.tok_s):>10,.0f} {statistics.median(c.tgt_s):>13,.0f} "
            f"{flop_s / 1e9:>9,.1f} {flop_s / peak32:>9.1%}" + (f" {flop_s / peak16:>9.1%}" if peak16 else "")
        )
    if vs_reference:
        base = statistics.median(contenders[-1].tok_s)
        for c in contenders[:-1]:
            ratios = [a / b for a, b in zip(c.tok_s, contenders[-1].tok_s)]
            print(
                f"{c.name} / reference fp32: {statistics.median(ratios):.2f}x (median of per-window ratios; medians {statistics.median(c.tok_s) / base:.2f}x)"
            )
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB")


# ---------------------------------------------------------------------------- GPU: steady state


def epoch_shapes(trainer: Trainer) -> set[tuple[int, int, int]]:
    """The distinct (sentences, source length, target length) of the epoch's batches, from the lengths."""
    pad = trainer.padding.pad
    src, tgt = trainer.train_data.src_lens, trainer.train_data.tgt_lens
    return {
        (len(b), round_up(int(src[b].max()), pad), round_up(int(tgt[b].max()), pad)) for b in trainer.epoch_batches(0)
    }


def steady_state(trainer: Trainer, n: int, peak: float) -> dict[str, float | str]:
    """The first `n` updates of the epoch, warmed up once, then timed (see the module docstring)."""
    device = trainer.device

    def updates():
        return Prefetcher(itertools.islice(trainer.planned_updates(0, 0), n), PREFETCH)

    warm = time.perf_counter()
    with updates() as planned_updates:
        for planned in planned_updates:
            trainer.update(planned.batches, planned.all_ntokens)
    sync(device)
    warm = time.perf_counter() - warm
    host, events, tokens, timed = [], [], 0, []
    sync(device)
    start = None  # from the first update's batches in hand: the epoch's batch list is built once a run
    with updates() as planned_updates:
        for planned in planned_updates:
            t = time.perf_counter()
            start = start or t
            begin = torch.cuda.Event(enable_timing=True) if device.type == "cuda" else None
            if begin is not None:
                begin.record()
            trainer.update(planned.batches, planned.all_ntokens)
            if begin is not None:
                end = torch.cuda.Event(enable_timing=True)
                end.record()
                events.append((begin, end))
            host.append(time.perf_counter() - t)
            tokens += planned.all_ntokens
            timed += planned.batches
    sync(device)
    if start is None:
        raise RuntimeError("no update to time: the epoch gave none")
    wall = (time.perf_counter() - start) / n
    flops = sum(model_flops(trainer.model, b) for b in timed)
    shapes = {(b.src.size(0), b.src.size(1), b.tgt_in.size(1)) for b in timed}
    device_ms = statistics.median(b.elapsed_time(e) for b, e in events) if events else float("nan")
    counter = SyncCounter()
    with updates() as planned_updates:  # closed: its thread would keep the trainer (and its GPU memory) alive
        planned = next(planned_updates)
    try:
        with counter:
            trainer.update(planned.batches, planned.all_ntokens)
        sync(device)
        syncs = sum(counter.syncs.values())
    except Exception as e:  # e.g. a compiled graph that will not run under a dispatch mode
        syncs, counter.syncs = -1, {f"not counted: {type(e).__name__}": 1}
    return {
        "tok_s": tokens / (wall * n),
        "tflop_s": flops / (wall * n) / 1e12,
        "mfu": flops / (wall * n) / peak,
        "host_ms": statistics.median(host) * 1e3,
        "device_ms": device_ms,
        "wall_ms": wall * 1e3,
        "warmup_s": warm,
        "shapes": len(shapes),
        "epoch_shapes": len(epoch_shapes(trainer)),
        "syncs": syncs,
        "sync_ops": ", ".join(f"{k} x{v}" for k, v in counter.syncs.items()) or "none",
        "attention": ", ".join(sorted(k for k in counter.attention if not k.endswith("backward"))) or "none",
        "memory_gb": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan"),
    }


def steady_benchmark(cfg: Config, args: argparse.Namespace) -> None:
    """Each variant's steady state (on a GPU; on a CPU with --steady-state, to try the measurement)."""
    device = torch.device("cuda" if torch.cuda.is_available() and cfg.train.device != "cpu" else "cpu")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        print(
            f"GPU: {name}; torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}"
        )
    dtype = torch.bfloat16 if device.type == "cuda" or cpu_info().native_bf16 else torch.float32
    peak = matmul_peak(dtype, device)
    n = 8192 if device.type == "cuda" else 2048
    print(f"{dtype} matmul peak (torch.mm {n}x{n}, median): {peak / 1e12:,.2f} TFLOP/s", flush=True)
    variants = [("as configured", [])] + [parse_variant(v) for v in args.variant]
    rows, failed = [], []
    for label, overrides in variants:
        configured = rows[0][1]["attention"] if rows and rows[0][0] == "as configured" else ""
        if same := same_kernel_as_configured(overrides, configured):
            print(f"== {label}: skipped, the configured run's kernel already ({same})", flush=True)
            continue
        trainer = r = None
        try:  # one variant failing (a kernel missing, memory, a compiler) leaves the others to run
            trainer = make_trainer(cfg, [f"name={cfg.name}_bench", *overrides])
            t = trainer.cfg.train
            what = (
                f"{label}: {trainer.max_tokens:,} tokens x {t.accumulate}, {trainer.precision}, compile {t.compile}, "
                f"attention {t.attention}, pad_to_multiple {t.pad_to_multiple} ({trainer.padding.reason})"
            )
            print(f"== {what}", flush=True)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            r = steady_state(trainer, args.updates, peak)
        except Exception as e:
            failed.append(f"{label}: failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}")
            print(f"== {failed[-1]}", flush=True)
        try:  # a sticky CUDA error can make the cleanup raise too: the next variants still run, or fail in one line
            if trainer is not None:
                trainer.close()
            del trainer
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        except Exception as e:
            failed.append(f"{label}: cleanup failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}")
            print(f"== {failed[-1]}", flush=True)
        if r is None:
            continue
        print(
            f"   {r['tok_s']:,.0f} target tok/s, {r['tflop_s']:.1f} TFLOP/s, MFU {r['mfu']:.1%}; per update: host "
            f"{r['host_ms']:.1f} ms, device {r['device_ms']:.1f} ms, wall {r['wall_ms']:.1f} ms; warm-up {r['warmup_s']:.0f} s; "
            f"shapes {r['shapes']} timed, {r['epoch_shapes']} in the epoch; syncs/update {r['syncs']} ({r['sync_ops']}); "
            f"attention {r['attention']}; peak memory {r['memory_gb']:.1f} GiB",
            flush=True,
        )
        rows.append((label, r))
    print()
    print(
        f"{'variant':28} {'target tok/s':>13} {'TFLOP/s':>8} {'MFU':>6} {'host ms':>8} {'device ms':>10} {'syncs':>6}  attention"
    )
    for label, r in rows:
        print(
            f"{label:28} {r['tok_s']:>13,.0f} {r['tflop_s']:>8.1f} {r['mfu']:>6.1%} {r['host_ms']:>8.1f} "
            f"{r['device_ms']:>10.1f} {r['syncs']:>6}  {r['attention']}"
        )
    for line in failed:  # below the table, so that a summary of the last lines shows them too
        print(line)
    if failed:
        sys.exit(1)


def same_kernel_as_configured(overrides: list[str], configured: str) -> str | None:
    """The kernel a variant of train.attention alone asks for, where the configured run (`auto`) ran
    only it: a row that would time the same thing again (a GPU's budget is short)."""
    kernel = overrides[0].partition("train.attention=")[2] if len(overrides) == 1 else ""
    return configured if kernel and "," not in configured and kernel in configured.split("_") else None


def parse_variant(text: str) -> tuple[str, list[str]]:
    """'LABEL=key=value,key=value' -> (LABEL, ['key=value', ...]); a UserError without a label or an override."""
    label, _, overrides = text.partition("=")
    if not label or not overrides:
        raise UserError(f"--variant {label!r}: expected 'LABEL=key=value,...'")
    return label, [o for o in overrides.split(",") if o]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/bible.yaml")
    parser.add_argument("--set", action="append", default=[], help="config override, section.key=value")
    parser.add_argument("--run-dir", default="runs/bench", help="where the scratch runs (and prepared data) live")
    parser.add_argument("--warmup", type=int, default=3, help="CPU: updates per trainer before timing")
    parser.add_argument("--window", type=int, default=5, help="CPU: updates per timed window")
    parser.add_argument("--windows", type=int, default=6, help="CPU: timed windows per trainer")
    parser.add_argument("--precisions", default=None, help="CPU: translate precisions to time: fp32, bf16")
    parser.add_argument("--vs-reference", action="store_true", help="CPU: also time the nn.Transformer reference")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--bf16-loss-steps", type=int, default=0, help="compare fp32/bf16 valid loss after N steps")
    parser.add_argument("--updates", type=int, default=40, help="GPU: updates warmed up, then timed")
    parser.add_argument("--steady-state", action="store_true", help="the GPU's measurement, also on a CPU")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="'LABEL=key=value,...' also timed with these overrides (on a CPU: at the first precision, in turns)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:  # a mistake in the config or a variant: one line before anything runs
        cfg = load_config(args.config, [f"run_dir={args.run_dir}", "train.log_every=1000000", *args.set])
        for variant in args.variant:
            with_overrides(cfg, parse_variant(variant)[1])
    except UserError as e:
        sys.exit(f"error: {e}")
    if args.precisions and (bad := set(args.precisions.split(",")) - {"fp32", "bf16"}):
        sys.exit(f"error: --precisions: fp32 or bf16 (comma-separated), got {sorted(bad)[0]!r}")
    if args.bf16_loss_steps:
        bf16_loss(cfg, args.bf16_loss_steps)
        return
    print(f"{describe_machine()}; oneDNN primitive cache {CACHE}", flush=True)
    on_gpu = cfg.train.device.startswith("cuda") or (cfg.train.device == "auto" and torch.cuda.is_available())
    steady_benchmark(cfg, args) if on_gpu or args.steady_state else cpu_benchmark(cfg, args)


if __name__ == "__main__":
    main()
