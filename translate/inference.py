"""Checkpoints loaded for inference: the precision to decode at, int8 quantization, and fp32
linear layers packed for oneDNN on CPU."""

from __future__ import annotations

import copy
import ctypes
import functools
import logging
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from translate.checkpoint import check_distinct, load_model
from translate.config import Config
from translate.errors import UserError
from translate.hardware import DTYPES, c_library, choose_decode_dtype
from translate.model import Transformer
from translate.tokenizer import Tokenizer

log = logging.getLogger("translate")


def load_models(
    checkpoints: Sequence[str | Path],
    device: torch.device | str = "cpu",
    *,
    dtype: str = "auto",
    quantize: str | None = None,
) -> tuple[list[Transformer], Tokenizer, Config]:
    """The models of one or more checkpoints (an ensemble: one vocabulary), in eval mode on
    `device` at the given precision (see `for_inference`), the tokenizer and the first
    checkpoint's config (its decode defaults)."""
    if not checkpoints:
        raise UserError("give at least one checkpoint")
    dtype = check_precision(torch.device(device), dtype, quantize)
    check_distinct([Path(c) for c in checkpoints])
    models, tokenizers, configs = zip(*(load_model(path, device) for path in checkpoints), strict=True)
    for path, tokenizer in zip(checkpoints[1:], tokenizers[1:], strict=True):
        if tokenizer.model_bytes != tokenizers[0].model_bytes:
            raise UserError(f"{path}: its vocabulary differs from {checkpoints[0]}'s; an ensemble needs one vocabulary")
    return [for_inference(m, dtype, quantize) for m in models], tokenizers[0], configs[0]


def check_precision(device: torch.device, dtype: str = "auto", quantize: str | None = None) -> str:
    """--dtype and --quantize against the device: the precision to decode at (see
    hardware.choose_decode_dtype); int8 runs on CPU, in place of a half precision."""
    if quantize not in (None, "int8"):
        raise UserError(f"--quantize must be int8, got {quantize!r}")
    if quantize is not None and device.type != "cpu":
        raise UserError(f"--quantize {quantize} is for CPU; on {device.type} use --dtype auto, bf16 or fp16")
    if quantize is not None and dtype not in ("auto", "fp32"):
        raise UserError(f"--quantize {quantize} replaces --dtype {dtype}: give one of them")
    chosen, reason = choose_decode_dtype(dtype, device)
    log.debug(f"decoding in {chosen}: {reason}")
    return chosen


class PackedLinear(torch.nn.Module):
    """An nn.Linear for fp32 inference on CPU whose weight is packed once into oneDNN's blocked
    layout and multiplied with oneDNN's GEMM (the op torch.compile's CPU backend uses for linear
    layers). At a decoding step's 64-320 rows it is 1.1-1.8x faster than torch's default
    (`scripts/bench_decode.py`); results agree with F.linear to float rounding, not bit for bit."""

    def __init__(self, linear: torch.nn.Linear, rows: int = 64) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), rows)
        self.bias = None if linear.bias is None else linear.bias.detach().clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


@functools.cache
def can_pack_linear() -> bool:
    """Whether oneDNN's packed fp32 linear can replace nn.Linear: the build has its two private
    ops (x86 builds usually do) and, checked once, they agree with the public F.linear on a
    small layer (with and without bias, at a step's row count and another). Otherwise decoding
    takes the public path: the model's own nn.Linear layers."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    generator = torch.Generator().manual_seed(0)
    try:
        for bias, rows in ((True, 64), (False, 5)):
            linear = torch.nn.Linear(48, 40, bias=bias)
            with torch.no_grad():
                linear.weight.copy_(torch.randn(40, 48, generator=generator))
                if bias:
                    linear.bias.copy_(torch.randn(40, generator=generator))
                x = torch.randn(rows, 48, generator=generator)
                if not torch.allclose(PackedLinear(linear)(x), F.linear(x, linear.weight, linear.bias), 1e-4, 1e-4):
                    log.warning("oneDNN's packed linear disagrees with F.linear here: decoding uses F.linear")
                    return False
    except (RuntimeError, AttributeError, TypeError) as e:
        log.warning(f"oneDNN's packed linear failed ({type(e).__name__}): decoding uses F.linear")
        return False
    return True


def for_inference(model: Transformer, dtype: str = "fp32", quantize: str | None = None) -> Transformer:
    """The model ready to decode. quantize="int8": a copy whose linear layers (output projection
    included) are dynamically quantized to int8: weights int8, activations quantized per batch
    (torch.ao.quantization.quantize_dynamic, fbgemm/x86). fp32 on CPU: a copy whose linear layers
    are `PackedLinear` (where the build has oneDNN). Otherwise the model cast to `dtype` in place
    (search keeps its scores in fp32). Nothing process-wide changes: the CLI's decoding commands
    call `keep_freed_memory` themselves."""
    if quantize is None:
        if dtype == "fp32" and next(model.parameters()).device.type == "cpu" and can_pack_linear():
            return pack_linears(model)
        return model.to(DTYPES[dtype])
    with warnings.catch_warnings():
        # torch.ao.quantization is deprecated in favour of torchao, whose int8 path is slower than fp32 on CPU
        # without torch.compile; quantize_dynamic is about 1.7x faster than fp32 there.
        warnings.filterwarnings("ignore", message=r"torch\.ao\.quantization is deprecated")
        warnings.filterwarnings("ignore", message=r"torch\.quantize_per_tensor")
        try:
            from torch.ao.quantization import quantize_dynamic
        except ImportError:
            raise UserError(
                f"--quantize int8 needs torch.ao.quantization, gone from torch {torch.__version__}"
            ) from None
        return quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep freed memory for reuse: large blocks come from the heap, not from
    mmap, and the heap is not trimmed. A decoding step allocates and frees blocks of several MB
    (logits, the beams' reordered caches); handed back to the system, each returns as fresh pages
    that the kernel must map and zero again, which cost beam search about a fifth of its time on
    this machine (`scripts/bench_decode.py`). The process keeps what it has used at its peak.
    Process-wide; False where the C library is not glibc (nothing changes)."""
    if not sys.platform.startswith("linux"):
        return False
    mallopt = getattr(c_library(), "mallopt", None)
    if mallopt is None:
        return False
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # malloc.h
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, 2**30) == 1


def pack_linears(model: Transformer) -> Transformer:
    """A copy of the model (fp32, CPU, eval) with every nn.Linear replaced by a PackedLinear, and
    each decoder layer's self-attention query, key and value projections also packed as one
    (W_qkv: one product a decoding step instead of three; the same results)."""
    packed = copy.deepcopy(model).float().eval()
    for layer in packed.decoder:
        layer.self_attn.fuse_qkv()
    for module in list(packed.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(module, name, PackedLinear(child))
    return packed
