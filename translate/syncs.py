"""The operations that make the host wait for the device, counted as they run.

`SyncCounter` is a TorchDispatchMode: every aten operation of its thread passes through it. It
counts those whose result the host needs before it can go on (a scalar read by `.item()` or
`bool()`, `nonzero`, boolean indexing, `masked_select`, `unique`, a copy to host memory) and
notes which scaled-dot-product attention kernel ran. On a CPU nothing waits, but the same
operations are there, so the count tells what an update would cost on a GPU; on a GPU,
`torch.cuda.set_sync_debug_mode("error")` checks the same thing from the driver's side.
tests/test_train.py requires 0 in training updates; scripts/bench_train.py prints the count.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ALWAYS = {"_local_scalar_dense", "nonzero", "masked_select", "unique_consecutive", "unique_dim", "_unique", "_unique2"}
ALWAYS |= {"equal", "is_nonzero", "masked_scatter", "histc"}
BOOL_INDEXED = {"index", "index_put", "index_put_", "_index_put_impl_"}  # with a boolean index: a nonzero inside


def _on_host(x) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "cpu"


def _on_device(x) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type not in ("cpu", "meta")


def is_sync(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether aten operation `name` with these arguments makes the host wait for the device."""
    if name in ALWAYS:
        return True
    if name in BOOL_INDEXED:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())
    if name == "repeat_interleave":
        return kwargs.get("output_size") is None and isinstance(args[1] if len(args) > 1 else None, torch.Tensor)
    if name == "_to_copy":  # a device tensor copied to host memory, waited for
        device = kwargs.get("device")
        return _on_device(args[0]) and device is not None and torch.device(device).type == "cpu"
    if name == "copy_":
        return _on_host(args[0]) and _on_device(args[1]) and not (len(args) > 2 and args[2])
    return False


class SyncCounter(TorchDispatchMode):
    """with SyncCounter() as c: ...; c.syncs counts the synchronising operations by name,
    c.attention the scaled-dot-product attention kernels that ran. `paused()` stops counting."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs: Counter[str] = Counter()
        self.attention: Counter[str] = Counter()
        self.counting = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.counting:
            name = func.overloadpacket.__name__
            if is_sync(name, args, kwargs):
                self.syncs[name] += 1
            if name.startswith("_scaled_dot_product_") or name.startswith("_flash_attention"):
                self.attention[name.removeprefix("_scaled_dot_product_")] += 1
        return func(*args, **kwargs)

    @contextmanager
    def paused(self) -> Iterator[None]:
        counting, self.counting = self.counting, False
        try:
            yield
        finally:
            self.counting = counting

    def uncounted(self, fn: Callable) -> Callable:
        """`fn`, whose operations are not counted."""

        def call(*args, **kwargs):
            with self.paused():
                return fn(*args, **kwargs)

        return call
