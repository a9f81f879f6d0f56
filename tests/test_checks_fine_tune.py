"""Lesson 08's checks: the reference passes every case, the memory budgets leave out anything of W's size, the
LoRA trainer trains only its adapters, and NF4's code is the published one. The wrong implementations are in
tests/mutants/fine_tune.py, run by tests/test_registry_entries.py."""
import pytest
import torch

import memfit.from_lessons.fine_tune as ref
from autograder.checks import fine_tune as checks
from memfit.gpt import COURSE_CONFIGS


@pytest.mark.parametrize("name, functions", [
    ("lora_state_bytes", (ref.lora_state_bytes,)), ("lora_function", (ref.LoRAFunction,)),
    ("lora_memory", (ref.LoRAFunction,)), ("nf4_code", (ref.nf4_code,)),
    ("nf4", (ref.quantize_nf4, ref.dequantize_nf4)), ("fake_step_memory", (ref.fake_step_memory,))])
def test_reference_passes_every_case(name, functions):
    getattr(checks, f"check_{name}")(*functions, cases="all")


def test_memory_budgets_leave_out_a_tensor_of_the_weights_size():
    for case in checks.MEMORY_CASES:
        budget = checks.lora_budgets(case.lora)
        assert budget["weight"] > budget["forward"] and budget["weight"] > budget["backward"] / 2, case
        if len(case.lora.x_shape) > 1:  # a copy of x (of 8 tokens or more) does not fit in what the forward may keep
            assert budget["x"] > budget["kept"], case


def test_nf4_code_is_the_published_table():
    assert torch.allclose(ref.nf4_code().double(), torch.tensor(checks.PUBLISHED_NF4, dtype=torch.float64),
                          atol=checks.CODE_TOLERANCE, rtol=0)


def test_lora_trainer_trains_the_adapters_only():
    trainer = ref.lora_trainer(COURSE_CONFIGS["tiny"], 4, base_dtype=torch.float32, device="cpu")
    frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    from memfit.training import random_batch
    idx, targets = random_batch(trainer.cfg, 2, 32, "cpu")
    for _ in range(3):
        trainer.step(idx, targets)
    for name, p in trainer.model.named_parameters():
        if p.requires_grad:
            assert "lora_" in name and p.dtype == torch.float32, name
        else:
            assert torch.equal(p, frozen[name]), name
    assert any(p.abs().sum() > 0 for n, p in trainer.model.named_parameters() if n.endswith("lora_b"))


def test_the_lora_layer_starts_as_the_base_layer():
    torch.manual_seed(0)
    base = torch.nn.Linear(64, 32, bias=False)
    x = torch.randn(5, 64)
    expected = base(x)
    assert torch.equal(ref.LoRALinear(base, 4, 8.0)(x), expected)
