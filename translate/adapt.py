"""Start a new run from a trained checkpoint (domain adaptation): `train.init_from` / `--init-from`.

The new run takes the checkpoint's weights and its SentencePiece vocabulary (the new data is
encoded with it; no vocabulary is trained), and starts a fresh optimizer, learning-rate
schedule and progress (step 0). The model settings that shape the weights must be those of
the checkpoint (dropout may differ). Every checkpoint of the new run records where it started
(`init_from`: path and step), which `translate info` shows.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
from pathlib import Path
from typing import Any

from translate.checkpoint import load_checkpoint, model_differences, newest_checkpoint
from translate.config import Config, VocabConfig, config_to_dict
from translate.errors import UserError

log = logging.getLogger("translate")


def load_init(cfg: Config) -> dict[str, Any]:
    """The checkpoint of train.init_from, once its model settings are found to be the config's."""
    path = Path(cfg.train.init_from).expanduser()
    try:
        ckpt = load_checkpoint(path)
    except UserError as e:  # the config may name it (configs/adapt.yaml): say where it comes from
        raise UserError(f"train.init_from (--init-from): {e}") from None
    here, there = config_to_dict(cfg)["model"], ckpt["config"]["model"]
    differ = model_differences(here, there)
    if differ:
        keys = ", ".join(f"model.{k} ({here[k]!r} here, {there.get(k)!r} there)" for k in differ)
        raise UserError(f"cannot initialise from {path}: the model settings differ from the checkpoint's: {keys}")
    return ckpt


def adapted_config(cfg: Config, ckpt: dict[str, Any]) -> Config:
    """The config with the checkpoint's vocab section: the vocabulary this run really uses."""
    vocab = VocabConfig(**{f.name: ckpt["config"]["vocab"][f.name] for f in dataclasses.fields(VocabConfig)})
    return dataclasses.replace(cfg, vocab=vocab)


def resumed_config(cfg: Config, saved: dict[str, Any], main: bool = True) -> Config:
    """The config of a run that has trained (`saved`: its last.pt) and goes on: its start is the one it
    had. train.init_from becomes the checkpoint it started from (None: from scratch), its vocabulary
    that of `saved`, whatever the checkpoint it started from holds now; another existing checkpoint
    given as train.init_from is not used (a warning)."""
    record = saved.get("init_from")
    started = record["path"] if record else None
    given = Path(cfg.train.init_from).expanduser() if cfg.train.init_from else None
    other = (
        given is not None and given.exists() and not (started and Path(started).exists() and given.samefile(started))
    )
    if other and main:
        log.warning(
            f"train.init_from {cfg.train.init_from} is not used: {cfg.run_path} has trained, starting "
            f"{f'from {started}' if started else 'from scratch'} (--init-from starts a new run)"
        )
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, init_from=started))
    return adapted_config(cfg, saved) if started else cfg


def init_record(cfg: Config, ckpt: dict[str, Any]) -> dict[str, Any]:
    return {"path": str(Path(cfg.train.init_from).expanduser().resolve()), "step": ckpt.get("step")}


@functools.lru_cache(maxsize=4)
def _vocabulary(path: str, size: int, mtime_ns: int) -> bytes:
    return load_checkpoint(path)["spm_model"]


def init_vocabulary(cfg: Config) -> bytes | None:
    """The SentencePiece model bytes a preparation keeps rather than trains: in a run that has trained,
    its own (its newest checkpoint's, whatever the config or the sources say now: the checkpoints go on
    with it); else train.init_from's checkpoint's; else None."""
    if (newest := newest_checkpoint(cfg.run_path / "checkpoints")) is not None:  # a run that has trained
        path = newest
    elif cfg.train.init_from:
        path = Path(cfg.train.init_from).expanduser()
        if not path.is_file():
            load_checkpoint(path)  # the one-line error for a missing path or a directory
    else:
        return None
    stat = path.stat()
    return _vocabulary(str(path), stat.st_size, stat.st_mtime_ns)


def vocabulary_hash(cfg: Config) -> str | None:
    """A hash of init_vocabulary's model, for the data's fingerprint: in a run that has trained, of its
    spm.model where there is one (read at every check of the data, without loading a checkpoint)."""
    own = cfg.run_path / "spm.model"
    trained = newest_checkpoint(cfg.run_path / "checkpoints") is not None
    model = own.read_bytes() if trained and own.is_file() else init_vocabulary(cfg)
    return hashlib.sha256(model).hexdigest()[:16] if model is not None else None
