"""The run directory of a training (runs/NAME): its lock, the checks before training over it, the
TensorBoard events cut back on resume, and the last.pt / best.pt links."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from translate.adapt import resumed_config
from translate.checkpoint import check_resumable, load_checkpoint, newest_checkpoint
from translate.config import Config, agrees, config_to_dict
from translate.errors import UserError
from translate.prepare import changed_sources, read_meta


class RunLock:
    """An exclusive lock on the run dir, so two trainings cannot write one run at once."""

    def __init__(self, run: Path) -> None:
        self.file = open(run / ".lock", "w")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"{run} is in use by another training (it holds {run}/.lock)") from None

    def release(self) -> None:
        if self.file.closed:  # released already
            return
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()


RUN_DIRS = {"data": "prepared data", "checkpoints": "checkpoints", "tb": "TensorBoard events"}


def check_run_layout(run: Path) -> None:
    """The run's own directories, where they exist, are directories (not files put there by hand)."""
    for name, what in RUN_DIRS.items():
        if (run / name).exists() and not (run / name).is_dir():
            raise UserError(f"{run / name} is a file, not a directory: the run keeps its {what} there; move it away")


def check_run_dir(cfg: Config, resume: bool, saved: dict[str, Any] | None = None) -> None:
    """Refuse to train over an earlier run without --resume; with it, check last.pt (`saved`, loaded
    if not given): its model, vocabulary and data settings must be those of the config."""
    run = cfg.run_path
    check_run_layout(run)
    ckpt_dir = run / "checkpoints"
    last, newest = ckpt_dir / "last.pt", newest_checkpoint(ckpt_dir)
    if newest is not None and not last.is_file():  # starting again would write over them
        raise UserError(
            f"{'cannot resume: ' if resume else ''}{ckpt_dir} holds checkpoints but no last.pt; make the one to "
            f"continue from last.pt (ln {newest} {last}){'' if resume else ' and add --resume'}, or train under "
            "another name (--set name=...)"
        )
    # TensorBoard events without a checkpoint are a start that failed before its first one (a
    # mistake in the data, a divergence): nothing to continue, the run starts again (its curves too)
    if newest is not None and not resume:
        raise UserError(
            f"{run} already holds a training run ({newest}): add --resume to continue it, "
            f"or train under another name (--set name=...)"
        )
    if not (resume and last.is_file()):
        return
    ckpt = saved if saved is not None else load_checkpoint(last)
    check_resumable(ckpt, last)
    check_same_setup(cfg, ckpt, last)
    refuse_changed_sources(cfg, "resume")


def refuse_changed_sources(cfg: Config, doing: str) -> None:
    """A UserError where a source file of the run's prepared data is gone, new or of another size since."""
    if not (changed := changed_sources(cfg)):
        return
    then = (read_meta(cfg) or {}).get("cwd")
    elsewhere = then is not None and then != os.getcwd()  # meta.json of earlier versions does not say
    if elsewhere and all(
        not Path(p).is_absolute() and not Path(p).exists() and (Path(then) / p).is_file() for p in changed
    ):
        raise UserError(
            f"cannot {doing}: {changed[0]} is not found from {os.getcwd()}, where the config's relative data "
            f"paths lead now; run from {then}, where it was prepared (cd there)"
        )
    raise UserError(
        f"cannot {doing}: {changed[0]} is gone, new or changed since {cfg.run_path / 'data'} was prepared from it"
        f"{f' (and {len(changed) - 1} more)' if len(changed) > 1 else ''}; the checkpoints were trained on "
        "the data as it was: put the files back, or train a new run on them (--set name=...)"
    )


UNCHECKED = {"data": ("num_workers",)}  # settings that change how, not what, a run prepares or trains


def check_same_setup(
    cfg: Config,
    ckpt: dict[str, Any],
    path: Path,
    doing: str = "resume",
    sections: tuple[str, ...] = ("model", "vocab", "data"),
) -> None:
    """A resumed (or prepared again) run keeps the settings of these sections of its checkpoint at
    `path` (UserError otherwise)."""
    saved, now = ckpt["config"], config_to_dict(cfg)
    # seed: it drew the held-out splits, the vocabulary's sample, the placeholder copies and the batches' order
    pairs = [
        (f"{section}.{key}", now[section].get(key), value)
        for section in sections
        for key, value in saved[section].items()
        if key not in UNCHECKED.get(section, ())
    ]
    pairs += [("seed", now.get("seed"), saved["seed"])] if "seed" in saved else []
    for key, here, there in pairs:
        if not agrees(here, there):
            advice = f" (the run's checkpoints were trained on its data as it is; {doing} another run: --set name=...)"
            raise UserError(
                f"cannot {doing}: {key} is {here!r} here but {there!r} in {path}{advice * (doing != 'resume')}"
            )


def prepare_config(cfg: Config) -> Config:
    """The config `translate prepare` goes by: in a run that has trained, its start (resumed_config)
    and only the vocabulary and data settings its checkpoints were trained with (others would replace
    the vocabulary and data that --resume goes on with)."""
    newest = newest_checkpoint(cfg.run_path / "checkpoints")
    if newest is None:
        return cfg
    ckpt = load_checkpoint(newest)
    cfg = resumed_config(cfg, ckpt)
    check_same_setup(cfg, ckpt, newest, doing="prepare", sections=("vocab", "data"))
    refuse_changed_sources(cfg, "prepare")
    return cfg


def truncate_events(tb_dir: Path, step: int) -> None:
    """Keep only the TensorBoard events up to `step`: a resumed run logs the later steps again.

    The kept events are copied into a new event file before the old files are removed, so any
    reader (not only those that honour purge markers) sees each step once.
    """
    old = sorted(tb_dir.glob("events.out.tfevents.*"))
    if not old:
        return
    writer = EventFileWriter(str(tb_dir), filename_suffix=".resumed")
    for path in old:
        for event in LegacyEventFileLoader(str(path)).Load():
            if event.WhichOneof("what") not in ("file_version", "session_log") and event.step <= step:
                writer.add_event(event)
    writer.close()
    for path in old:
        path.unlink()
