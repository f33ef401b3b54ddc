from pathlib import Path

import pytest
import yaml

from translate.config import Config, config_from_dict, config_to_dict, load_config, parse_duration, save_config
from translate.errors import UserError

CONFIGS = sorted(Path(__file__).parent.parent.glob("configs/*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_load(path):
    cfg = load_config(path)
    assert cfg.name == path.stem


def test_defaults_match_design():
    cfg = Config()
    assert (cfg.model.d_model, cfg.model.n_heads, cfg.model.d_ff) == (256, 4, 1024)
    assert cfg.model.norm == "post" and cfg.train.schedule == "inverse_sqrt" and cfg.data.source == "bible"


def test_unknown_key_suggests_closest():
    with pytest.raises(UserError, match=r"unknown config key 'train.warmup_step'.*'train.warmup_steps'"):
        config_from_dict({"train": {"warmup_step": 10}})
    with pytest.raises(UserError, match=r"'modle'.*'model'"):
        config_from_dict({"modle": {}})


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"train": {"max_steps": "many"}}, r"train.max_steps' expects int"),
        ({"train": {"lr": "fast"}}, r"train.lr' expects float"),
        ({"model": {"norm": "middle"}}, r"model.norm' expects 'post' \| 'pre'"),
        ({"model": {"tie_embeddings": "yes"}}, r"expects bool"),
        ({"train": {"lr": -1.0}}, r"train.lr must be positive"),
        ({"model": {"d_model": 100, "n_heads": 3}}, r"divisible"),
        ({"decode": {"beam_size": 0}}, r"beam_size"),
        ({"data": "bible"}, r"'data' must be a mapping"),
        ({"data": {"source": "files"}}, r"data.train is not set"),
        ({"train": {"pad_to_multiple": "eight"}}, r"train.pad_to_multiple' expects int or 'auto', got 'eight'"),
        ({"train": {"pad_to_multiple": 0}}, r"train.pad_to_multiple must be auto or at least 1"),
        ({"train": {"eval_max_sentences": "all"}}, r"train.eval_max_sentences' expects int or null"),
        ({"train": {"cooldown": 1.5}}, r"train.cooldown must be a share of the run in \[0, 1\], got 1.5"),
        ({"train": {"max_tokens": {"fp32": 1536, "bf16": 2304}}}, r"needs a value for each of fp32, bf16, fp16"),
        ({"train": {"max_tokens": {"fp32": 1536, "bf16": 2304, "fp8": 1}}}, r"train.max_tokens' expects int or a map"),
        ({"train": {"max_tokens": {"fp32": 64, "bf16": 2304, "fp16": 2304}}}, r"train.max_tokens .* data.max_len"),
        ({"train": {"max_tokens": "many"}}, r"train.max_tokens' expects int or a mapping of 'fp32'"),
        ({"train": {"max_tokens": {}}}, r"train.max_tokens' expects int or a mapping"),
        ({"train": {"lr": {"fp32": 1.5e-3, "bf16": 1e-3}}}, r"train.lr by precision needs a value for each of fp32"),
        ({"train": {"lr": {"fp32": -1.0, "bf16": 1e-3, "fp16": 1e-3}}}, r"train.lr must be positive"),
        ({"train": {"lr": {"fp32": "fast", "bf16": 1e-3, "fp16": 1e-3}}}, r"train.lr' expects float or a mapping"),
        ({"model": {"d_ff": {"fp32": 512, "bf16": 1024}}}, r"model.d_ff by precision needs a value for each of fp32"),
        ({"model": {"d_ff": {"fp32": 0, "bf16": 1024, "fp16": 1024}}}, r"model.d_ff must be positive"),
        ({"model": {"d_ff": {"fp32": 1.5, "bf16": 1024, "fp16": 1024}}}, r"model.d_ff' expects int or a mapping"),
    ],
)
def test_bad_values_name_the_key(raw, message):
    with pytest.raises(UserError, match=message):
        config_from_dict(raw)


def test_overrides_and_yaml_quirks():
    cfg = config_from_dict(
        {"train": {"lr": "7e-4"}}, ["model.d_model=128", "train.max_epochs=3", "name=x", "data.test=null"]
    )
    assert cfg.train.lr == pytest.approx(7e-4)  # YAML 1.1 reads 7e-4 as a string
    assert cfg.model.d_model == 128 and cfg.train.max_epochs == 3 and cfg.name == "x"
    assert config_from_dict({"train": {"amp": False}}, ["train.amp=off"]).train.amp == "off"  # YAML 1.1: off is False
    assert config_from_dict({}, ["train.pad_to_multiple=16"]).train.pad_to_multiple == 16
    assert config_from_dict({}, ["train.pad_to_multiple=auto"]).train.pad_to_multiple == "auto"
    by_precision = {"train": {"max_tokens": {"fp32": 1536, "bf16": 2304, "fp16": 2304}}}
    assert config_from_dict(by_precision, ["train.max_tokens.fp32=1024"]).train.max_tokens["fp32"] == 1024
    assert config_from_dict(by_precision, ["train.max_tokens=4096"]).train.max_tokens == 4096  # one for all
    lrs = config_from_dict({"train": {"lr": {"fp32": "1.5e-3", "bf16": 1e-3, "fp16": 1e-3}}}, ["train.lr.bf16=7e-4"])
    assert lrs.train.lr == pytest.approx({"fp32": 1.5e-3, "bf16": 7e-4, "fp16": 1e-3})
    widths = config_from_dict({"model": {"d_ff": {"fp32": 512, "bf16": 1024, "fp16": 1024}}}, ["model.d_ff.fp16=768"])
    assert widths.model.d_ff == {"fp32": 512, "bf16": 1024, "fp16": 768}
    with pytest.raises(UserError, match="section.key=value"):
        config_from_dict({}, ["model.d_model"])
    with pytest.raises(UserError, match="unknown config key 'model.dmodel'"):
        config_from_dict({}, ["model.dmodel=3"])


def test_round_trip_through_run_dir(tmp_path):
    cfg = config_from_dict(
        {"model": {"d_model": 64, "n_heads": 2}},
        ["train.max_steps=7", "train.max_tokens={fp32: 512, bf16: 1024, fp16: 1024}"],
    )
    save_config(cfg, tmp_path / "config.yaml")
    again = load_config(tmp_path / "config.yaml")
    assert again == cfg
    assert yaml.safe_load((tmp_path / "config.yaml").read_text()) == config_to_dict(cfg)  # every default written


def test_file_errors(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  d_model: 3\n   n_heads: [\n")
    with pytest.raises(UserError, match=r"bad.yaml: line \d+"):
        load_config(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- a\n- b\n")
    with pytest.raises(UserError, match="mapping"):
        load_config(listy)


@pytest.mark.parametrize(
    "text, seconds",
    [(90, 90), ("90", 90), ("1e3", 1000), ("90s", 90), ("50m", 3000), ("2min", 120), ("1.5h", 5400), ("1h30m", 5400),
     (" 1h 30m ", 5400), ("1m30s", 90), (".5h", 1800)],
)  # fmt: skip
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "h", "1h30", "30mm", "-5", "0", "inf", "nan", "1h-30m"])
def test_bad_durations_name_the_key(text):
    with pytest.raises(UserError, match="'train.max_time' expects a positive duration"):
        parse_duration(text)


def test_an_empty_config_file_is_refused_and_configs_are_saved_whole(tmp_path):
    """An empty file (a run's config.yaml cut short) must not start the default run elsewhere."""
    empty = tmp_path / "config.yaml"
    empty.write_text("")
    with pytest.raises(UserError, match="the config is empty"):
        load_config(empty)
    (tmp_path / "defaults.yaml").write_text("{}\n")
    assert load_config(tmp_path / "defaults.yaml") == Config()
    save_config(Config(), empty, header="a header")
    assert load_config(empty) == Config() and [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []
