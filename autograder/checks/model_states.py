"""Checks of lesson 01 (solutions/01_model_states.ipynb): exact parameter counts and the bytes of
parameters, gradients and optimizer states, against models built by PyTorch and measured tensors.

Each check iterates over a plan of case records (COUNT_CASES, BYTES_CASES, INVALID_CASES, MEASURED_CASES); AXES
lists what the exercises' text lets vary and case_axes reads the same records. No exercise of this lesson takes
or returns a tensor, so there is no dtype, out=, memory, aliasing or guard-region axis: the recipes' dtypes are
the `precision` axis, and the measured check trains on the CPU on every machine (bytes per element do not depend
on the device)."""
from __future__ import annotations

import functools
import numbers
from dataclasses import dataclass

import torch

import memfit.from_lessons.model_states as reference  # imported before the grading child's guards go up
from autograder.checks import Check, CheckFailed, CheckSkipped, call_learner, check_cases, select
from autograder.checks.domain import Choice, Sizes, grade_drawn
from memfit.gpt import (COURSE_CONFIGS, GPT, LLAMA_3_1_8B, LLAMA_3_1_70B, LLAMA_3_1_405B, LLAMA_3_2_1B, GPTConfig,
                        n_params, unique_parameters)

INT32_MAX = 2**31 - 1

# ------------------------------------------------------------------------------------ count_params

ODD = GPTConfig(vocab_size=1001, d_model=96, n_layers=5, n_heads=12, n_kv_heads=1, ffn_hidden=250, name="odd (MQA)")
# one layer, tied, multi-query, f = 3.5 h: edge values a small visible case shows and a hidden one varies
ONE_LAYER = GPTConfig(vocab_size=500, d_model=64, n_layers=1, n_heads=4, n_kv_heads=1, ffn_hidden=224,
                      tie_embeddings=True, name="one-layer (MQA, tied)")
ONE_LAYER_HIDDEN = GPTConfig(vocab_size=3001, d_model=48, n_layers=1, n_heads=6, n_kv_heads=1, ffn_hidden=168,
                             tie_embeddings=True, name="one-layer-b (MQA, tied)")


def _attention(cfg: GPTConfig) -> str:
    if cfg.n_kv_heads == cfg.n_heads:
        return "MHA"
    return "MQA" if cfg.n_kv_heads == 1 else "GQA"


@dataclass(frozen=True)
class CountCase:
    cfg: GPTConfig
    hidden: bool

    def axes(self) -> dict:
        cfg = self.cfg
        return {"attention": _attention(cfg), "tied_head": cfg.tie_embeddings,
                "ffn_hidden": "3.5 h" if 2 * cfg.ffn_hidden == 7 * cfg.d_model else "other",
                "n_layers": "1" if cfg.n_layers == 1 else "several",
                "count": "> int32" if true_param_count(cfg) > INT32_MAX else "<= int32"}


COUNT_CASES = ([CountCase(cfg, False) for cfg in (COURSE_CONFIGS["tiny"], COURSE_CONFIGS["tiny-mha"], ONE_LAYER,
                                                  LLAMA_3_1_8B)]
               + [CountCase(cfg, True) for cfg in (LLAMA_3_1_70B, LLAMA_3_1_405B, LLAMA_3_2_1B, COURSE_CONFIGS["small"],
                                                   COURSE_CONFIGS["medium"], ODD, ONE_LAYER_HIDDEN)])
COUNT_VISIBLE = [c.cfg for c in COUNT_CASES if not c.hidden]  # read by slides/figures/01_model_states.py
COUNT_HIDDEN = [c.cfg for c in COUNT_CASES if c.hidden]


def _built_count(cfg: GPTConfig) -> int:
    with torch.device("meta"):
        return n_params(GPT(cfg))


@functools.lru_cache(maxsize=None)
def true_param_count(cfg: GPTConfig) -> int:
    """The count of the real model, built on the meta device (shapes only, no memory). Layers are identical, so
    a deep model is counted from its one- and two-layer versions: built, not derived from a formula."""
    if cfg.n_layers <= 2:
        return _built_count(cfg)
    one, two = _built_count(cfg.scaled(n_layers=1)), _built_count(cfg.scaled(n_layers=2))
    return one + (cfg.n_layers - 1) * (two - one)


def _count_hint(cfg: GPTConfig, diff: int) -> str:
    h, kv, L = cfg.d_model, cfg.n_kv_heads * cfg.head_dim, cfg.n_layers
    hints = {cfg.vocab_size * h: "one vocab x d_model matrix: the embedding or the output head (tied or not?)",
             (2 * L + 1) * h: "the RMSNorm weights (two per layer and a final one)",
             2 * L * h: "the two RMSNorm weights of each layer", h: "the final RMSNorm",
             2 * L * h * (h - kv): "the K and V projections: with grouped-query attention they are h x kv, "
                                   "kv = n_kv_heads * head_dim",
             L * h * cfg.ffn_hidden: "one of the three SwiGLU matrices"}
    hint = hints.get(abs(diff)) if diff else None
    return f" (the difference is {hint})" if hint else ""


def _describe(cfg: GPTConfig) -> str:
    return (f"{cfg.name}: vocab {cfg.vocab_size}, d_model {cfg.d_model}, {cfg.n_layers} layers, {cfg.n_heads} heads, "
            f"{cfg.n_kv_heads} kv heads, ffn {cfg.ffn_hidden}, {'tied' if cfg.tie_embeddings else 'untied'}")


_plan = select  # (autograder/checks/__init__.py: one planner for every check module)


def count_domain() -> dict:
    """Every course GPT the text allows: any vocabulary, width, depth and FFN size, heads in groups over the KV heads
    (MHA, GQA, MQA), tied or untied."""
    return {"n_layers": Sizes(1, 160, edges=(1, 2, 126)), "vocab_size": Sizes(1, 262_144, edges=(1, 32_000, 128_256)),
            "kv_heads": Sizes(1, 16, edges=(1, 8)), "group": Sizes(1, 16, edges=(1, 8)),
            "head_dim": Sizes(1, 256, edges=(1, 64, 128)), "ffn_hidden": Sizes(1, 65_536, edges=(1, 14_336)),
            "tie_embeddings": Choice(False, True)}


DRAWN_COUNT_CASES = 20


def gpt_domain() -> dict:
    """Small GPTs a CPU runs a step of in a moment (lessons 02, 04 and 08 measure drawn ones): heads in groups over
    the KV heads (MHA, GQA, MQA), head dims RoPE takes (even), any FFN and vocabulary size, tied or not."""
    return {"kv_heads": Sizes(1, 4, edges=(1,)), "group": Sizes(1, 4, edges=(1,)),
            "head_dim": Choice(8, 2, 4, 16, 24), "ffn_hidden": Sizes(1, 200, edges=(1,)),
            "vocab_size": Sizes(2, 400, edges=(2,)), "tie_embeddings": Choice(False, True)}


def drawn_gpt(d: dict, n_layers: int = 2, name: str | None = None) -> GPTConfig:
    """A GPT from a draw of gpt_domain() or count_domain(): two layers unless told (two blocks: the meter counts one
    block as two minus one), named by its sizes unless told."""
    heads = d["kv_heads"] * d["group"]
    name = name or (f"a drawn GPT (d_model {heads * d['head_dim']}, {heads} heads over {d['kv_heads']} kv, "
                    f"ffn {d['ffn_hidden']}, vocab {d['vocab_size']}{', tied' if d['tie_embeddings'] else ''})")
    return GPTConfig(vocab_size=d["vocab_size"], d_model=heads * d["head_dim"], n_layers=n_layers, n_heads=heads,
                     n_kv_heads=d["kv_heads"], ffn_hidden=d["ffn_hidden"], tie_embeddings=d["tie_embeddings"],
                     name=name)


def drawn_config(case: dict) -> GPTConfig:
    """count_params' drawn GPT: every size of count_domain(), its depth too."""
    return drawn_gpt(case, case["n_layers"], "a drawn config")


def check_count_params(count_params, cases: str = "visible") -> None:
    for case in _plan(COUNT_CASES, cases):
        _count_case(count_params, case.cfg)
    if check_cases(cases)[1]:
        grade_drawn(count_domain(), "count_params", DRAWN_COUNT_CASES,
                    lambda case: _count_case(count_params, drawn_config(case)))


def _count_case(count_params, cfg: GPTConfig) -> None:
    got = call_learner(count_params, cfg, what=f"count_params({cfg.name})")
    want = true_param_count(cfg)
    if not isinstance(got, int) or isinstance(got, bool):
        raise CheckFailed(f"count_params({cfg.name}) should return an int, got {type(got).__name__} {got!r}")
    if got != want:
        raise CheckFailed(f"count_params({cfg.name}): expected {want:,}, got {got:,}: off by "
                          f"{got - want:+,}{_count_hint(cfg, got - want)} [{_describe(cfg)}]")


# ------------------------------------------------------------------------------------- state_bytes

def reference_state_bytes():
    return reference.state_bytes, reference.STATE_PRECISIONS, reference.STATE_OPTIMIZERS


PRECISIONS, OPTIMIZERS, BLOCK = reference.STATE_PRECISIONS, reference.STATE_OPTIMIZERS, reference.BLOCK_8BIT
KEYS = ("params", "grads", "optimizer")
CALLS = ("positional", "keywords", "default optimizer", "defaults")


def _n_vs_block(n: int) -> str:
    if n == 1:
        return "1"
    if n < BLOCK:
        return "below one block"
    return "whole blocks" if n % BLOCK == 0 else "a partial last block"


@dataclass(frozen=True)
class BytesCase:
    n: int
    precision: str
    optimizer: str
    hidden: bool
    call: str = "positional"  # CALLS: how the arguments are passed

    def axes(self) -> dict:
        return {"precision": self.precision, "optimizer": self.optimizer, "n_vs_block": _n_vs_block(self.n),
                "magnitude": "> int32" if self.n > INT32_MAX else "<= int32", "call": self.call}

    def arguments(self) -> tuple[tuple, dict]:
        """(args, kwargs) of the call."""
        if self.call == "defaults":
            return (self.n,), {}
        if self.call == "default optimizer":
            return (self.n, self.precision), {}
        if self.call == "keywords":
            return (self.n,), {"precision": self.precision, "optimizer": self.optimizer}
        return (self.n, self.precision, self.optimizer), {}

    def what(self) -> str:
        args = {"positional": f"{self.precision!r}, {self.optimizer!r}", "defaults": "",
                "default optimizer": f"{self.precision!r}",
                "keywords": f"precision={self.precision!r}, optimizer={self.optimizer!r}"}[self.call]
        return f"state_bytes({self.n:,}{', ' if args else ''}{args})"


def defaults(n: int, hidden: bool) -> BytesCase:
    """state_bytes(n): the signature's defaults, precision "amp" and optimizer "adamw"."""
    return BytesCase(n, "amp", "adamw", hidden, "defaults")


def default_optimizer(n: int, precision: str, hidden: bool) -> BytesCase:
    """state_bytes(n, precision): the optimizer's default, "adamw"."""
    return BytesCase(n, precision, "adamw", hidden, "default optimizer")


N_8B = 8_030_261_248  # Llama-3.1-8B: whole blocks, above int32
_VISIBLE_N = (1, 200, 512, 1000, 12_345)  # one value per n_vs_block, cycled over the recipes x optimizers
_HIDDEN_N = (1, 255, 257, 65_536, 99_999, 70_553_706_496, 3_000_000_001)

BYTES_CASES = (
    [BytesCase(_VISIBLE_N[i % len(_VISIBLE_N)], p, o, False)
     for i, (p, o) in enumerate((p, o) for p in PRECISIONS for o in OPTIMIZERS)]
    + [BytesCase(N_8B, "mixed", "adamw", False), BytesCase(2**31 + 5, "bf16", "adamw8bit", False),
       defaults(1000, False), default_optimizer(300, "bf16", False),
       BytesCase(777, "mixed_fp32_grads", "sgd", False, "keywords")]
    + [BytesCase(n, p, o, True) for n in _HIDDEN_N for p in PRECISIONS for o in OPTIMIZERS]
    + [defaults(4321, True), default_optimizer(4321, "fp32", True),
       BytesCase(2**33 + 3, "mixed_fp32_grads", "adamw8bit", True, "keywords")])


@dataclass(frozen=True)
class InvalidCase:
    precision: str
    optimizer: str
    bad: str  # the argument that is bad: "precision" or "optimizer"
    kind: str  # "unknown", "other case" (the names are case-sensitive), "near miss" (a prefix or a variant)
    hidden: bool

    def axes(self) -> dict:
        return {"invalid": self.bad, "invalid_name": self.kind}


INVALID_CASES = [
    InvalidCase("fp8", "adamw", "precision", "unknown", False), InvalidCase("amp", "adam9", "optimizer", "unknown", False),
    InvalidCase("AMP", "adamw", "precision", "other case", False),
    InvalidCase("amp", "AdamW", "optimizer", "other case", False),
    InvalidCase("mixed_fp32", "adamw", "precision", "near miss", False),
    InvalidCase("amp", "adam", "optimizer", "near miss", False),
    InvalidCase("fp16", "sgd", "precision", "unknown", True), InvalidCase("bf16", "lion", "optimizer", "unknown", True),
    InvalidCase("Mixed", "sgd", "precision", "other case", True), InvalidCase("fp32", "SGD", "optimizer", "other case", True),
    InvalidCase("bf", "adamw", "precision", "near miss", True), InvalidCase("mixed", "adamw8", "optimizer", "near miss", True),
]
# what a message must contain to name the bad argument (the table calls a precision a recipe too)
ARGUMENT_NAMES = {"precision": ("precision", "recipe"), "optimizer": ("optimizer",)}


def _compare(got, want: dict, what: str, n: int) -> None:
    if not isinstance(got, dict):
        raise CheckFailed(f"{what} should return a dict with keys params, grads, optimizer; got {type(got).__name__}")
    missing = set(want) - set(got)
    if missing:
        raise CheckFailed(f"{what}: the dict lacks {sorted(missing)} (keys: params, grads, optimizer)")
    extra = [k for k in got if k not in want]
    if extra:
        raise CheckFailed(f"{what}: the dict has extra keys {extra}: it should hold exactly 'params', 'grads' and "
                          f"'optimizer', so that sum(state_bytes(...).values()) is the total")
    for key in want:
        if isinstance(got[key], bool) or not isinstance(got[key], numbers.Real) or got[key] != want[key]:
            per = f" ({got[key] / n:g} bytes per parameter, expected {want[key] / n:g})" if n and isinstance(
                got[key], (int, float)) and not isinstance(got[key], bool) else ""
            raise CheckFailed(f"{what}[{key!r}]: expected {want[key]:,} bytes, got {got[key]!r}{per}")
    for key in want:
        if not isinstance(got[key], numbers.Integral):
            raise CheckFailed(f"{what}[{key!r}] is a {type(got[key]).__name__} ({got[key]!r}): a count of bytes is a "
                              f"whole number, return an int (integer arithmetic: //, math.ceil)")


def _expect_named_value_error(state_bytes, case: InvalidCase) -> None:
    """state_bytes(1000, precision, optimizer) must raise ValueError whose message names the bad argument."""
    what = f"state_bytes(1000, {case.precision!r}, {case.optimizer!r})"
    why = (f"{case.precision!r} is not one of the recipes {PRECISIONS} (the names are case-sensitive)"
           if case.bad == "precision" else
           f"{case.optimizer!r} is not one of the optimizers {OPTIMIZERS} (the names are case-sensitive)")
    try:
        state_bytes(1000, case.precision, case.optimizer)
    except ValueError as exc:
        names = ARGUMENT_NAMES[case.bad]
        if not any(name in str(exc).lower() for name in names):
            raise CheckFailed(f"{what} raised ValueError({str(exc)!r}): {why}, and the message should name the bad "
                              f"argument, {case.bad!r}") from None
        return
    except NotImplementedError:
        call_learner(state_bytes, 1000, case.precision, case.optimizer)  # reports the stub
    except (CheckFailed, CheckSkipped):
        raise
    except Exception as exc:
        raise CheckFailed(f"{what} raised {type(exc).__name__}: {why}; raise ValueError naming the bad argument, "
                          f"{case.bad!r}") from None
    raise CheckFailed(f"{what} returned a value: {why}; raise ValueError naming the bad argument, {case.bad!r}")


def state_domain() -> dict:
    """Any parameter count (around the 8-bit optimizer's block, past int32, to a trillion), every recipe and
    optimizer, and every way of passing them."""
    return {"n": Sizes(1, 2**40, edges=(1, BLOCK - 1, BLOCK, BLOCK + 1, INT32_MAX, INT32_MAX + 2)),
            "precision": Choice(*PRECISIONS), "optimizer": Choice(*OPTIMIZERS), "call": Choice(*CALLS)}


DRAWN_STATE_CASES = 60


def _drawn_state_case(case: dict) -> BytesCase:
    precision = "amp" if case["call"] == "defaults" else case["precision"]
    optimizer = "adamw" if case["call"] in ("defaults", "default optimizer") else case["optimizer"]
    return BytesCase(case["n"], precision, optimizer, True, case["call"])


def _state_case(state_bytes, case: BytesCase) -> None:
    what = case.what()
    want = reference.state_bytes(case.n, case.precision, case.optimizer)
    args, kwargs = case.arguments()
    _compare(call_learner(state_bytes, *args, what=what, **kwargs), want, what, case.n)


def check_state_bytes(state_bytes, cases: str = "visible") -> None:
    for case in _plan(BYTES_CASES, cases):
        _state_case(state_bytes, case)
    if check_cases(cases)[1]:
        grade_drawn(state_domain(), "state_bytes", DRAWN_STATE_CASES,
                    lambda case: _state_case(state_bytes, _drawn_state_case(case)))
    for case in _plan(INVALID_CASES, cases):
        _expect_named_value_error(state_bytes, case)


# ---------------------------------------------------------------------------- state_bytes_measured

@dataclass(frozen=True)
class MeasuredCase:
    config: str  # a key of COURSE_CONFIGS
    precision: str
    optimizer: str
    hidden: bool

    def axes(self) -> dict:
        cfg = COURSE_CONFIGS[self.config]
        return {"precision": self.precision, "optimizer": self.optimizer, "tied_head": cfg.tie_embeddings,
                "attention": _attention(cfg)}


TRAINED_PRECISIONS, TRAINED_OPTIMIZERS = ("fp32", "amp", "bf16"), ("adamw", "sgd")
MEASURED_CASES = ([MeasuredCase("tiny", "fp32", "adamw", False), MeasuredCase("tiny", "amp", "adamw", False),
                   MeasuredCase("tiny-mha", "bf16", "sgd", False)]
                  + [MeasuredCase(name, p, o, True) for name in ("tiny", "tiny-mha") for p in TRAINED_PRECISIONS
                     for o in TRAINED_OPTIMIZERS])


def measured_state_bytes(cfg: GPTConfig, precision: str, optimizer: str) -> dict:
    """Bytes the trainer holds: weights and optimizer states after a step, gradients after a backward."""
    from memfit.training import Trainer, random_batch
    trainer = Trainer(cfg, precision, optimizer, device="cpu")
    idx, targets = random_batch(cfg, 2, 16, trainer.device)
    trainer.step(idx, targets)
    with trainer.autocast():
        loss = trainer.model(idx, targets)
    loss.backward()
    grads = sum(p.grad.numel() * p.grad.element_size() for p in unique_parameters(trainer.model))
    held = trainer.state_bytes()
    return {"params": held["params"], "grads": grads, "optimizer": held["optimizer"]}


def check_state_bytes_measured(state_bytes, cases: str = "visible") -> None:
    plan = [(c.config, c.precision, c.optimizer) for c in _plan(MEASURED_CASES, cases)]
    for name, precision, optimizer in dict.fromkeys(plan):  # a case both visible and hidden runs once
        cfg = COURSE_CONFIGS[name]
        n = true_param_count(cfg)
        what = f"state_bytes({n:,}, {precision!r}, {optimizer!r}) for {cfg.name} trained on the CPU"
        _compare(call_learner(state_bytes, n, precision, optimizer, what=what),
                 measured_state_bytes(cfg, precision, optimizer), what + " (measured)", n)
    if check_cases(cases)[1]:
        def check_one(d: dict) -> None:
            cfg = drawn_config({**d, "n_layers": min(d["n_layers"], 2), "vocab_size": min(d["vocab_size"], 512),
                                 "head_dim": 2 * min(d["head_dim"], 16), "ffn_hidden": min(d["ffn_hidden"], 256)})
            n = true_param_count(cfg)
            what = f"state_bytes({n:,}, {d['precision']!r}, {d['optimizer']!r}) for {cfg.name} trained on the CPU"
            _compare(call_learner(state_bytes, n, d["precision"], d["optimizer"], what=what),
                     measured_state_bytes(cfg, d["precision"], d["optimizer"]), what + " (measured)", n)
        grade_drawn({**count_domain(), "precision": Choice(*TRAINED_PRECISIONS), "optimizer": Choice(*TRAINED_OPTIMIZERS)},
                    "state_bytes_measured", DRAWN_MEASURED_CASES, check_one)


DRAWN_MEASURED_CASES = 3  # count_params' GPTs cut to two layers and a CPU's sizes, each trained one step


# ------------------------------------------------------------------------------------------- axes

AXES = {
    "count_params": {"attention": ("MHA", "GQA", "MQA"), "tied_head": (False, True), "ffn_hidden": ("3.5 h", "other"),
                     "n_layers": ("1", "several"), "count": ("<= int32", "> int32")},
    "state_bytes": {"precision": PRECISIONS, "optimizer": OPTIMIZERS,
                    "n_vs_block": ("1", "below one block", "whole blocks", "a partial last block"),
                    "magnitude": ("<= int32", "> int32"), "call": CALLS,
                    "invalid": ("precision", "optimizer"), "invalid_name": ("unknown", "other case", "near miss")},
    "state_bytes_measured": {"precision": TRAINED_PRECISIONS, "optimizer": TRAINED_OPTIMIZERS,
                             "tied_head": (False, True), "attention": ("MHA", "GQA")},
}

_RECORDS = {"count_params": (COUNT_CASES,), "state_bytes": (BYTES_CASES, INVALID_CASES),
            "state_bytes_measured": (MEASURED_CASES,)}


def case_axes(check: str, cases: str) -> list[dict]:
    """The cases `check` runs under `cases` ("visible" or "hidden"), each as {axis: value}: read from the same
    records the check iterates over."""
    return [record.axes() for records in _RECORDS[check] for record in _plan(records, cases)]


CHECKS = [
    Check("count_params", 3, check_count_params, uses=("count_params",)),
    Check("state_bytes", 3, check_state_bytes, uses=("state_bytes",)),
    Check("state_bytes_measured", 2, check_state_bytes_measured, uses=("state_bytes",)),
]
