"""What a training run shows: TensorBoard curves, sample translations and attention images, the
progress bar and the log lines. Only rank 0 writes; on the other ranks every method does nothing."""

from __future__ import annotations

import logging
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from translate.evaluate import sentence_chrf
from translate.hardware import host_memory_mb, host_memory_peak_mb
from translate.model import Transformer
from translate.plot import attention_figure, attention_maps, figure_to_array, heads_figure, sample_indices
from translate.rundir import truncate_events
from translate.tokenizer import Tokenizer
from translate.trainstate import WindowStats

log = logging.getLogger("translate")


class TensorboardLogger:
    """The run's TensorBoard events (RUN/tb) and its progress bar."""

    def __init__(self, tb_dir: Path, main: bool, step: int) -> None:
        self.main = main
        self.writer: SummaryWriter | None = None
        self.bar: tqdm | None = None
        if main:  # the curves continue from the run's step (a resumed one's; at 0, those of a failed start go)
            truncate_events(tb_dir, step)
            self.writer = SummaryWriter(tb_dir)

    def open_bar(self, step: int, max_steps: int) -> None:
        self.bar = tqdm(
            total=max_steps, initial=step, desc="train", unit="step", disable=not self.main, dynamic_ncols=True
        )

    def train(self, step: int, stats: WindowStats, lr: float, skipped_total: int, expected_steps: int) -> None:
        """The window's mean loss, lr, gradient norm and tokens/s (curves, bar and a debug line)."""
        if not self.main:
            return
        w = self.writer
        w.add_scalar("train/loss", stats.loss, step)
        w.add_scalar("train/nll", stats.nll, step)
        w.add_scalar("train/ppl", stats.ppl, step)
        w.add_scalar("train/lr", lr, step)
        w.add_scalar("train/grad_norm", stats.grad_norm, step)
        w.add_scalar("train/tokens_per_s", stats.tokens_per_s, step)
        if stats.skipped:
            w.add_scalar("train/skipped_updates", skipped_total, step)
        rss, peak = host_memory_mb(), host_memory_peak_mb()
        if rss is not None:
            w.add_scalar("sys/host_memory_mb", rss, step)
        if peak is not None:
            w.add_scalar("sys/host_memory_peak_mb", peak, step)
        if self.bar is not None:
            self.bar.total = expected_steps  # the ETA follows whichever bound comes first
            postfix = dict(loss=f"{stats.loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{stats.tokens_per_s:,.0f}")
            self.bar.set_postfix(**postfix, refresh=False)
        mem = f" host memory {rss:.0f} MiB" if rss is not None else ""
        mem += f" (peak {peak:.0f})" if peak is not None else ""
        skipped = f" ({stats.skipped} of {stats.updates} updates skipped: not finite)" if stats.skipped else ""
        log.debug(f"step {step} loss {stats.loss:.4f} lr {lr:.3e} tokens/s {stats.tokens_per_s:.0f}{mem}{skipped}")

    def valid(self, step: int, m: dict[str, float], best_metric: str, best: float, best_step: int) -> None:
        if not self.main:
            return
        for key in ("loss", "ppl", "bleu", "chrf"):
            self.writer.add_scalar(f"valid/{key}", m[key], step)
        self.writer.flush()
        tqdm.write(
            f"step {step}: valid loss {m['loss']:.3f} ppl {m['ppl']:.2f} BLEU {m['bleu']:.2f} chrF {m['chrf']:.2f}"
            f" (best {best_metric} {best:.2f} at step {best_step})"
        )
        log.debug(f"step {step} valid " + " ".join(f"{k} {v:.4f}" for k, v in m.items()))  # train.log: 4 decimals

    def samples(
        self,
        step: int,
        model: Transformer,
        tokenizer: Tokenizer,
        sources: list[str],
        refs: list[str],
        hyps: list[str],
        max_positions: int,
    ) -> None:
        """The translations of a few fixed valid sentences (text) and their last-layer cross-attention
        (images: mean of heads; every head for the first), to see alignment emerge."""
        if not self.main:
            return
        picks = sample_indices(tokenizer, sources[: len(hyps)])
        chrf = sentence_chrf([hyps[i] for i in picks], [refs[i] for i in picks])
        text = "\n\n".join(
            f"**valid sentence {i + 1}** (chrF {c:.1f})  \n**source:** {sources[i]}  \n"
            f"**reference:** {refs[i]}  \n**output:** {hyps[i]}"
            for i, c in zip(picks, chrf)
        )
        self.writer.add_text("valid/samples", text, step)
        for k, i in enumerate(picks):
            target = tokenizer.encode([hyps[i]])[0][: max_positions - 2]
            w, sp, tp = attention_maps(model, tokenizer, sources[i], target)  # (H, T, S)
            title = f"step {step}, valid sentence {i + 1}: cross-attention, last layer"
            fig = attention_figure(w.mean(0), sp, tp, title=f"{title}, mean of heads")
            self.writer.add_image(f"valid/attention_{k}", figure_to_array(fig), step, dataformats="HWC")
            if k == 0:
                grid = figure_to_array(heads_figure(w, sp, tp, title))
                self.writer.add_image("valid/attention_heads", grid, step, dataformats="HWC")

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()  # the curves up to this checkpoint survive a kill

    def close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def close(self) -> None:
        self.close_bar()
        if self.writer is not None:
            self.writer.close()
            self.writer = None
