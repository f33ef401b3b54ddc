"""The hardware decides: device resolution (CUDA, MPS, CPU) and the precision to train and decode at.
Both CPU classes are mocked: AVX-512 BF16 (native bf16) and AVX2 only (bf16 emulated)."""

import sys

import pytest
import torch

from translate import hardware
from translate.errors import UserError
from translate.hardware import CpuInfo, Padding, choose_amp, choose_decode_dtype, choose_padding, resolve_device

CPU, CUDA, MPS = torch.device("cpu"), torch.device("cuda:0"), torch.device("mps")
AVX512_BF16 = CpuInfo("AVX512", True, "mocked", 2)
AVX2 = CpuInfo("AVX2", False, "mocked", 2)


@pytest.fixture
def cpu_class(monkeypatch):
    def use(info: CpuInfo) -> None:
        monkeypatch.setattr(hardware, "_cpu_info", info)

    return use


def test_amp_auto_takes_bf16_only_where_the_cpu_has_it(cpu_class):
    cpu_class(AVX512_BF16)
    assert choose_amp("auto", CPU) == (torch.bfloat16, "CPU AVX512 with native bf16 -> bf16")
    assert choose_amp("bf16", CPU)[0] == torch.bfloat16
    cpu_class(AVX2)
    assert choose_amp("auto", CPU) == (None, "CPU AVX2 without native bf16 -> fp32")
    assert choose_amp("off", CPU)[0] is None


def test_explicit_bf16_on_a_cpu_without_it_is_refused(cpu_class):
    cpu_class(AVX2)
    with pytest.raises(UserError, match=r"train.amp bf16: this CPU \(AVX2\) has no native bf16.*use train.amp auto"):
        choose_amp("bf16", CPU)
    with pytest.raises(UserError, match="fp16 needs a CUDA GPU"):
        choose_amp("fp16", CPU)
    with pytest.raises(UserError, match=r"--dtype bf16: this CPU \(AVX2\) has no native bf16.*auto.*fp32"):
        choose_decode_dtype("bf16", CPU)


def test_cuda_and_mps_precision(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert choose_amp("auto", CUDA)[0] == torch.bfloat16 and choose_amp("fp16", CUDA)[0] == torch.float16
    assert choose_decode_dtype("auto", CUDA)[0] == "bf16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert choose_amp("auto", CUDA)[0] == torch.float16 and choose_amp("off", CUDA)[0] is None
    assert choose_decode_dtype("auto", CUDA)[0] == "fp16"
    with pytest.raises(UserError, match="does not support bf16"):
        choose_amp("bf16", CUDA)
    assert choose_amp("auto", MPS) == (None, "MPS -> fp32")
    with pytest.raises(UserError, match="not supported on MPS"):
        choose_amp("bf16", MPS)
    assert choose_decode_dtype("auto", MPS)[0] == "fp32"


def test_padding_auto_follows_the_precision():
    """auto: the same batches everywhere (packed by lengths rounded to 8); tensors padded to 8 only
    where products build per-shape plans (bf16/fp16, GPUs), not in fp32 on a CPU. A number is both."""
    fp32_cpu, bf16_cpu = choose_padding("auto", CPU, None), choose_padding("auto", CPU, torch.bfloat16)
    assert (fp32_cpu.pack, fp32_cpu.pad) == (8, 1) and "fp32 on a CPU" in fp32_cpu.reason
    assert (bf16_cpu.pack, bf16_cpu.pad) == (8, 8) and "bf16" in bf16_cpu.reason
    for amp in (None, torch.bfloat16, torch.float16):
        assert (choose_padding("auto", CUDA, amp).pack, choose_padding("auto", CUDA, amp).pad) == (8, 8)
    assert choose_padding(1, CPU, torch.bfloat16) == Padding(1, 1, "train.pad_to_multiple 1")
    assert choose_padding(16, CPU, None) == Padding(16, 16, "train.pad_to_multiple 16")


def test_decode_dtype_auto_is_fp32_on_either_cpu_class(cpu_class):
    for info in (AVX512_BF16, AVX2):
        cpu_class(info)
        assert choose_decode_dtype("auto", CPU)[0] == "fp32"
        with pytest.raises(UserError, match="fp16 is for CUDA"):
            choose_decode_dtype("fp16", CPU)
    cpu_class(AVX512_BF16)
    assert choose_decode_dtype("bf16", CPU)[0] == "bf16"
    with pytest.raises(UserError, match="--dtype must be"):
        choose_decode_dtype("float8", CPU)


def test_native_bf16_follows_torch_and_the_isa_limits(monkeypatch):
    monkeypatch.setattr(hardware.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    assert hardware._native_bf16("AVX512")[0]
    assert not hardware._native_bf16("AVX2")[0]  # e.g. ATEN_CPU_CAPABILITY=avx2
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert hardware._native_bf16("AVX512") == (False, "ONEDNN_MAX_CPU_ISA=AVX2")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
    assert hardware._native_bf16("AVX512")[0]
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    assert not hardware._native_bf16("AVX512")[0]  # AVX-512 without BF16 (e.g. Skylake)
    monkeypatch.setattr(hardware.platform, "machine", lambda: "arm64")
    monkeypatch.setattr(hardware, "timed_bf16_faster", lambda: True)
    assert hardware._native_bf16("DEFAULT") == (True, "a timed 256x256 bf16 and fp32 product")


def test_device_auto_prefers_cuda_then_mps(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(hardware, "mps_available", lambda: True)
    assert resolve_device("auto") == MPS and resolve_device("mps") == MPS
    assert resolve_device("cpu") == CPU
    monkeypatch.setattr(hardware, "mps_available", lambda: False)
    assert resolve_device("auto") == CPU
    with pytest.raises(UserError, match="train.device mps: torch reports no MPS device"):
        resolve_device("mps", "train.device")
    with pytest.raises(UserError, match="no CUDA GPU"):
        resolve_device("cuda")
    with pytest.raises(UserError, match="must be auto, cpu, cuda, cuda:N or mps"):
        resolve_device("tpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto", local_rank=1) == torch.device("cuda:1")


def test_timed_bf16_check_runs():
    assert isinstance(hardware.timed_bf16_faster(n=32, repeats=1), bool)


@pytest.mark.skipif(hardware._malloc_trim() is None, reason="the C library has no malloc_trim")
def test_release_free_memory_gives_the_heaps_free_pages_back():
    """Memory freed in the middle of the heap stays resident (glibc keeps it for the next
    allocations) until release_free_memory hands its pages back; the peak stays what it was."""
    import ctypes

    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size, count = 64 * 2**10, 2048  # 128 MiB in blocks under the mmap threshold: on the heap
    blocks = [libc.malloc(size) for _ in range(count)]
    for b in blocks:
        ctypes.memset(b, 1, size)  # resident
    for b in blocks[:-1]:
        libc.free(b)  # the last block keeps the heap's top: free cannot shrink it
    before = hardware.host_memory_mb()
    assert hardware.release_free_memory()
    after = hardware.host_memory_mb()
    libc.free(blocks[-1])
    assert before - after > 64, (before, after)
    assert hardware.host_memory_peak_mb() - after > 64  # the peak is not lowered


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's /proc")
def test_the_peak_of_host_memory_starts_afresh_when_reset():
    """In a fresh process (the test suite's own memory moves with the tests before): a block touched
    and freed stays in the peak until reset_host_memory_peak starts it from the current memory."""
    import subprocess

    code = (
        "import numpy as np\n"
        "from translate import hardware\n"
        "block = np.ones(64 * 2**20)\n"  # 512 MiB touched
        "del block\n"
        "high, now = hardware.host_memory_peak_mb(), hardware.host_memory_mb()\n"
        "assert hardware.reset_host_memory_peak()\n"
        "print(high, now, hardware.host_memory_peak_mb())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    high, now, after = map(float, out.stdout.split())
    assert high - now > 256  # the block is gone, its peak is not
    assert after < high - 256  # the peak starts again from what the process holds now
