import dataclasses
import logging
import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

FIXTURES = Path(__file__).parent / "fixtures"


def run_cli(*args: str, cwd: Path | None = None, input: str | None = None, check: bool = True, env=None):
    """Run the real `translate` command line in a subprocess."""
    result = subprocess.run(
        [sys.executable, "-m", "translate", *map(str, args)],
        cwd=cwd,
        input=input,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        timeout=600,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"translate {' '.join(map(str, args))} failed ({result.returncode}):\n{result.stderr[-3000:]}"
        )
    return result


def run_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, *args: object) -> tuple[int, str, str]:
    """Run `translate ARGS...` in this process, as the console script does: (exit code, stdout, stderr).
    It saves the torch import of a subprocess; the log handlers a command adds are removed after it."""
    from translate.cli import main

    logger = logging.getLogger("translate")
    handlers, level = list(logger.handlers), logger.level
    monkeypatch.setattr(sys, "argv", ["translate", *map(str, args)])
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)  # main sets its own: undone after
    sigterm = signal.getsignal(signal.SIGTERM)
    capsys.readouterr()
    try:
        with pytest.raises(SystemExit) as stop:
            main()
    finally:
        for handler in logger.handlers[len(handlers) :]:  # the log files of prepare/train
            handler.close()
        logger.handlers[:] = handlers
        logger.setLevel(level)
        signal.signal(signal.SIGTERM, sigterm)
    out, err = capsys.readouterr()
    return stop.value.code, out, err


def tiny_config(
    tmp_path: Path, name: str = "e2e", model: dict | None = None, data: dict | None = None, **train
) -> Path:
    """A files config on the committed Bible fixture, small enough to train in seconds."""
    cfg = {
        "name": name,
        "run_dir": str(tmp_path / "runs"),
        "data": {
            "source": "files",
            "train": str(FIXTURES / "bible.train"),
            "valid": str(FIXTURES / "bible.valid"),
            "test": str(FIXTURES / "bible.test"),
            **(data or {}),
        },
        "vocab": {"size": 300},
        "model": {"d_model": 32, "n_heads": 2, "d_ff": 64, "encoder_layers": 1, "decoder_layers": 1, **(model or {})},
        "train": {
            "max_tokens": 1024,
            "max_steps": 8,
            "warmup_steps": 4,
            "lr": 2e-3,
            "log_every": 2,
            "eval_every": 4,
            "save_every": 4,
            "keep_last": 3,
            "eval_max_sentences": 8,
            "amp": "off",  # the same arithmetic on either CPU class (auto takes bf16 where it is native)
            **train,
        },
        "decode": {"beam_size": 3, "max_len_b": 5},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    """One tiny run trained once through the CLI, shared by the tests that only read it."""
    tmp = tmp_path_factory.mktemp("trained")
    config = tiny_config(tmp)
    run_cli("train", "--config", config)
    return tmp / "runs" / "e2e", config


@pytest.fixture(scope="session")
def checkpoint(trained_run):
    """The shared tiny run's best checkpoint."""
    run, _ = trained_run
    return run / "checkpoints" / "best.pt"


# ---------------------------------------------------------------------------- the tiny model

WORDS = (
    "the a cat dog house river green small big runs sees eats under over near old young bird tree stone "
    "water light night day mountain village quickly slowly beautiful garden window yellow purple"
).split()

LINES = [
    "the cat sees a bird",
    "a small green house near the river under the old tree quickly",
    "dog",
    "the young bird eats slowly in the beautiful garden near the yellow window at night",
    "water",
    "the old stone",
]


def tiny_model(vocab_size: int = 50, seed: int = 0, **model):
    """The tests' one model builder: a small random Transformer in eval mode (2 + 2 layers of width
    32, 2 heads, no dropout; `model` overrides ModelConfig keys). xavier and untied by default:
    their larger random weights give peaked, line-dependent outputs (N(0, 0.02) and tied
    embeddings give nearly flat ones that repeat one word)."""
    import torch

    from translate.config import ModelConfig
    from translate.model import Transformer

    torch.manual_seed(seed)
    settings = dict(d_model=32, n_heads=2, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0)
    cfg = ModelConfig(**{**settings, "tie_embeddings": False, "init": "xavier", **model})
    return Transformer(cfg, vocab_size).eval()


@pytest.fixture(scope="session")
def tokenizer():
    """A SentencePiece vocabulary of 48 pieces over sentences of WORDS."""
    from translate.tokenizer import Tokenizer

    rng = random.Random(0)
    sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(300)]
    return Tokenizer.train(sentences, vocab_size=48)


@pytest.fixture(scope="session")
def model(tokenizer):
    """tiny_model over `tokenizer`, 32 positions (so that long lines are cut)."""
    return tiny_model(tokenizer.vocab_size, max_positions=32)


def save_checkpoint(model, tokenizer, path: Path, **decode) -> Path:
    """A checkpoint file of an in-memory model, its config's decode section set from `decode`."""
    import torch

    from translate.checkpoint import CHECKPOINT_FORMAT
    from translate.config import Config, DecodeConfig, config_to_dict

    cfg = dataclasses.replace(Config(), model=model.cfg, decode=DecodeConfig(**decode))
    ckpt = {
        "format": CHECKPOINT_FORMAT,
        "config": config_to_dict(cfg),
        "vocab_size": tokenizer.vocab_size,
        "spm_model": tokenizer.model_bytes,
        "model": model.state_dict(),
    }
    torch.save(ckpt, path)
    return path


@pytest.fixture(scope="session")
def tiny_checkpoint(model, tokenizer, tmp_path_factory) -> Path:
    """The tiny model saved as a checkpoint: beam 2, outputs of at most source + 3 pieces."""
    path = tmp_path_factory.mktemp("tiny") / "best.pt"
    return save_checkpoint(model, tokenizer, path, beam_size=2, max_len_a=1.0, max_len_b=3, batch_tokens=200)


def assert_same(got: list, expected: list, tol: float = 1e-5) -> None:
    """Same n-best texts, same scores up to float noise (batch shapes differ)."""
    assert [[text for text, _ in hyps] for hyps in got] == [[text for text, _ in hyps] for hyps in expected]
    for a, b in zip(got, expected, strict=True):
        assert [s for _, s in a] == pytest.approx([s for _, s in b], abs=tol)
