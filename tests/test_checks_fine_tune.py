"""Lesson 08's checks: the reference passes every case, the memory budgets leave out anything of W's size, the
LoRA trainer trains only its adapters, and NF4's code is the published one. The wrong implementations are in
tests/mutants/fine_tune.py, run by tests/test_registry_entries.py."""
import pytest
import torch

import memfit
import memfit.from_lessons.fine_tune as ref
from autograder.checks import fine_tune as checks
from memfit.gpt import COURSE_CONFIGS
from memfit.training import Trainer, random_batch


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_nf4_matmul_is_dequantize_then_matmul(dtype):
    """The given QLoRA kernel: ragged M and N, every tile class the CPU has, a 3-D and a strided x."""
    gen, device = torch.Generator().manual_seed(0), memfit.DEVICE
    code = ref.nf4_code().to(device)
    for m, n, k in ((1, 96, 192), (5, 64, 64), (33, 200, 128), (300, 72, 256)):
        q = ref.quantize_nf4((torch.randn(n, k, generator=gen) * 0.05).to(device))
        x = torch.randn(m, k, generator=gen).to(device, dtype)
        exact = x.double() @ ref.dequantize_nf4(q).double().t()
        same = (x @ ref.dequantize_nf4(q).to(dtype).t()).double()
        got = ref.nf4_matmul(x, q.codes, q.absmax, code)
        assert got.dtype == dtype and got.shape == (m, n)
        tol = 2 * (same - exact).abs().max() + 4 * torch.finfo(dtype).eps * max(1.0, exact.abs().max().item())
        assert (got.double() - exact).abs().max() <= tol, (m, n, k, dtype)
    x3 = torch.randn(7, 2, 128, generator=gen).to(device, dtype).transpose(0, 1)  # 3-D, not contiguous
    q = ref.quantize_nf4((torch.randn(40, 128, generator=gen) * 0.05).to(device))
    expected = x3.float() @ ref.dequantize_nf4(q).t()
    got = ref.nf4_matmul(x3, q.codes, q.absmax, code).float()
    assert (got - expected).abs().max() <= 4 * torch.finfo(dtype).eps * expected.abs().max() * 8


def test_qlora_is_lora_on_the_dequantized_weight_and_its_fake_step_is_the_real_one():
    from memfit.meter import LIVE_TENSORS
    from memfit.training import measure_step
    torch.manual_seed(0)
    device = memfit.DEVICE
    base = torch.nn.Linear(128, 96, bias=False, device=device)
    q_layer = ref.QLoRALinear(base, 4, 8.0)
    torch.nn.init.normal_(q_layer.lora_b)
    dense = ref.LoRALinear(torch.nn.Linear(128, 96, bias=False, device=device), 4, 8.0)
    dense.weight.data = ref.dequantize_nf4(ref.quantize_nf4(base.weight.detach()))
    dense.lora_a.data, dense.lora_b.data = q_layer.lora_a.data.clone(), q_layer.lora_b.data.clone()
    xq, xd = (torch.randn(3, 5, 128, generator=torch.Generator().manual_seed(1)).to(device).requires_grad_()
              for _ in range(2))
    q_layer(xq).square().sum().backward()
    dense(xd).square().sum().backward()
    for a, b in ((xq.grad, xd.grad), (q_layer.lora_a.grad, dense.lora_a.grad), (q_layer.lora_b.grad, dense.lora_b.grad)):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)
    make = lambda: ref.qlora_trainer(COURSE_CONFIGS["tiny"], 4, device=device)  # noqa: E731
    real = measure_step(make(), 2, 32, meter=LIVE_TENSORS)
    fake = ref.fake_step_memory(make, 2, 32)
    assert fake.peak == real.peak and fake.states == real.states
    assert real.states["params"] < sum(ref.lora_state_bytes(COURSE_CONFIGS["tiny"], 4).values())  # NF4 is smaller


def test_the_course_kernels_give_the_model_pytorchs_loss_and_gradients():
    """The full plan's attention (lesson 05) and loss (lesson 06) in the course GPT: the same loss and gradients
    as PyTorch's attention and cross-entropy, in fp32 (interpreted on a CPU, compiled on a GPU)."""
    from memfit.gpt import GPT
    from memfit.training import random_batch
    cfg = COURSE_CONFIGS["tiny"]
    torch.manual_seed(0)
    plain = GPT(cfg).to(memfit.DEVICE)
    ours = GPT(cfg, **ref.course_kernels()).to(memfit.DEVICE)
    ours.load_state_dict(plain.state_dict())
    idx, targets = random_batch(cfg, 2, 40, memfit.DEVICE)  # 40: not a multiple of the kernels' tiles
    losses = [model(idx, targets) for model in (plain, ours)]
    for loss in losses:
        loss.backward()
    assert torch.allclose(losses[0], losses[1], rtol=1e-5)
    for (name, p), q in zip(plain.named_parameters(), ours.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-3, atol=1e-6 * p.grad.abs().max().item()), name


def _quantize_nf4_on_a_view(w):
    """Right, written the natural way: w's blocks as a view (strided for a transposed w), bucketize on them as is."""
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.dtype not in ref.BASE_DTYPES or w.shape[1] % 64:
        raise ValueError("w must be 2-D fp32/fp16/bf16 with a multiple of 64 columns")
    d_out, d_in = w.shape
    blocks = w.float().reshape(d_out, d_in // 64, 64)
    absmax = blocks.abs().amax(dim=-1)
    scaled = blocks / torch.where(absmax > 0, absmax, 1.0)[..., None]
    code = ref.nf4_code().to(w.device)
    index = torch.bucketize(scaled, (code[1:] + code[:-1]) / 2).to(torch.uint8).reshape(d_out, d_in)
    return ref.NF4((index[:, 0::2] << 4) | index[:, 1::2], absmax, tuple(w.shape), w.dtype)


def test_the_nf4_check_prints_no_warning_for_bucketize_on_its_strided_weight():
    """The check's transposed w makes torch.bucketize copy a strided input, and PyTorch warns (once per process):
    the check keeps that out of the learner's output. torch.set_warn_always makes the warning fire every time, so
    that an earlier test cannot have used it up."""
    import warnings
    transposed = next(c for c in checks.NF4_CASES if c.layout == "transposed" and not c.hidden
                      and c.dtype == torch.float32)
    torch.set_warn_always(True)
    try:
        with warnings.catch_warnings(record=True) as outside:
            warnings.simplefilter("always")
            _quantize_nf4_on_a_view(transposed.make())
        assert any("non-contiguous" in str(w.message) for w in outside)  # the path does warn
        with warnings.catch_warnings(record=True) as shown:
            warnings.simplefilter("always")
            checks.check_nf4(_quantize_nf4_on_a_view, ref.dequantize_nf4)
        assert not [str(w.message) for w in shown]
    finally:
        torch.set_warn_always(False)


def test_the_visible_fake_cases_hold_a_model_over_the_real_bytes_limit_and_the_kernels():
    """The visible cases stay short (a few layers of the large models), and still reject, in the notebook, a call that
    allocates the model for real (the guard's limit) and one under PyTorch's own FakeTensorMode (the kernels)."""
    from memfit.from_lessons.model_states import count_params
    visible = [c for c in checks.FAKE_CASES if not c.hidden]
    assert any(c.kernels for c in visible)
    assert any(c.formula and 2 * count_params(c.formula[0]) > 4 * checks.REAL_BYTES_LIMIT for c in visible)


def test_step_memory_of_one_micro_batch_is_fake_step_memory_and_accumulation_peaks_once():
    tiny = COURSE_CONFIGS["tiny"]
    make = lambda: ref.plan_trainer(ref.PLANS[2], tiny, "cpu")  # noqa: E731
    assert ref.step_memory(make, 2, 64) == ref.fake_step_memory(make, 2, 64)
    real = {k: ref.step_memory(lambda: Trainer(tiny, "fp32", "adamw", "none", "cpu"), 4, 64, k, fake=False).peak
            for k in (1, 2, 3)}
    assert real[1] < real[2] == real[3]
    trainer = Trainer(tiny, "fp32", "sgd", "none", "cpu")
    idx, targets = random_batch(tiny, 2, 16, "cpu")
    for accum in (0, 1.0, True):
        with pytest.raises(ValueError, match="accum must be a positive int"):
            trainer.step(idx, targets, accum)


@pytest.mark.parametrize("plan", [ref.PLANS[0], ref.PLANS[2], ref.PLANS[5]])
def test_peak_extrapolated_from_one_and_two_layers_is_the_deep_models(plan):
    import dataclasses
    cfg = dataclasses.replace(COURSE_CONFIGS["tiny"], n_layers=5)
    deep = ref.fake_step_memory(lambda: ref.plan_trainer(plan, cfg, "cpu"), 2, 64)
    assert ref.plan_memory(plan, cfg, 2, 64) == deep


def test_card_memory_and_model_config():
    assert ref.card_memory("T4") == memfit.hardware.profile_for("t4").total_memory
    with pytest.raises(ValueError, match="unknown card"):
        ref.card_memory("T5")
    assert ref.model_config("llama-3.1-8b").n_layers == 32


@pytest.mark.parametrize("plan", ref.PLANS)
def test_each_plan_extrapolates_to_llama_8b_whole_depth_and_grows_no_faster_than_its_line(plan):
    """What lesson 08 relies on for Llama-3.1-8B: each plan's peak from 1 and 2 layers is its 32 layers' within
    4 MiB (sections 5, 7 and 8; the plans with the fused loss land 1.9 MiB above at 32,768 tokens), at 4,096 and 32,768 tokens; and between those lengths the peak lies on or under the
    line through them (section 8's table reads the line: it must not promise a length that does not fit)."""
    from memfit.gpt import LLAMA_3_1_8B
    lengths = (4096, 16384, 32768)
    line = {s: ref.plan_memory(plan, LLAMA_3_1_8B, 1, s).peak for s in lengths}
    for s in (4096, 32768):
        whole = ref.fake_step_memory(lambda: ref.plan_trainer(plan, LLAMA_3_1_8B, "cpu"), 1, s).peak
        assert abs(line[s] - whole) <= 4 * 2**20, f"{plan} at {s} tokens: extrapolated {line[s]:,} B, whole depth {whole:,} B"
    on_line = line[4096] + (line[32768] - line[4096]) * (16384 - 4096) / (32768 - 4096)
    assert line[16384] <= on_line, f"{plan}: {line[16384]:,} B at 16,384 tokens, above the line's {on_line:,.0f} B"
