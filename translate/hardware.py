"""What the machine can do, decided in one place: the device, and the precision to train and decode at.

A CPU multiplies bf16 matrices natively only with AVX-512 BF16 or AMX; elsewhere (AVX2-only
x86, many laptops and cloud machines) torch emulates them about 450x slower than fp32. So
`train.amp: auto` and `--dtype auto` take bf16 on a CPU only where it is native, and an
explicit bf16 on a CPU without it is refused rather than run for days. Each choice comes with
a one-line reason that the trainer logs and the run records.
"""

from __future__ import annotations

import functools
import os
import platform
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TypeVar

import torch

from translate.errors import UserError

T = TypeVar("T")

DEVICE_NAMES = "auto, cpu, cuda, cuda:N or mps"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_ONEDNN_BF16_ISAS = ("BF16", "AMX", "ALL", "DEFAULT", "AVX10")  # ONEDNN_MAX_CPU_ISA values that keep bf16


@dataclass(frozen=True)
class CpuInfo:
    capability: str  # torch.backends.cpu.get_cpu_capability(): AVX512, AVX2, DEFAULT, SVE256 ...
    native_bf16: bool  # bf16 matrix products in hardware (AVX-512 BF16 or AMX)
    how: str  # how native_bf16 was found: the capability query, or a timed product
    cores: int

    def describe(self) -> str:
        bf16 = "with native bf16" if self.native_bf16 else "without native bf16"
        return f"CPU {self.capability} {bf16}"


_cpu_info: CpuInfo | None = None


def cpu_info() -> CpuInfo:
    """This CPU's class, found once per process."""
    global _cpu_info
    if _cpu_info is None:
        capability = torch.backends.cpu.get_cpu_capability()
        native, how = _native_bf16(capability)
        _cpu_info = CpuInfo(capability, native, how, os.cpu_count() or 1)
    return _cpu_info


def _native_bf16(capability: str) -> tuple[bool, str]:
    """Whether bf16 matrix products run in hardware here, and how that was decided.

    On x86 torch's own queries answer (AVX-512 BF16 or AMX tiles), within the instruction sets
    that ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA allow. Where those queries are missing
    (another architecture, another torch), a small bf16 product is timed against fp32 once."""
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if isa and not any(name in isa for name in _ONEDNN_BF16_ISAS):
        return False, f"ONEDNN_MAX_CPU_ISA={isa}"
    if platform.machine().lower() in ("x86_64", "amd64", "i386", "i686"):
        query = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
        amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
        if query is not None:
            if not capability.startswith("AVX512"):
                return False, f"torch CPU capability {capability}"
            return bool(query() or amx()), "torch's AVX-512 BF16 / AMX query"
    return timed_bf16_faster(), "a timed 256x256 bf16 and fp32 product"


def timed_bf16_faster(n: int = 256, repeats: int = 5) -> bool:
    """Whether a bf16 n x n product is at least as fast as the fp32 one on this CPU (medians)."""

    def median_time(dtype: torch.dtype) -> float:
        a = torch.randn(n, n).to(dtype)
        torch.mm(a, a)
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            torch.mm(a, a)
            times.append(time.perf_counter() - t)
        return sorted(times)[repeats // 2]

    return median_time(torch.bfloat16) <= median_time(torch.float32)


# ---------------------------------------------------------------------------- devices


def mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def check_device_name(name: str, setting: str = "--device") -> None:
    if name not in ("auto", "cpu", "mps") and not (name == "cuda" or name.startswith("cuda:")):
        raise UserError(f"{setting} must be {DEVICE_NAMES}, got {name!r}")


def resolve_device(name: str, setting: str = "--device", local_rank: int = 0) -> torch.device:
    """auto | cpu | cuda | cuda:N | mps -> a device. auto: CUDA GPU `local_rank` where there is
    one, else Apple's MPS where torch reports it, else the CPU. Asking for a device that is not
    there is a UserError naming `setting` (the flag or config key the name came from)."""
    check_device_name(name, setting)
    if name == "cpu":
        return torch.device("cpu")
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device(f"cuda:{local_rank}")
        return torch.device("mps") if mps_available() else torch.device("cpu")
    if name == "mps":
        if not mps_available():
            raise UserError(f"{setting} mps: torch reports no MPS device here (use auto or cpu)")
        return torch.device("mps")
    if not torch.cuda.is_available():
        raise UserError(f"{setting} {name}: no CUDA GPU is available (use auto or cpu)")
    return torch.device(name if ":" in name else f"cuda:{local_rank}")


# ---------------------------------------------------------------------------- batch shapes

PACK_MULTIPLE = 8  # train.pad_to_multiple auto: batches packed by lengths rounded up to this


@dataclass(frozen=True)
class Padding:
    """How training's batches are formed and shaped: `pack`, the multiple the sentences' lengths are
    rounded up to when they are packed into batches; `pad`, the multiple the batch tensors' lengths
    are padded to; and why, in a few words."""

    pack: int
    pad: int
    reason: str

    @property
    def project(self) -> int:
        """The multiple the count of positions projected onto the vocabulary is rounded up to
        (data.projected_positions): 8x `pad`, the non-pad positions alone where nothing is padded."""
        return 8 * self.pad if self.pad > 1 else 1


def choose_padding(setting: int | str, device: torch.device, amp: torch.dtype | None) -> Padding:
    """`train.pad_to_multiple` on this hardware. A number n packs and pads to n.

    auto packs by lengths rounded up to 8 everywhere, so every machine trains on the same batches,
    and pads the tensors to 8 where the matrix products build a plan per shape: reduced precision
    (oneDNN's bf16 primitives on a CPU, each with its own buffers: few shapes keep host memory
    flat) and GPUs (cuDNN/cuBLAS plans, compiled graphs). In fp32 on a CPU the products go through
    MKL, which keeps nothing per shape: there the tensors keep the batch's own longest lengths
    (padding would be only wasted work: about 8 % more positions)."""
    if setting != "auto":
        return Padding(int(setting), int(setting), f"train.pad_to_multiple {setting}")
    if device.type == "cpu" and amp is None:
        return Padding(PACK_MULTIPLE, 1, f"fp32 on a CPU -> packed by lengths rounded to {PACK_MULTIPLE}, not padded")
    return Padding(PACK_MULTIPLE, PACK_MULTIPLE, f"{precision_name(amp)} on {device.type} -> padded to {PACK_MULTIPLE}")


def by_precision(setting: T | dict[str, T], amp: torch.dtype | None) -> tuple[T, str]:
    """A setting that may name one value per precision (train.max_tokens, train.lr, model.d_ff) at this precision:
    the value, or the mapping's entry for the precision train.amp chose (the config checks that it has
    one for each); and why, for the log."""
    if not isinstance(setting, dict):
        return setting, "one value for every precision"
    chosen = setting[precision_name(amp)]
    return chosen, f"by precision: {precision_name(amp)} -> {chosen}"


def precision_name(amp: torch.dtype | None) -> str:
    """fp32, bf16 or fp16: what an autocast dtype (None: none) trains at."""
    return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[amp]


# ---------------------------------------------------------------------------- precision


def _no_native_bf16(setting: str, value: str) -> UserError:
    info = cpu_info()
    return UserError(
        f"{setting} {value}: this CPU ({info.capability}) has no native bf16, so bf16 runs emulated, hundreds of "
        f"times slower than fp32; use {setting} auto (fp32 here) or {'off' if setting == 'train.amp' else 'fp32'}"
    )


def choose_amp(amp: str, device: torch.device) -> tuple[torch.dtype | None, str]:
    """The autocast dtype for `train.amp` on `device` (None = full fp32) and why, in a few words.

    auto: bf16 on a CUDA GPU that supports it, else fp16 (with a GradScaler); bf16 on a CPU with
    native bf16, else fp32; fp32 on MPS. An explicit choice the device cannot run well is refused."""
    if amp == "off":
        return None, "train.amp off -> fp32"
    if device.type == "cuda":
        bf16 = torch.cuda.is_bf16_supported()
        if amp == "auto":
            return (torch.bfloat16, "CUDA with bf16 -> bf16") if bf16 else (torch.float16, "CUDA without bf16 -> fp16")
        if amp == "bf16" and not bf16:
            raise UserError("train.amp bf16: this GPU does not support bf16; use auto (fp16 here) or off")
        return DTYPES[amp], f"train.amp {amp} on CUDA"
    if device.type == "mps":
        if amp == "auto":
            return None, "MPS -> fp32"
        raise UserError(f"train.amp {amp} is not supported on MPS here; use auto or off (fp32)")
    if amp == "fp16":
        raise UserError("train.amp fp16 needs a CUDA GPU; on a CPU use auto or off (or bf16 where it is native)")
    info = cpu_info()
    if amp == "auto":
        return (
            torch.bfloat16 if info.native_bf16 else None
        ), f"{info.describe()} -> {'bf16' if info.native_bf16 else 'fp32'}"
    if not info.native_bf16:
        raise _no_native_bf16("train.amp", amp)
    return torch.bfloat16, f"train.amp bf16 on a {info.describe()}"


def choose_decode_dtype(dtype: str, device: torch.device) -> tuple[str, str]:
    """The precision to decode at for `--dtype` (auto | fp32 | bf16 | fp16) on `device`, and why.

    auto: bf16 on a CUDA GPU that supports it, else fp16; fp32 on a CPU (packed fp32 linear
    layers are exact, and bf16 decoding was only 1.2x faster where native: docs/experiments.md)
    and on MPS. bf16 on a CPU is allowed only where it is native; fp16 only on CUDA."""
    if dtype not in ("auto", *DTYPES):
        raise UserError(f"--dtype must be auto, fp32, bf16 or fp16, got {dtype!r}")
    if device.type == "cuda":
        if dtype == "auto":
            return ("bf16", "CUDA with bf16 -> bf16") if torch.cuda.is_bf16_supported() else ("fp16", "CUDA -> fp16")
        if dtype == "bf16" and not torch.cuda.is_bf16_supported():
            raise UserError("--dtype bf16: this GPU does not support bf16; use auto (fp16 here), fp16 or fp32")
        return dtype, f"--dtype {dtype}"
    if dtype == "auto":
        return "fp32", f"{device.type.upper()} -> fp32"
    if dtype == "fp16":
        raise UserError(f"--dtype fp16 is for CUDA GPUs; on {device.type} use auto (fp32) or --quantize int8")
    if dtype == "bf16":
        if device.type != "cpu":
            raise UserError(f"--dtype bf16 is not supported on {device.type}; use auto (fp32)")
        if not cpu_info().native_bf16:
            raise _no_native_bf16("--dtype", "bf16")
    return dtype, f"--dtype {dtype}"


SDPA_KERNELS = {  # train.attention -> the kernels torch may choose among
    "cudnn": ("CUDNN_ATTENTION",),
    # flash takes no padding mask: it runs the decoder's self-attention (causal, unmasked), the
    # memory-efficient kernel the calls with a mask (the encoder's self-attention, cross-attention)
    "flash": ("FLASH_ATTENTION", "EFFICIENT_ATTENTION"),
    "efficient": ("EFFICIENT_ATTENTION",),
    "math": ("MATH",),
}


def attention_kernels(name: str, device: torch.device) -> AbstractContextManager:
    """A context in which scaled-dot-product attention uses only the kernels of `name`
    (train.attention, see SDPA_KERNELS) on a GPU; `auto`, and any choice on other devices, leave it
    to torch."""
    if name == "auto" or device.type != "cuda":
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, kernel) for kernel in SDPA_KERNELS[name]])


def no_attention_kernel(error: BaseException) -> bool:
    """Whether `error` is torch's refusal of every attention kernel it was allowed (train.attention)."""
    return isinstance(error, RuntimeError) and "No available kernel" in str(error)


def describe_machine() -> str:
    """One line for the top of a benchmark's output: the CPU class, native bf16, cores, threads, torch."""
    info = cpu_info()
    gpu = f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return (
        f"machine: CPU capability {info.capability}, native bf16 {'yes' if info.native_bf16 else 'no'} "
        f"({info.how}), {info.cores} cores, {torch.get_num_threads()} torch threads, torch {torch.__version__}{gpu}"
    )


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` says a tensor did not fit: torch.OutOfMemoryError (CUDA, MPS) or Python's
    MemoryError by type; torch's CPU allocator raises a plain RuntimeError, known by its message."""
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(error, RuntimeError) and "can't allocate memory" in str(error)


def host_memory_mb() -> float | None:
    """Resident memory of this process in MiB (Linux /proc), None where the system has no /proc."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def host_memory_peak_mb() -> float | None:
    """The highest resident memory of this process so far in MiB (Linux's VmHWM), None elsewhere."""
    try:
        with open("/proc/self/status") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return kib / 2**10


def reset_host_memory_peak() -> bool:
    """Start the peak of host_memory_peak_mb afresh from the current resident memory (Linux's
    /proc/self/clear_refs), so that training's peak is not preparation's; False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def release_free_memory() -> bool:
    """Give the pages of the heap that hold no object back to the system (glibc's `malloc_trim`);
    False where the C library has no such call (musl, macOS, Windows).

    Training calls it once, when it starts (what preparation and loading freed). Not between updates:
    an update allocates and frees hundreds of MiB of activations of many sizes, and glibc keeps the
    freed memory in its heap for the next ones (in the default fp32 run 150-290 MiB free beside
    202-228 in use); trimming at every logging step gave that back but cost 1.5-3 % of the speed
    side by side and lowered the peak little (docs/experiments.md, "Host memory over a run")."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def _malloc_trim():
    return getattr(c_library(), "malloc_trim", None)


@functools.cache
def c_library():
    """The C library this process already uses (ctypes), None where there is no process-wide
    handle (Windows): glibc's malloc_trim and mallopt where the library is glibc."""
    import ctypes

    try:
        return ctypes.CDLL(None)
    except (OSError, TypeError):
        return None
