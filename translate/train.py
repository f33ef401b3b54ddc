"""The training loop: schedule, AMP, accumulation, clipping, DDP, validation, checkpoints, logging.

One update reads `accumulate` batches on each of the world's ranks; the gradient of the
summed token loss is divided by the number of target tokens of the whole update, so the
update does not depend on how the tokens were split across batches or devices. The sampler's
position (epoch, global batch index) is part of every checkpoint: a resumed run reads
exactly the batches an uninterrupted run would have read.

The Trainer stays one class of about 500 lines: its methods share one run's state (model,
optimizer, progress, clocks, TensorBoard writer). What does not need that state lives elsewhere:
the run directory in rundir.py, the processes of a torchrun in distributed.py, the data in prepare.py and data.py.
"""

from __future__ import annotations

import logging
import math
import random
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from translate.adapt import adapted_config, init_record, load_init
from translate.batching import token_batches
from translate.checkpoint import (
    CHECKPOINT_FORMAT,
    atomic_save,
    average_checkpoints,
    load_checkpoint,
    prune,
    rng_state,
    set_rng_state,
    step_checkpoints,
    versions,
)
from translate.config import Config, config_to_dict, parse_duration, save_config
from translate.data import Batch, collate, load_split
from translate.decoding import translate_lines
from translate.distributed import World, init_process_group, wait_for, watch_launcher
from translate.errors import UserError
from translate.evaluate import score, sentence_chrf
from translate.hardware import choose_amp, cpu_info, host_memory_mb, is_out_of_memory, resolve_device
from translate.loss import label_smoothed_nll_loss
from translate.model import Transformer, count_parameters
from translate.plot import attention_figure, attention_maps, figure_to_array, heads_figure, sample_indices
from translate.prepare import is_prepared, prepare
from translate.rundir import RunLock, check_run_dir, check_same_setup, link, truncate_events
from translate.textio import read_all_lines
from translate.tokenizer import PAD, Tokenizer

log = logging.getLogger("translate")


# ---------------------------------------------------------------------------- set-up


def lr_lambda(cfg: Config):
    """Multiplier of train.lr after `step` updates (LambdaLR); linear warmup for every schedule."""
    t, d = cfg.train, cfg.model.d_model
    warmup = max(t.warmup_steps, 1)

    def factor(step: int) -> float:
        s = step + 1  # the update about to be made
        if t.schedule == "noam":  # d^-0.5 * min(s^-0.5, s * w^-1.5), train.lr ignored
            return d**-0.5 * min(s**-0.5, s * warmup**-1.5) / t.lr
        if s < warmup:
            return s / warmup
        if t.schedule == "inverse_sqrt":
            return math.sqrt(warmup / s)
        progress = min((s - warmup) / max(t.max_steps - warmup, 1), 1.0)  # cosine
        floor = t.min_lr / t.lr
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def build_optimizer(cfg: Config, model: torch.nn.Module) -> torch.optim.Optimizer:
    t = cfg.train
    cls = torch.optim.AdamW if t.optimizer == "adamw" else torch.optim.Adam
    # The fused kernel is several times faster than the per-tensor loop (7x for the default model on CPU).
    fused = next(model.parameters()).device.type in ("cpu", "cuda")
    return cls(
        model.parameters(), lr=t.lr, betas=tuple(t.adam_betas), eps=t.adam_eps, weight_decay=t.weight_decay, fused=fused
    )


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@dataclass
class Progress:
    """Counters saved in every checkpoint; `position` is the next global batch of `epoch`."""

    step: int = 0
    epoch: int = 0
    position: int = 0
    best: float | None = None
    best_step: int = 0
    bad_evals: int = 0
    skipped: int = 0
    elapsed: float = 0.0  # seconds of training (updates, validation, checkpoints) over every session


class StopRequest:
    """SIGINT/SIGTERM ask the loop to finish its update, save and exit."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.previous = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}

    def handle(self, signum, frame) -> None:
        if self.signum is not None:  # a second Ctrl-C: stop now
            raise KeyboardInterrupt
        self.signum = signum

    def restore(self) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)


# ---------------------------------------------------------------------------- the loop


class Trainer:
    def __init__(self, cfg: Config, resume: bool) -> None:
        init = load_init(cfg) if cfg.train.init_from else None  # refused before anything is written
        cfg = adapted_config(cfg, init) if init else cfg
        self.init_from = init_record(cfg, init) if init else None
        self.cfg, self.run = cfg, cfg.run_path
        self.ckpt_dir = self.run / "checkpoints"
        self.clock = {"set-up": 0.0, "updates": 0.0, "validation": 0.0, "checkpoints": 0.0}
        setup_start = time.perf_counter()
        self._join(cfg)
        resumed = self._prepare(cfg, resume)
        self._load_data(cfg)
        self._build(cfg, resume, resumed, init)
        del init
        self.writer: SummaryWriter | None = None
        if self.main:
            self._open_logs(cfg, resume)
        self.clock["set-up"] = time.perf_counter() - setup_start

    def _join(self, cfg: Config) -> None:
        """Which process this is, on which device, at which precision and thread count."""
        world = World.from_env()
        self.distributed, self.rank, self.world = world.distributed, world.rank, world.size
        self.main = world.main
        if self.distributed:
            watch_launcher()  # a worker whose torchrun died stops, saves and frees the run's lock
        self.device = resolve_device(cfg.train.device, "train.device", world.local_rank)
        self.amp, self.amp_reason = choose_amp(cfg.train.amp, self.device)
        self.budget = parse_duration(cfg.train.max_time) if cfg.train.max_time is not None else None
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)

    def _prepare(self, cfg: Config, resume: bool) -> dict[str, Any] | None:
        """Rank 0 locks the run, checks it and prepares the data while the others wait; then the
        process group. Returns last.pt when resuming (checked against the config)."""
        timeout = parse_duration(cfg.train.dist_timeout, "train.dist_timeout")
        resumed = None
        if self.main:
            self.run.mkdir(parents=True, exist_ok=True)
            self.lock = RunLock(self.run)
            resumed = check_run_dir(cfg, resume)  # before prepare(): a refused resume changes nothing
            prepare(cfg)
        else:
            wait_for(lambda: is_prepared(cfg), timeout, f"rank 0 to prepare the data in {self.run / 'data'}")
        if self.distributed:
            init_process_group(self.device, timeout)
        return resumed

    def _load_data(self, cfg: Config) -> None:
        data_dir = self.run / "data"
        self.tokenizer = Tokenizer.load(self.run / "spm.model")
        self.train_data = load_split(data_dir, "train")
        self.valid_data = load_split(data_dir, "valid")
        self.valid_src = read_all_lines(data_dir / f"valid.{cfg.data.src_lang}", "valid source")
        self.valid_ref = read_all_lines(data_dir / f"valid.{cfg.data.tgt_lang}", "valid reference")

    def _build(self, cfg: Config, resume: bool, resumed: dict[str, Any] | None, init: dict[str, Any] | None) -> None:
        """Model, optimizer, schedule and scaler: fresh, from last.pt (--resume) or from train.init_from."""
        seed_everything(cfg.seed)
        self.model = Transformer(cfg.model, self.tokenizer.vocab_size).to(self.device)
        self.optimizer = build_optimizer(cfg, self.model)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg))
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp == torch.float16)
        self.progress = Progress()
        last = self.ckpt_dir / "last.pt"
        if resume and last.is_file():
            self._restore(resumed or load_checkpoint(last))
        elif resume and self.main:
            log.info(f"--resume: {last} does not exist yet, starting from step 0")
        if init and not (resume and last.is_file()):
            self.model.load_state_dict(init["model"])
            log.info(f"weights and vocabulary from {cfg.train.init_from} (step {init.get('step')}); fresh optimizer")
        self.net: torch.nn.Module = self.model
        if self.distributed:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.net = DDP(self.model, device_ids=ids, broadcast_buffers=False)
        if cfg.train.compile:
            self.net = torch.compile(self.net)

    def _open_logs(self, cfg: Config, resume: bool) -> None:
        """Rank 0: the checkpoint directory, config.yaml, TensorBoard (cut back to the resumed step)."""
        self.ckpt_dir.mkdir(exist_ok=True)
        header = f"precision {self.precision}: train.amp {cfg.train.amp}, {self.amp_reason}"
        save_config(cfg, self.run / "config.yaml", header=header)
        if resume:
            truncate_events(self.run / "tb", self.progress.step)
        self.writer = SummaryWriter(self.run / "tb")
        log.info(f"amp {cfg.train.amp}: {self.amp_reason}")
        log.info(
            f"model: {count_parameters(self.model):,} parameters, vocab {self.tokenizer.vocab_size}; "
            f"device {self.device}, precision {self.precision}, world size {self.world}; "
            f"{len(self.train_data):,} train pairs"
        )

    @property
    def precision(self) -> str:
        return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[self.amp]

    def hardware(self) -> dict[str, Any]:
        """What the run trained on and at which precision, and why (saved in config.yaml and checkpoints)."""
        info = cpu_info()
        return {
            "device": str(self.device),
            "precision": self.precision,
            "reason": f"train.amp {self.cfg.train.amp}: {self.amp_reason}",
            "cpu": info.capability,
            "cpu_native_bf16": info.native_bf16,
            "world_size": self.world,
        }

    def _restore(self, ckpt: dict[str, Any]) -> None:
        check_same_setup(self.cfg, ckpt)
        if ckpt["spm_model"] != self.tokenizer.model_bytes:
            raise UserError(
                f"cannot resume: {self.run / 'spm.model'} is not the vocabulary the checkpoint was trained with"
            )
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        self.scaler.load_state_dict(ckpt["scaler"])
        self.progress = Progress(**ckpt["progress"])
        self.init_from = ckpt.get("init_from", self.init_from)
        set_rng_state(ckpt["rng"][min(self.rank, len(ckpt["rng"]) - 1)])
        if self.main:
            log.info(f"resumed from {self.ckpt_dir / 'last.pt'} at step {self.progress.step}")

    # ------------------------------------------------------------------------ one update

    def _forward_loss(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        # On a CPU only the non-pad positions are projected onto the vocabulary (their count rounded up
        # to 8x train.pad_to_multiple, as the lengths are: fewer distinct shapes, flat host memory)
        pad = self.cfg.train.pad_to_multiple
        keep = batch.projected(8 * pad if pad > 1 else 1) if self.device.type == "cpu" else None
        with torch.autocast(self.device.type, dtype=self.amp or torch.float32, enabled=self.amp is not None):
            logits = self.net(batch.src, batch.tgt_in, keep)
        target = batch.tgt_out[keep] if keep is not None else batch.tgt_out
        loss, nll, _ = label_smoothed_nll_loss(logits, target, self.cfg.train.label_smoothing, PAD)
        return loss, nll

    def _update(self, batches: list[Batch], stop_flag: int) -> tuple[dict[str, torch.Tensor], bool, bool]:
        """One optimizer update over this rank's batches. Returns (sums, finite, stop requested)."""
        counts = torch.tensor([sum(b.ntokens for b in batches), stop_flag], dtype=torch.float64, device=self.device)
        if self.distributed:
            dist.all_reduce(counts)
        ntokens, stop = counts[0], bool(counts[1].item() > 0)
        scale = self.world / ntokens  # DDP averages gradients over ranks
        loss_sum = torch.zeros((), device=self.device)
        nll_sum = torch.zeros((), device=self.device)
        for i, batch in enumerate(batches):
            batch = batch.to(self.device)
            sync = i == len(batches) - 1 or not self.distributed
            ctx = self.net.no_sync() if not sync and hasattr(self.net, "no_sync") else nullcontext()
            try:
                with ctx:
                    loss, nll = self._forward_loss(batch)
                    self.scaler.scale(loss * scale.to(loss.dtype)).backward()
            except (RuntimeError, MemoryError) as e:
                if not is_out_of_memory(e):
                    raise
                (B, S), T, t = batch.src.shape, batch.tgt_in.size(1), self.cfg.train
                raise UserError(
                    f"out of memory on {self.device} at step {self.progress.step}, on a batch of {B} sentences of up "
                    f"to {S} source and {T} target tokens: lower train.max_tokens (now {t.max_tokens}) and raise "
                    f"train.accumulate (now {t.accumulate}) to keep the tokens per update"
                ) from None
            loss_sum += loss.detach()
            nll_sum += nll
        self.scaler.unscale_(self.optimizer)
        clip = self.cfg.train.clip_norm if self.cfg.train.clip_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        finite = bool(torch.isfinite(grad_norm).item()) and bool(torch.isfinite(loss_sum).item())
        if self.scaler.is_enabled():
            self.scaler.step(self.optimizer)  # skips the step itself when gradients overflowed
            self.scaler.update()
        elif finite:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if finite:
            self.scheduler.step()
        local = sum(b.ntokens for b in batches)
        sums = {"loss": loss_sum, "nll": nll_sum, "ntokens": local, "all_ntokens": ntokens, "grad_norm": grad_norm}
        return sums, finite, stop

    # ------------------------------------------------------------------------ validation

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        self.model.eval()
        t = self.cfg.train
        lens = self.valid_data.src_lens, self.valid_data.tgt_lens
        batches = token_batches(*lens, t.max_tokens, shuffle=False, pad_to_multiple=t.pad_to_multiple)
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)
        for idx in batches[self.rank :: self.world]:
            batch = collate(self.valid_data, idx, t.pad_to_multiple).to(self.device)
            with torch.autocast(self.device.type, dtype=self.amp or torch.float32, enabled=self.amp is not None):
                logits = self.model(batch.src, batch.tgt_in)
            loss, nll, n = label_smoothed_nll_loss(logits, batch.tgt_out, self.cfg.train.label_smoothing, PAD)
            sums += torch.stack([loss.double(), nll.double(), n.double()])
        if self.distributed:
            dist.all_reduce(sums)
        loss, nll, n = sums.tolist()
        metrics = {"loss": loss / n, "nll": nll / n, "ppl": math.exp(min(nll / n, 50))}
        scores = torch.zeros(2, dtype=torch.float64, device=self.device)
        if self.main:
            limit = self.cfg.train.eval_max_sentences or len(self.valid_src)
            hyps = self._translate(self.valid_src[:limit])
            s = score(hyps, self.valid_ref[:limit])
            scores += torch.tensor([s["bleu"], s["chrf"]], dtype=torch.float64, device=self.device)
            self._log_samples(hyps)
        if self.distributed:
            dist.broadcast(scores, 0)  # every rank takes the same early-stopping decision
        metrics["bleu"], metrics["chrf"] = scores.tolist()
        self.model.train()
        return metrics

    def _translate(self, lines: list[str]) -> list[str]:
        d = self.cfg.decode
        out = translate_lines(
            [self.model],
            self.tokenizer,
            lines,
            d.search_options(beam_size=self.cfg.train.eval_beam_size),
            batch_tokens=d.batch_tokens,
            device=self.device,
            protect=d.protect,
            workers=1,  # one batch at a time on every thread, as the published runs were validated
        )
        return [nbest[0][0] for nbest in out]

    def _log_samples(self, hyps: list[str]) -> None:
        """TensorBoard: the translations of a few fixed valid sentences (text) and their last-layer
        cross-attention (images: mean of heads; every head for the first), to see alignment emerge."""
        step = self.progress.step
        picks = sample_indices(self.tokenizer, self.valid_src[: len(hyps)])
        chrf = sentence_chrf([hyps[i] for i in picks], [self.valid_ref[i] for i in picks])
        text = "\n\n".join(
            f"**valid sentence {i + 1}** (chrF {c:.1f})  \n**source:** {self.valid_src[i]}  \n"
            f"**reference:** {self.valid_ref[i]}  \n**output:** {hyps[i]}"
            for i, c in zip(picks, chrf)
        )
        self.writer.add_text("valid/samples", text, step)
        for k, i in enumerate(picks):
            target = self.tokenizer.encode([hyps[i]])[0][: self.cfg.model.max_positions - 2]
            w, sp, tp = attention_maps(self.model, self.tokenizer, self.valid_src[i], target)  # (H, T, S)
            title = f"step {step}, valid sentence {i + 1}: cross-attention, last layer"
            fig = attention_figure(w.mean(0), sp, tp, title=f"{title}, mean of heads")
            self.writer.add_image(f"valid/attention_{k}", figure_to_array(fig), step, dataformats="HWC")
            if k == 0:
                grid = figure_to_array(heads_figure(w, sp, tp, title))
                self.writer.add_image("valid/attention_heads", grid, step, dataformats="HWC")

    def _improved(self, metrics: dict[str, float]) -> bool:
        key = self.cfg.train.best_metric
        value = metrics[key]
        best = self.progress.best
        better = best is None or (value < best if key == "loss" else value > best)
        if better:
            self.progress.best, self.progress.best_step, self.progress.bad_evals = value, self.progress.step, 0
        else:
            self.progress.bad_evals += 1
        return better

    # ------------------------------------------------------------------------ checkpoints

    def save(self, best: bool, metrics: dict[str, float] | None) -> None:
        self.tick()
        rng = self._gather_rng()  # a collective: every rank takes part
        if not self.main:
            return
        self.writer.flush()  # the curves up to this checkpoint survive a kill
        step = self.progress.step
        state = {
            "format": CHECKPOINT_FORMAT,
            "versions": versions(),
            "config": config_to_dict(self.cfg),
            "vocab_size": self.tokenizer.vocab_size,
            "spm_model": self.tokenizer.model_bytes,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "progress": asdict(self.progress),
            "rng": rng,
            "step": step,
            "epoch": self.progress.epoch,
            "metrics": metrics or {},
            "hardware": self.hardware(),
            "init_from": self.init_from,
        }
        path = self.ckpt_dir / f"step_{step:07d}.pt"
        try:
            atomic_save(state, path)
        except UserError as e:  # e.g. a full disk: the checkpoints saved before are intact
            last = self.ckpt_dir / "last.pt"
            then = f"continue from {last} with" if last.exists() else "start again with"
            raise UserError(f"{e}, then {then}: translate train --config {self.run / 'config.yaml'} --resume") from None
        link(path, self.ckpt_dir / "last.pt")
        if best:
            link(path, self.ckpt_dir / "best.pt")
        prune(self.ckpt_dir, self.cfg.train.keep_last)

    def _gather_rng(self) -> list[dict[str, Any]]:
        """Every rank's RNG state (rank order), so a resumed DDP run draws the same dropout masks."""
        state = rng_state()
        if not self.distributed:
            return [state]
        states: list[Any] = [None] * self.world
        dist.all_gather_object(states, state)
        return states

    # ------------------------------------------------------------------------ main loop

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        t = self.cfg.train
        lens = self.train_data.src_lens, self.train_data.tgt_lens
        batches = token_batches(*lens, t.max_tokens, self.cfg.seed, epoch, pad_to_multiple=t.pad_to_multiple)
        return batches[: len(batches) - len(batches) % self.world]

    def fit(self) -> dict[str, float]:
        t, p = self.cfg.train, self.progress
        stopper = StopRequest()
        bar = tqdm(
            total=t.max_steps, initial=p.step, desc="train", unit="step", disable=not self.main, dynamic_ncols=True
        )
        window = {"loss": 0.0, "nll": 0.0, "ntokens": 0.0, "all_ntokens": 0.0, "grad_norm": 0.0, "updates": 0}
        self.metrics, self.bad_in_row, self.window_clock, stop_reason = {}, 0, self.clock["updates"], None
        self.session = (time.perf_counter(), p.elapsed, p.step)  # when, and how far, this session started
        per_update = t.accumulate * self.world
        if p.step >= t.max_steps:
            stop_reason = f"already at train.max_steps={t.max_steps}"
        elif self.out_of_time():
            stop_reason = f"already past train.max_time={t.max_time} ({p.elapsed / 60:.1f} min trained)"
        self.model.train()
        try:
            while stop_reason is None:
                if t.max_epochs is not None and p.epoch >= t.max_epochs:
                    stop_reason = f"reached train.max_epochs={t.max_epochs}"
                    break
                batches = self.epoch_batches(p.epoch)
                if len(batches) < per_update:
                    raise UserError(
                        f"the train split gives {len(batches)} batches of train.max_tokens={t.max_tokens} tokens, "
                        f"fewer than one update needs ({per_update}): lower train.max_tokens or train.accumulate"
                    )
                while p.position + per_update <= len(batches):
                    stop_reason = self._train_step(batches, per_update, stopper, window, bar)
                    if stop_reason:
                        break
                else:
                    p.epoch, p.position = p.epoch + 1, 0
        finally:
            bar.close()
            stopper.restore()
        self.tick()
        if stop_reason == "signal":
            self._close()
            name = signal.Signals(stopper.signum).name if stopper.signum else "signal"
            resume = f"translate train --config {self.run / 'config.yaml'} --resume"
            print(f"stopped by {name} at step {p.step}; checkpoint saved. Resume with: {resume}", file=sys.stderr)
            raise SystemExit(128 + (stopper.signum or signal.SIGINT))
        if self.main:
            log.info(f"training stopped: {stop_reason}; best valid {t.best_metric} {p.best} at step {p.best_step}")
            log.info(self.time_summary())
            if t.average_last:
                self._average_last(t.average_last)
        self._close()
        return self.metrics

    def _train_step(self, batches, per_update: int, stopper: StopRequest, window: dict[str, Any], bar: tqdm):
        """One update, then what follows it (logging, validation, checkpoint); returns why to stop, if so."""
        t, p = self.cfg.train, self.progress
        mine = [batches[p.position + k * self.world + self.rank] for k in range(t.accumulate)]
        p.position += per_update
        start = time.perf_counter()
        pad = t.pad_to_multiple
        sums, finite, stop = self._update([collate(self.train_data, b, pad) for b in mine], stopper.signum or 0)
        self.clock["updates"] += time.perf_counter() - start
        if not finite:
            p.skipped += 1
            self.bad_in_row += 1
            if self.main:
                self.writer.add_scalar("train/skipped_updates", p.skipped, p.step)
            if self.bad_in_row >= t.max_bad_steps:
                raise UserError(
                    f"{self.bad_in_row} updates in a row had a non-finite loss or gradient at step {p.step}: "
                    "lower train.lr or raise train.warmup_steps"
                    + (
                        " (or train.amp: off: this run is in fp16, whose range is narrow)"
                        if self.precision == "fp16"
                        else ""
                    )
                )
        else:
            self.bad_in_row = 0
            p.step += 1
            bar.update(1)
            for k in ("loss", "nll", "ntokens", "all_ntokens", "grad_norm"):
                window[k] += sums[k]
            window["updates"] += 1
        if p.step % t.log_every == 0 and window["updates"]:
            self._log_train(window, bar)
        out_of_time = finite and self.out_of_time()
        evaluated = finite and (p.step % t.eval_every == 0 or p.step >= t.max_steps or out_of_time)
        best, stop_reason = False, None
        if evaluated:
            start = time.perf_counter()
            self.metrics = self.validate()
            best = self._improved(self.metrics)
            self._log_valid(self.metrics)
            self.clock["validation"] += time.perf_counter() - start
        if stop:
            stop_reason = "signal"
        elif p.step >= t.max_steps:
            stop_reason = f"reached train.max_steps={t.max_steps}"
        elif out_of_time:
            stop_reason = f"reached train.max_time={t.max_time} ({self.trained_time() / 60:.1f} min trained)"
        elif t.patience and p.bad_evals >= t.patience:
            stop_reason = f"no better valid {t.best_metric} in {t.patience} evaluations (train.patience)"
        if (finite and (p.step % t.save_every == 0 or best)) or stop_reason:
            start = time.perf_counter()
            self.save(best, self.metrics if evaluated else None)
            self.clock["checkpoints"] += time.perf_counter() - start
        return stop_reason

    def trained_time(self) -> float:
        """Seconds trained: this session's so far plus those of the sessions it resumed."""
        started, elapsed_before, _ = self.session
        return elapsed_before + time.perf_counter() - started

    def tick(self) -> None:
        self.progress.elapsed = self.trained_time()

    def out_of_time(self) -> bool:
        """Whether train.max_time is spent. Every rank takes rank 0's answer, so all stop at the same update."""
        if self.budget is None:
            return False
        over = torch.tensor([float(self.trained_time() >= self.budget)], device=self.device)
        if self.distributed:
            dist.broadcast(over, 0)
        return bool(over.item())

    def expected_steps(self) -> int:
        """The update at which training will stop: max_steps, or sooner where the time budget runs out first
        (at this session's pace so far)."""
        t, p = self.cfg.train, self.progress
        started, elapsed_before, first_step = self.session
        if self.budget is None or p.step <= first_step:
            return t.max_steps
        pace = (p.step - first_step) / (time.perf_counter() - started)  # updates per second, validation included
        left = max(self.budget - self.trained_time(), 0.0)
        return min(t.max_steps, p.step + int(left * pace) + 1)

    def time_summary(self) -> str:
        """How this session's time was spent, in one line."""
        c = self.clock
        total = c["set-up"] + time.perf_counter() - self.session[0]
        parts = [f"{k} {v / 60:.1f} min ({v / total:.0%})" for k, v in c.items()]
        other = total - sum(c.values())
        return f"time: {total / 60:.1f} min in all: " + ", ".join(parts) + f", other {other / 60:.1f} min"

    def _log_train(self, window: dict[str, Any], bar: tqdm) -> None:
        """TensorBoard and the progress bar: the window's mean loss, lr, gradient norm, tokens/s of updates."""
        if self.main:
            n = float(window["ntokens"])
            loss = float(window["loss"]) / n
            lr = self.scheduler.get_last_lr()[0]
            tok_s = float(window["all_ntokens"]) / max(self.clock["updates"] - self.window_clock, 1e-9)
            step = self.progress.step
            self.writer.add_scalar("train/loss", loss, step)
            self.writer.add_scalar("train/nll", float(window["nll"]) / n, step)
            self.writer.add_scalar("train/ppl", math.exp(min(float(window["nll"]) / n, 50)), step)
            self.writer.add_scalar("train/lr", lr, step)
            self.writer.add_scalar("train/grad_norm", float(window["grad_norm"]) / window["updates"], step)
            self.writer.add_scalar("train/tokens_per_s", tok_s, step)
            rss = host_memory_mb()
            if rss is not None:
                self.writer.add_scalar("sys/host_memory_mb", rss, step)
            bar.total = self.expected_steps()  # the ETA follows whichever bound comes first
            bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{tok_s:,.0f}", refresh=False)
            mem = f" host memory {rss:.0f} MiB" if rss is not None else ""
            log.debug(f"step {step} loss {loss:.4f} lr {lr:.3e} tokens/s {tok_s:.0f}{mem}")
        for k in window:
            window[k] = 0.0 if k != "updates" else 0
        self.window_clock = self.clock["updates"]

    def _log_valid(self, m: dict[str, float]) -> None:
        if not self.main:
            return
        step = self.progress.step
        for key in ("loss", "ppl", "bleu", "chrf"):
            self.writer.add_scalar(f"valid/{key}", m[key], step)
        self.writer.flush()
        tqdm.write(
            f"step {step}: valid loss {m['loss']:.3f} ppl {m['ppl']:.2f} BLEU {m['bleu']:.2f} chrF {m['chrf']:.2f}"
            f" (best {self.cfg.train.best_metric} {self.progress.best:.2f} at step {self.progress.best_step})"
        )
        log.debug(f"step {step} valid {m}")

    def _average_last(self, n: int) -> None:
        paths = step_checkpoints(self.ckpt_dir)[-n:]
        if len(paths) < 2:
            log.info(f"train.average_last={n}: only {len(paths)} checkpoint kept, nothing to average")
            return
        atomic_save(average_checkpoints(paths), self.ckpt_dir / "averaged.pt")
        log.info(f"averaged {len(paths)} checkpoints into {self.ckpt_dir / 'averaged.pt'}")

    def _close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.distributed:
            dist.barrier()
            dist.destroy_process_group()
        if self.main:
            self.lock.release()


def train(cfg: Config, resume: bool = False) -> dict[str, float]:
    """Train (after preparing the data if needed); returns the last validation metrics."""
    return Trainer(cfg, resume).fit()
