"""The seeds' debugging advice: a small model must learn 32 pairs by heart."""

import pytest
from conftest import FIXTURES

from translate.checkpoint import load_model
from translate.config import config_from_dict
from translate.decoding import translate_lines
from translate.options import SearchOptions
from translate.train import train


@pytest.mark.slow  # 400 updates: `make test-all` and CI run it
def test_overfits_32_pairs(tmp_path):
    lines = {lang: (FIXTURES / f"bible.train.{lang}").read_text().splitlines()[:32] for lang in ("en", "fr")}
    for lang, text in lines.items():
        (tmp_path / f"pairs.{lang}").write_text("\n".join(text) + "\n")
    prefix = str(tmp_path / "pairs")
    cfg = config_from_dict(
        {
            "name": "overfit",
            "run_dir": str(tmp_path / "runs"),
            # no placeholders: a pair trained only in its masked form cannot be recited unmasked
            "data": {"source": "files", "train": prefix, "valid": prefix, "test": prefix, "protect_share": 0},
            "vocab": {"size": 200},
            "model": {
                "d_model": 64,
                "n_heads": 4,
                "d_ff": 128,
                "encoder_layers": 2,
                "decoder_layers": 2,
                "dropout": 0.0,
            },
            "train": {
                "max_tokens": 4000,
                "amp": "off",  # fp32 on every CPU class: the same trajectory where bf16 is native and where not
                "max_steps": 400,
                "lr": 3e-3,
                "warmup_steps": 30,
                "label_smoothing": 0.0,
                "log_every": 50,
                "eval_every": 400,
                "save_every": 400,
            },
            "decode": {"protect": []},
        }  # fmt: skip
    )
    metrics = train(cfg)
    assert metrics["bleu"] == 100.0
    model, tokenizer, _ = load_model(tmp_path / "runs" / "overfit" / "checkpoints" / "last.pt")
    out = [
        nbest[0][0]
        for nbest in translate_lines(model, tokenizer, lines["en"], SearchOptions(beam_size=4, length_penalty=0.6))
    ]
    assert out == lines["fr"]
