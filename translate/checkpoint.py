"""Self-contained checkpoints: atomic writes, safe loads, averaging.

A checkpoint is a dict saved with `torch.save`:

    format        CHECKPOINT_FORMAT (bumped when the layout changes)
    versions      translate, torch, python, sentencepiece versions that wrote it
    config        the resolved config (plain dict)
    vocab_size    size of the SentencePiece vocabulary
    spm_model     the SentencePiece model's bytes
    model         model weights (state_dict)
    step, epoch   where training stands (for `translate info`)
    progress      update count, epoch, position of the next batch (and the epoch's batches), best score and its step,
                  evaluations without improvement, skipped updates
    optimizer, scheduler, scaler   training state (absent in averaged checkpoints)
    rng           python, numpy, torch (and cuda) random states, one per process
    metrics       the last validation scores
    hardware      the device, CPU class, precision and world size that trained it, and the settings chosen by them
    init_from     the checkpoint the run's weights began from (--init-from), if any
    averaged_from the inputs of an average (`translate average`), in averaged checkpoints
    tune_length_penalty   what `translate tune` (or the end of training) chose, and the value before it

`translate decode CKPT` needs nothing else. Loading uses `weights_only=True`: a checkpoint
can hold no code.
"""

from __future__ import annotations

import errno
import os
import pickle
import platform
import random
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece
import torch

import translate
from translate.config import Config, agrees, config_from_dict
from translate.errors import UserError, is_disk_full
from translate.model import Transformer
from translate.textio import atomic_write, check_output_path
from translate.tokenizer import Tokenizer

CHECKPOINT_FORMAT = 1
STEP_FILE = re.compile(r"step_(\d+)\.pt$")


def versions() -> dict[str, str]:
    return {
        "translate": translate.__version__,
        "torch": str(torch.__version__),
        "python": platform.python_version(),
        "sentencepiece": sentencepiece.__version__,
    }


def atomic_save(obj: Any, path: str | Path) -> None:
    """Write to a temp file in the same directory, fsync, then rename over `path`.

    A crash or a full disk at any moment leaves the previous file at `path` intact; a full disk
    or a directory that cannot be written is a UserError saying so.
    """
    path = check_output_path(path, "checkpoint", follow_link=False)  # a link the user named: resolved by the caller
    try:
        with atomic_write(path, "wb") as f:
            torch.save(obj, f)
    except BaseException as e:
        if isinstance(e, OSError) and e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise UserError(f"cannot save {path}: {e.strerror} in {path.parent}") from None
        if is_disk_full(e):
            kept = f"the previous {path.name} is intact" if path.exists() else "the files saved before are intact"
            raise UserError(f"disk full while saving {path}: nothing was written and {kept}; free some space") from None
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def link(src: Path, dst: Path) -> None:
    """Point `dst` at the same file as `src`, atomically (a hard link renamed over dst)."""
    tmp = dst.with_name(f".{dst.name}.link")
    tmp.unlink(missing_ok=True)
    os.link(src, tmp)
    os.replace(tmp, dst)


def check_distinct(paths: list[Path]) -> None:
    """A UserError where two of `paths` are one file (best.pt and last.pt are often hard links of a
    step checkpoint): averaging or ensembling a model with itself only costs time."""
    for i, later in enumerate(paths):
        if twin := next((p for p in paths[:i] if p.exists() and later.exists() and p.samefile(later)), None):
            raise UserError(f"{twin} and {later} are the same checkpoint (one file); give distinct ones")


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read and check a checkpoint; every way it can be wrong is one UserError line."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"checkpoint not found: {path}")
    if path.is_dir():
        if (path / "translate_config.yaml").is_file():
            raise UserError(f"{path} is a model exported by translate export, not a checkpoint (give its .pt file)")
        inside = path / "best.pt" if path.name == "checkpoints" else path / "checkpoints" / "best.pt"
        raise UserError(f"{path} is a directory, not a checkpoint (try {inside})")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types here: zip, pickle, OS and runtime errors
        raise UserError(f"{path}: {_why_unreadable(path, e)}") from None
    if damaged := _damaged_record(path):
        raise UserError(f"{path}: not a readable checkpoint (corrupt: its record {damaged} fails its checksum)")
    if not isinstance(ckpt, dict) or "format" not in ckpt or "model" not in ckpt:
        raise UserError(f"{path}: not a translate checkpoint (a .pt file of some other program)")
    missing = [key for key in ("config", "vocab_size", "spm_model") if key not in ckpt]
    if missing and ckpt["format"] == CHECKPOINT_FORMAT:
        raise UserError(f"{path}: not a complete translate checkpoint (it has no {', '.join(missing)})")
    if ckpt["format"] != CHECKPOINT_FORMAT:
        raise UserError(
            f"{path}: checkpoint format {ckpt['format']} (written by translate "
            f"{ckpt.get('versions', {}).get('translate', '?')}); this version reads format {CHECKPOINT_FORMAT}"
        )
    kinds = {"model": dict, "config": dict, "vocab_size": int, "spm_model": bytes}
    bad = [key for key, kind in kinds.items() if not isinstance(ckpt[key], kind)]
    if not bad:
        try:
            sentencepiece.SentencePieceProcessor(model_proto=ckpt["spm_model"])
        except Exception:  # sentencepiece raises RuntimeError (or OSError) on a model it cannot parse
            bad = ["spm_model"]
    if bad:
        raise UserError(f"{path}: not a readable checkpoint (corrupt: its {', '.join(bad)})")
    return ckpt


def _damaged_record(path: Path) -> str | None:
    """The first record of a checkpoint's zip archive whose bytes fail their CRC-32 (bytes damaged on
    disk or in a copy, which torch.load reads without complaint), or None. About a third of torch.load's time."""
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile:  # an old-style (not zip) file: no checksums to test
        return None
    with archive:
        for record in archive.infolist():
            if record.CRC == 0 and record.file_size:  # written without checksums (torch's set_crc32_options)
                continue
            try:
                with archive.open(record) as f:  # reading to the end compares the CRC-32
                    while f.read(1 << 24):
                        pass
            except Exception:  # BadZipFile for a wrong CRC; zlib or OS errors for worse
                return record.filename
    return None


def _why_unreadable(path: Path, error: Exception) -> str:
    with open(path, "rb") as f:
        head = f.read(4)
    if not head:
        return "an empty file, not a checkpoint"
    if head == b"PK\x03\x04" and not zipfile.is_zipfile(path):
        return "not a readable checkpoint (truncated or corrupt)"
    if head[:1] != b"\x80" and head != b"PK\x03\x04":  # neither a zip nor a pickle: not written by torch.save
        return "not a checkpoint (not a file written by PyTorch)"
    if isinstance(error, pickle.UnpicklingError) or "weights_only" in str(error).lower():
        return "not a translate checkpoint (it holds Python objects of another program)"
    return f"not a translate checkpoint ({type(error).__name__})"


def checkpoint_config(ckpt: dict[str, Any]) -> Config:
    return config_from_dict(ckpt["config"])


def model_of(ckpt: dict[str, Any], path: str | Path) -> Transformer:
    """The model of a loaded checkpoint (read from `path`), in eval mode on the CPU; weights that
    do not fit the model its config describes are a UserError."""
    model = Transformer(checkpoint_config(ckpt).model, ckpt["vocab_size"])
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        why = [line.strip() for line in str(e).splitlines() if line.strip()][1:2] or [str(e)]  # the first problem
        raise UserError(f"{path}: weights do not fit the model its config describes ({why[0][:300]})") from None
    return model.eval()


def load_model(path: str | Path, device: torch.device | str = "cpu") -> tuple[Transformer, Tokenizer, Config]:
    """Model (in eval mode, on `device`), tokenizer and config from one checkpoint file."""
    ckpt = load_checkpoint(path)
    return model_of(ckpt, path).to(device), Tokenizer(ckpt["spm_model"]), checkpoint_config(ckpt)


# ---------------------------------------------------------------------------- training state


def rng_state(cuda: bool) -> dict[str, Any]:
    """The random generators' states; the GPUs' where `cuda` (the run trains on one: a CPU run on a
    machine with a GPU starts no CUDA context to save them)."""
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]),
        "torch": torch.get_rng_state(),
    }
    if cuda:
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------------- the checkpoints dir


def step_checkpoints(ckpt_dir: Path) -> list[Path]:
    """step_*.pt files, oldest first."""
    found = [(int(m.group(1)), p) for p in ckpt_dir.glob("step_*.pt") if (m := STEP_FILE.search(p.name))]
    return [p for _, p in sorted(found)]


def newest_checkpoint(ckpt_dir: Path) -> Path | None:
    """The checkpoint a run's state is in: last.pt, else (a run cut between saving and linking it,
    or last.pt deleted) its newest step_*.pt, else best.pt; None for a run that has saved none."""
    last, steps, best = ckpt_dir / "last.pt", step_checkpoints(ckpt_dir), ckpt_dir / "best.pt"
    return last if last.is_file() else steps[-1] if steps else best if best.is_file() else None


def prune(ckpt_dir: Path, keep_last: int) -> None:
    for old in step_checkpoints(ckpt_dir)[:-keep_last]:
        old.unlink(missing_ok=True)


def check_resumable(ckpt: dict[str, Any], path: Path) -> None:
    """A checkpoint --resume can continue: one a run saved, with its optimizer and progress (an
    average, or a checkpoint stripped for decoding, has weights only)."""
    missing = [k for k in ("optimizer", "scheduler", "scaler", "progress", "rng") if k not in ckpt]
    if missing:
        what = "an average of checkpoints" if ckpt.get("averaged_from") else "a checkpoint for decoding only"
        raise UserError(
            f"cannot resume: {path} is {what} (no {', '.join(missing)}); "
            "put a checkpoint the run saved there, or start a run from it with --init-from"
        )


# model settings the same weights may have been trained under (the others give them their meaning)
FREE_MODEL_KEYS = ("dropout", "attention_dropout", "init")


def model_differences(here: dict[str, Any], there: dict[str, Any]) -> list[str]:
    """The `model` settings (config sections as dicts) in which two models' weights differ in meaning."""
    return [k for k in here if k not in FREE_MODEL_KEYS and not agrees(here[k], there.get(k))]


def average_checkpoints(paths: list[Path]) -> dict[str, Any]:
    """Average the weights of several checkpoints of the same model; the result decodes like any.
    It keeps the first input's config, with the length penalty it had before `translate tune` chose
    one for that input's weights, and no scores."""
    if not paths:
        raise UserError("no checkpoints to average")
    first = load_checkpoint(paths[0])
    total = {k: v.double() for k, v in first["model"].items()}
    newest = {k: first[k] for k in ("step", "epoch") if k in first}
    inputs = [f"{os.path.abspath(paths[0])} (step {first.get('step')})"]
    for path in paths[1:]:
        ckpt = load_checkpoint(path)
        inputs.append(f"{os.path.abspath(path)} (step {ckpt.get('step')})")
        if (ckpt.get("step") or 0) > (newest.get("step") or 0):
            newest = {k: ckpt[k] for k in ("step", "epoch") if k in ckpt}
        if ckpt["spm_model"] != first["spm_model"] or ckpt["model"].keys() != total.keys():
            raise UserError(
                f"{path}: another model or vocabulary than {paths[0]}; only checkpoints of one model and vocabulary average"
            )
        here, there = first["config"]["model"], ckpt["config"]["model"]
        if differ := model_differences(here, there):  # those the weights' shapes do not show (n_heads, norm)
            key = differ[0]
            raise UserError(
                f"{path}: model.{key} {there.get(key)}, {paths[0]} has {here[key]}; only checkpoints of one model average"
            )
        for k, v in ckpt["model"].items():
            if v.shape != total[k].shape:
                raise UserError(
                    f"{path}: weight {k} has shape {tuple(v.shape)}, {paths[0]} has {tuple(total[k].shape)}"
                )
            total[k] += v.double()
    model = {k: (v / len(paths)).to(first["model"][k].dtype) for k, v in total.items()}
    keep = ("format", "versions", "config", "vocab_size", "spm_model", "init_from")  # init_from: where the run began
    averaged = {k: first[k] for k in keep if k in first}
    averaged.update(newest)  # the newest input's step and epoch; no scores: an input's are not the average's
    averaged.update(model=model, averaged_from=inputs, versions=versions())
    if first.get("tune_length_penalty"):  # chosen for the first input's weights, not these: the value before it
        averaged["config"]["decode"]["length_penalty"] = first["tune_length_penalty"]["before"]
    return averaged
