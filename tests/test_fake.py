"""memfit.fake.FakeTensors: FakeTensorMode in which a Triton launch on fake tensors does nothing and a value read
on the host reads 1; outside it, such a launch raises instead of reading address 0."""
import memfit  # noqa: F401  (first: decides TRITON_INTERPRET before triton is imported)

import pytest
import torch
import triton
import triton.language as tl
from torch._subclasses.fake_tensor import FakeTensorMode

from memfit.fake import FakeTensors, is_fake


@triton.jit
def _add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


def _launch(x):
    _add_one[(1,)](x, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))


def test_a_launch_on_fake_tensors_does_nothing_inside_and_a_real_one_still_runs():
    with FakeTensors():
        x = torch.zeros(5, device=memfit.DEVICE)
        assert is_fake(x)
        _launch(x)  # would read a fake tensor's memory
        with FakeTensors():  # nested
            _launch(torch.zeros(3, device=memfit.DEVICE))
        _launch(x)
    real = torch.zeros(5, device=memfit.DEVICE)
    _launch(real)
    assert real.tolist() == [1.0] * 5


def test_a_launch_on_fake_tensors_outside_raises_naming_the_kernel_and_the_fix():
    """Under PyTorch's own FakeTensorMode, Triton would read the fake tensor's address as 0 (on a GPU, an illegal
    memory access that ends the CUDA context): the launch refuses instead."""
    with pytest.raises(RuntimeError, match=r"_add_one was launched on fake tensors.*memfit.fake.FakeTensors"):
        with FakeTensorMode():
            _launch(torch.zeros(5, device=memfit.DEVICE))
    with pytest.raises(ZeroDivisionError):
        with FakeTensors():
            1 / 0
    with pytest.raises(RuntimeError, match="launched on fake tensors"):  # the failed context was closed
        with FakeTensorMode():
            _launch(torch.zeros(5, device=memfit.DEVICE))


def test_a_host_read_of_a_fake_value_is_one_and_a_known_constant_keeps_its_value():
    with FakeTensors():
        counts = torch.zeros(7, dtype=torch.int64)
        assert int((counts != -100).sum()) == 1
        assert torch.ones(3).sum().item() == 1.0
        assert bool(torch.zeros(2).any()) is True
        assert torch.tensor(2.5).item() == 2.5  # made from a real value: FakeTensorMode knows it
