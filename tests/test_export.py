"""translate export: CTranslate2 and Hugging Face directories that decode as `translate decode` does.

Two small models (post-norm with tied embeddings; pre-norm with untied embeddings) learn the
fixtures' 40 test pairs by heart through the CLI, so that what they output depends on the source
and their next-piece distributions are peaked: a barely trained model says nearly the same thing
for every sentence, with many hypotheses of nearly equal score, and then which of them a search
keeps hangs on float rounding, which differs between libraries. They are exported through the
CLI and loaded with each library's own API. Every system decodes the test sentences with alpha
0 and one fixed maximum length (--max-len-a 0): the two libraries divide by len ** alpha where
ours uses GNMT's penalty and take one maximum length per call where ours takes a * source + b,
so those two settings are the ones that all three express alike.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import FIXTURES, run_cli, tiny_config

from translate.textio import UMASK

pytestmark = pytest.mark.slow  # trains two models and loads two libraries: `make test-all` and CI run it

HAS_CT2 = importlib.util.find_spec("ctranslate2") is not None
HAS_HF = importlib.util.find_spec("transformers") is not None
needs_ct2 = pytest.mark.skipif(not HAS_CT2, reason="ctranslate2 is not installed (pip install '.[export]')")
needs_hf = pytest.mark.skipif(not HAS_HF, reason="transformers is not installed (pip install '.[export]')")

SOURCES = FIXTURES / "bible.test.en"
MAX_LEN = 24  # pieces, for every system
LINES = SOURCES.read_text(encoding="utf-8").splitlines()
TRANSFORMERS4 = Path(sys.prefix) / "transformers4"  # `make transformers4`: for the pipeline test under transformers 5


MODEL = {"d_model": 64, "n_heads": 4, "d_ff": 128, "encoder_layers": 2, "decoder_layers": 2, "dropout": 0.0}
TRAIN = {"max_tokens": 4000, "max_steps": 300, "lr": 3e-3, "warmup_steps": 30, "label_smoothing": 0.0}
NORMS = {"post": {}, "pre": {"norm": "pre", "tie_embeddings": False}}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """post: post-norm, tied embeddings; pre: pre-norm, untied. Each learns the 40 test pairs
    (300 updates of one batch, about 30 s on 2 cores)."""
    out = {}
    for name, norm in NORMS.items():
        tmp = tmp_path_factory.mktemp(name)
        data = {"train": str(FIXTURES / "bible.test")}
        train = {**TRAIN, "eval_every": TRAIN["max_steps"], "save_every": TRAIN["max_steps"]}
        run_cli("train", "--config", tiny_config(tmp, name=name, model={**MODEL, **norm}, data=data, **train))
        out[name] = tmp / "runs" / name / "checkpoints" / "best.pt"
    return out


def decode(checkpoint: Path, beam: int) -> list[str]:
    """`translate decode` of the test lines (each whole, as the exports take them), alpha 0, at most MAX_LEN pieces."""
    out = run_cli(
        "decode",
        checkpoint,
        "-i",
        SOURCES,
        "--no-split",
        "--beam",
        beam,
        "--lenpen",
        0,
        "--max-len-a",
        0,
        "--max-len-b",
        MAX_LEN,
    ).stdout
    return out.splitlines()


def same_share(a: list[str], b: list[str]) -> float:
    assert len(a) == len(b) == len(LINES)
    return sum(x == y for x, y in zip(a, b)) / len(a)


@pytest.fixture(scope="module")
def ours(checkpoints) -> dict[tuple[str, int], list[str]]:
    return {(name, beam): decode(ckpt, beam) for name, ckpt in checkpoints.items() for beam in (1, 5)}


@pytest.fixture(scope="module")
def exported(checkpoints, tmp_path_factory) -> dict[tuple[str, str], Path]:
    tmp = tmp_path_factory.mktemp("exported")
    dirs = {}
    for name, ckpt in checkpoints.items():
        for to in ("ctranslate2", "huggingface"):
            if (to == "ctranslate2" and HAS_CT2) or (to == "huggingface" and HAS_HF and name == "post"):
                dirs[name, to] = tmp / f"{name}-{to}"
                run_cli("export", ckpt, dirs[name, to], "--to", to)
    return dirs


def ct2_translate(directory: Path, beam: int, **options) -> list[str]:
    import ctranslate2
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(directory / "sentencepiece.model"))
    translator = ctranslate2.Translator(str(directory), device="cpu", **options)
    results = translator.translate_batch(
        sp.encode(LINES, out_type=str), beam_size=beam, length_penalty=0, max_decoding_length=MAX_LEN,
        suppress_sequences=[["<pad>"], ["<s>"]],  # min_decoding_length 1 by default: EOS not first, as ours
    )  # fmt: skip
    return [sp.decode(r.hypotheses[0]).rstrip(" ") for r in results]  # as the README of the export says


def test_the_models_translate(ours):
    """What the exports are compared on: a distinct output per sentence (not one string for all)."""
    for (name, beam), lines in ours.items():
        assert len(set(lines)) >= 0.9 * len(LINES) and all(lines), (name, beam, lines[:3])


@needs_ct2
@pytest.mark.parametrize("name", ["post", "pre"])
@pytest.mark.parametrize("beam", [1, 5])
def test_ctranslate2_decodes_as_translate_decode(exported, ours, name, beam):
    """Greedy and beam 5: the same outputs. CTranslate2's beam search keeps, as ours does, the
    first k non-EOS of the 2k best extensions and finishes the EOS ones among the first k; at
    alpha 0 it stops once the best extension ends, which gives the same 1-best as our bound."""
    share = same_share(ct2_translate(exported[name, "ctranslate2"], beam), ours[name, beam])
    assert share >= 0.99


def hf_generate(directory: Path, beam: int) -> list[str]:
    from transformers import MarianMTModel, MarianTokenizer

    model = MarianMTModel.from_pretrained(directory).eval()
    tokenizer = MarianTokenizer.from_pretrained(directory)
    batch = tokenizer(LINES, return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = model.generate(
            **batch, num_beams=beam, length_penalty=0.0, max_new_tokens=MAX_LEN, early_stopping="never"
        )
    return tokenizer.batch_decode(out, skip_special_tokens=True)


@needs_hf
@pytest.mark.parametrize("beam", [1, 5])
def test_huggingface_decodes_as_translate_decode(exported, ours, beam):
    """The same outputs up to a trailing space: MarianTokenizer strips the text it decodes, and an
    output cut at MAX_LEN may end with a lone word-boundary piece."""
    ours_stripped = [line.rstrip() for line in ours["post", beam]]
    assert same_share(hf_generate(exported["post", "huggingface"], beam), ours_stripped) >= 0.99


@needs_hf
def test_huggingface_pipeline(exported, ours):
    """`pipeline("translation", model=DIR)` with the directory's own generation config, set to
    greedy here, in a subprocess. Transformers 5 removed the translation pipeline: with version 5
    installed, the subprocess imports version 4 from `make transformers4` (CI has it)."""
    import transformers

    env = dict(os.environ)
    if int(transformers.__version__.split(".")[0]) >= 5:
        if not (TRANSFORMERS4 / ".installed").exists():
            why = (
                f"transformers {transformers.__version__} has no translation pipeline; `make transformers4` installs 4"
            )
            if os.environ.get("TRANSLATE_REQUIRE_TRANSFORMERS4"):
                pytest.fail(why)
            pytest.skip(why)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TRANSFORMERS4), env.get("PYTHONPATH")]))
    script = (
        "import json, sys, transformers\n"
        "translate = transformers.pipeline('translation', model=sys.argv[1])\n"
        "lines = open(sys.argv[2], encoding='utf-8').read().splitlines()\n"
        f"out = translate(lines, num_beams=1, max_new_tokens={MAX_LEN})\n"
        "print(json.dumps([transformers.__version__, [o['translation_text'] for o in out]]))\n"
    )
    command = [sys.executable, "-c", script, str(exported["post", "huggingface"]), str(SOURCES)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    version, texts = json.loads(result.stdout.splitlines()[-1])
    assert version.startswith("4.")
    assert same_share(texts, [line.rstrip() for line in ours["post", 1]]) >= 0.99  # as MarianTokenizer strips


@needs_hf
def test_huggingface_model_computes_our_logits(exported, checkpoints):
    """The saved MarianMTModel, reloaded, gives the checkpoint's logits (Marian rebuilds its
    sinusoidal table on load: the permuted dimensions must match it)."""
    from transformers import MarianMTModel

    from translate.checkpoint import load_model

    model, _, _ = load_model(checkpoints["post"])
    hf = MarianMTModel.from_pretrained(exported["post", "huggingface"]).eval()
    src = torch.tensor([[10, 20, 30, 3], [11, 12, 3, 0]])
    tgt = torch.tensor([[2, 40, 50, 60], [2, 60, 70, 80]])
    with torch.no_grad():
        theirs = hf(input_ids=src, attention_mask=src != 0, decoder_input_ids=tgt).logits
        torch.testing.assert_close(theirs, model(src, tgt), atol=1e-4, rtol=1e-4)


@needs_ct2
@pytest.mark.parametrize("name", ["post", "pre"])
def test_ctranslate2_scores_as_our_model(exported, checkpoints, name):
    """CTranslate2's log-probs of a given target are the checkpoint's (teacher forcing)."""
    import ctranslate2

    from translate.checkpoint import load_model

    model, tokenizer, _ = load_model(checkpoints[name])
    translator = ctranslate2.Translator(str(exported[name, "ctranslate2"]))
    src = tokenizer.encode(LINES[:4])
    tgt = tokenizer.encode((FIXTURES / "bible.test.fr").read_text(encoding="utf-8").splitlines()[:4])
    pieces = (
        [[tokenizer.id_to_piece(i) for i in ids] for ids in src],
        [[tokenizer.id_to_piece(i) for i in ids] for ids in tgt],
    )
    results = translator.score_batch(*pieces)
    for s, t, r in zip(src, tgt, results):
        with torch.no_grad():
            logp = model(torch.tensor([s + [3]]), torch.tensor([[2] + t])).log_softmax(-1)[0]
        ours = logp.gather(1, torch.tensor(t + [3])[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(r.log_probs), ours, atol=1e-3, rtol=1e-3)


@needs_ct2
def test_ctranslate2_int8(checkpoints, ours, tmp_path):
    out = tmp_path / "int8"
    run_cli("export", checkpoints["post"], out, "--to", "ctranslate2", "--quantize", "int8")
    readme = (out / "README.md").read_text()
    assert "Weights: int8" in readme and str(checkpoints["post"].resolve()) in readme
    translations = ct2_translate(out, 1, compute_type="int8")
    assert len(translations) == len(LINES) and all(isinstance(t, str) for t in translations)
    assert same_share(translations, ours["post", 1]) > 0.5  # int8 weights: close to fp32, not the same


def test_export_dirs_hold_readme_and_vocabulary(exported, checkpoints):
    for (name, to), directory in exported.items():
        readme = (directory / "README.md").read_text()
        step = torch.load(checkpoints[name], weights_only=True)["step"]
        assert str(checkpoints[name].resolve()) in readme and f"(step {step}," in readme
        assert (directory / "translate_config.yaml").is_file()
        spm_files = ["sentencepiece.model"] if to == "ctranslate2" else ["source.spm", "target.spm", "vocab.json"]
        assert all((directory / f).is_file() for f in spm_files)
        assert not [p for p in directory.parent.iterdir() if p.name.startswith(".")]  # no temp dir left
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in directory.rglob("*") if p.is_file()}
        assert set(modes.values()) == {0o666 & ~UMASK}, modes  # readable by whoever serves them, as new files are


def test_readme_names_the_runs_languages(checkpoints, tmp_path):
    from dataclasses import replace

    from translate.config import config_from_dict
    from translate.export import readme

    ckpt = torch.load(checkpoints["post"], weights_only=True)
    cfg = config_from_dict(ckpt["config"])
    for to in ("ctranslate2", "huggingface"):
        assert readme(to, tmp_path / "m", checkpoints["post"], ckpt, cfg, None).startswith("# m: en->fr translation, ")
        other = replace(cfg, data=replace(cfg.data, src_lang="de", tgt_lang="en"))
        text = readme(to, tmp_path / "m", checkpoints["post"], ckpt, other, None)
        assert text.startswith("# m: de->en translation, ") and "In the beginning" not in text and "French" not in text


def error_line(*args) -> str:
    result = run_cli("export", *args, check=False)
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_refusals_through_the_cli(checkpoints, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    expected = "not a checkpoint" if HAS_CT2 else "needs the ctranslate2 package"  # without '.[export]'
    assert expected in error_line(text, tmp_path / "out", "--to", "ctranslate2")
    assert "unknown export target --to 'onnx'" in error_line(checkpoints["post"], tmp_path / "out", "--to", "onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_refusals(checkpoints, tmp_path):
    from translate.errors import UserError
    from translate.export import export

    post, out = checkpoints["post"], tmp_path / "out"
    with pytest.raises(UserError, match="--quantize applies to --to ctranslate2 only"):
        export(post, "huggingface", out, quantize="int8")
    with pytest.raises(UserError, match="unknown --quantize 'int4'"):
        export(post, "ctranslate2", out, quantize="int4")
    if HAS_HF:
        with pytest.raises(UserError, match="pre-norm model .* cannot be exported to huggingface"):
            export(checkpoints["pre"], "huggingface", out)
    assert list(tmp_path.iterdir()) == []  # nothing half-written
    if HAS_CT2 or HAS_HF:
        from translate.checkpoint import load_checkpoint

        ckpt = load_checkpoint(post)
        bias = next(name for name in ckpt["model"] if name.endswith(".bias"))
        ckpt["model"][bias] = ckpt["model"][bias][:-1]  # weights that do not fit the config
        torch.save(ckpt, bad := tmp_path / "bad.pt")
        with pytest.raises(UserError, match=r"bad\.pt: weights do not fit the model its config describes"):
            export(bad, "ctranslate2" if HAS_CT2 else "huggingface", out)
        assert not out.exists()


@needs_ct2
def test_a_directory_in_the_way_is_refused(checkpoints, tmp_path):
    from translate.errors import UserError
    from translate.export import export

    post = checkpoints["post"]
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    with pytest.raises(UserError, match="exists and is not empty; choose another or pass --force"):
        export(post, "ctranslate2", full)
    assert [p.name for p in full.iterdir()] == ["keep.txt"]
    with pytest.raises(UserError, match="is not a directory"):
        export(post, "ctranslate2", full / "keep.txt")
    with pytest.raises(UserError, match="cannot create /proc/no_such_dir: No such file or directory"):
        export(post, "ctranslate2", "/proc/no_such_dir/out")  # a parent no one can make: one line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]  # nothing half-written


@needs_ct2
def test_a_directory_holding_the_checkpoint_is_refused_even_with_force(checkpoints, tmp_path):
    """`export runs/NAME/checkpoints/best.pt runs/NAME --force` would replace the run it reads."""
    from translate.errors import UserError
    from translate.export import export

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    ckpt = run / "checkpoints" / "best.pt"
    shutil.copy(checkpoints["post"], ckpt)
    for out in (run, run / "checkpoints"):
        with pytest.raises(UserError, match="holds the checkpoint"):
            export(ckpt, "ctranslate2", out, force=True)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "run",
        "run/checkpoints",
        "run/checkpoints/best.pt",
    ]


@needs_ct2
def test_force_replaces_and_empty_dir_is_used(checkpoints, tmp_path):
    full, empty = tmp_path / "full", tmp_path / "empty"
    full.mkdir()
    empty.mkdir()
    (full / "old.txt").write_text("old")
    run_cli("export", checkpoints["post"], full, "--to", "ctranslate2", "--force")
    run_cli("export", checkpoints["post"], empty, "--to", "ctranslate2")
    for d in (full, empty):
        assert (d / "model.bin").is_file() and not (d / "old.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "full"]
    # the working directory (empty, then with --force), and a link's directory: written into, kept
    here, link = tmp_path / "here", tmp_path / "link"
    here.mkdir()
    link.symlink_to(full)
    run_cli("export", checkpoints["post"], ".", "--to", "ctranslate2", cwd=here)
    (here / "mine.txt").write_text("mine")
    run_cli("export", checkpoints["post"], ".", "--to", "ctranslate2", "--force", cwd=here)
    run_cli("export", checkpoints["post"], link, "--to", "ctranslate2", "--force")
    assert link.is_symlink() and sorted(p.name for p in here.iterdir()) == sorted(p.name for p in full.iterdir())
    assert (here / "model.bin").is_file() and not (here / "mine.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "full", "here", "link"]


@needs_ct2
def test_a_failed_swap_puts_the_directory_back(checkpoints, tmp_path, monkeypatch):
    from translate import export as export_module

    out = tmp_path / "out"
    out.mkdir()
    (out / "a.txt").write_text("a")
    (out / "b.txt").write_text("b")
    replace, calls = os.replace, []

    def fails_on_the_second_move_in(src, dst):
        calls.append(dst)
        if Path(dst).parent == out and len([c for c in calls if Path(c).parent == out]) == 2:
            raise OSError(28, "No space left on device")
        return replace(src, dst)

    monkeypatch.setattr(export_module.os, "replace", fails_on_the_second_move_in)
    with pytest.raises(OSError, match="No space left"):
        export_module.export(checkpoints["post"], "ctranslate2", out, force=True)
    assert sorted(p.name for p in out.iterdir()) == ["a.txt", "b.txt"]  # as it was, nothing of ours left


def test_missing_library_is_one_line(monkeypatch, checkpoints, tmp_path):
    from translate import export
    from translate.errors import UserError

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in export.NEEDS.values() else real(name, *a)
    )
    for to, package in export.NEEDS.items():
        with pytest.raises(
            UserError, match=rf"needs the {package} package.*pip install -e '\.\[export\]' in the project's checkout"
        ):
            export.export(checkpoints["post"], to, tmp_path / "out")
    assert not (tmp_path / "out").exists()
