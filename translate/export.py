"""Export a checkpoint to other inference engines: CTranslate2 and Hugging Face transformers.

`export(checkpoint, to, out_dir)` writes a directory that the target library loads with its own
public API, the SentencePiece model included, and a README.md saying how to load it and which
checkpoint and config it came from:

- ctranslate2: `ctranslate2.Translator(DIR)`. A CTranslate2 `TransformerSpec` filled with our
  weights (post-norm or pre-norm, tied or untied embeddings, our sinusoidal table as its
  position encodings) and saved by CTranslate2's own converter, optionally quantized
  (`quantize`: int8, int8_float32, int16, float16, bfloat16 ...). Vocabulary: the SentencePiece
  pieces; the source EOS is added by CTranslate2 (add_source_eos), decoding starts from <s>.
- huggingface: `MarianMTModel.from_pretrained(DIR)` and `MarianTokenizer.from_pretrained(DIR)`,
  so `pipeline("translation", model=DIR)` works. MarianMT is our post-norm architecture (scaled
  embeddings, sinusoidal positions, shared or separate embeddings); it has no pre-norm variant,
  so a pre-norm model is refused. Marian lays its sinusoidal table out as all the sines, then
  all the cosines, where ours interleaves them, and it rebuilds that table on load: the model
  dimensions are permuted to its layout (an exact reparametrization, the outputs are the same).

What the export does not carry: our length penalty is GNMT's ((5 + len) / 6) ** alpha and our
maximum output length a * source + b per sentence; both libraries divide by len ** alpha and
take one maximum length per call, so beam outputs can differ from `translate decode` unless
alpha is 0, and greedy outputs are the same up to the length limit.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
import yaml

from translate.checkpoint import checkpoint_config, load_checkpoint, model_of
from translate.config import Config
from translate.errors import UserError
from translate.model import Transformer
from translate.textio import UMASK, through_link
from translate.tokenizer import BOS, EOS, PAD, UNK, Tokenizer

TARGETS = ("ctranslate2", "huggingface")
CT2_QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")
NEEDS = {"ctranslate2": "ctranslate2", "huggingface": "transformers"}
SPM_FILE = "sentencepiece.model"  # the CTranslate2 directory's SentencePiece model


def check_request(to: str, quantize: str | None) -> None:
    """The target and quantization asked for exist, and the target's library is installed."""
    if to not in TARGETS:
        raise UserError(f"unknown export target --to {to!r}: choose {' or '.join(TARGETS)}")
    if quantize is not None and to != "ctranslate2":
        raise UserError(f"--quantize applies to --to ctranslate2 only ({to} gets the checkpoint's fp32 weights)")
    if quantize is not None and quantize not in CT2_QUANTIZATIONS:
        raise UserError(f"unknown --quantize {quantize!r}: choose one of {', '.join(CT2_QUANTIZATIONS)}")
    if importlib.util.find_spec(NEEDS[to]) is None:
        raise UserError(
            f"export --to {to} needs the {NEEDS[to]} package, which is not installed: "
            "pip install -e '.[export]' in the project's checkout"
        )


def check_output_dir(out_dir: Path, force: bool, checkpoint: str | Path) -> None:
    """The directory can be written (its parent made if need be) and replaced without losing the
    checkpoint or, unless `force`, anything else."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"output {out_dir} exists and is not a directory")
    if Path(checkpoint).resolve().is_relative_to(out_dir.resolve()):
        raise UserError(f"output directory {out_dir} holds the checkpoint {checkpoint}; choose another directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise UserError(f"output directory {out_dir} exists and is not empty; choose another or pass --force")
    if out_dir.is_dir():  # its entries are swapped in place: the directory itself must be writable
        if not os.access(out_dir, os.W_OK | os.X_OK):
            raise UserError(f"output directory {out_dir}: directory not writable: {out_dir}")
        return
    parent = next((p for p in out_dir.absolute().parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise UserError(f"output directory {out_dir}: {parent} is a file, not a directory")
    if parent is not None and not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"output directory {out_dir}: directory not writable: {parent}")


def export(
    checkpoint: str | Path, to: str, out_dir: str | Path, quantize: str | None = None, force: bool = False
) -> Path:
    """Write `checkpoint` as a `to` model directory at `out_dir`. A new directory is built next to
    where it goes and renamed into place when complete; one that exists gets the files, built inside
    it and swapped in (replace_dir). A failure leaves nothing behind (and, with `force`, what the
    directory held as it was)."""
    out_dir = through_link(os.path.abspath(out_dir))  # "." has a name; a link's directory is written
    check_request(to, quantize)
    check_output_dir(out_dir, force, checkpoint)
    ckpt = load_checkpoint(checkpoint)
    cfg = checkpoint_config(ckpt)
    if to == "huggingface" and cfg.model.norm != "post":
        raise UserError(
            f"{checkpoint}: a pre-norm model (model.norm: pre) cannot be exported to huggingface: MarianMT, "
            "its Transformer, is post-norm only; export it --to ctranslate2"
        )
    tokenizer = Tokenizer(ckpt["spm_model"])
    model = model_of(ckpt, checkpoint)
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # e.g. under /proc, or a name too long
        raise UserError(
            f"output directory {out_dir}: cannot create {out_dir.parent}: {os.strerror(e.errno or 0)}"
        ) from None
    home = out_dir if out_dir.is_dir() else out_dir.parent  # where it is built: on the file system it goes to
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=home))
    except OSError as e:  # e.g. under /proc or /sys
        raise UserError(f"output directory {out_dir}: cannot write in {home}: {os.strerror(e.errno or 0)}") from None
    try:
        if to == "ctranslate2":
            write_ctranslate2(model, tokenizer, tmp, quantize)
        else:
            write_huggingface(model, tokenizer, cfg, tmp)
        (tmp / "translate_config.yaml").write_text(yaml.safe_dump(ckpt["config"], sort_keys=False), encoding="utf-8")
        (tmp / "README.md").write_text(readme(to, out_dir, checkpoint, ckpt, cfg, quantize), encoding="utf-8")
        os.chmod(tmp, 0o777 & ~UMASK)
        for path in tmp.rglob("*"):  # the permissions of new files (save_pretrained writes some for its owner only)
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~UMASK)
        replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def replace_dir(new: Path, target: Path) -> None:
    """Put the files of `new` in `target`. A new `target` is `new` renamed. One already there (checked
    empty, or --force) stays the directory it is (a mount point, the working directory, a link's
    directory) and has its entries swapped: its own set aside in a directory beside `new` (both
    inside it, on its file system), then `new`'s moved in; on an error all go back as they were."""
    if not target.exists():
        os.replace(new, target)
        return
    old = Path(tempfile.mkdtemp(prefix=new.name.removesuffix(".tmp"), suffix=".old", dir=new.parent))
    moved_out: list[str] = []
    moved_in: list[str] = []
    try:
        for entry in [e for e in target.iterdir() if e not in (new, old)]:
            os.replace(entry, old / entry.name)
            moved_out.append(entry.name)
        for entry in list(new.iterdir()):
            os.replace(entry, target / entry.name)
            moved_in.append(entry.name)
    except BaseException:
        for name in moved_in:
            os.replace(target / name, new / name)
        for name in moved_out:
            os.replace(old / name, target / name)
        old.rmdir()  # empty now; if not (the putting back cut short), what is left stays there
        raise
    shutil.rmtree(old)
    new.rmdir()


def readme(
    to: str, out_dir: Path, checkpoint: str | Path, ckpt: dict[str, Any], cfg: Config, quantize: str | None
) -> str:
    m, d = cfg.model, cfg.decode
    name = out_dir.name
    pair = f"{cfg.data.src_lang}->{cfg.data.tgt_lang}"  # the run's languages (en->fr by default)
    example = "In the beginning God created the heaven and the earth."
    if cfg.data.src_lang != "en":
        example = f"A sentence in {cfg.data.src_lang}."
    source = (
        f"Exported by `translate export` from the checkpoint `{Path(checkpoint).resolve()}` (step {ckpt.get('step')}, "
        f"run `{cfg.name}`), trained with the config in `translate_config.yaml`: a {m.norm}-norm Transformer, "
        f"d_model {m.d_model}, {m.n_heads} heads, d_ff {m.d_ff}, {m.encoder_layers}+{m.decoder_layers} layers, "
        f"{'tied' if m.tie_embeddings else 'untied'} embeddings, {ckpt['vocab_size']} SentencePiece pieces. "
        f"`translate decode` searches with beam {d.beam_size}, length penalty {d.length_penalty} "
        f"(GNMT's ((5 + len) / 6) ** alpha), at most {d.max_len_a} * source + {d.max_len_b} pieces.\n"
    )
    if to == "ctranslate2":
        weights = quantize or "float32"
        return (
            f"""# {name}: {pair} translation, CTranslate2

{source}
Weights: {weights}. Files: `model.bin`, `config.json`, `shared_vocabulary.json` (CTranslate2),
`{SPM_FILE}` (the SentencePiece model, for both languages).

```python
import ctranslate2
import sentencepiece as spm

sp = spm.SentencePieceProcessor(model_file="{name}/{SPM_FILE}")
translator = ctranslate2.Translator("{name}", device="cpu")  # compute_type="int8" for speed
pieces = sp.encode([{example!r}], out_type=str)
results = translator.translate_batch(pieces, beam_size={d.beam_size}, suppress_sequences=[["<pad>"], ["<s>"]])
print(sp.decode(results[0].hypotheses[0]).rstrip(" "))  # as translate decode: no space at the end
```

The source's end token is added by CTranslate2. Its length penalty divides by len ** alpha
(`length_penalty=`), its maximum length is one per batch (`max_decoding_length=`, default 256).
"""
            + DIFFERS
        )
    return (
        f"""# {name}: {pair} translation, Hugging Face transformers (MarianMT)

{source}
Files: `config.json`, `generation_config.json`, `model.safetensors` (MarianMTModel), `source.spm`
and `target.spm` (the same SentencePiece model), `vocab.json`, `tokenizer_config.json` (MarianTokenizer).

```python
from transformers import MarianMTModel, MarianTokenizer

model = MarianMTModel.from_pretrained("{name}")
tokenizer = MarianTokenizer.from_pretrained("{name}")
batch = tokenizer([{example!r}], return_tensors="pt", padding=True)
print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True)[0])
```

With transformers 4 (version 5 removed the translation pipeline):
`pipeline("translation", model="{name}")({example!r})`.
`generation_config.json` holds beam {d.beam_size} and length penalty {d.length_penalty}, which transformers applies as
len ** alpha; `max_length` is the model's {m.max_positions} positions. The model's dimensions are
stored in Marian's order (sines, then cosines): the outputs are those of the checkpoint.
"""
        + DIFFERS
    )


DIFFERS = """
The model translates each input as one sequence, as it is: unlike `translate decode`, nothing cuts
paragraphs into sentences, masks protected spans (numbers, URLs, placeholders, markup, characters the
vocabulary lacks), reads typographic quotes and dashes the vocabulary lacks as their plain forms
(’ as ') or applies a glossary. Give it one sentence at a time.
"""


# ---------------------------------------------------------------------------- CTranslate2


def ct2_spec(model: Transformer, vocabulary: list[str]):
    """A CTranslate2 TransformerSpec holding `model`'s weights, its pieces named by `vocabulary`."""
    from ctranslate2.specs import common_spec, transformer_spec

    c = model.cfg
    spec = transformer_spec.TransformerSpec.from_config(
        (c.encoder_layers, c.decoder_layers), c.n_heads, pre_norm=c.norm == "pre",
        activation=common_spec.Activation.RELU,
    )  # fmt: skip
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    pe = model.pe[: c.max_positions].float().numpy()

    def linear(spec, name: str, bias: bool = True) -> None:
        spec.weight = state[f"{name}.weight"]
        if bias:
            spec.bias = state[f"{name}.bias"]

    def fused(spec, names: list[str]) -> None:
        spec.weight = torch.cat([torch.from_numpy(state[f"{n}.weight"]) for n in names]).numpy()
        spec.bias = torch.cat([torch.from_numpy(state[f"{n}.bias"]) for n in names]).numpy()

    def norm(spec, name: str) -> None:
        spec.gamma, spec.beta = state[f"{name}.weight"], state[f"{name}.bias"]

    def ffn(spec, layer: str, sub: str) -> None:
        norm(spec.layer_norm, f"{layer}.{sub}.norm")
        linear(spec.linear_0, f"{layer}.ffn.linear1")
        linear(spec.linear_1, f"{layer}.ffn.linear2")

    enc, dec = spec.encoder, spec.decoder
    enc.embeddings[0].weight = state["embed.weight"]
    dec.embeddings.weight = state["embed.weight" if c.tie_embeddings else "tgt_embed.weight"]
    dec.projection.weight = state["embed.weight" if c.tie_embeddings else "output.weight"]
    enc.scale_embeddings = dec.scale_embeddings = True  # by sqrt(d_model), as ours
    enc.position_encodings.encodings = dec.position_encodings.encodings = pe
    for i, ls in enumerate(enc.layer):
        a = f"encoder.{i}.self_attn"
        fused(ls.self_attention.linear[0], [f"{a}.W_q", f"{a}.W_k", f"{a}.W_v"])
        linear(ls.self_attention.linear[1], f"{a}.W_o")
        norm(ls.self_attention.layer_norm, f"encoder.{i}.sub_attn.norm")
        ffn(ls.ffn, f"encoder.{i}", "sub_ffn")
    for i, ls in enumerate(dec.layer):
        a, x = f"decoder.{i}.self_attn", f"decoder.{i}.cross_attn"
        fused(ls.self_attention.linear[0], [f"{a}.W_q", f"{a}.W_k", f"{a}.W_v"])
        linear(ls.self_attention.linear[1], f"{a}.W_o")
        norm(ls.self_attention.layer_norm, f"decoder.{i}.sub_self.norm")
        linear(ls.attention.linear[0], f"{x}.W_q")
        fused(ls.attention.linear[1], [f"{x}.W_k", f"{x}.W_v"])
        linear(ls.attention.linear[2], f"{x}.W_o")
        norm(ls.attention.layer_norm, f"decoder.{i}.sub_cross.norm")
        ffn(ls.ffn, f"decoder.{i}", "sub_ffn")
    if c.norm == "pre":
        norm(enc.layer_norm, "enc_norm")
        norm(dec.layer_norm, "dec_norm")
    spec.register_source_vocabulary(vocabulary)
    spec.register_target_vocabulary(vocabulary)
    names = {i: vocabulary[i] for i in (UNK, BOS, EOS)}
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = names[UNK], names[BOS], names[EOS]
    spec.config.decoder_start_token = names[BOS]  # our decoder reads BOS first
    spec.config.add_source_eos = True  # a source is its pieces + EOS
    spec.config.layer_norm_epsilon = 1e-5  # torch's LayerNorm
    return spec


def write_ctranslate2(model: Transformer, tokenizer: Tokenizer, out: Path, quantize: str | None) -> None:
    """CTranslate2's converter, fed our spec, writes model.bin and its vocabulary to `out`."""
    from ctranslate2.converters import Converter

    vocabulary = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]

    class TranslateConverter(Converter):
        def _load(self):
            return ct2_spec(model, vocabulary)

    TranslateConverter().convert(str(out), quantization=quantize, force=True)
    tokenizer.save(out / SPM_FILE)


# ---------------------------------------------------------------------------- Hugging Face


def marian_order(d_model: int) -> torch.Tensor:
    """The permutation of the model dimensions that takes our sinusoidal table (sin, cos
    interleaved) to Marian's (every sine, then every cosine): Marian's dimension j is our perm[j]."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def marian_state(model: Transformer) -> dict[str, torch.Tensor]:
    """Our weights under MarianMTModel's names, the model dimensions in Marian's order."""
    c = model.cfg
    perm = marian_order(c.d_model)
    ours = {k: v.detach().float() for k, v in model.state_dict().items()}

    def get(name: str) -> torch.Tensor:
        """A weight with its model-dimension axes permuted: inputs of the linear layers reading the
        residual stream, outputs of those writing it, layer norms and embeddings."""
        w = ours[name]
        if name.endswith(("W_o.weight", "linear2.weight")):
            return w[perm].contiguous()
        if name.endswith(("W_o.bias", "linear2.bias")) or ".norm." in name or name.startswith(("enc_norm", "dec_norm")):
            return w[perm].contiguous()
        if w.dim() == 2:  # embeddings, output projection, W_q/W_k/W_v, linear1
            return w[:, perm].contiguous()
        return w  # W_q/W_k/W_v/linear1 biases: in their own space

    if c.tie_embeddings:
        state = {"model.shared.weight": get("embed.weight")}
    else:
        state = {
            "model.encoder.embed_tokens.weight": get("embed.weight"),
            "model.decoder.embed_tokens.weight": get("tgt_embed.weight"),
            "lm_head.weight": get("output.weight"),
        }
    names = {"W_q": "q_proj", "W_k": "k_proj", "W_v": "v_proj", "W_o": "out_proj"}
    attns = {"encoder": {"self_attn": "self_attn"}, "decoder": {"self_attn": "self_attn", "cross_attn": "encoder_attn"}}
    norms = {"sub_attn": "self_attn_layer_norm", "sub_self": "self_attn_layer_norm",
             "sub_cross": "encoder_attn_layer_norm", "sub_ffn": "final_layer_norm"}  # fmt: skip
    for side in ("encoder", "decoder"):
        for i in range(getattr(c, f"{side}_layers")):
            hf, layer = f"model.{side}.layers.{i}", f"{side}.{i}"
            for p in ("weight", "bias"):
                for a, b in attns[side].items():
                    for w, h in names.items():
                        state[f"{hf}.{b}.{h}.{p}"] = get(f"{layer}.{a}.{w}.{p}")
                for ours_norm, hf_norm in norms.items():
                    if f"{layer}.{ours_norm}.norm.{p}" in ours:
                        state[f"{hf}.{hf_norm}.{p}"] = get(f"{layer}.{ours_norm}.norm.{p}")
                for ours_fc, hf_fc in (("linear1", "fc1"), ("linear2", "fc2")):
                    state[f"{hf}.{hf_fc}.{p}"] = get(f"{layer}.ffn.{ours_fc}.{p}")
    return state


def hf_marian(model: Transformer):
    """A MarianMTModel (eval mode) computing what `model` computes: post-norm, scaled embeddings,
    sinusoidal positions (Marian's own table, the dimensions permuted to it), shared or separate
    embeddings. A pre-norm model is a UserError."""
    from transformers import MarianConfig, MarianMTModel

    c = model.cfg
    if c.norm != "post":
        raise UserError("MarianMT is post-norm only: a pre-norm model (model.norm: pre) has no Hugging Face form")
    config = MarianConfig(
        vocab_size=model.vocab_size, decoder_vocab_size=model.vocab_size, d_model=c.d_model,
        encoder_layers=c.encoder_layers, decoder_layers=c.decoder_layers, encoder_attention_heads=c.n_heads,
        decoder_attention_heads=c.n_heads, encoder_ffn_dim=c.d_ff, decoder_ffn_dim=c.d_ff, activation_function="relu",
        max_position_embeddings=c.max_positions, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS,
        decoder_start_token_id=BOS, forced_eos_token_id=None, scale_embedding=True,
        share_encoder_decoder_embeddings=c.tie_embeddings, tie_word_embeddings=c.tie_embeddings,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
    )  # fmt: skip
    hf = MarianMTModel(config).eval()
    state = marian_state(model)
    missing = set(hf.state_dict()) - set(state) - {"final_logits_bias"}
    missing = {k for k in missing if "embed_positions" not in k}  # Marian's own sinusoidal table
    if c.tie_embeddings:
        missing = {k for k in missing if not k.endswith("embed_tokens.weight") and k != "lm_head.weight"}
    if missing:
        raise RuntimeError(f"no weights for MarianMTModel's {sorted(missing)[:5]}")
    hf.load_state_dict(state, strict=False)
    if c.tie_embeddings:
        hf.tie_weights()
    return hf


def write_huggingface(model: Transformer, tokenizer: Tokenizer, cfg: Config, out: Path) -> None:
    """MarianMTModel.save_pretrained and MarianTokenizer.save_pretrained into `out`."""
    import json

    from transformers import GenerationConfig, MarianTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one line of output, ours
    hf = hf_marian(model)
    hf.generation_config = GenerationConfig(
        decoder_start_token_id=BOS, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
        num_beams=cfg.decode.beam_size, length_penalty=cfg.decode.length_penalty, max_length=cfg.model.max_positions,
        suppress_tokens=[PAD, BOS],  # as our search: never produced
        min_new_tokens=1,  # nor EOS first
    )  # fmt: skip
    hf.save_pretrained(out)
    spm_dir = Path(tempfile.mkdtemp(prefix=".spm.", dir=out))
    try:
        for name in ("source.spm", "target.spm"):
            tokenizer.save(spm_dir / name)
        vocab = {tokenizer.id_to_piece(i): i for i in range(tokenizer.vocab_size)}
        (spm_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=1), encoding="utf-8")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Recommended: pip install sacremoses", for a normalizer it never calls
            marian = MarianTokenizer(
                source_spm=str(spm_dir / "source.spm"), target_spm=str(spm_dir / "target.spm"),
                vocab=str(spm_dir / "vocab.json"), source_lang=cfg.data.src_lang, target_lang=cfg.data.tgt_lang,
                model_max_length=cfg.model.max_positions, clean_up_tokenization_spaces=False,
            )  # fmt: skip
        marian.save_pretrained(out)
    finally:
        shutil.rmtree(spm_dir, ignore_errors=True)
