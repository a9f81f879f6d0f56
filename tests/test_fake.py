"""memfit.fake.FakeTensors: FakeTensorMode in which a Triton launch on fake tensors does nothing and a value read
on the host reads 1; outside it, such a launch raises instead of reading address 0."""
import memfit  # noqa: F401  (first: decides TRITON_INTERPRET before triton is imported)

import pytest
import torch
import triton
import triton.language as tl
from torch._subclasses.fake_tensor import FakeTensorMode

from memfit.fake import FakeTensors, RealTensorInFakeMode, is_fake


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


def test_a_model_built_before_the_mode_gets_the_courses_message_not_pytorchs_assertion():
    """PyTorch's assertion suggests allow_non_fake_inputs, which keeps the real model (an 8B one: 16 GB and more):
    inside FakeTensors the error names the operation and the real tensor, and says to build the model inside."""
    from memfit.gpt import COURSE_CONFIGS
    from memfit.meter import LIVE_TENSORS
    from memfit.training import Trainer, measure_step
    trainer = Trainer(COURSE_CONFIGS["tiny"], "fp32", "adamw", "none", "cpu")
    with pytest.raises(RealTensorInFakeMode, match=r"aten\.embedding\.default was given a real tensor \(a Parameter of "
                       r"shape \(2048, 128\), float32\) among fake ones.*Build the trainer inside: `with "
                       r"FakeTensors\(\): trainer = make_trainer\(\)`") as raised:
        with FakeTensors():
            measure_step(trainer, 2, 16, meter=LIVE_TENSORS)
    assert "Please convert" not in str(raised.value) and raised.value.__cause__ is None
    linear = torch.nn.Linear(8, 4)
    with pytest.raises(RealTensorInFakeMode, match=r"a real tensor \(a Parameter of shape \(4, 8\), float32\)"):
        with FakeTensors():
            linear(torch.zeros(2, 8))
    with FakeTensors() as first:
        made_in_first = torch.nn.Linear(8, 4)
    with pytest.raises(RealTensorInFakeMode, match=r"a fake tensor of another fake mode.*under the same one"):
        with FakeTensors():
            made_in_first(torch.zeros(2, 8))
    del first
    with FakeTensors():  # built inside: no error
        assert is_fake(torch.nn.Linear(8, 4)(torch.zeros(2, 8)))
