"""Training speed of translate on the real corpus, and against a plain PyTorch reference.

    python scripts/bench_train.py                         # translate fp32 and bf16 (CPU autocast)
    python scripts/bench_train.py --vs-reference          # + torch.nn.Transformer reference, interleaved
    python scripts/bench_train.py --bf16-loss-steps 300   # valid loss after N steps, fp32 vs bf16

It trains the model of CONFIG (default configs/bible.yaml) on its train split, after a
warm-up, in windows of --window updates; the trainers take turns window by window on the
same batches, so that a busy machine slows them alike. It prints medians over the windows:

- tokens/s: non-pad source + target tokens per second (and target tokens alone);
- padding: share of pad positions among all source + target positions of the epoch's batches;
- peak RSS of this process;
- MFU (model FLOP utilisation): achieved model FLOPs/s over the machine's matmul peak, which the
  script measures in the same run as the median rate of `torch.mm` on 2048x2048 fp32 (and bf16,
  before and after the timed windows, keeping the higher; bf16 only where the CPU multiplies bf16 natively: elsewhere bf16 is emulated and neither timed nor
  offered as a peak).

The first line says which machine class the figures come from (torch's CPU capability, native
bf16 or not, cores).

Model FLOPs are counted analytically over the real (non-pad) tokens of each batch:
  6 * (encoder-layer parameters) per source token
+ 6 * (decoder-layer parameters + output projection V*D) per target token
+ attention: 12 * D * (S^2 * encoder layers + (T^2 + T*S) * decoder layers) per sentence
(6 = 2 FLOPs per multiply-add x 3 for forward + backward; embedding lookups and norms are not counted).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from reference_trainer import ReferenceTrainer  # noqa: E402

from translate.batching import padding_fraction  # noqa: E402
from translate.config import Config, load_config  # noqa: E402
from translate.data import Batch, collate  # noqa: E402
from translate.hardware import cpu_info, describe_machine  # noqa: E402
from translate.model import Transformer  # noqa: E402
from translate.tokenizer import PAD  # noqa: E402
from translate.train import Trainer  # noqa: E402


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
        device = next(self.flops_model.parameters()).device
        sync(device)
        t = time.perf_counter()
        for b in batches:
            self.step(b)
        sync(device)
        dt = time.perf_counter() - t
        self.tok_s.append(tokens / dt)
        self.tgt_s.append(targets / dt)
        self.flop_s.append(flops / dt)


def make_trainer(cfg: Config, amp: str) -> Trainer:
    cfg = load_config_with(cfg, [f"train.amp={amp}", f"name={cfg.name}_{amp}"])
    trainer = Trainer(cfg, resume=True)  # a scratch run: nothing is saved
    return trainer


def load_config_with(cfg: Config, overrides: list[str]) -> Config:
    from translate.config import config_from_dict, config_to_dict

    return config_from_dict(config_to_dict(cfg), overrides)


def ours(trainer: Trainer):
    return lambda batch: trainer._update([batch], 0)


def bf16_loss(cfg: Config, steps: int) -> None:
    """Valid loss after `steps` updates from the same initial weights, fp32 against bf16 autocast."""
    losses = {}
    for amp in ("off", "bf16"):
        c = load_config_with(cfg, [f"train.max_steps={steps}", f"name={cfg.name}_loss_{amp}", f"train.amp={amp}"])
        trainer = Trainer(c, resume=True)
        batches = trainer.epoch_batches(0)
        for i in range(steps):
            trainer._update([collate(trainer.train_data, batches[i % len(batches)], c.train.pad_to_multiple)], 0)
        losses[amp] = trainer.validate()["loss"]
        trainer._close()
        print(f"{amp}: valid loss after {steps} updates {losses[amp]:.4f}", flush=True)
    print(
        f"bf16 / fp32 valid loss: {losses['bf16'] / losses['off']:.4f} (relative difference {losses['bf16'] / losses['off'] - 1:+.2%})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/bible.yaml")
    parser.add_argument("--set", action="append", default=[], help="config override, section.key=value")
    parser.add_argument("--run-dir", default="runs/bench", help="where the scratch runs (and prepared data) live")
    parser.add_argument("--warmup", type=int, default=3, help="updates per trainer before timing")
    parser.add_argument("--window", type=int, default=5, help="updates per timed window")
    parser.add_argument("--windows", type=int, default=6, help="timed windows per trainer")
    parser.add_argument(
        "--precisions",
        default=None,
        help="translate precisions to time: fp32, bf16 (default: both where bf16 is native)",
    )
    parser.add_argument("--vs-reference", action="store_true", help="also time the nn.Transformer reference (fp32)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--bf16-loss-steps", type=int, default=0, help="compare fp32/bf16 valid loss after N steps")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_config(args.config, [f"run_dir={args.run_dir}", "train.log_every=1000000", *args.set])
    if args.bf16_loss_steps:
        bf16_loss(cfg, args.bf16_loss_steps)
        return

    print(describe_machine(), flush=True)
    amp = {"fp32": "off", "bf16": "bf16"}
    native = cpu_info().native_bf16 or torch.cuda.is_available()
    precisions = (args.precisions or ("fp32,bf16" if native else "fp32")).split(",")
    trainers = {p: make_trainer(cfg, amp[p]) for p in precisions}
    first = next(iter(trainers.values()))
    device = first.device
    index_batches = first.epoch_batches(0)
    pad = padding_fraction(index_batches, first.train_data.src_lens, first.train_data.tgt_lens)
    need = args.warmup + args.window * args.windows
    # translate pads lengths to train.pad_to_multiple as its trainer does; the reference gets them as they come
    padded = [collate(first.train_data, b, cfg.train.pad_to_multiple) for b in index_batches[:need]]
    contenders = [Timed(f"translate {p}", ours(t), t.model, padded) for p, t in trainers.items()]
    if args.vs_reference:
        torch.manual_seed(cfg.seed)
        ref = ReferenceTrainer(cfg, first.tokenizer.vocab_size)
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
    print()
    print(
        f"model: {sum(p.numel() for p in first.model.parameters()):,} parameters; batches of train.max_tokens={cfg.train.max_tokens}; threads {torch.get_num_threads()}"
    )
    print(f"padding: {pad:.2%} of source + target positions in the epoch's {len(index_batches)} batches")
    positions = sum(b.src.numel() + b.tgt_out.numel() for b in padded)
    print(
        f"translate's timed batches, lengths padded to a multiple of {cfg.train.pad_to_multiple}: "
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
    if args.vs_reference:
        base = statistics.median(contenders[-1].tok_s)
        for c in contenders[:-1]:
            ratios = [a / b for a, b in zip(c.tok_s, contenders[-1].tok_s)]
            print(
                f"{c.name} / reference fp32: {statistics.median(ratios):.2f}x (median of per-window ratios; medians {statistics.median(c.tok_s) / base:.2f}x)"
            )
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB")
    for t in trainers.values():
        t._close()


if __name__ == "__main__":
    main()
