"""Fake tensors for predictions: PyTorch's FakeTensorMode, made ready for the course's own kernels.

Under `FakeTensorMode` a tensor has a shape, a dtype, a device and strides but no memory: each PyTorch operation
computes only its output's metadata, and the course's live-tensor meter still sees every tensor made and freed.
A whole training step of an 8B model runs on a laptop in seconds (lesson 08). Two things stop a program that
brings its own kernels from running there; `FakeTensors` handles both:

* a Triton launch reads its tensors' addresses, and a fake tensor has none: inside, a launch with a fake tensor
  among its arguments does nothing. The course's wrappers allocate their outputs with PyTorch before launching,
  so those allocations, the memory the prediction is about, are counted; the values stay unwritten. Importing
  this module puts that test into Triton's `kernel[grid]` for good: outside FakeTensors such a launch raises
  (Triton would read the address as 0, and on a GPU the kernel's writes there end the CUDA context).
* a value read back on the host (`.item()`, `int(t)`, `bool(t)`) has no data to come from: inside, such a read
  returns 1 (the fused loss reads the number of counted tokens and its upstream gradient that way). A prediction
  therefore holds only for programs whose allocations do not depend on tensors' values, as a training step's do.

A real tensor among fake ones, a parameter of a model built before the mode was entered, stops FakeTensorMode with
an assertion that suggests `allow_non_fake_inputs`, which would keep the real model (for an 8B model, tens of GB
allocated). Inside FakeTensors it raises `RealTensorInFakeMode` instead, naming the operation and the tensor, and
the fix: build the model (the trainer) inside `with FakeTensors():`.
"""
from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensor, FakeTensorMode


def is_fake(t) -> bool:
    """Is `t` a fake tensor (no memory behind it)?"""
    return isinstance(t, FakeTensor)


_active = 0  # FakeTensors contexts open in this process (they nest)


def _guarded(getitem):
    """Triton's `kernel[grid]`, made to refuse fake tensors: inside FakeTensors the launch does nothing; anywhere else
    it raises, because Triton would read a fake tensor's address as 0 and the kernel would write there (on a GPU,
    an illegal memory access that ends the process's CUDA context)."""
    def __getitem__(kernel, grid):
        launch = getitem(kernel, grid)

        def launch_unless_fake(*args, **kwargs):
            if any(isinstance(a, FakeTensor) for a in args) or any(isinstance(a, FakeTensor) for a in kwargs.values()):
                if _active:
                    return None
                name = getattr(kernel, "__name__", None) or getattr(getattr(kernel, "fn", None), "__name__", "a kernel")
                raise RuntimeError(f"the Triton kernel {name} was launched on fake tensors (FakeTensorMode): they have "
                                   "no memory to read or write. Predict under memfit.fake.FakeTensors, in which such "
                                   "a launch does nothing")
            return launch(*args, **kwargs)
        return launch_unless_fake
    __getitem__.memfit_guard = True
    return __getitem__


def _install_guard() -> None:
    from triton.runtime.jit import KernelInterface  # (memfit, imported first as this package, chose Triton's mode)
    if not getattr(KernelInterface.__getitem__, "memfit_guard", False):
        KernelInterface.__getitem__ = _guarded(KernelInterface.__getitem__)


_install_guard()


class RealTensorInFakeMode(RuntimeError):
    """An operation inside FakeTensors was given a real tensor, or a fake one of another fake mode."""


_REAL_INPUT = ("Please convert all Tensors to FakeTensors first",
               "Can't call metadata mutating ops on non-Fake Tensor inputs")


def _describe(t: torch.Tensor) -> str:
    kind = "a Parameter" if isinstance(t, torch.nn.Parameter) else "a tensor"
    return f"{kind} of shape {tuple(t.shape)}, {str(t.dtype).removeprefix('torch.')}"


def _foreign_input_message(func, args, kwargs, mode, pytorch_says: str) -> str:
    """The course's words for PyTorch's assertion on a tensor that is not this mode's fake: what happened and the fix
    (PyTorch's own suggestion, allow_non_fake_inputs, keeps a real model: for an 8B model, tens of GB allocated)."""
    from torch.utils._pytree import tree_leaves
    tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if pytorch_says.startswith("Mixing fake modes"):
        other = next((t for t in tensors if isinstance(t, FakeTensor) and t.fake_mode is not mode), None)
        what = f" ({_describe(other)})" if other is not None else ""
        return (f"{func} was given a fake tensor of another fake mode{what}: a tensor made inside one `with "
                "FakeTensors():` cannot meet those of a second one. Build the trainer and measure its step under the "
                "same one: `with FakeTensors(): trainer = make_trainer()`, then measure inside that block")
    real = next((t for t in tensors if not isinstance(t, FakeTensor)), None)
    what = f" ({_describe(real)})" if real is not None else ""
    return (f"{func} was given a real tensor{what} among fake ones: inside `with FakeTensors():` every tensor must "
            "be made inside the mode, and a model or trainer built before entering it keeps real parameters, "
            "allocated for real (16 GB and more for an 8B model: PyTorch's suggestion, allow_non_fake_inputs, would "
            "keep them). Build the trainer inside: `with FakeTensors(): trainer = make_trainer()`, and measure its "
            "step in the same block")


class FakeTensors(FakeTensorMode):
    """`with FakeTensors():` FakeTensorMode, in which the course's Triton kernels launch nothing on fake tensors, a
    value read on the host reads 1, and a real tensor among fake ones raises RealTensorInFakeMode (see the module's
    text)."""

    def __enter__(self):
        global _active
        entered = super().__enter__()
        _active += 1
        return entered

    def __exit__(self, *exc):
        global _active
        _active -= 1
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        try:
            return super().__torch_dispatch__(func, types, args, kwargs or {})
        except DataDependentOutputException:
            if func is not torch.ops.aten._local_scalar_dense.default:
                raise
            dtype = args[0].dtype
            return True if dtype == torch.bool else 1.0 if dtype.is_floating_point else 1
        except AssertionError as exc:  # PyTorch's words for a real tensor (or another mode's) among fake ones
            said = str(exc)
            if not (said.startswith(_REAL_INPUT) or said.startswith("Mixing fake modes")):
                raise
            message = _foreign_input_message(func, args, kwargs or {}, self, said)
        raise RealTensorInFakeMode(message)
