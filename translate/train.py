"""The training loop: schedule, AMP, accumulation, clipping, DDP, validation, checkpoints, logging.

One update reads `accumulate` batches on each of the world's ranks; the gradient of the
summed token loss is divided by the number of target tokens of the whole update, so the
update does not depend on how the tokens were split across batches or devices. The sampler's
position (epoch, global batch index) is part of every checkpoint: a resumed run reads
exactly the batches an uninterrupted run would have read.

An update makes no device->host synchronisation, so that on a GPU the host queues the next
update while the device computes this one: the token counts come from the batches' lengths on
the host, the stop flags (a signal, the time budget) are host values agreed in one collective
between the ranks (on the host), an update whose loss or gradient is not finite is skipped by the
fused optimizer on the device (`found_inf`, as GradScaler does) and counted when the loop next
logs or saves, and the batches of the next updates are collated ahead in a background thread
(into pinned memory on a GPU). tests/test_train.py counts the synchronisations of updates.

The Trainer holds one run's model, optimizer and data, and makes its updates; the rest has a
module of its own: the run's state, clocks, running sums and stop checks (trainstate.py),
TensorBoard and the progress bar (trainlog.py), validation (validation.py), the optimizer and
schedule (optim.py), the run directory (rundir.py), the processes of a torchrun
(distributed.py), the data (prepare.py, data.py). The Trainer stays one class (about 650
lines), since its methods share one run's model, optimizer, data and state.
"""

from __future__ import annotations

import dataclasses
import datetime
import inspect
import logging
import os
import shlex
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from translate.adapt import adapted_config, init_record, load_init, resumed_config
from translate.batching import shard_batches, token_batches
from translate.checkpoint import (
    CHECKPOINT_FORMAT,
    atomic_save,
    average_checkpoints,
    link,
    load_checkpoint,
    prune,
    rng_state,
    set_rng_state,
    step_checkpoints,
    versions,
)
from translate.config import Config, config_to_dict, parse_duration, save_config
from translate.data import Batch, Prefetcher, collate, load_split
from translate.distributed import World, init_process_group, watch_launcher
from translate.errors import UserError
from translate.glossary import load_glossary
from translate.hardware import (
    attention_kernels,
    by_precision,
    choose_amp,
    choose_padding,
    cpu_info,
    is_out_of_memory,
    no_attention_kernel,
    precision_name,
    release_free_memory,
    reset_host_memory_peak,
    resolve_device,
)
from translate.loss import label_smoothed_nll_loss
from translate.model import Transformer, count_parameters
from translate.optim import build_optimizer, lr_lambda, seed_everything
from translate.prepare import prepare
from translate.rundir import RunLock, check_run_dir, check_same_setup
from translate.tokenizer import PAD, Tokenizer
from translate.trainlog import TensorboardLogger
from translate.trainstate import Clock, Speedometer, StopRequest, TrainState, UpdateResult, stop_reason
from translate.validation import Validator

log = logging.getLogger("translate")


# ---------------------------------------------------------------------------- set-up


PREFETCH = 2  # updates collated ahead of the one the device works on
RANK_SEED_STRIDE = 1_000_003  # rank r > 0 seeds with seed + r x this: runs of nearby seeds share no rank's stream


@dataclass
class PlannedUpdate:
    """The batches of one update, collated ahead, and where the epoch stands once it is made."""

    epoch: int
    position: int  # the epoch's next global batch after this update
    epoch_batches: int  # the global batches the epoch was packed into (before the ranks' share is cut)
    batches: list[Batch]  # this rank's
    all_ntokens: int  # target tokens of every rank's batches (from their lengths: no collective)
    last: bool  # the last update of train.max_epochs


# The model's only buffer (the position table) is alike on every rank: DDP need not send it with each
# forward. torch 2.13 names that forward_sync_buffers (and warns of broadcast_buffers); earlier ones do not.
NO_BUFFER_SYNC = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
    else {"broadcast_buffers": False}
)


def relative_paths(cfg: Config) -> list[str]:
    """The config's paths that are relative to the working directory (a local dataset's among them)."""
    paths = [cfg.run_dir, cfg.data.train, cfg.data.valid, cfg.data.test, cfg.data.bible_db]
    paths += [cfg.train.init_from, cfg.decode.glossary]
    if cfg.data.dataset and Path(cfg.data.dataset).exists():  # a hub name is not a path
        paths.append(cfg.data.dataset)
    return [str(p) for p in paths if p and not Path(p).expanduser().is_absolute()]


def load_last(last: Path) -> dict[str, Any]:
    """The run's last.pt; where it cannot be read, the error names the checkpoint before it to go on from."""
    try:
        return load_checkpoint(last)
    except UserError as e:
        earlier = [p for p in step_checkpoints(last.parent) if not p.samefile(last)]
        if not earlier:
            raise
        raise UserError(f"{e}; to continue from the checkpoint before it: ln -f {earlier[-1]} {last}") from None


def resume_command(cfg: Config, world: World) -> str:
    """The command that continues the run of `cfg`: under torchrun, torchrun with as many processes;
    from this directory where the config names paths relative to it."""
    cd = f"cd {shlex.quote(os.getcwd())} && " if relative_paths(cfg) else ""
    config = shlex.quote(str(cfg.run_path / "config.yaml"))
    if not world.distributed:
        return f"{cd}translate train --config {config} --resume"
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world.size))
    nodes = f" on each of the {world.size // local} machines, as before" if local != world.size else ""
    return f"{cd}torchrun --nproc_per_node {local} -m translate train --config {config} --resume{nodes}"


# ---------------------------------------------------------------------------- the loop


class Trainer:
    def __init__(self, cfg: Config, resume: bool) -> None:
        if cfg.decode.glossary:  # the checkpoints will name it: a missing or malformed file is refused now
            load_glossary(cfg.decode.glossary)
        init = saved = None
        last = cfg.run_path / "checkpoints" / "last.pt"
        if resume and last.is_file():  # last.pt has it all: the run's state, its start, its vocabulary
            saved = load_last(last)  # checked by check_run_dir (before anything is prepared)
            cfg = resumed_config(cfg, saved, World.from_env().main)
        elif cfg.train.init_from:
            init = load_init(cfg)  # refused before anything is written
            cfg = adapted_config(cfg, init)
        self.init_from = init_record(cfg, init) if init else None
        self.cfg, self.run, self.resume = cfg, cfg.run_path, resume
        self.ckpt_dir = self.run / "checkpoints"
        self.clock = Clock()
        setup_start = time.perf_counter()
        self._join(cfg)
        try:
            self._prepare(cfg, resume, saved)
            self._load_data(cfg)
            self._build(cfg, saved, init)
            del init, saved
            self.logger = TensorboardLogger(self.run / "tb", self.main, self.state.step)
        except BaseException:
            self._abandon()
            raise
        if self.main:
            self._write_header(self.cfg)
        self.speed = Speedometer(self.device, self.state.skipped, self.state.window)
        self.session = (time.perf_counter(), self.state.elapsed, self.state.step)  # when, and how far, it started
        self.metrics: dict[str, float] = {}
        self.closed = False
        self.clock.setup = time.perf_counter() - setup_start

    def _join(self, cfg: Config) -> None:
        """Which process this is, on which device, at which precision and thread count."""
        world = World.from_env()
        self.distributed, self.rank, self.world = world.distributed, world.rank, world.size
        self.main = world.main
        if self.distributed:
            watch_launcher()  # a worker whose torchrun died stops, saves and frees the run's lock
        self.device = resolve_device(cfg.train.device, "train.device", world.local_rank)
        self.amp, self.amp_reason = choose_amp(cfg.train.amp, self.device)
        self.padding = choose_padding(cfg.train.pad_to_multiple, self.device, self.amp)
        self.max_tokens, self.max_tokens_reason = by_precision(cfg.train.max_tokens, self.amp)
        self.lr, self.lr_reason = by_precision(cfg.train.lr, self.amp)
        self.budget = parse_duration(cfg.train.max_time) if cfg.train.max_time is not None else None

    def _prepare(self, cfg: Config, resume: bool, saved: dict[str, Any] | None) -> None:
        """The process group; then rank 0 locks the run, checks it (and `saved`, its last.pt, against
        the config) and prepares the data while the others wait for its verdict: where it refuses, every
        rank ends at once (rank 0 says why; the others would otherwise wait for it in the group's start)."""
        timeout = parse_duration(cfg.train.dist_timeout, "train.dist_timeout")
        self.host_group = None  # where the ranks agree on host values: gloo (NCCL's would need the GPU)
        if self.distributed:
            init_process_group(self.device, timeout)
            if self.device.type != "cpu":
                self.host_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout))
        refused: BaseException | None = None
        if self.main:
            try:
                self.run.mkdir(parents=True, exist_ok=True)
                self.lock = RunLock(self.run)
                check_run_dir(cfg, resume, saved)  # before prepare(): a refused resume changes nothing
                prepare(cfg)
            except BaseException as e:  # said to the others first
                refused = e
        if self.distributed:
            verdict = [refused is not None]
            try:
                dist.broadcast_object_list(verdict, src=0, group=self.host_group)
            except RuntimeError:
                if refused is not None:
                    raise refused from None
                if self.main:  # the others gave up waiting (train.dist_timeout) while this one prepared
                    raise UserError(
                        f"the other processes stopped waiting for the data in {self.run / 'data'} (longer than "
                        f"train.dist_timeout, {timeout / 60:g} min): it is prepared now; run the command again"
                    ) from None
                raise UserError(
                    f"waited for rank 0 to prepare the data in {self.run / 'data'}: it stopped or took longer than "
                    f"train.dist_timeout ({timeout / 60:g} min); see rank 0's log"
                ) from None
            if verdict[0] and not self.main:
                raise SystemExit(UserError.exit_code)  # rank 0 prints why
        if refused is not None:
            raise refused

    def _load_data(self, cfg: Config) -> None:
        data_dir = self.run / "data"
        self.tokenizer = Tokenizer.load(self.run / "spm.model")
        self.train_data = load_split(data_dir, "train")
        self.validator = Validator(
            cfg, data_dir, self.tokenizer, self.device, self.amp, self.padding, self.max_tokens, self.rank, self.world
        )

    def _build(self, cfg: Config, ckpt: dict[str, Any] | None, init: dict[str, Any] | None) -> None:
        """Model, optimizer, schedule and scaler: fresh, from `ckpt` (last.pt, --resume) or from train.init_from."""
        last = self.ckpt_dir / "last.pt"
        self.cfg = cfg = self._at_width(cfg, ckpt or init)
        seed_everything(cfg.seed)
        self.model = Transformer(cfg.model, self.tokenizer.vocab_size).to(self.device)
        if self.rank:  # each rank its own dropout masks (rank 0 draws those of a single process)
            seed_everything(cfg.seed + RANK_SEED_STRIDE * self.rank)
        self.optimizer = build_optimizer(cfg, self.model, self.lr)
        self.time_spent = 0.0  # the share of train.max_time trained, as the ranks agreed after the last update
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(cfg, self.lr, lambda: self.time_spent)
        )
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp == torch.float16)
        self.state = TrainState()
        if ckpt is not None:
            self._restore(ckpt)
        elif self.resume and self.main:
            log.info(f"--resume: {last} does not exist yet, starting from step 0")
        if init and ckpt is None:
            self.model.load_state_dict(init["model"])
            log.info(f"weights and vocabulary from {cfg.train.init_from} (step {init.get('step')}); fresh optimizer")
        self.net: torch.nn.Module = self.model
        if self.distributed:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.net = DDP(self.model, device_ids=ids, **NO_BUFFER_SYNC)
        if cfg.train.compile:
            self.net = torch.compile(self.net)

    def _at_width(self, cfg: Config, ckpt: dict[str, Any] | None) -> Config:
        """The config with model.d_ff as one number: where the run continues a checkpoint (--resume,
        train.init_from) that checkpoint's width, which the config was found to agree with; otherwise the
        entry of the precision train.amp chose, where the config gives one per precision."""
        setting = cfg.model.d_ff
        if ckpt is not None and isinstance(setting, dict):
            d_ff, self.d_ff_reason = ckpt["config"]["model"]["d_ff"], "by precision: the checkpoint's width"
        else:
            d_ff, self.d_ff_reason = by_precision(setting, self.amp)
        return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, d_ff=d_ff))

    def _write_header(self, cfg: Config) -> None:
        """Rank 0: the checkpoint directory, config.yaml, and what the run trains on."""
        self.ckpt_dir.mkdir(exist_ok=True)
        for stale in self.ckpt_dir.glob(".*.tmp"):  # a save killed midway (kill -9): the run's lock is ours
            stale.unlink(missing_ok=True)
        header = f"precision {self.precision}: train.amp {cfg.train.amp}, {self.amp_reason}"
        save_config(cfg, self.run / "config.yaml", header=header)
        log.info(f"amp {cfg.train.amp}: {self.amp_reason}")
        log.info(f"pad_to_multiple {cfg.train.pad_to_multiple}: {self.padding.reason}")
        log.info(f"max_tokens {self.max_tokens}: {self.max_tokens_reason}")
        log.info(f"lr {self.lr:g}: {self.lr_reason}")
        log.info(f"d_ff {cfg.model.d_ff}: {self.d_ff_reason}")
        log.info(
            f"model: {count_parameters(self.model):,} parameters, vocab {self.tokenizer.vocab_size}; "
            f"device {self.device}, precision {self.precision}, world size {self.world}; "
            f"{len(self.train_data):,} train pairs"
        )
        m = cfg.model
        if m.norm == "post" and m.decoder_layers < m.encoder_layers:
            log.warning(
                f"model: a post-norm decoder shallower than its encoder ({m.encoder_layers} + {m.decoder_layers} "
                "layers) learnt nothing in measured runs at a high learning rate and a short warmup; "
                "model.norm: pre trains this shape (docs/training.md)"
            )
        t = cfg.train
        if t.average_last and t.average_last > t.keep_last:
            log.warning(
                f"train.average_last {t.average_last} but train.keep_last {t.keep_last}: the run will average the "
                f"{t.keep_last} step checkpoints it keeps; raise keep_last to average {t.average_last}"
            )

    @property
    def precision(self) -> str:
        return precision_name(self.amp)

    def hardware(self) -> dict[str, Any]:
        """What the run trained on and at which precision, and why (saved in config.yaml and checkpoints)."""
        info = cpu_info()
        return {
            "device": str(self.device),
            "precision": self.precision,
            "reason": f"train.amp {self.cfg.train.amp}: {self.amp_reason}",
            "padding": f"train.pad_to_multiple {self.cfg.train.pad_to_multiple}: {self.padding.reason}",
            "max_tokens": f"train.max_tokens {self.max_tokens}: {self.max_tokens_reason}",
            "lr": f"train.lr {self.lr:g}: {self.lr_reason}",
            "d_ff": f"model.d_ff {self.cfg.model.d_ff}: {self.d_ff_reason}",
            "cpu": info.capability,
            "cpu_native_bf16": info.native_bf16,
            "world_size": self.world,
        }

    def _restore(self, ckpt: dict[str, Any]) -> None:
        check_same_setup(self.cfg, ckpt, self.ckpt_dir / "last.pt")
        if ckpt["spm_model"] != self.tokenizer.model_bytes:
            raise UserError(
                f"cannot resume: {self.run / 'spm.model'} is not the vocabulary the checkpoint was trained with "
                f"(translate prepare --config {self.run / 'config.yaml'} --force writes the data anew with it)"
            )
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        self._take_lr(self.scheduler.base_lrs[0])
        self.scaler.load_state_dict(ckpt["scaler"])
        self.state = TrainState(**ckpt["progress"])
        self.init_from = ckpt.get("init_from", self.init_from)
        if self.rank < len(ckpt["rng"]):  # a rank the run did not have keeps its own fresh seed
            set_rng_state(ckpt["rng"][self.rank])
        if self.main:
            log.info(f"resumed from {self.ckpt_dir / 'last.pt'} at step {self.state.step}")
            saved = ckpt.get("hardware", {}).get("world_size", len(ckpt["rng"]))
            if saved != self.world:
                log.warning(
                    f"resumed with {self.world} process{'es' * (self.world > 1)} where the run had {saved}: an update now takes "
                    f"{self.world}/{saved} of the tokens it took (max_tokens x accumulate x processes) and the "
                    f"batches are shared out anew, so the run will not match one never interrupted"
                )

    def resume_command(self) -> str:
        return resume_command(self.cfg, World.from_env())

    def _take_lr(self, saved: float) -> None:
        """A run resumed with another peak lr (train.lr changed, or another precision's entry) goes on
        at the same point of its schedule, scaled to the new peak; the saved schedule keeps the old one."""
        if saved == self.lr:
            return
        self.scheduler.base_lrs = [self.lr for _ in self.scheduler.base_lrs]
        for group in self.optimizer.param_groups:
            group["initial_lr"] = self.lr
            group["lr"] *= self.lr / saved
        self.scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]
        if self.main:
            log.info(f"lr {self.lr:g} from now on (the checkpoint trained at {saved:g})")

    # ------------------------------------------------------------------------ batches

    def collate(self, indices: np.ndarray) -> Batch:
        """Training's batch of these sentences: lengths padded as train.pad_to_multiple says on this
        hardware (`self.padding`), the positions to project rounded to 8x it, in pinned memory where a
        GPU will copy it."""
        batch = collate(self.train_data, indices, self.padding.pad, project_multiple=self.padding.project)
        return batch.pin_memory() if self.device.type == "cuda" else batch

    def packed_batches(self, epoch: int) -> list[np.ndarray]:
        """The epoch's global batches as packed, before they are shared out between the ranks."""
        lens = self.train_data.src_lens, self.train_data.tgt_lens
        return token_batches(*lens, self.max_tokens, self.cfg.seed, epoch, pad_to_multiple=self.padding.pack)

    def ranks_share(self, batches: list[np.ndarray]) -> list[np.ndarray]:
        """The packed batches that the ranks share: the tail that would leave some rank without one cut."""
        return batches[: len(batches) - len(batches) % self.world]

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        return self.ranks_share(self.packed_batches(epoch))

    def planned_updates(self, epoch: int, position: int) -> Iterator[PlannedUpdate]:
        """Every update from global batch `position` of `epoch` on, to train.max_epochs: each takes the
        next accumulate x world batches, this rank every world-th of them."""
        t = self.cfg.train
        per_update, tgt_lens = t.accumulate * self.world, self.train_data.tgt_lens
        while t.max_epochs is None or epoch < t.max_epochs:
            packed = self.packed_batches(epoch)
            batches = self.ranks_share(packed)
            if len(batches) < per_update:
                raise UserError(
                    f"the train split gives {len(batches)} batches of train.max_tokens={self.max_tokens} tokens, "
                    f"fewer than one update needs ({per_update}): lower train.max_tokens or train.accumulate"
                )
            while position + per_update <= len(batches):
                group = batches[position : position + per_update]
                position += per_update
                last = t.max_epochs is not None and epoch + 1 == t.max_epochs and position + per_update > len(batches)
                mine = [self.collate(b) for b in shard_batches(group, self.rank, self.world)]
                all_ntokens = int(sum(tgt_lens[b].sum() for b in group))
                yield PlannedUpdate(epoch, position, len(packed), mine, all_ntokens, last)
            epoch, position = epoch + 1, 0

    # ------------------------------------------------------------------------ one update

    def forward_loss(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Sums over the batch's target tokens: (label-smoothed loss, NLL). Only the positions in
        `batch.keep` are projected onto the vocabulary (the non-pad ones, rounded up: see collate)."""
        kernels = attention_kernels(self.cfg.train.attention, self.device)
        with kernels, torch.autocast(self.device.type, dtype=self.amp or torch.float32, enabled=self.amp is not None):
            logits = self.net(batch.src, batch.tgt_in, batch.keep)
        loss, nll, _ = label_smoothed_nll_loss(logits, batch.target(), self.cfg.train.label_smoothing, PAD)
        return loss, nll

    def update(self, batches: list[Batch], all_ntokens: int | None = None, stop_signal: int = 0) -> UpdateResult:
        """One optimizer update over this rank's batches, without a device->host synchronisation.

        `all_ntokens`: the target tokens of every rank's batches of this update (default: these
        batches', in a single process); the gradient is that of the summed loss over them."""
        if all_ntokens is None:
            assert not self.distributed, "a distributed update needs the tokens of every rank"
            all_ntokens = sum(b.ntokens for b in batches)
        scale = self.world / all_ntokens  # DDP averages gradients over ranks
        loss_sum = nll_sum = torch.zeros((), device=self.device)
        for i, batch in enumerate(batches):
            batch = batch.to(self.device)
            sync = i == len(batches) - 1 or not self.distributed
            ctx = self.net.no_sync() if not sync and hasattr(self.net, "no_sync") else nullcontext()
            try:
                with ctx:
                    loss, nll = self.forward_loss(batch)
                    self.scaler.scale(loss * scale).backward()
            except (RuntimeError, MemoryError) as e:
                if no_attention_kernel(e) and self.cfg.train.attention != "auto":
                    raise UserError(
                        f"train.attention {self.cfg.train.attention}: torch has no such attention kernel for this "
                        f"model on {self.device} (a GPU, torch or shape it does not support); use auto"
                    ) from None
                if not is_out_of_memory(e):
                    raise
                (B, S), T, t = batch.src.shape, batch.tgt_in.size(1), self.cfg.train
                raise UserError(
                    f"out of memory on {self.device} at step {self.state.step}, on a batch of {B} sentences of up "
                    f"to {S} source and {T} target tokens: lower train.max_tokens (now {self.max_tokens}) and raise "
                    f"train.accumulate (now {t.accumulate}) to keep the tokens per update"
                ) from None
            loss_sum = loss_sum + loss.detach()
            nll_sum = nll_sum + nll
        self.scaler.unscale_(self.optimizer)
        clip = self.cfg.train.clip_norm if self.cfg.train.clip_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        skipped = ~(torch.isfinite(grad_norm) & torch.isfinite(loss_sum))
        self._step(skipped)
        self.optimizer.zero_grad(set_to_none=True)
        stop, out_of_time = self.agree(stop_signal)
        self.scheduler.step()  # after agree(): train.cooldown reads the time spent
        local = sum(b.ntokens for b in batches)
        return UpdateResult(loss_sum, nll_sum, grad_norm, skipped, local, all_ntokens, stop, out_of_time)

    def _step(self, skipped: torch.Tensor) -> None:
        """The optimizer's step, skipped on the device where `skipped` holds."""
        if self.scaler.is_enabled():
            self.scaler.step(self.optimizer)  # fp16: skips the step itself when gradients overflowed
            self.scaler.update()
        elif self.optimizer.defaults.get("fused"):
            self.optimizer.found_inf, self.optimizer.grad_scale = skipped.float(), None
            try:
                self.optimizer.step()  # the fused kernel leaves weights and moments as they are where found_inf
            finally:
                del self.optimizer.found_inf, self.optimizer.grad_scale
        elif not bool(skipped):  # a synchronisation, on devices without a fused Adam (MPS)
            self.optimizer.step()

    def agree(self, stop_signal: int = 0) -> tuple[bool, bool]:
        """(a rank was asked to stop, rank 0 says train.max_time is spent): host values, the same on
        every rank (one collective on the host), so that all stop after the same update. Sets
        `time_spent`, rank 0's share of the time budget trained, for the schedule's cooldown."""
        spent = self.trained_time() / self.budget if self.main and self.budget else 0.0
        over = spent >= 1.0
        if self.distributed:
            flags = torch.tensor([float(bool(stop_signal)), float(over), spent], dtype=torch.float64)
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.host_group)
            stop_signal, over, spent = flags.tolist()
        self.time_spent = spent
        return bool(stop_signal), bool(over)

    # ------------------------------------------------------------------------ validation

    def validate(self) -> dict[str, float]:
        return self.validator(self.model, self.state.step, self.logger)

    def _improved(self, metrics: dict[str, float]) -> bool:
        key = self.cfg.train.best_metric
        value = metrics[key]
        best = self.state.best
        better = best is None or (value < best if key == "loss" else value > best)
        if better:
            self.state.best, self.state.best_step, self.state.bad_evals = value, self.state.step, 0
        else:
            self.state.bad_evals += 1
        return better

    # ------------------------------------------------------------------------ checkpoints

    def save(self, best: bool, metrics: dict[str, float] | None) -> None:
        self.tick()
        self.check_skipped()
        self.state.window = self.speed.window()
        rng = self._gather_rng()  # a collective: every rank takes part
        if not self.main:
            return
        self.logger.flush()
        step = self.state.step
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
            "progress": asdict(self.state),
            "rng": rng,
            "step": step,
            "epoch": self.state.epoch,
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
            raise UserError(f"{e}, then {then}: {self.resume_command()}") from None
        link(path, self.ckpt_dir / "last.pt")
        if best:
            link(path, self.ckpt_dir / "best.pt")
        prune(self.ckpt_dir, self.cfg.train.keep_last)

    def _gather_rng(self) -> list[dict[str, Any]]:
        """Every rank's RNG state (rank order), so a resumed DDP run draws the same dropout masks."""
        state = rng_state(cuda=self.device.type == "cuda")
        if not self.distributed:
            return [state]
        states: list[Any] = [None] * self.world
        dist.all_gather_object(states, state)
        return states

    def check_skipped(self) -> None:
        """The skipped updates so far into TrainState (a synchronisation); a UserError where the last
        train.max_bad_steps or more were all skipped."""
        self.state.skipped, in_row = self.speed.skipped_so_far()
        if in_row >= self.cfg.train.max_bad_steps:
            if not self.main:  # every rank stops here (the count is of the global update); rank 0 says why
                raise SystemExit(UserError.exit_code)
            fp16 = (
                " (or train.amp: off: this run is in fp16, whose range is narrow)" if self.precision == "fp16" else ""
            )
            raise UserError(
                f"{in_row} updates in a row had a non-finite loss or gradient at step {self.state.step}: "
                f"lower train.lr or raise train.warmup_steps{fp16}"
            )

    # ------------------------------------------------------------------------ main loop

    def fit(self) -> dict[str, float]:
        try:
            return self._fit()
        except BaseException:
            self._abandon()
            raise

    def _fit(self) -> dict[str, float]:
        t, s = self.cfg.train, self.state
        stopper = StopRequest()
        self.logger.open_bar(s.step, t.max_steps)
        release_free_memory()  # what preparation and loading freed
        reset_host_memory_peak()  # the peak in train.log is training's, not that of preparation or loading
        self.session = (time.perf_counter(), s.elapsed, s.step)
        reason = None
        if s.step >= t.max_steps:
            reason = f"already at train.max_steps={t.max_steps}"
        elif self.agree()[1]:
            reason = f"already past train.max_time={t.max_time} ({s.elapsed / 60:.1f} min trained)"
        elif t.patience and s.bad_evals >= t.patience:
            reason = f"already stopped: no better valid {t.best_metric} in {t.patience} evaluations (train.patience)"
        if reason is None:
            self._same_share_of_the_epoch()
        updates = Prefetcher(self.planned_updates(s.epoch, s.position), PREFETCH) if reason is None else None
        self.model.train()
        try:
            while reason is None:
                planned = next(updates, None)
                if planned is None:  # the epochs of train.max_epochs are done (the last update has saved)
                    reason = f"reached train.max_epochs={t.max_epochs}"
                    break
                reason = self._train_step(planned, stopper)
        finally:
            if updates is not None:
                updates.close()
            self.logger.close_bar()
            stopper.restore()
        self.tick()
        if reason == "signal":
            self.close()
            name = signal.Signals(stopper.signum).name if stopper.signum else "signal"
            if self.main:  # on the console and in train.log
                log.warning(
                    f"stopped by {name} at step {s.step}; checkpoint saved. Resume with: {self.resume_command()}"
                )
            raise SystemExit(128 + (stopper.signum or signal.SIGINT))
        if self.main:
            best = "none" if s.best is None else f"{s.best:.4g}"
            log.info(f"training stopped: {reason}; best valid {t.best_metric} {best} at step {s.best_step}")
            log.info(self.time_summary())
            if t.average_last:
                self._average_last(t.average_last)
        self.close(then=self._tune_length_penalty)
        return self.metrics

    def _same_share_of_the_epoch(self) -> None:
        """A run resumed with batches of another size (train.max_tokens changed, or another precision's
        entry of it; or checkpointed by code that packed them otherwise) packs its epoch into another number of batches, which the saved position does not
        index: it goes on at the same share of the epoch, the right number of updates to the epoch's end
        (not the sentences left: the new batches are in another random order, so some come twice in
        that epoch and others not at all; the next epochs are whole)."""
        s = self.state
        if s.epoch_batches is None or not s.position:
            return
        n = len(self.packed_batches(s.epoch))  # another world size cuts another tail off the same list
        if n == s.epoch_batches:
            return
        position = min(round(s.position * n / s.epoch_batches), n)
        if self.main:
            log.warning(
                f"epoch {s.epoch} now has {n} batches (of {self.max_tokens} tokens, over {self.world} "
                f"process{'es' * (self.world > 1)}) where the run had {s.epoch_batches} (train.max_tokens, the number "
                f"of processes or, from earlier code, the packing changed); it goes on at the same share of it "
                f"(batch {position} for {s.position})"
            )
        s.position, s.epoch_batches = position, n

    def _train_step(self, planned: PlannedUpdate, stopper: StopRequest) -> str | None:
        """One update, then what follows it (logging, validation, checkpoint); returns why to stop, if so."""
        t, s = self.cfg.train, self.state
        start = time.perf_counter()
        result = self.update(planned.batches, planned.all_ntokens, stopper.signum or 0)
        seconds = time.perf_counter() - start
        self.clock.updates += seconds
        self.speed.add(result, seconds)
        s.epoch, s.position, s.epoch_batches, s.step = (
            planned.epoch,
            planned.position,
            planned.epoch_batches,
            s.step + 1,
        )
        self.logger.advance()
        if s.step % t.log_every == 0:
            self.log_train()
        last = s.step >= t.max_steps or result.out_of_time or planned.last
        evaluated = improved = False
        if s.step % t.eval_every == 0 or last:
            start = time.perf_counter()
            self.metrics, evaluated = self.validate(), True
            improved = self._improved(self.metrics)
            self.logger.valid(s.step, self.metrics, t.best_metric, s.best, s.best_step)
            self.clock.validation += time.perf_counter() - start
        reason = stop_reason(t, s, result, self.trained_time(), planned.last)
        if s.step % t.save_every == 0 or improved or reason:
            start = time.perf_counter()
            self.save(improved, self.metrics if evaluated else None)
            self.clock.checkpoints += time.perf_counter() - start
        return reason

    def log_train(self) -> None:
        """The window's figures to TensorBoard and the bar (reading them waits for the device)."""
        start = time.perf_counter()
        stats = self.speed.read()
        self.clock.updates += time.perf_counter() - start  # the device's work the updates queued
        self.check_skipped()
        lr = self.scheduler.get_last_lr()[0]
        self.logger.train(self.state.step, stats, lr, self.state.skipped, self.expected_steps())

    def trained_time(self) -> float:
        """Seconds trained: this session's so far plus those of the sessions it resumed."""
        started, elapsed_before, _ = self.session
        return elapsed_before + time.perf_counter() - started

    def tick(self) -> None:
        self.state.elapsed = self.trained_time()

    def expected_steps(self) -> int:
        """The update at which training will stop: max_steps, or sooner where the time budget runs out first
        (at this session's pace so far)."""
        t, s = self.cfg.train, self.state
        started, elapsed_before, first_step = self.session
        if self.budget is None or s.step <= first_step:
            return t.max_steps
        pace = (s.step - first_step) / (time.perf_counter() - started)  # updates per second, validation included
        left = max(self.budget - self.trained_time(), 0.0)
        return min(t.max_steps, s.step + int(left * pace) + 1)

    def time_summary(self) -> str:
        """How this session's time was spent, in one line."""
        return self.clock.summary(self.clock.setup + time.perf_counter() - self.session[0])

    def _average_last(self, n: int) -> None:
        paths = step_checkpoints(self.ckpt_dir)[-n:]
        if len(paths) < 2:
            log.info(f"train.average_last={n}: only {len(paths)} checkpoint kept, nothing to average")
            return
        atomic_save(average_checkpoints(paths), self.ckpt_dir / "averaged.pt")
        log.info(f"averaged {len(paths)} checkpoints into {self.ckpt_dir / 'averaged.pt'}")

    def _tune_length_penalty(self) -> None:
        """decode.tune_length_penalty: the value with the best BLEU on the valid split into best.pt
        (tune.py), unless best.pt keeps that search's choice already (a finished run resumed)."""
        grid, best = self.cfg.decode.tune_length_penalty, self.ckpt_dir / "best.pt"
        if not grid:
            return
        if not best.is_file():
            log.info(f"decode.tune_length_penalty: no {best} to tune (no validation yet)")
            return
        from translate.engine import EngineSpec
        from translate.tune import tune_checkpoint

        log.info(f"decode.tune_length_penalty: choosing among {grid} for {best} on the valid split")
        v = self.validator
        tune_checkpoint(
            best, v.sources, v.refs, grid, spec=EngineSpec([best], device=str(self.device)), skip_if_done=True
        )

    def _abandon(self) -> None:
        """After an error in setup or training: TensorBoard's files closed and the run's lock freed now,
        not when this Trainer is collected (a library user may correct the mistake and train again in
        the same process). No barrier: the other ranks may not reach one."""
        self.closed = True
        if getattr(self, "logger", None) is not None:
            self.logger.close()
        if getattr(self, "lock", None) is not None:
            self.lock.release()

    def close(self, then: Callable[[], object] | None = None) -> None:
        """The end of the run: TensorBoard files closed, process group left, `then` run by rank 0,
        the run's lock released."""
        if self.closed:
            return
        self.closed = True
        self.logger.close()
        if self.distributed:
            dist.barrier()
            dist.destroy_process_group()
        if self.main:
            try:
                if then is not None:
                    then()
            finally:
                self.lock.release()


def train(cfg: Config, resume: bool = False) -> dict[str, float]:
    """Train (after preparing the data if needed); returns the last validation metrics."""
    return Trainer(cfg, resume).fit()
