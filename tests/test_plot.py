"""Pictures: attention maps and heatmaps, TensorBoard images, `translate attention` and `translate plot`."""

import io
import struct

import matplotlib.image
import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from typer.testing import CliRunner

from translate.checkpoint import load_model
from translate.cli import app
from translate.errors import UserError
from translate.plot import (
    MAX_HEATMAPS_INCHES,
    attention_figure,
    attention_maps,
    cross_attention,
    figure_to_array,
    heads_figure,
    read_scalars,
    sample_indices,
)
from translate.tokenizer import Tokenizer

SENTENCE = "God saw the light, and it was good."


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def model(trained_run):
    return load_model(trained_run[0] / "checkpoints" / "best.pt")


@pytest.mark.parametrize("kind", ["cross", "encoder", "decoder"])
def test_attention_maps_are_distributions_over_their_labels(model, kind):
    model, tokenizer, _ = model
    target = tokenizer.encode(["Dieu vit la lumière."])[0]
    weights, cols, rows = attention_maps(model, tokenizer, SENTENCE, target, kind, layer=-1)
    H = model.cfg.n_heads
    assert weights.shape == (H, len(rows), len(cols))
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    n_src = len(tokenizer.encode([SENTENCE])[0]) + 1
    if kind == "cross":
        assert len(cols) == n_src and rows == [tokenizer.id_to_piece(i) for i in target] + ["</s>"]
    elif kind == "encoder":
        assert rows == cols and len(cols) == n_src and cols[-1] == "</s>"
    else:
        assert rows == cols and cols[0] == "<s>" and len(cols) == len(target) + 1
        assert np.allclose(np.triu(weights, k=1), 0.0)  # a position never attends to later ones
    mean, _, _ = cross_attention(model, tokenizer, SENTENCE, target)
    np.testing.assert_allclose(mean, attention_maps(model, tokenizer, SENTENCE, target)[0].mean(0), atol=1e-6)


def test_heatmap_grids_have_a_panel_per_head_and_grow_with_the_sentence():
    rng = np.random.default_rng(0)
    cols, rows = [f"▁s{i}" for i in range(7)], [f"▁t{i}" for i in range(9)]
    for heads, axes in [(2, 3), (4, 5), (6, 9)]:  # a grid of up to 4 a row, and the colour bar
        fig = heads_figure(rng.random((heads, 9, 7)), cols, rows, "t")
        shown = [ax for ax in fig.axes if ax.get_images()]
        assert len(shown) == heads and len(fig.axes) == axes
        assert [t.get_text() for t in shown[0].get_yticklabels()] == rows
        figure_to_array(fig)
    small = figure_to_array(attention_figure(rng.random((4, 3)), cols[:3], rows[:4]))
    large = figure_to_array(attention_figure(rng.random((20, 15)), cols * 2 + ["x"], rows * 2 + ["y", "z"]))
    assert small.dtype == np.uint8 and small.shape[2] == 3
    assert large.shape[0] > small.shape[0] and large.shape[1] > small.shape[1]
    many = [f"▁p{i}" for i in range(600)]  # a long sentence: smaller cells, a figure of bounded size
    width, height = attention_figure(rng.random((600, 600)), many, many).get_size_inches()
    assert max(width, height) < MAX_HEATMAPS_INCHES + 6


def test_sample_indices_are_fixed_and_readable(trained_run):
    tokenizer = Tokenizer.load(trained_run[0] / "spm.model")
    sources = ["", "Yes.", "In the beginning God created the heavens and the earth.", "x " * 80, "He wept."]
    n = [len(ids) for ids in tokenizer.encode(sources)]
    assert n[1] < n[2] < n[3] and n[4] < n[2]
    assert sample_indices(tokenizer, sources, k=2, min_pieces=n[2], max_pieces=n[2]) == [2, 1]  # fitting first
    assert sample_indices(tokenizer, sources, k=9, min_pieces=1, max_pieces=n[2]) == [1, 2, 4, 3]  # never blank
    assert sample_indices(tokenizer, ["", " "], k=3) == []


def test_tensorboard_holds_attention_images_of_each_validation(trained_run):
    run, _ = trained_run
    events = EventAccumulator(str(run / "tb"), size_guidance={"images": 0, "tensors": 0}).Reload()
    tags = [t for t in events.Tags()["images"] if t.startswith("valid/attention")]
    assert "valid/attention_heads" in tags and "valid/attention_0" in tags and len(tags) <= 4
    for tag in tags:
        images = events.Images(tag)
        assert [e.step for e in images] == [4, 8]  # one per validation (eval_every 4, max_steps 8)
        for image in images:
            pixels = matplotlib.image.imread(io.BytesIO(image.encoded_image_string), format="png")
            assert pixels.shape[:2] == (image.height, image.width) and min(image.height, image.width) > 100
            assert pixels.std() > 0.01  # not a blank picture
    text = events.Tensors("valid/samples/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert text.count("**source:**") == len(tags) - 1 and "chrF" in text


def test_attention_command_all_heads_and_self_attention(trained_run, tmp_path):
    ckpt = str(trained_run[0] / "checkpoints" / "best.pt")
    runner = CliRunner()
    sizes = {}
    for name, options in [
        ("mean", []),
        ("grid", ["--all-heads"]),
        ("encoder", ["--self", "encoder", "--head", "1"]),
        ("decoder", ["--self", "decoder", "--all-heads", "--layer", "0"]),
    ]:
        out = tmp_path / f"{name}.png"
        result = runner.invoke(app, ["attention", ckpt, SENTENCE, "-o", str(out), "--beam", "1", *options])
        assert result.exit_code == 0, result.output
        assert "attention heatmap written" in result.output
        sizes[name] = png_size(out)
    assert sizes["grid"][0] > sizes["mean"][0]  # two heads side by side
    assert runner.invoke(app, ["attention", ckpt, SENTENCE, "--self", "both"]).exit_code == 2
    for options, message in [
        (["--all-heads", "--head", "0"], "not both"),
        (["--self", "encoder", "--layer", "3"], "the encoder has 1 layer (0..0"),
        (["-o", str(tmp_path / "a.txt")], "picture format"),
    ]:
        result = runner.invoke(app, ["attention", ckpt, SENTENCE, "--beam", "1", *options])
        assert isinstance(result.exception, UserError) and message in str(result.exception), options
    result = runner.invoke(app, ["attention", ckpt, "light " * 2000, "-o", str(tmp_path / "long.png")])
    assert isinstance(result.exception, UserError) and "more than the model reads at once" in str(result.exception)
    assert not (tmp_path / "a.txt").exists()


def test_plot_command_draws_the_curves_of_several_runs(trained_run, tmp_path):
    run, _ = trained_run
    scalars = read_scalars(run)
    assert list(scalars["train/loss"][0]) == [2, 4, 6, 8] and list(scalars["valid/bleu"][0]) == [4, 8]
    assert torch.isfinite(torch.tensor(scalars["train/lr"][1])).all()
    out = tmp_path / "curves.png"
    result = CliRunner().invoke(app, ["plot", str(run), str(run / "tb"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "curves of 2 runs" in result.output
    width, height = png_size(out)
    assert width > 2 * height > 600
    pdf = tmp_path / "curves.pdf"
    assert CliRunner().invoke(app, ["plot", str(run), "-o", str(pdf)]).exit_code == 0
    assert pdf.read_bytes()[:4] == b"%PDF"


def test_plot_mistakes_are_one_line(tmp_path):
    result = CliRunner().invoke(app, ["plot", str(tmp_path / "nope"), "-o", str(tmp_path / "c.png")])
    assert isinstance(result.exception, UserError)
    assert str(result.exception) == f"run directory not found: {tmp_path / 'nope'}"
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no TensorBoard event files"):
        read_scalars(tmp_path / "empty")
    assert not (tmp_path / "c.png").exists()


def test_importing_and_plotting_leave_matplotlib_as_it_was(tmp_path):
    """plot.py draws outside pyplot: no backend is chosen and no figure is registered."""
    import subprocess
    import sys

    code = (
        "import sys, torch, translate.plot as p; "
        "p.save_figure(p.attention_figure(torch.rand(2, 3).numpy(), ['a','b','c'], ['x','y']), sys.argv[1]); "
        "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot imported'"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "a.png")], check=True)
    assert (tmp_path / "a.png").stat().st_size > 0
