import logging
import os
import subprocess
import sys
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
    capsys.readouterr()
    try:
        with pytest.raises(SystemExit) as stop:
            main()
    finally:
        for handler in logger.handlers[len(handlers) :]:  # the log files of prepare/train
            handler.close()
        logger.handlers[:] = handlers
        logger.setLevel(level)
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
