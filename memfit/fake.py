"""Fake tensors for predictions: PyTorch's FakeTensorMode, made ready for the course's own kernels.

Under `FakeTensorMode` a tensor has a shape, a dtype, a device and strides but no memory: each PyTorch operation
computes only its output's metadata, and the course's live-tensor meter still sees every tensor made and freed.
A whole training step of an 8B model runs on a laptop in seconds (lesson 08). Two things stop a program that
brings its own kernels from running there; `FakeTensors` handles both:

* a Triton launch reads its tensors' addresses, and a fake tensor has none: inside, a launch with a fake tensor
  among its arguments does nothing. The course's wrappers allocate their outputs with PyTorch before launching,
  so those allocations, the memory the prediction is about, are counted; the values stay unwritten.
* a value read back on the host (`.item()`, `int(t)`, `bool(t)`) has no data to come from: inside, such a read
  returns 1 (the fused loss reads the number of counted tokens and its upstream gradient that way). A prediction
  therefore holds only for programs whose allocations do not depend on tensors' values, as a training step's do.
"""
from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensor, FakeTensorMode


def is_fake(t) -> bool:
    """Is `t` a fake tensor (no memory behind it)?"""
    return isinstance(t, FakeTensor)


_active = 0  # FakeTensors contexts open in this process (they nest)
_launch = None  # Triton's own kernel[grid] while one is open


def _skipping_fake(getitem):
    def __getitem__(kernel, grid):
        launch = getitem(kernel, grid)

        def launch_unless_fake(*args, **kwargs):
            if any(is_fake(a) for a in args) or any(is_fake(a) for a in kwargs.values()):
                return None
            return launch(*args, **kwargs)
        return launch_unless_fake
    return __getitem__


def _skip_fake_launches(change: int) -> None:
    """Open (+1) or close (-1) one context; Triton's `kernel[grid]` skips fake launches while any is open."""
    global _active, _launch
    from triton.runtime.jit import KernelInterface  # (here, not at import: memfit picks Triton's mode first)
    if change > 0 and _active == 0:
        _launch = KernelInterface.__getitem__
        KernelInterface.__getitem__ = _skipping_fake(_launch)
    _active += change
    if change < 0 and _active == 0:
        KernelInterface.__getitem__ = _launch


class FakeTensors(FakeTensorMode):
    """`with FakeTensors():` FakeTensorMode, in which the course's Triton kernels launch nothing on fake tensors and a
    value read on the host reads 1 (see the module's text)."""

    def __enter__(self):
        _skip_fake_launches(+1)
        try:
            return super().__enter__()
        except BaseException:
            _skip_fake_launches(-1)
            raise

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            _skip_fake_launches(-1)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        try:
            return super().__torch_dispatch__(func, types, args, kwargs or {})
        except DataDependentOutputException:
            if func is not torch.ops.aten._local_scalar_dense.default:
                raise
            dtype = args[0].dtype
            return True if dtype == torch.bool else 1.0 if dtype.is_floating_point else 1
