"""Checks of lesson 08 (solutions/08_fine_tune.ipynb): LoRA's bytes against models built with adapters and a
measured step, a LoRA autograd function's numerics (the course's rule) and memory (both meters), NF4's code
against its published table, NF4 quantize / dequantize byte for byte, and a step measured on fake tensors
against the real one and lesson 02's formula.

Each check iterates over a plan of case records; AXES lists what the exercises' text lets vary and case_axes reads
the same records. lora_function and nf4 also grade hidden cases drawn from their exercises' whole domains
(autograder/checks/domain.py)."""
from __future__ import annotations

import contextlib
import functools
import math
import random
import warnings
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import memfit
import memfit.from_lessons.fine_tune as reference  # imported before the grading child's guards go up
from autograder.checks import Check, CheckFailed, KernelSpec, call_learner, check_cases, select, expect_value_error
from autograder.checks.domain import Choice, Impossible, Sizes, grade_drawn
from autograder.checks.model_states import count_domain, drawn_config, drawn_gpt, gpt_domain
from autograder.checks.numerics import (assert_close_by_rule, case_dtypes, dtype_name, expect_like, seeded_generator,
                                        seeded_randn, summation_bound)
from memfit.gpt import COURSE_CONFIGS, GPT, LLAMA_3_1_8B, LLAMA_3_1_70B, LLAMA_3_2_1B, GPTConfig, unique_parameters
from memfit.meter import LIVE_TENSORS, format_bytes, open_meter


_plan = select  # (autograder/checks/__init__.py: one planner for every check module)


def _attention(cfg: GPTConfig) -> str:
    if cfg.n_kv_heads == cfg.n_heads:
        return "MHA"
    return "MQA" if cfg.n_kv_heads == 1 else "GQA"


# ------------------------------------------------------------------------------------------ lora_state_bytes

MQA = GPTConfig(vocab_size=1001, d_model=96, n_layers=5, n_heads=12, n_kv_heads=1, ffn_hidden=250, name="odd (MQA)")
TARGET_SETS = {"default": reference.DEFAULT_TARGETS, "all five": reference.LORA_TARGETS, "one": None, "two": None}


@dataclass(frozen=True)
class LoraBytesCase:
    cfg: GPTConfig
    r: int
    targets: tuple
    base_dtype: torch.dtype
    hidden: bool
    measured: bool = False  # also train one step and compare with the meter

    def axes(self) -> dict:
        kind = ("default" if self.targets == reference.DEFAULT_TARGETS else
                "all five" if self.targets == reference.LORA_TARGETS else "one" if len(self.targets) == 1 else "two")
        return {"targets": kind, "target": self.targets, "attention": _attention(self.cfg),
                "tied_head": self.cfg.tie_embeddings, "base_dtype": dtype_name(self.base_dtype),
                "r": "1" if self.r == 1 else "> 32" if self.r > 32 else "2-32",
                "size": "> int32" if self.cfg.n_layers * self.cfg.d_model ** 2 * 12 > 2**31 else "small",
                "measured": self.measured}

    def what(self) -> str:
        return (f"lora_state_bytes({self.cfg.name}, r={self.r}, targets={self.targets}, "
                f"base_dtype=torch.{dtype_name(self.base_dtype)})")


T8 = reference.DEFAULT_TARGETS
LORA_BYTES_CASES = [
    LoraBytesCase(COURSE_CONFIGS["tiny"], 8, T8, torch.bfloat16, False),
    LoraBytesCase(COURSE_CONFIGS["tiny-mha"], 4, ("wqkv", "head"), torch.float32, False, measured=True),
    LoraBytesCase(COURSE_CONFIGS["small"], 1, ("w2",), torch.float16, False),
    LoraBytesCase(LLAMA_3_1_8B, 64, reference.LORA_TARGETS, torch.bfloat16, False),
    LoraBytesCase(COURSE_CONFIGS["tiny"], 16, ("wo", "w13"), torch.float32, False, measured=True),
    LoraBytesCase(MQA, 2, ("wqkv", "w2"), torch.bfloat16, False),
    LoraBytesCase(COURSE_CONFIGS["medium"], 32, reference.LORA_TARGETS, torch.float16, True),
    LoraBytesCase(LLAMA_3_2_1B, 64, ("head", "w13"), torch.bfloat16, True),
    LoraBytesCase(MQA, 3, ("wqkv",), torch.float32, True),
    LoraBytesCase(LLAMA_3_1_70B, 16, T8, torch.bfloat16, True),
    LoraBytesCase(LLAMA_3_1_8B, 1, ("wo",), torch.float16, True),
    LoraBytesCase(COURSE_CONFIGS["tiny-mha"], 40, T8, torch.bfloat16, True, measured=True),
    LoraBytesCase(MQA, 5, ("w2", "head"), torch.float32, True, measured=True),
]


@dataclass(frozen=True)
class InvalidLoraCase:
    argument: str
    value: object
    hidden: bool

    def axes(self) -> dict:
        return {"invalid": self.argument}

    def call(self, fn):
        kwargs = {"r": 4, "targets": T8, "base_dtype": torch.bfloat16, self.argument: self.value}
        return lambda: fn(COURSE_CONFIGS["tiny"], kwargs["r"], kwargs["targets"], kwargs["base_dtype"])


INVALID_LORA_CASES = [
    InvalidLoraCase("r", 0, False), InvalidLoraCase("r", 2.0, False), InvalidLoraCase("targets", (), False),
    InvalidLoraCase("targets", ("wq",), False), InvalidLoraCase("targets", ("wo", "wo"), False),
    InvalidLoraCase("base_dtype", torch.int8, False),
    InvalidLoraCase("r", -3, True), InvalidLoraCase("r", True, True), InvalidLoraCase("targets", ("WQKV",), True),
    InvalidLoraCase("targets", ("w2", "w13", "w2"), True), InvalidLoraCase("base_dtype", torch.float64, True),
]


def _built_lora(cfg: GPTConfig, r: int, targets) -> tuple[int, int]:
    """(trainable, frozen) parameter counts of the model built on the meta device with the reference adapters."""
    with torch.device("meta"):
        model = reference.add_lora(GPT(cfg), r, 16.0, targets)
    params = unique_parameters(model)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    return trainable, sum(p.numel() for p in params) - trainable


@functools.lru_cache(maxsize=None)
def true_lora_counts(cfg: GPTConfig, r: int, targets: tuple) -> tuple[int, int]:
    """Built, not derived: a deep model's counts from its one- and two-layer versions (its layers are identical)."""
    if cfg.n_layers <= 2:
        return _built_lora(cfg, r, targets)
    one, two = _built_lora(cfg.scaled(n_layers=1), r, targets), _built_lora(cfg.scaled(n_layers=2), r, targets)
    return tuple(a + (cfg.n_layers - 1) * (b - a) for a, b in zip(one, two))


def expected_lora_bytes(cfg: GPTConfig, r: int, targets: tuple, base_dtype: torch.dtype) -> dict:
    trainable, frozen = true_lora_counts(cfg, r, tuple(targets))
    base = torch.empty((), dtype=base_dtype).element_size()
    return {"trainable": trainable, "params": frozen * base + 4 * trainable, "grads": 4 * trainable,
            "optimizer": 8 * trainable}


def measured_lora_bytes(cfg: GPTConfig, r: int, targets: tuple, base_dtype: torch.dtype) -> dict:
    """The bytes a real step leaves: parameters, the gradients after backward, AdamW's states after the step."""
    trainer = reference.lora_trainer(cfg, r, targets, base_dtype, device="cpu")
    from memfit.training import random_batch
    idx, tgt = random_batch(cfg, 2, 16, "cpu")
    loss = trainer.model(idx, tgt)
    loss.backward()
    params = unique_parameters(trainer.model)
    grads = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    trainer.optimizer.step()
    states = trainer.state_bytes()
    return {"trainable": sum(p.numel() for p in params if p.requires_grad), "params": states["params"],
            "grads": grads, "optimizer": states["optimizer"]}


def _lora_hint(case: LoraBytesCase, key: str, diff: int) -> str:
    cfg, r = case.cfg, case.r
    h, f, kv = cfg.d_model, cfg.ffn_hidden, cfg.n_kv_heads * cfg.head_dim
    per_block = {"wqkv": r * (2 * h + 2 * kv), "wo": r * 2 * h, "w13": r * (h + 2 * f), "w2": r * (f + h)}
    unit = {"trainable": 1, "params": 4, "grads": 4, "optimizer": 8}[key]
    hints: dict[int, list[str]] = {}

    def add(diff_: int, text: str) -> None:
        hints.setdefault(diff_, []).append(text)

    for name, v in per_block.items():
        add(unit * cfg.n_layers * v, f"the {name} adapters of every block")
        add(unit * v, f"one block's {name} adapter")
    add(unit * r * (h + cfg.vocab_size), "the head's adapter, r·(d_model + vocab_size)")
    add(unit * cfg.n_layers * r * 2 * (h - kv), "wqkv's output: d_model + 2·kv with kv = n_kv_heads·head_dim "
                                                "(grouped-query attention)")
    add(unit * cfg.n_layers * r * h, "w13's input: one matrix (gate and up fused), one adapter, r·(d_model + 2·ffn_hidden)")
    add(unit * cfg.n_layers * r * f, "w13's output is 2·ffn_hidden (gate and up in one matrix)")
    hint = " or ".join(hints.get(abs(diff), [])) or None
    if key == "params" and hint is None:
        base = torch.empty((), dtype=case.base_dtype).element_size()
        n = true_lora_counts(cfg, r, case.targets)
        if diff % n[1] == 0:
            hint = f"the frozen base's bytes per parameter ({base} in {dtype_name(case.base_dtype)})"
        elif diff == (4 - base) * n[0] or diff == -(4 - base) * n[0]:
            hint = "the adapters are fp32, whatever the base's dtype"
    return f" (the difference is {hint})" if hint else ""


def _compare_lora_bytes(got, want: dict, case: LoraBytesCase, source: str) -> None:
    if not isinstance(got, dict):
        raise CheckFailed(f"{case.what()} should return a dict with keys {sorted(want)}, got {type(got).__name__}")
    if set(got) != set(want):
        raise CheckFailed(f"{case.what()}: expected the keys {sorted(want)}, got {sorted(got)}")
    for key in ("trainable", "params", "grads", "optimizer"):
        value = got[key]
        if not isinstance(value, int) or isinstance(value, bool):
            raise CheckFailed(f"{case.what()}[{key!r}] should be an int, got {type(value).__name__} {value!r}")
        if value != want[key]:
            raise CheckFailed(f"{case.what()}[{key!r}]: expected {want[key]:,} ({source}), got {value:,}: off by "
                              f"{value - want[key]:+,}{_lora_hint(case, key, value - want[key])}")


def check_lora_state_bytes(lora_state_bytes, cases: str = "visible") -> None:
    for case in _plan(LORA_BYTES_CASES, cases):
        got = call_learner(lora_state_bytes, case.cfg, case.r, case.targets, case.base_dtype, what=case.what())
        _compare_lora_bytes(got, expected_lora_bytes(case.cfg, case.r, case.targets, case.base_dtype), case,
                            "the model built with the adapters")
        if case.measured:
            _compare_lora_bytes(got, measured_lora_bytes(case.cfg, case.r, case.targets, case.base_dtype), case,
                                "measured after a training step on the CPU")
    for case in _plan(INVALID_LORA_CASES, cases):
        expect_value_error(case.call(lora_state_bytes), what=f"lora_state_bytes(..., {case.argument}={case.value!r})",
                           why=f"for {case.argument}={case.value!r}")
    if check_cases(cases)[1]:
        def check_one(drawn: dict) -> None:
            targets = tuple(t for t in reference.LORA_TARGETS if t in drawn["targets"].split("+"))
            case = LoraBytesCase(drawn_config(drawn), drawn["r"], targets, getattr(torch, drawn["base_dtype"]), True)
            got = call_learner(lora_state_bytes, case.cfg, case.r, case.targets, case.base_dtype, what=case.what())
            _compare_lora_bytes(got, expected_lora_bytes(case.cfg, case.r, case.targets, case.base_dtype), case,
                                "the model built with the adapters")
        grade_drawn(lora_bytes_domain(), "lora_state_bytes", DRAWN_LORA_BYTES_CASES, check_one)


def lora_bytes_domain() -> dict:
    """Every call the text allows: any course GPT (lesson 01's count_params domain), any rank, any non-empty set of
    targets (as "+"-joined names: the default four first, then all five, then single ones), each base dtype."""
    names = reference.LORA_TARGETS
    subsets = ["+".join(reference.DEFAULT_TARGETS), "+".join(names), *names, "wqkv+wo", "w13+w2", "wqkv+head",
               "wo+w2+head"]
    return {**count_domain(), "r": Sizes(1, 512, edges=(1, 8, 16, 64)), "targets": Choice(*subsets),
            "base_dtype": Choice("bfloat16", "float16", "float32")}


DRAWN_LORA_BYTES_CASES = 12


# ------------------------------------------------------------------------------------ lora_function (numerics)

@dataclass(frozen=True)
class LoraCase:
    x_shape: tuple  # the shape x has (its strides: `layout`)
    d_out: int
    r: int
    scale: float
    hidden: bool
    dtype: torch.dtype = torch.float32
    layout: str = "contiguous"  # "contiguous", "transposed" (a permuted view), "strided last dim"
    x_grad: bool = True
    seed: int = 0
    adapters: str = "trainable"  # ADAPTERS: which of lora_a and lora_b require a gradient

    @property
    def d_in(self) -> int:
        return self.x_shape[-1]

    def axes(self) -> dict:
        return {"rank": len(self.x_shape), "dtype": dtype_name(self.dtype), "layout": self.layout,
                "x_requires_grad": self.x_grad, "scale": "1" if self.scale == 1 else "other",
                "r": "1" if self.r == 1 else "> 1", "d_out": "= d_in" if self.d_out == self.d_in else "!= d_in",
                "adapters": self.adapters}

    def what(self) -> str:
        return (f"LoRAFunction.apply(x {tuple(self.x_shape)} {self.layout} {dtype_name(self.dtype)}"
                f"{'' if self.x_grad else ' without requires_grad'}, weight ({self.d_out}, {self.d_in}), lora_a "
                f"({self.r}, {self.d_in}), lora_b ({self.d_out}, {self.r}), scale={self.scale}"
                f"{'' if self.adapters == 'trainable' else ', ' + self.adapters})")

    def make(self, device=None):
        """x, weight, lora_a, lora_b, dy on the device, with the layout asked for."""
        device = device or memfit.DEVICE
        shape = list(self.x_shape)
        if self.layout == "transposed":  # a permuted view of a contiguous tensor: leading dims swapped
            base = seeded_randn([shape[1], shape[0]] + shape[2:], self.dtype, self.seed)
            x = base.transpose(0, 1)
        elif self.layout == "strided last dim":  # every other column of a wider tensor
            base = seeded_randn(shape[:-1] + [2 * shape[-1]], self.dtype, self.seed)
            x = base[..., ::2]
        else:
            x = seeded_randn(shape, self.dtype, self.seed)
        x = x.to(device).detach().requires_grad_(self.x_grad)
        w = seeded_randn((self.d_out, self.d_in), self.dtype, self.seed + 1, 1 / math.sqrt(self.d_in)).to(device)
        a = seeded_randn((self.r, self.d_in), self.dtype, self.seed + 2, 1 / math.sqrt(self.d_in)).to(device)
        b = seeded_randn((self.d_out, self.r), self.dtype, self.seed + 3, 0.5).to(device)
        dy = seeded_randn(tuple(shape[:-1]) + (self.d_out,), self.dtype, self.seed + 4).to(device)
        return (x, w, a.requires_grad_(self.adapters in ("trainable", "lora_b frozen")),
                b.requires_grad_(self.adapters in ("trainable", "lora_a frozen")), dy)


def _lora_dtypes() -> tuple:
    """fp32 and the 16-bit dtypes this machine multiplies in (a CPU does both; a T4 no bf16)."""
    if memfit.DEVICE.type == "cpu":
        return (torch.float32, torch.float16, torch.bfloat16)
    return case_dtypes(True)


LORA_DTYPES = _lora_dtypes()


def _numerics_cases() -> list[LoraCase]:
    cases = [LoraCase((37, 96), 80, 8, 2.0, False),
             LoraCase((2, 19, 64), 128, 4, 0.5, False, layout="transposed"),
             LoraCase((64,), 48, 1, 1.0, False, seed=3),
             LoraCase((16, 64), 64, 16, 1.0, False, x_grad=False, seed=4),
             LoraCase((5, 3, 128), 96, 2, 0.25, False, layout="strided last dim", seed=5)]
    for dtype in LORA_DTYPES[1:]:
        cases.append(LoraCase((33, 128), 96, 8, 2.0, False, dtype=dtype, seed=6))
    cases += [LoraCase((12, 64), 48, 4, 1.0, False, seed=7, adapters=adapters)  # what needs_input_grad may say
              for adapters in ("frozen", "lora_a frozen", "lora_b frozen")]
    hidden = [LoraCase((3, 33, 160), 96, 12, 0.25, True, seed=11),
              LoraCase((70, 32), 200, 1, 4.0, True, layout="strided last dim", seed=12),
              LoraCase((130,), 130, 3, 1.0, True, seed=13),
              LoraCase((4, 7, 96), 96, 32, 1.0, True, layout="transposed", x_grad=False, seed=14),
              LoraCase((2, 11, 80), 40, 5, 0.5, True, seed=17, adapters="frozen"),
              LoraCase((19, 72), 72, 3, 2.0, True, seed=18, x_grad=False, adapters="lora_a frozen"),
              LoraCase((23, 48), 64, 6, 1.0, True, seed=19, adapters="lora_b frozen")]
    for dtype in LORA_DTYPES[1:]:
        hidden += [LoraCase((2, 41, 96), 72, 6, 0.5, True, dtype=dtype, layout="transposed", seed=15),
                   LoraCase((48, 256), 128, 16, 2.0, True, dtype=dtype, x_grad=False, seed=16)]
    return cases + hidden


NUMERICS_CASES = _numerics_cases()


def _composite(x, w, a, b, scale, dy):
    """PyTorch's own y and gradients (x, a, b) by autograd, in the inputs' dtype."""
    x, a, b = (t.detach().requires_grad_(t.requires_grad) for t in (x, a, b))
    y = x @ w.t() + scale * ((x @ a.t()) @ b.t())
    y.backward(dy)
    return y.detach(), (x.grad if x.requires_grad else None), a.grad, b.grad


def _named(call, function, method: str):
    """`call`, named after the learner's class and its method (a stub's message then says "LoRAFunction.forward",
    not "apply")."""
    def named(*args):
        return call(*args)
    named.__name__ = f"{getattr(function, '__name__', 'LoRAFunction')}.{method}"
    named.__learner_call__ = method == "forward"  # (a backward's decoy would accumulate gradients twice)
    return named


def _run_learner(fn, case: LoraCase, x, w, a, b, dy):
    y = call_learner(_named(fn.apply, fn, "forward"), x, w, a, b, case.scale, what=case.what())
    expect_like(y, torch.empty(tuple(case.x_shape[:-1]) + (case.d_out,), dtype=case.dtype, device=x.device),
                f"{case.what()}, y")
    if not y.requires_grad:
        raise CheckFailed(f"{case.what()}: y does not require a gradient: return the result of the forward's "
                          "computation (autograd attaches LoRAFunction's backward to it)")
    call_learner(_named(y.backward, fn, "backward"), dy, what=f"{case.what()}, then y.backward(dy) (your backward)")
    return y


def lora_domain() -> dict:
    """Every call exercise 2 allows: x of rank 1 to 4, contiguous, a permuted view or strided in its last dimension,
    with or without a gradient; d_in, d_out and r from 1 (r above d_in too), several scales, each dtype
    (autograder/checks/domain.py draws hidden cases from it)."""
    return {"rank": Choice(2, 1, 3, 4), "tokens": Sizes(1, 64, edges=(1,)), "lead": Sizes(1, 4),
            "d_in": Sizes(1, 160, edges=(1,)), "d_out": Sizes(1, 160, edges=(1,)), "r": Sizes(1, 32, edges=(1,)),
            "scale": Choice(1.0, 2.0, 0.25, 16.0), "dtype": Choice(*(dtype_name(d) for d in LORA_DTYPES)),
            "layout": Choice("contiguous", "transposed", "strided last dim"), "x_requires_grad": Choice(True, False),
            "adapters": Choice(*ADAPTERS)}


ADAPTERS = ("trainable", "lora_a frozen", "lora_b frozen", "frozen")  # what ctx.needs_input_grad may say of them


def _drawn_lora_case(d: dict) -> LoraCase:
    rank, tokens, lead = d["rank"], d["tokens"], d["lead"]
    if rank == 1 and d["layout"] == "transposed":
        raise Impossible()  # a 1-D x has no leading dimensions to permute
    if d["adapters"] == "frozen" and not d["x_requires_grad"]:
        raise Impossible()  # nothing requires a gradient: no backward to check
    lead_dims = {1: (), 2: (tokens,), 3: (lead, tokens), 4: (lead, 2, tokens)}[rank]
    return LoraCase((*lead_dims, d["d_in"]), d["d_out"], d["r"], d["scale"], True, getattr(torch, d["dtype"]),
                    d["layout"], d["x_requires_grad"], d["seed"], d["adapters"])


DRAWN_LORA_CASES = 8


def check_lora_function(lora_function, cases: str = "visible") -> None:
    for case in _plan(NUMERICS_CASES, cases):
        _check_lora_case(lora_function, case)
    bad = LoraCase((8, 64), 32, 4, 1.0, False)
    x, w, a, b, _ = bad.make()
    for label, args in (("weight of shape (32, 48) for x's 64 features", (x, w[:, :48], a, b)),
                        ("lora_b of shape (32, 3) for lora_a's rank 4", (x, w, a, b[:, :3]))):
        expect_value_error(lambda *t: lora_function.apply(*t, 1.0), *args, what=f"LoRAFunction.apply with a {label}",
                           why="(call check_lora_inputs first)")
    _check_two_forwards(lora_function)
    if check_cases(cases)[1]:
        grade_drawn(lora_domain(), "lora_function", DRAWN_LORA_CASES,
                    lambda d: _check_lora_case(lora_function, _drawn_lora_case(d)))


def _check_two_forwards(lora_function) -> None:
    """One layer called on two inputs before one backward (a layer shared by two micro-batches, or recomputed): each
    backward uses its own forward's saved tensors, and the adapters' gradients are the two calls' sum."""
    first, second = LoraCase((9, 40), 24, 4, 2.0, False, seed=21), LoraCase((13, 40), 24, 4, 0.5, False, seed=22)
    x1, w, a, b, dy1 = first.make()
    x2, _, _, _, dy2 = second.make()
    what = "two calls of LoRAFunction.apply with one weight, lora_a and lora_b (x of 9 and 13 tokens, scales 2 and 0.5)"
    forward = _named(lora_function.apply, lora_function, "forward")
    y1 = call_learner(forward, x1, w, a, b, first.scale, what=what + ", the first")
    y2 = call_learner(forward, x2, w, a, b, second.scale, what=what + ", the second")
    loss = lambda y1, y2: (y1.float() * dy1.float()).sum() + (y2.float() * dy2.float()).sum()  # noqa: E731
    call_learner(_named(loss(y1, y2).backward, lora_function, "backward"), what=what + ", then one backward of both")
    e1, e2 = (_composite(*(t.detach().double().requires_grad_(t.requires_grad) for t in (x, w, a, b)), c.scale,
                         dy.double()) for x, dy, c in ((x1, dy1, first), (x2, dy2, second)))
    m1, m2 = (_composite(*(t.detach().double().abs().requires_grad_(t.requires_grad) for t in (x, w, a, b)), c.scale,
                         dy.double().abs()) for x, dy, c in ((x1, dy1, first), (x2, dy2, second)))
    for name, got, exact, magnitude in (("dx of the first", x1.grad, e1[1], m1[1]),
                                        ("dx of the second", x2.grad, e2[1], m2[1]),
                                        ("d lora_a", a.grad, e1[2] + e2[2], m1[2] + m2[2]),
                                        ("d lora_b", b.grad, e1[3] + e2[3], m1[3] + m2[3])):
        if got is None:
            raise CheckFailed(f"{what}: {name} is None after the backward")
        assert_close_by_rule(got, exact, exact.to(got.dtype), f"{what}: {name} (each backward must use what its own "
                             "forward saved on ctx, nothing kept on the class or the module between calls)",
                             bound=summation_bound(magnitude, 22 + 40 + 24 + 4, torch.float32))


def _check_lora_case(lora_function, case: LoraCase) -> None:
    x, w, a, b, dy = case.make()
    y = _run_learner(lora_function, case, x, w, a, b, dy)
    x64, w64, a64, b64 = (t.detach().double().requires_grad_(t.requires_grad) for t in (x, w, a, b))
    exact = _composite(x64, w64, a64, b64, case.scale, dy.double())
    same = _composite(x, w, a, b, case.scale, dy)
    # Σ|terms| of each element: the same products on the inputs' magnitudes; every sum has fewer terms than these
    magnitude = _composite(*(t.detach().double().abs().requires_grad_(t.requires_grad) for t in (x, w, a, b)),
                           abs(case.scale), dy.double().abs())
    terms = math.prod(case.x_shape[:-1]) + case.d_in + case.d_out + case.r
    hint = {"y": " (y = x Wᵀ + scale · (x Aᵀ) Bᵀ)", "dx": " (dx = dy W + scale · (dy B) A)",
            "d lora_a": " (dA = scale · (dy B)ᵀ x, summed over every token)",
            "d lora_b": " (dB = scale · dyᵀ (x Aᵀ), summed over every token)"}
    for name, got, e, s, m in (("y", y, exact[0], same[0], magnitude[0]),
                               ("dx", x.grad, exact[1], same[1], magnitude[1]),
                               ("d lora_a", a.grad, exact[2], same[2], magnitude[2]),
                               ("d lora_b", b.grad, exact[3], same[3], magnitude[3])):
        if e is None:
            continue
        if got is None:
            raise CheckFailed(f"{case.what()}: {name} is None after y.backward(dy): return it from backward"
                              f"{hint[name]}")
        try:
            assert_close_by_rule(got, e, s, f"{case.what()}, {name}",
                                 bound=summation_bound(m, terms, case.dtype))
        except CheckFailed as exc:
            raise CheckFailed(f"{exc}{hint[name]}") from None


# -------------------------------------------------------------------------------------- lora_memory

@dataclass(frozen=True)
class MemoryCase:
    lora: LoraCase
    meter: str  # "live-tensors" or "cuda-allocator"

    @property
    def hidden(self) -> bool:
        return self.lora.hidden

    def axes(self) -> dict:
        return {**{k: v for k, v in self.lora.axes().items() if k in ("rank", "layout", "x_requires_grad", "dtype")},
                "meter": self.meter}


def _memory_cases() -> list[MemoryCase]:
    # tokens well below d_out and d_in: a tensor of W's size (d_out x d_in) is several times any budget below
    loras = [LoraCase((24, 256), 192, 8, 2.0, False),
             LoraCase((2, 12, 256), 192, 4, 0.5, False, layout="transposed"),
             LoraCase((32, 256), 128, 4, 1.0, False, x_grad=False),
             LoraCase((256,), 256, 2, 1.0, False),
             LoraCase((3, 8, 320), 256, 8, 1.0, False, dtype=torch.float16, layout="strided last dim", seed=20),
             LoraCase((20, 320), 256, 16, 1.0, True, dtype=torch.float16, seed=21),
             LoraCase((3, 10, 384), 256, 8, 0.25, True, layout="strided last dim", seed=22),
             LoraCase((2, 16, 320), 256, 4, 2.0, True, layout="transposed", x_grad=False, seed=23),
             LoraCase((320,), 192, 1, 1.0, True, dtype=torch.float16, seed=24)]
    loras += [LoraCase((2, 10, 320), 256, 8, 0.5, False, dtype=torch.bfloat16, layout="transposed", seed=25),
              LoraCase((24, 384), 256, 4, 2.0, True, dtype=torch.bfloat16, x_grad=False, seed=26)]
    loras = [case for case in loras if case.dtype in LORA_DTYPES]  # no bf16 on a T4
    meters = [LIVE_TENSORS] + (["cuda-allocator"] if torch.cuda.is_available() else [])
    return [MemoryCase(lora, m) for lora in loras for m in meters]


MEMORY_CASES = _memory_cases()
SLACK = 1024  # bytes: a scalar or two (the scale as a tensor, a shape)


def lora_budgets(case: LoraCase) -> dict:
    """The bytes the exercise's text allows: kept = x Aᵀ; the forward's peak = four tensors of y's size (x Wᵀ,
    (x Aᵀ) Bᵀ and its scaled copy, then y, their sum, when it is not made in place), two of x Aᵀ's size (x Aᵀ and a
    temporary) and, x strided, a copy of x; the backward's = dA and dB, four tensors of x's size when x needs a
    gradient (dx and three temporaries: dy W, (dy B) A and its scaled copy), two of x Aᵀ's size (dy B and a temporary)
    and one of y's; without dx, one of x's size for a strided x's reshaped copy only.
    Nothing of W's size anywhere: W is larger than any of these budgets in every case."""
    e = torch.empty((), dtype=case.dtype).element_size()
    tokens = math.prod(case.x_shape[:-1])
    x_b, y_b, xa_b = tokens * case.d_in * e, tokens * case.d_out * e, tokens * case.r * e
    strided = case.layout != "contiguous"
    grads = case.r * case.d_in * e + case.d_out * case.r * e
    if case.x_grad:
        backward = 4 * x_b + grads + 2 * xa_b + y_b  # dx and three temporaries of its size, dA, dB, dy·B and one more
    else:
        backward = grads + 2 * xa_b + (x_b if strided else 0) + y_b  # no dx: x's size only for a strided x's copy
    return {"kept": xa_b + SLACK, "forward": 4 * y_b + 2 * xa_b + (x_b if strided else 0) + SLACK,
            "backward": backward + SLACK, "weight": case.d_out * case.d_in * e, "x": x_b, "xa": xa_b}


def _storage_bytes(*tensors) -> int:
    return sum(t.untyped_storage().nbytes() for t in {id(t.untyped_storage()): t for t in tensors}.values())


def _weight_sized(meter, peak: int, budget: dict) -> bool:
    """Did a tensor of W's size exist? The live meter knows its largest storage; the allocator only the peak."""
    largest = getattr(meter, "largest", None)
    return (largest if largest is not None else peak) >= budget["weight"]


def check_lora_memory(lora_function, cases: str = "visible") -> None:
    for mcase in _plan(MEMORY_CASES, cases):
        _lora_memory_case(lora_function, mcase)
    if check_cases(cases)[1]:
        def check_one(d: dict) -> None:
            if d["adapters"] != "trainable":
                raise Impossible()  # (the budgets are for trainable adapters)
            _lora_memory_case(lora_function, MemoryCase(_drawn_lora_case(d), LIVE_TENSORS))
        grade_drawn(lora_memory_domain(), "lora_memory", DRAWN_LORA_MEMORY_CASES, check_one)


def lora_memory_domain() -> dict:
    """lora_function's domain where a tensor of W's size is several times every budget: few tokens, wide layers,
    small ranks."""
    return {**lora_domain(), "tokens": Sizes(1, 24, edges=(1,)), "lead": Sizes(1, 2), "d_in": Sizes(192, 384),
            "d_out": Sizes(192, 320), "r": Sizes(1, 16, edges=(1,)), "adapters": Choice("trainable")}


DRAWN_LORA_MEMORY_CASES = 2


def _lora_memory_case(lora_function, mcase: MemoryCase) -> None:
    device = memfit.DEVICE
    case, budget = mcase.lora, lora_budgets(mcase.lora)
    what = f"{case.what()} on the {mcase.meter} meter"
    x, w, a, b, dy = case.make(device)
    warm = call_learner(_named(lora_function.apply, lora_function, "forward"), x, w, a, b, case.scale, what=case.what())  # workspaces
    call_learner(_named(warm.backward, lora_function, "backward"), dy, what=f"{case.what()}, then y.backward(dy) (your backward)")
    del warm
    x.grad = a.grad = b.grad = None
    with open_meter(device, mcase.meter) as meter:
        meter.reset_peak()
        y = call_learner(_named(lora_function.apply, lora_function, "forward"), x, w, a, b, case.scale, what=case.what())
        forward_peak = meter.peak
        kept = meter.current - _storage_bytes(y)
    wsize = format_bytes(budget["weight"])
    if kept > budget["kept"]:
        copy = " (that is a copy of x: save x itself, and reshape it in backward)" if kept >= budget["x"] else ""
        raise CheckFailed(f"{what}: the forward keeps {format_bytes(kept)} beyond y until the backward; x Aᵀ is "
                          f"{format_bytes(budget['xa'])} and x is saved by reference{copy}")
    if forward_peak > budget["forward"]:
        why = (f"W is {wsize}: do not form W + scale·B A" if _weight_sized(meter, forward_peak, budget)
               else "free each temporary once it is added (or add in place)")
        raise CheckFailed(f"{what}: the forward's peak is {format_bytes(forward_peak)}, over the budget of "
                          f"{format_bytes(budget['forward'])} (four tensors of y's size, two of x Aᵀ's"
                          f"{', one of x' if case.layout != 'contiguous' else ''}); {why}")
    with open_meter(device, mcase.meter) as meter:
        meter.reset_peak()
        call_learner(_named(y.backward, lora_function, "backward"), dy, what=f"{case.what()}, then y.backward(dy) (your backward)")
        backward_peak = meter.peak
    if backward_peak > budget["backward"]:
        why = ("x does not require a gradient here: compute dx only when ctx.needs_input_grad[0]; "
               if not case.x_grad else "")
        if not why:
            why = (f"W, whose gradient is not needed, is {wsize}: nothing of its size belongs in the backward; "
                   if _weight_sized(meter, backward_peak, budget) else
                   "dA, dB, four tensors of x's size (dx among them), two of x Aᵀ's and one of y's; ")
        raise CheckFailed(f"{what}: the backward's peak is {format_bytes(backward_peak)}, over the budget of "
                          f"{format_bytes(budget['backward'])} ({why.rstrip('; ')})")
    del y


# ------------------------------------------------------------------------------------------ nf4_code

# QLoRA (Dettmers et al., 2023, arXiv 2305.14314), appendix E; bitsandbytes' NF4 table
PUBLISHED_NF4 = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                 -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                 0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                 0.7229568362236023, 1.0)
CODE_TOLERANCE = 2.5e-7  # two fp32 ulps at 1: the published values were computed through fp32 probabilities


@dataclass(frozen=True)
class CodeCase:
    hidden: bool
    calls: int  # the hidden case calls twice: a code must not depend on a previous call

    def axes(self) -> dict:
        return {"levels": "all 16"}


CODE_CASES = [CodeCase(False, 1), CodeCase(True, 2)]


def check_nf4_code(nf4_code, cases: str = "visible") -> None:
    published = torch.tensor(PUBLISHED_NF4, dtype=torch.float64)
    for case in _plan(CODE_CASES, cases):
        for _ in range(case.calls):
            got = call_learner(nf4_code, what="nf4_code()")
            if not isinstance(got, torch.Tensor) or got.dtype != torch.float32 or tuple(got.shape) != (16,):
                raise CheckFailed(f"nf4_code() should return 16 fp32 values, got "
                                  f"{getattr(got, 'dtype', type(got).__name__)} of shape {tuple(getattr(got, 'shape', ()))}")
            got64 = got.detach().cpu().double()
            if not bool((got64[1:] > got64[:-1]).all()):
                raise CheckFailed(f"nf4_code() should be sorted ascending, got {[round(v, 4) for v in got64.tolist()]}")
            err = (got64 - published).abs()
            if err.max() > CODE_TOLERANCE:
                i = int(err.argmax())
                hint = ""
                if (got64 > 0).sum() != 8 or (got64 < 0).sum() != 7:
                    hint = (f": {int((got64 > 0).sum())} levels above zero and {int((got64 < 0).sum())} below, NF4 has "
                            "8 and 7 (positive quantiles from linspace(δ, 0.5, 9)[:-1], negative from "
                            "linspace(δ, 0.5, 8)[:-1], and 0)")
                elif abs(got64.abs().max() - 1) > 1e-6:
                    hint = ": divide by the largest |level| so the ends are -1 and 1"
                raise CheckFailed(f"nf4_code()[{i}]: expected {published[i]:.9f} (published), got {got64[i]:.9f}: off by "
                                  f"{got64[i] - published[i]:+.2e}, more than {CODE_TOLERANCE:g}{hint}")
            if got64[7] != 0 or got64[0] != -1 or got64[15] != 1:
                raise CheckFailed(f"nf4_code(): level 7 must be exactly 0 and the ends exactly -1 and 1, got "
                                  f"{got64[7].item()!r}, {got64[0].item()!r}, {got64[15].item()!r}")


# ----------------------------------------------------------------------------------------------- nf4

@dataclass(frozen=True)
class NF4Case:
    rows: int
    cols: int
    dtype: torch.dtype
    values: str  # "gaussian", "ties" (exact midpoints, ±1, zero blocks), "magnitudes" (tiny, huge, negative max)
    hidden: bool
    layout: str = "contiguous"  # or "transposed": a transposed view
    seed: int = 0

    def axes(self) -> dict:
        return {"dtype": dtype_name(self.dtype), "values": self.values, "layout": self.layout,
                "blocks per row": "1" if self.cols == 64 else "several"}

    def what(self) -> str:
        return f"quantize_nf4(w: {self.rows} x {self.cols} {dtype_name(self.dtype)}, {self.values}, {self.layout})"

    def make(self) -> torch.Tensor:
        gen = seeded_generator(self.seed)
        w = torch.randn(self.rows, self.cols, generator=gen, dtype=torch.float64) * 0.02
        if self.values == "ties":
            code = reference.nf4_code()
            mids = (code[1:] + code[:-1]) / 2
            special = torch.cat([mids, -mids.flip(0), code, torch.tensor([1.0, -1.0, 0.0, 0.5])]).double()
            flat = w.reshape(-1)
            for start in range(0, flat.numel(), 2 * 64):  # every other block: exact ties under an absmax of 1
                block = flat[start:start + 64]
                block.copy_(special[torch.randint(0, special.numel(), (block.numel(),), generator=gen)])
                block[0] = 1.0
            if self.rows > 1:
                w[-1, :64] = 0.0  # a block of zeros
        elif self.values == "magnitudes":
            scales = torch.tensor([1e-30, 1e-6, 1.0, 3e4], dtype=torch.float64)
            w = w * scales[torch.randint(0, 4, (self.rows, self.cols // 64, 1), generator=gen)].repeat_interleave(
                64, dim=1).view(self.rows, self.cols)
            w[0, :64] = -w[0, :64].abs()
            w[0, 5] = -0.08  # a block whose largest magnitude is negative
        if self.dtype != torch.float32 and self.values == "magnitudes":
            w = w.clamp(-6e4, 6e4).where(w.abs() > 1e-7, 0.0)  # fp16's range
        w = w.to(self.dtype)
        if self.layout == "transposed":
            w = w.t().contiguous().t()
        return w.to(memfit.DEVICE)


NF4_CASES = [NF4Case(4, 128, torch.float32, "ties", False), NF4Case(8, 192, torch.bfloat16, "gaussian", False, seed=1),
             NF4Case(3, 64, torch.float16, "magnitudes", False, seed=2),
             NF4Case(6, 128, torch.float32, "gaussian", False, layout="transposed", seed=3),
             NF4Case(16, 256, torch.float32, "magnitudes", False, seed=4),
             NF4Case(64, 512, torch.float16, "gaussian", True, seed=11),
             NF4Case(10, 640, torch.float32, "ties", True, seed=12),
             NF4Case(5, 64, torch.bfloat16, "magnitudes", True, layout="transposed", seed=13),
             NF4Case(33, 320, torch.bfloat16, "ties", True, seed=14),
             NF4Case(7, 1024, torch.float32, "gaussian", True, layout="transposed", seed=15),
             NF4Case(2, 64, torch.float32, "magnitudes", True, seed=16)]


@dataclass(frozen=True)
class InvalidNF4Case:
    label: str
    hidden: bool

    def axes(self) -> dict:
        return {"invalid": self.label}

    def make(self):
        return {"1-D": lambda: torch.zeros(128), "3-D": lambda: torch.zeros(2, 2, 64),
                "int": lambda: torch.zeros(2, 64, dtype=torch.int32),
                "columns not a multiple of 64": lambda: torch.zeros(2, 96),
                "float64": lambda: torch.zeros(2, 64, dtype=torch.float64)}[self.label]().to(memfit.DEVICE)


INVALID_NF4_CASES = [InvalidNF4Case(label, hidden) for hidden in (False, True)
                     for label in ("1-D", "3-D", "int", "columns not a multiple of 64", "float64")]


def _indices(codes: torch.Tensor) -> torch.Tensor:
    return torch.stack([codes >> 4, codes & 15], dim=-1).reshape(codes.shape[0], -1).long()


def _compare_nf4(got, want, case: NF4Case, w: torch.Tensor) -> None:
    what = case.what()
    for attr in ("codes", "absmax", "shape", "dtype"):
        if not hasattr(got, attr):
            raise CheckFailed(f"{what} should return an NF4 (codes, absmax, shape, dtype), got {type(got).__name__} "
                              f"without .{attr}")
    if tuple(got.shape) != tuple(w.shape) or got.dtype != w.dtype:
        raise CheckFailed(f"{what}: the NF4's shape and dtype should be the weight's, {tuple(w.shape)} and "
                          f"{dtype_name(w.dtype)}; got {tuple(got.shape)} and {got.dtype}")
    expect_like(got.absmax, want.absmax, f"{what}, absmax")
    expect_like(got.codes, want.codes, f"{what}, codes")
    if not torch.equal(got.absmax, want.absmax):
        bad = (got.absmax != want.absmax).nonzero()[0].tolist()
        raise CheckFailed(f"{what}: absmax{tuple(bad)} expected {want.absmax[tuple(bad)].item()!r} (max |w| of the "
                          f"block, in fp32), got {got.absmax[tuple(bad)].item()!r}")
    if not torch.equal(got.codes, want.codes):
        gi, wi = _indices(got.codes), _indices(want.codes)
        row, col = (gi != wi).nonzero()[0].tolist()
        code = reference.nf4_code()
        g, e = gi[row, col].item(), wi[row, col].item()
        scaled = w[row, col].float() / want.absmax[row, col // 64].clamp_min(torch.finfo(torch.float32).tiny)
        hint = ""
        if torch.equal(gi.view(-1, 2).flip(1).reshape(gi.shape), wi):
            hint = ": the nibbles are swapped (column 2j goes in the high nibble of byte j)"
        elif abs(g - e) == 1 and scaled.item() in ((code[1:] + code[:-1]) / 2).tolist():
            hint = ": the value is exactly a midpoint, which goes to the lower level"
        raise CheckFailed(f"{what}: the code of w[{row}, {col}] = {w[row, col].item()!r} (w / absmax = "
                          f"{scaled.item()!r}) should be index {e} (level {code[e].item():.6f}), got index {g} "
                          f"(level {code[g].item():.6f}){hint}")


@contextlib.contextmanager
def _strided_search_copies_quietly():
    """The check's transposed w, viewed in blocks, is a strided tensor: torch.bucketize (the text's way) copies it and
    warns once, about speed. A copy is no mistake: the check keeps that warning out of the learner's output."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.searchsorted\(\): input value tensor is non-contiguous")
        yield


def nf4_domain() -> dict:
    """Every weight exercise 4 allows: 1 row or more, one block of 64 per row or several, each dtype, each kind of
    values of NF4_CASES, contiguous or a transposed view."""
    return {"rows": Sizes(1, 40, edges=(1, 2)), "blocks": Sizes(1, 12, edges=(1, 2)),
            "dtype": Choice("float32", "float16", "bfloat16"), "values": Choice("gaussian", "ties", "magnitudes"),
            "layout": Choice("contiguous", "transposed")}


DRAWN_NF4_CASES = 4


def check_nf4(quantize_nf4, dequantize_nf4, cases: str = "visible") -> None:
    for case in _plan(NF4_CASES, cases):
        _check_nf4_case(quantize_nf4, dequantize_nf4, case)
    for case in _plan(INVALID_NF4_CASES, cases):
        expect_value_error(quantize_nf4, case.make(), what=f"quantize_nf4 of a {case.label} tensor",
                           why=f"for a {case.label} tensor")
    if check_cases(cases)[1]:
        def check_one(d: dict) -> None:
            case = NF4Case(d["rows"], 64 * d["blocks"], getattr(torch, d["dtype"]), d["values"], True, d["layout"],
                           d["seed"])
            _check_nf4_case(quantize_nf4, dequantize_nf4, case)
        grade_drawn(nf4_domain(), "nf4", DRAWN_NF4_CASES, check_one)


def _check_nf4_case(quantize_nf4, dequantize_nf4, case: NF4Case) -> None:
    w = case.make()
    before = w.clone()
    with _strided_search_copies_quietly():
        got = call_learner(quantize_nf4, w, what=case.what())
    if not torch.equal(w, before):
        raise CheckFailed(f"{case.what()} changed w: quantize a copy")
    want = reference.quantize_nf4(w)
    _compare_nf4(got, want, case, w)
    # dequantize is checked on the reference's NF4, so that a quantize bug is not counted twice
    given = reference.NF4(want.codes.clone(), want.absmax.clone(), want.shape, want.dtype)
    what = f"dequantize_nf4(quantize_nf4(w: {case.rows} x {case.cols} {dtype_name(case.dtype)}, {case.values}))"
    w_hat = call_learner(dequantize_nf4, given, what=what)
    exact = reference.dequantize_nf4(want)
    expect_like(w_hat, exact, what)
    err = (w_hat.double() - exact.double()).abs()
    tol = 0.5 * torch.finfo(case.dtype).eps * exact.double().abs()  # in fp32, then one rounding: exact
    if bool((err > tol).any()):
        i = int((err - tol).argmax())
        row, col = divmod(i, case.cols)
        raise CheckFailed(f"{what}[{row}, {col}]: expected {exact[row, col].item()!r} (level × absmax, in fp32, "
                          f"then {dtype_name(case.dtype)}), got {w_hat[row, col].item()!r}")


# ------------------------------------------------------------------------------------------ fake_step_memory

@dataclass(frozen=True)
class FakeCase:
    label: str
    make: object = field(compare=False)  # a trainer factory (device "cpu", or the machine's for a real kernel step)
    batch: int = 2
    seq: int = 64
    real: bool = True  # compare with the same step on real tensors (small models only)
    formula: tuple | None = None  # (config, precision, recompute): lesson 02's predict_peak, within 2%
    hidden: bool = False
    recipe: str = "full"
    kernels: bool = False  # the model runs the course's Triton kernels (lesson 05's attention, lesson 06's loss)

    def axes(self) -> dict:
        return {"recipe": self.recipe, "kernels": self.kernels,
                "compared with": ("real step" if self.real else "formula, no real memory" if self.formula
                                  else "the reference's prediction, no real memory")}


def _trainer(cfg, precision, recompute="none", optimizer="adamw", kernels=False):
    from memfit.training import Trainer
    own = reference.course_kernels() if kernels else {}
    # (the kernels' real steps on the machine's device: a GPU's compiled Triton cannot read CPU tensors)
    return lambda: Trainer(cfg, precision, optimizer, recompute, device=memfit.DEVICE if kernels else "cpu", **own)


# Models of billions of parameters, far over the 256 MiB of real tensors the learner's call may hold. A fake step's time
# grows with its number of operations, so with the layers: these keep the widths and recipes of full-size models with a
# few of their layers (the same code runs in every layer). The notebook itself runs Llama-3.1-8B whole (section 5).
DEEP = GPTConfig(vocab_size=32_000, d_model=4096, n_layers=8, n_heads=32, n_kv_heads=8, ffn_hidden=14_336,
                 max_seq_len=4096, name="a 2B model (13B's widths, 8 layers)")
LLAMA_8B_2_LAYERS = LLAMA_3_1_8B.scaled(n_layers=2, name="Llama-3.1-8B's shapes, 2 of its 32 layers")
LLAMA_8B_4_LAYERS = LLAMA_3_1_8B.scaled(n_layers=4, name="Llama-3.1-8B's shapes, 4 of its 32 layers")
# (8 layers and the whole vocabulary, 2.8B parameters: lesson 02's formula agrees to the byte, as on all 32 layers,
# in a quarter of the time)
LLAMA_8B_8_LAYERS = LLAMA_3_1_8B.scaled(n_layers=8, name="Llama-3.1-8B's shapes, 8 of its 32 layers")
FAKE_CASES = [
    FakeCase("course-tiny, fp32, AdamW", _trainer(COURSE_CONFIGS["tiny"], "fp32")),
    FakeCase("course-tiny-mha, LoRA r=4, fp32 base", lambda: reference.lora_trainer(
        COURSE_CONFIGS["tiny-mha"], 4, base_dtype=torch.float32, device="cpu"), batch=3, seq=32, recipe="LoRA"),
    FakeCase(f"{DEEP.name}, bf16, full recomputation", _trainer(DEEP, "bf16", "full"), batch=1, seq=256, real=False,
             formula=(DEEP, "bf16", "full")),
    FakeCase(f"{LLAMA_8B_2_LAYERS.name}, the plan {reference.PLANS[1]!r}",
             lambda: reference.plan_trainer(reference.PLANS[1], LLAMA_8B_2_LAYERS, "cpu"), batch=1, seq=1024,
             real=False, kernels=True),
    FakeCase("course-tiny, amp, selective recomputation", _trainer(COURSE_CONFIGS["tiny"], "amp", "selective"),
             batch=3, seq=48, hidden=True),
    FakeCase("course-tiny, LoRA r=8 on every target, bf16 base, full recomputation", lambda: reference.lora_trainer(
        COURSE_CONFIGS["tiny"], 8, reference.LORA_TARGETS, torch.bfloat16, "full", device="cpu"), hidden=True,
        recipe="LoRA"),
    FakeCase(f"{LLAMA_8B_8_LAYERS.name}, amp, no recomputation", _trainer(LLAMA_8B_8_LAYERS, "amp"), batch=2,
             seq=1024, real=False, formula=(LLAMA_8B_8_LAYERS, "amp", "none"), hidden=True),
    FakeCase(f"{LLAMA_8B_4_LAYERS.name}, LoRA r=16, bf16 base",
             lambda: reference.lora_trainer(LLAMA_8B_4_LAYERS, 16, device="cpu"), batch=1, seq=512, real=False,
             hidden=True, recipe="LoRA"),
    FakeCase("course-tiny, fp32, AdamW, lesson 05's attention and lesson 06's loss",
             _trainer(COURSE_CONFIGS["tiny"], "fp32", kernels=True), batch=1, seq=24, hidden=True, kernels=True),
]
REAL_BYTES_LIMIT = 256 * 2**20  # what the learner's call may allocate for real: far below any of these models


class _RealAllocations(TorchDispatchMode):
    """Raises once the call holds more than REAL_BYTES_LIMIT of real (not fake) tensors it created."""

    def __init__(self):
        super().__init__()
        import weakref
        self._weakref, self.live, self.sizes = weakref, 0, {}

    def _release(self, key):
        self.live -= self.sizes.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch._subclasses.fake_tensor import FakeTensor
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor) and t.device.type != "meta":
                storage = t.untyped_storage()
                if id(storage) not in self.sizes:
                    self.sizes[id(storage)] = storage.nbytes()
                    self.live += storage.nbytes()
                    self._weakref.finalize(storage, self._release, id(storage))
        if self.live > REAL_BYTES_LIMIT:
            raise CheckFailed(f"fake_step_memory created {format_bytes(self.live)} of real tensors: build the trainer "
                              "(make_trainer()) and run measure_step inside FakeTensorMode, where tensors have no memory")
        return out


def _step_fields(got, what: str):
    if not (hasattr(got, "peak") and hasattr(got, "states")):
        raise CheckFailed(f"{what} should return measure_step's StepMemory (.peak, .states), got {type(got).__name__}")
    return got.peak, dict(got.states)


def fake_domain() -> dict:
    """Every step the text allows that a CPU also runs on real tensors in a moment: a small GPT (lesson 02's drawn
    ones), trained in full in each precision and recomputation or with LoRA adapters of any rank on a base of each
    dtype, any batch and sequence length."""
    return {**gpt_domain(), "recipe": Choice("full", "LoRA"), "precision": Choice("fp32", "amp", "bf16"),
            "recompute": Choice("none", "selective", "full"), "r": Sizes(1, 16, edges=(1,)),
            "base_dtype": Choice("float32", "bfloat16"), "batch": Sizes(1, 3, edges=(1,)),
            "seq": Sizes(1, 64, edges=(1,))}


DRAWN_FAKE_CASES = 2


def _drawn_fake_case(d: dict) -> FakeCase:
    cfg = drawn_gpt(d)
    if d["recipe"] == "LoRA":
        base = getattr(torch, d["base_dtype"])
        make = lambda: reference.lora_trainer(cfg, d["r"], base_dtype=base, device="cpu")  # noqa: E731
        label = f"{cfg.name}, LoRA r={d['r']}, {d['base_dtype']} base"
    else:
        make = _trainer(cfg, d["precision"], d["recompute"])
        label = f"{cfg.name}, {d['precision']}, recompute={d['recompute']}"
    return FakeCase(label, make, d["batch"], d["seq"], hidden=True, recipe=d["recipe"])


def check_fake_step_memory(fake_step_memory, cases: str = "visible") -> None:
    for case in _plan(FAKE_CASES, cases):
        _fake_case(fake_step_memory, case)
    if check_cases(cases)[1]:
        grade_drawn(fake_domain(), "fake_step_memory", DRAWN_FAKE_CASES,
                    lambda d: _fake_case(fake_step_memory, _drawn_fake_case(d)))


def _fake_case(fake_step_memory, case: FakeCase) -> None:
    from memfit.from_lessons.activations import predict_peak
    from memfit.training import measure_step
    what = f"fake_step_memory({case.label}, batch={case.batch}, seq={case.seq})"
    with _RealAllocations():  # (a kernel launched on fake tensors outside FakeTensors says so: memfit.fake)
        got = call_learner(fake_step_memory, case.make, case.batch, case.seq, what=what)
    peak, states = _step_fields(got, what)
    if case.real:
        real = measure_step(case.make(), case.batch, case.seq, meter=LIVE_TENSORS)
        if states != real.states:
            raise CheckFailed(f"{what}: states {states} differ from the real step's {real.states}")
        if peak != real.peak:
            raise CheckFailed(f"{what}: peak {peak:,} B, the same step on real tensors {real.peak:,} B: measure the "
                              "steady-state step as measure_step does (the warm-up step creates the optimizer's "
                              "states), with the live-tensor meter")
    if not case.real and not case.formula:
        want = reference.fake_step_memory(case.make, case.batch, case.seq)
        if (peak, states) != (want.peak, dict(want.states)):
            raise CheckFailed(f"{what}: peak {peak:,} B and states {states}; the step measured on fake tensors "
                              f"as measure_step measures it: peak {want.peak:,} B, states {dict(want.states)}")
    if case.formula:
        cfg, precision, recompute = case.formula
        want = predict_peak(cfg, case.batch, case.seq, precision, "adamw", recompute)["peak"]
        if abs(peak / want - 1) > 0.02:
            raise CheckFailed(f"{what}: peak {format_bytes(peak)}, lesson 02's formula {format_bytes(want)} "
                              f"({peak / want - 1:+.1%}; the two agree within 2% on these models)")


# ------------------------------------------------------------------------------------------------ plan

class CountingPredictor:
    """A predictor of the check's own: peak(plan, seq) = base[plan] + per_token[plan] · seq, counting its calls."""

    def __init__(self, base: dict, per_token: dict | None = None):
        self.base, self.per_token, self.calls = base, per_token or {}, []

    def __call__(self, plan, cfg, seq):
        self.calls.append((plan, seq))
        if plan not in self.base:
            raise CheckFailed(f"predict was called with plan={plan!r}: call it with the names of PLANS")
        return self.base[plan] + self.per_token.get(plan, 0) * seq


GIB = 2**30


@dataclass(frozen=True)
class PlanCase:
    label: str
    card: int
    peaks: tuple  # each plan's peak (bytes), in PLANS' order
    hidden: bool
    seq: int = 512

    def axes(self) -> dict:
        return {"plan case": self.label}


def _budget(card: int) -> float:
    return reference.HEADROOM * card


PLAN_CASES = [  # peaks in PLANS' order (8 plans)
    PlanCase("the first plan fits", 100 * GIB, (50 * GIB, 40 * GIB, 30 * GIB, 20 * GIB, 1, 10 * GIB, 5 * GIB, 1), False),
    PlanCase("a later plan fits", 24 * GIB, (150 * GIB, 75 * GIB, 44 * GIB, 21 * GIB, 1, 34 * GIB, 13 * GIB, 1), False),
    PlanCase("a peak exactly at the budget", 10**10, (10**10, 9 * 10**9, 8 * 10**9, 7 * 10**9, 1, 6 * 10**9, 5 * 10**9, 1),
             False),
    PlanCase("the preferred plan, not the smallest", 16 * GIB, (40 * GIB, 14 * GIB, 12 * GIB, 10 * GIB, 1, 6 * GIB, 4 * GIB, 1),
             False),
    PlanCase("nothing fits", 15 * GIB, (150 * GIB, 75 * GIB, 44 * GIB, 22 * GIB, 18 * GIB, 34 * GIB, 14 * GIB, 14 * GIB), False),
    PlanCase("a peak one byte over the budget", 10**10, (9 * 10**9 + 1, 9 * 10**9, 1, 1, 1, 1, 1, 1), False),
    PlanCase("a peak one byte over the budget", 4 * 10**10, (4 * 10**10, 36 * 10**9 + 1, 36 * 10**9, 1, 1, 1, 1, 1), True),
    PlanCase("the first plan fits", 80 * 10**9, (70 * GIB, 45 * GIB, 43 * GIB, 22 * GIB, 1, 34 * GIB, 13 * GIB, 1), True),
    PlanCase("a later plan fits", 40 * 10**9, (150 * GIB, 45 * GIB, 43 * GIB, 22 * GIB, 1, 34 * GIB, 13 * GIB, 1), True),
    PlanCase("a peak exactly at the budget", 2 * 10**10, (3 * 10**10, 2 * 10**10, 18 * 10**9, 1, 1, 1, 1, 1), True),
    PlanCase("the preferred plan, not the smallest", 90 * GIB, (100 * GIB, 80 * GIB, 60 * GIB, 30 * GIB, 1, 20 * GIB, GIB, 1),
             True),
    PlanCase("nothing fits", GIB, (9 * GIB, 8 * GIB, 7 * GIB, 6 * GIB, 3 * GIB, 5 * GIB, 2 * GIB, GIB), True),
    PlanCase("only a plan with the course's kernels fits", 24 * GIB,
             (150 * GIB, 75 * GIB, 44 * GIB, 30 * GIB, 19 * GIB, 34 * GIB, 25 * GIB, 9 * GIB), False),
    PlanCase("only a plan with the course's kernels fits", 12 * GIB,
             (150 * GIB, 45 * GIB, 43 * GIB, 22 * GIB, 12 * GIB, 34 * GIB, 13 * GIB, 9 * GIB), True),
]


@dataclass(frozen=True)
class TokensCase:
    label: str
    max_seq_len: int
    base: int
    per_token: int
    card: int
    hidden: bool

    def axes(self) -> dict:
        return {"tokens case": self.label}

    def expected(self) -> int:
        steps = [s for s in range(reference.SEQ_STEP, self.max_seq_len + 1, reference.SEQ_STEP)
                 if self.base + self.per_token * s <= _budget(self.card)]
        return max(steps, default=0)


TOKENS_CASES = [
    TokensCase("an answer in the middle", 131_072, 16 * GIB, 1_000_000, 40 * GIB, False),
    TokensCase("a peak exactly at the budget", 8192, 9 * 10**9 - 4096 * 10**6, 10**6, 10**10, False),
    TokensCase("not even one step fits", 65_536, 20 * GIB, 10**6, 15 * GIB, False),
    TokensCase("a peak one byte over the budget", 8192, 9 * 10**9 - 4096 * 10**6 + 1, 10**6, 10**10, False),
    TokensCase("a peak one byte over the budget", 65_536, 18 * 10**9 - 2048 * 10**6 + 1, 10**6, 2 * 10**10, True),
    TokensCase("everything fits (max_seq_len not a multiple)", 1000, GIB, 10, 80 * GIB, False),
    TokensCase("an answer in the middle", 131_072, 5 * GIB, 3_000_000, 80 * 10**9, True),
    TokensCase("a peak exactly at the budget", 32_768, 18 * 10**9 - 256 * 10**6, 10**6, 2 * 10**10, True),
    TokensCase("not even one step fits", 4096, 14 * GIB, 1, 15 * GIB, True),
    TokensCase("everything fits (max_seq_len not a multiple)", 131_000, GIB, 1, 80 * GIB, True),
]


@dataclass(frozen=True)
class InvalidPlanCase:
    argument: str
    value: object
    hidden: bool
    function: str = "plan_fine_tune"  # card_bytes: each function checks its own

    def axes(self) -> dict:
        return {"invalid": f"{self.argument} ({self.function})"}


INVALID_PLAN_CASES = [InvalidPlanCase("card_bytes", 0, False), InvalidPlanCase("seq", 0, False),
                      InvalidPlanCase("seq", 10**9, False), InvalidPlanCase("plan", "LoRA", False, "most_tokens"),
                      InvalidPlanCase("card_bytes", 2.5e10, False, "most_tokens"),
                      InvalidPlanCase("card_bytes", 1.5e10, True), InvalidPlanCase("seq", -4, True),
                      InvalidPlanCase("card_bytes", True, True), InvalidPlanCase("plan", "lora r=16, bf16 base", True,
                                                                                 "most_tokens"),
                      InvalidPlanCase("card_bytes", -1, True, "most_tokens"), InvalidPlanCase("seq", 513, True)]


@dataclass(frozen=True)
class MeasuredPlanCase:
    """course-tiny with the reference's fake predictor, a budget that lets exactly `plan` fit first."""
    plan: str
    seq: int
    hidden: bool

    def axes(self) -> dict:
        return {"measured": "course-tiny, fake-tensor predictor"}


MEASURED_PLAN_CASES = [MeasuredPlanCase(reference.PLANS[2], 64, False), MeasuredPlanCase(reference.PLANS[3], 64, True)]


def _tiny_predictor():
    cache = {}

    def predict(plan, cfg, seq):
        if (plan, seq) not in cache:
            cache[(plan, seq)] = reference.fake_peak(plan, cfg, seq)
        return cache[(plan, seq)]
    return predict


def check_plan(plan_fine_tune, most_tokens, cases: str = "visible") -> None:
    plans = reference.PLANS
    tiny = COURSE_CONFIGS["tiny"]
    for case in _plan(PLAN_CASES, cases):
        _plan_case(plan_fine_tune, case)
    for case in _plan(TOKENS_CASES, cases):
        _tokens_case(most_tokens, case)
    if check_cases(cases)[1]:
        grade_drawn(PLAN_DOMAIN, "plan", DRAWN_PLAN_CASES, lambda d: (_plan_case(plan_fine_tune, _drawn_plan_case(d)),
                                                                     _tokens_case(most_tokens, _drawn_tokens_case(d))))
    for case in _plan(INVALID_PLAN_CASES, cases):
        predict = CountingPredictor(dict.fromkeys(plans, 1))
        if case.argument == "plan":
            call = (lambda: most_tokens(10**10, tiny, case.value, predict))
        elif case.argument == "seq":
            call = (lambda: plan_fine_tune(10**10, tiny, case.value, predict))
        elif case.function == "most_tokens":
            call = (lambda: most_tokens(case.value, tiny, reference.PLANS[2], predict))
        else:
            call = (lambda: plan_fine_tune(case.value, tiny, 64, predict))
        expect_value_error(call, what=f"{case.function} with {case.argument}={case.value!r}",
                           why=f"for {case.argument}={case.value!r}")
    for case in _plan(MEASURED_PLAN_CASES, cases):
        predict = _tiny_predictor()
        index = plans.index(case.plan)
        peaks = {p: predict(p, tiny, case.seq) for p in plans[:index + 1]}
        card = math.ceil(peaks[case.plan] / reference.HEADROOM)
        if any(peaks[p] <= _budget(card) for p in plans[:index]):
            raise AssertionError(f"the check's budget for {case.plan} lets an earlier plan fit")  # the check's own bug
        what = f"plan_fine_tune({card:,} bytes, {tiny.name}, seq={case.seq}) with the fake-tensor predictor"
        got = call_learner(plan_fine_tune, card, tiny, case.seq, predict, what=what)
        if not isinstance(got, dict) or got.get("plan") != case.plan:
            raise CheckFailed(f"{what}: expected the plan {case.plan!r} (predicted {peaks[case.plan]:,} B), got {got}")
        from memfit.training import measure_step
        real = measure_step(reference.plan_trainer(case.plan, tiny, "cpu"), 1, case.seq, meter=LIVE_TENSORS)
        if real.peak > _budget(card):  # the reference's predictor is exact on real steps: a learner cannot cause this
            raise AssertionError(f"{case.plan}: measured {real.peak:,} B over the budget {_budget(card):,.0f}")


def _plan_case(plan_fine_tune, case: "PlanCase") -> None:
    plans, tiny = reference.PLANS, COURSE_CONFIGS["tiny"]
    predict = CountingPredictor(dict(zip(plans, case.peaks)))
    what = f"plan_fine_tune({case.card:,} bytes, {tiny.name}, seq={case.seq}) ({case.label}; peaks {case.peaks})"
    got = call_learner(plan_fine_tune, case.card, tiny, case.seq, predict, what=what)
    fitting = [p for p, peak in zip(plans, case.peaks) if peak <= _budget(case.card)]
    want = {"plan": fitting[0], "peak": case.peaks[plans.index(fitting[0])]} if fitting else None
    if got != want:
        raise CheckFailed(f"{what}: expected {want}, got {got} (the first of PLANS, in their order, whose peak is at "
                          f"most HEADROOM × card_bytes = {_budget(case.card):,.0f})")
    needed = plans.index(fitting[0]) + 1 if fitting else len(plans)
    if len(predict.calls) > needed:
        raise CheckFailed(f"{what}: predict was called {len(predict.calls)} times, {needed} are needed: stop at the "
                          "first plan that fits")


def _tokens_case(most_tokens, case: "TokensCase") -> None:
    plans = reference.PLANS
    cfg = COURSE_CONFIGS["tiny"].scaled(max_seq_len=case.max_seq_len)
    predict = CountingPredictor({plans[2]: case.base}, {plans[2]: case.per_token})
    what = (f"most_tokens({case.card:,} bytes, max_seq_len {case.max_seq_len:,}, peak = {case.base:,} + "
            f"{case.per_token:,} × seq) ({case.label})")
    got = call_learner(most_tokens, case.card, cfg, plans[2], predict, what=what)
    if got != case.expected():
        raise CheckFailed(f"{what}: expected {case.expected():,}, got {got!r} (the largest multiple of "
                          f"{reference.SEQ_STEP} up to max_seq_len whose peak is at most {_budget(case.card):,.0f}; "
                          "0 if none)")
    limit = math.ceil(math.log2(case.max_seq_len // reference.SEQ_STEP + 1)) + 2
    if len(predict.calls) > limit:
        raise CheckFailed(f"{what}: predict was called {len(predict.calls)} times: a bisection needs at most {limit}")


# Every planning question the text allows: a card of any size, each plan's peak far below, at, one byte over or far
# over the budget (drawn per plan from the case's seed), and a sequence limit of any length for most_tokens, whose
# answer lands anywhere from none to all of it.
PLAN_DOMAIN = {"card": Sizes(10**6, 10**12, edges=(10**6, 80 * 10**9)), "max_seq_len": Sizes(1, 131_072, edges=(1, 4096)),
               "answer": Choice("in the middle", "at the budget", "one byte over", "none", "all")}
DRAWN_PLAN_CASES = 20
_PEAK_KINDS = ("far below", "at the budget", "one byte over", "far over")


def _drawn_plan_case(d: dict) -> "PlanCase":
    rng, budget = random.Random(d["seed"]), math.floor(_budget(d["card"]))
    peak = {"far below": lambda: rng.randint(1, max(1, budget // 2)), "at the budget": lambda: budget,
            "one byte over": lambda: budget + 1, "far over": lambda: rng.randint(budget + 2, 3 * budget + 2)}
    peaks = tuple(peak[rng.choice(_PEAK_KINDS)]() for _ in reference.PLANS)
    return PlanCase("drawn", d["card"], peaks, True)


def _drawn_tokens_case(d: dict) -> "TokensCase":
    rng, budget, step = random.Random(d["seed"] + 1), math.floor(_budget(d["card"])), reference.SEQ_STEP
    steps = d["max_seq_len"] // step  # the multiples of SEQ_STEP up to max_seq_len
    per_token = rng.randint(1, max(1, budget // max(1, d["max_seq_len"])))
    answer = {"none": 0, "all": steps, "in the middle": rng.randint(0, steps), "at the budget": rng.randint(0, steps),
              "one byte over": rng.randint(0, steps)}[d["answer"]]
    if d["answer"] == "none":
        base = budget - step * per_token + 1
    elif d["answer"] == "all":
        base = rng.randint(0, max(0, budget - steps * step * per_token))
    else:  # the answer-th multiple fits (exactly at the budget, or one byte under the next), the next does not
        base = budget - answer * step * per_token - (0 if d["answer"] != "in the middle" else rng.randint(0, per_token - 1))
        if d["answer"] == "one byte over":  # the next multiple is one byte over (where there is a next one)
            answer = min(answer, max(0, steps - 1))
            base = budget - (answer + 1) * step * per_token + 1
    return TokensCase("drawn", d["max_seq_len"], base, per_token, d["card"], True)


# ------------------------------------------------------------------------------------------ the lesson's table

AXES = {
    "lora_state_bytes": {"targets": ("default", "all five", "one", "two"), "target": reference.LORA_TARGETS,
                         "attention": ("MHA", "GQA", "MQA"), "tied_head": (False, True),
                         "base_dtype": ("float32", "float16", "bfloat16"), "r": ("1", "2-32", "> 32"),
                         "size": ("small", "> int32"), "measured": (False, True),
                         "invalid": ("r", "targets", "base_dtype")},
    "lora_function": {"rank": (1, 2, 3), "dtype": ("float32", "float16", "bfloat16"),
                      "layout": ("contiguous", "transposed", "strided last dim"), "x_requires_grad": (True, False),
                      "scale": ("1", "other"), "r": ("1", "> 1"), "d_out": ("= d_in", "!= d_in"), "adapters": ADAPTERS},
    "lora_memory": {"rank": (1, 2, 3), "layout": ("contiguous", "transposed", "strided last dim"),
                    "x_requires_grad": (True, False), "dtype": ("float32", "float16", "bfloat16"),
                    "meter": (LIVE_TENSORS,)},
    "nf4_code": {"levels": ("all 16",)},
    "nf4": {"dtype": ("float32", "float16", "bfloat16"), "values": ("gaussian", "ties", "magnitudes"),
            "layout": ("contiguous", "transposed"), "blocks per row": ("1", "several"),
            "invalid": ("1-D", "3-D", "int", "columns not a multiple of 64", "float64")},
    "fake_step_memory": {"recipe": ("full", "LoRA"), "kernels": (False, True),
                         "compared with": ("real step", "formula, no real memory",
                                           "the reference's prediction, no real memory")},
    "plan": {"plan case": tuple(dict.fromkeys(c.label for c in PLAN_CASES)),
             "tokens case": tuple(dict.fromkeys(c.label for c in TOKENS_CASES)),
             "invalid": ("card_bytes (plan_fine_tune)", "card_bytes (most_tokens)", "seq (plan_fine_tune)",
                         "plan (most_tokens)"), "measured": ("course-tiny, fake-tensor predictor",)},
}

_RECORDS = {"lora_state_bytes": (LORA_BYTES_CASES, INVALID_LORA_CASES), "lora_function": (NUMERICS_CASES,),
            "lora_memory": (MEMORY_CASES,), "nf4_code": (CODE_CASES,), "nf4": (NF4_CASES, INVALID_NF4_CASES),
            "fake_step_memory": (FAKE_CASES,),
            "plan": (PLAN_CASES, TOKENS_CASES, INVALID_PLAN_CASES, MEASURED_PLAN_CASES)}


def case_axes(check: str, cases: str) -> list[dict]:
    """The cases `check` runs under `cases`, each as {axis: value}: read from the records the check iterates over."""
    return [record.axes() for records in _RECORDS[check] for record in _plan(records, cases)]


# the given NF4 matmul (QLoRA's base): compiled for every profile, T4 and V100 included, in each tile class
KERNELS = [KernelSpec("nf4_matmul_kernel", "nf4_matmul",
                      {"x_ptr": "*{dtype}", "codes_ptr": "*u8", "absmax_ptr": "*fp32", "code_ptr": "*fp32",
                       "y_ptr": "*{dtype}", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_ym": "i32"},
                      dtypes=(dtype,), variant=variant, constexprs=dict(IEEE=dtype == "fp32", EMULATE_BF16=False))
           for variant in ("m16", "m64", "m256", "m_large") for dtype in ("fp16", "fp32")]

CHECKS = [
    Check("lora_state_bytes", 2, check_lora_state_bytes, uses=("lora_state_bytes",)),
    Check("lora_function", 3, check_lora_function, uses=("LoRAFunction",)),
    Check("lora_memory", 2, check_lora_memory, uses=("LoRAFunction",)),
    Check("nf4_code", 1, check_nf4_code, uses=("nf4_code",)),
    Check("nf4", 3, check_nf4, uses=("quantize_nf4", "dequantize_nf4")),
    Check("fake_step_memory", 2, check_fake_step_memory, uses=("fake_step_memory",), timeout_s=300.0),
    Check("plan", 3, check_plan, uses=("plan_fine_tune", "most_tokens"), timeout_s=300.0),
]
