"""Checks of lesson 09 (solutions/09_parallelism.ipynb): Megatron's conjugate operators and sequence parallelism's
pair, a block's weights sharded for tensor parallelism, the block itself on simulated ranks, what a rank keeps for
backward, ring attention, pipeline schedules, memory per GPU of a 4-D layout, and the planner.

References come from memfit.from_lessons.parallelism (the solution notebook's #@save cells) and memfit.parallel
(the unsharded block, RoPE's tables, the planner's costs). Learner code that talks to ranks runs in threads of this
process (memfit.zero.simulate): a call there is made directly, not through call_learner (whose watches patch
process-wide state that threads would share), and its result then kept to the same contracts
(contracts.broken_contract: no tensor kept on ctx, the kind the def line declares).

Every check's cases are data: PLANS[check] builds a list of Case records (arguments, hidden or not, the axes they
cover); the check iterates over them and case_axes() reads the same list. After the fixed hidden cases each check
grades cases drawn from its exercise's whole domain (autograder/checks/domain.py).
"""
from __future__ import annotations

import math
import random
import traceback
from dataclasses import dataclass, field

import torch

import memfit
import memfit.from_lessons.parallelism as _reference  # imported before the grading child's guards go up
import memfit.parallel as _library
from autograder.checks import (Check, CheckFailed, LearnerCodeError, NotImplementedYet, call_learner, check_cases,
                               expect_value_error, given_references, select)
from autograder.checks import contracts
from autograder.checks.domain import Choice, Impossible, Sizes, grade_drawn
from autograder.checks.numerics import assert_close_by_rule, dtype_name, same_bits, seeded_generator
from memfit.gpt import GPTConfig
from memfit.zero import SimComm, SimulationFailed, simulate

_NOT_LEARNERS = ("/autograder/", "/memfit/", "/torch/", "/threading.py")  # frames that are not the learner's line


@dataclass(frozen=True)
class Case:
    kind: str
    args: tuple
    hidden: bool
    axes: dict = field(default_factory=dict, compare=False)


_select = select


def _cfg(n_heads=4, n_kv_heads=2, d_model=32, ffn_hidden=48, head_dim=None, vocab=64, layers=2, tied=False):
    return GPTConfig(vocab_size=vocab, d_model=d_model, n_layers=layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
                     ffn_hidden=ffn_hidden, max_seq_len=4096, head_dim_override=head_dim, tie_embeddings=tied,
                     name="check")


# Block shapes the exercises allow: multi-head, grouped-query, multi-query (one kv head), heads of another width
# than d_model / n_heads (Gemma's override).
CONFIGS = {"grouped-query": _cfg(), "multi-head": _cfg(n_kv_heads=4), "one kv head": _cfg(n_kv_heads=1),
           "head_dim override": _cfg(n_heads=4, n_kv_heads=2, head_dim=12), "8 heads": _cfg(n_heads=8, n_kv_heads=4,
                                                                                           ffn_hidden=64)}


def _config_kind(cfg) -> str:
    if cfg.head_dim_override is not None:
        return "head_dim override"
    return {1: "one kv head"}.get(cfg.n_kv_heads, "multi-head" if cfg.n_kv_heads == cfg.n_heads else "grouped-query")


def _learner_frame(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = next((f for f in reversed(frames) if not any(p in f.filename for p in _NOT_LEARNERS)), frames[-1])
    return f"at {where.filename}, line {where.lineno}"


def _on_ranks(n: int, fn, what: str, names: str) -> list:
    """fn(comm) on n simulated ranks; the learner's exceptions turned into messages (a stub into its own)."""
    try:
        return simulate(n, fn, timeout_s=60)
    except NotImplementedError:
        raise NotImplementedYet(f"{names} is not implemented yet: replace the `raise NotImplementedError()` in its "
                                "cell with your code") from None
    except (CheckFailed, Impossible):
        raise
    except SimulationFailed as exc:
        raise CheckFailed(f"{what}: {exc}") from None
    except Exception as exc:
        message = f"{what}: your code raised {type(exc).__name__}: {exc} ({_learner_frame(exc)})"
        exc.__traceback__ = None
        raise LearnerCodeError(message) from None


def _keep_contracts(fn, args, result, what: str) -> None:
    broken = contracts.broken_contract(fn, args, {}, result, [], what)
    if broken:
        raise CheckFailed(f"{what} {broken}")


def _tensor(shape, dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=seeded_generator(seed)) * scale).to(dtype)


def _rows(t: torch.Tensor, n: int, rank: int) -> torch.Tensor:
    k = t.shape[0] // n
    return t[rank * k:(rank + 1) * k]


def _rank_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """The sum in rank order, as memfit.zero's simulated all_reduce adds (its own code, so the two cannot drift)."""
    return SimComm._sum(parts)


# ------------------------------------------------------------------------------------------- conjugate_ops

OPS = ("tp_copy", "tp_reduce", "sp_gather", "sp_scatter")
_COLLECTIVES = {"tp_copy": (None, "all_reduce"), "tp_reduce": ("all_reduce", None),
                "sp_gather": ("all_gather", "reduce_scatter"), "sp_scatter": ("reduce_scatter", "all_gather")}


_CLASSES = {"tp_copy": "CopyToTP", "tp_reduce": "ReduceFromTP", "sp_gather": "GatherFromSP", "sp_scatter": "ScatterToSP"}


def _sent(kind: str | None, nbytes: int, n: int) -> list:
    """What Comm records for one collective on a tensor (all_reduce), a shard (all_gather) or an output
    (reduce_scatter) of nbytes."""
    if kind is None:
        return []
    return [(kind, 2 * (n - 1) * nbytes // n if kind == "all_reduce" else (n - 1) * nbytes)]


def _ops_axes(op, n, shape, dtype, strided) -> dict:
    return {"operator": op, "world_size": "one" if n == 1 else (2 if n == 2 else "3 or more"),
            "dtype": dtype_name(dtype), "layout": "a non-contiguous view" if strided else "contiguous",
            "rank of x": "1-D" if len(shape) == 1 else "3-D" if len(shape) == 3 else "2-D"}


def _plan_conjugate_ops() -> list[Case]:
    plan = []
    visible = [(op, 2, (4, 3), torch.float32, False) for op in OPS] + [
        ("sp_scatter", 3, (6, 2, 5), torch.float16, False), ("tp_copy", 1, (6,), torch.float64, True),
        ("sp_gather", 3, (4, 2, 3), torch.bfloat16, True), ("tp_reduce", 4, (5,), torch.float32, False)]
    hidden = []
    for i, op in enumerate(OPS):
        hidden += [(op, 1, (4, 3), torch.float32, False), (op, 3, (6, 2, 5), torch.float16, True),
                   (op, 4, (8,), torch.float64, False), (op, 2, (6, 5), torch.bfloat16, True),
                   (op, 5, (10, 3, 2), torch.float32, i % 2 == 0)]
    plan += [Case("op", args, h, _ops_axes(*args)) for h, cases in ((False, visible), (True, hidden)) for args in cases]
    plan += [Case("invalid", (n, rows), h, {"invalid": "dim 0 not a multiple of the ranks"})
             for h, n, rows in ((False, 2, 3), (True, 3, 4), (True, 4, 6))]
    return plan


def _op_case(functions: dict, op: str, n: int, shape: tuple, dtype: torch.dtype, strided: bool, seed: int = 0) -> None:
    fn = functions[op]
    what = f"{op}(x, comm) on {n} ranks, x of shape {tuple(shape)} {dtype_name(dtype)}" + \
        (", a non-contiguous view" if strided else "")
    xs = [_tensor(shape, dtype, seed + 10 * r + 1) for r in range(n)]
    out_shape = {"sp_gather": (shape[0] * n, *shape[1:]), "sp_scatter": (shape[0] // n, *shape[1:])}.get(op, shape)
    dys = [_tensor(out_shape, dtype, seed + 10 * r + 7) for r in range(n)]
    if op == "tp_copy":
        want = [x for x in xs]
        want_grad = [_rank_sum(dys)] * n
    elif op == "tp_reduce":
        want = [_rank_sum(xs)] * n
        want_grad = dys
    elif op == "sp_gather":
        want = [torch.cat(xs)] * n
        total = _rank_sum(dys)
        want_grad = [_rows(total, n, r) for r in range(n)]
    else:
        total = _rank_sum(xs)
        want = [_rows(total, n, r) for r in range(n)]
        want_grad = [torch.cat(dys)] * n
    fwd_kind, bwd_kind = _COLLECTIVES[op]
    x_bytes = xs[0].numel() * xs[0].element_size()
    shard = x_bytes if op != "sp_scatter" else x_bytes // n
    want_fwd = _sent(fwd_kind, x_bytes if fwd_kind == "all_reduce" else shard, n)
    want_bwd = _sent(bwd_kind, x_bytes if bwd_kind == "all_reduce" else shard, n)

    def rank(comm):
        # a first call on twice the values (exact in floating point), kept: the second call must leave it alone
        first = fn(_laid_out(2 * xs[comm.rank], strided), comm)
        if isinstance(first, torch.Tensor):
            first = first.detach()
        comm.calls.clear()
        x = _laid_out(xs[comm.rank], strided).requires_grad_()
        kept_x = x.detach().clone()
        y = fn(x, comm)
        _keep_contracts(fn, (x, comm), y, what)
        forward_calls = list(comm.calls)
        dy = _laid_out(dys[comm.rank], strided)  # autograd may hand backward a gradient of any layout
        kept_dy = dy.clone()
        y.backward(dy)
        return y.detach(), x.grad, forward_calls, comm.calls[len(forward_calls):], same_bits(x.detach(), kept_x), \
            same_bits(dy, kept_dy), first
    for r, (y, grad, fwd, bwd, x_same, dy_same, first) in enumerate(
            _on_ranks(n, rank, what, f"{op} ({_CLASSES[op]})")):
        where = f"{what}, rank {r}"
        if not (isinstance(first, torch.Tensor) and first.shape == want[r].shape and torch.equal(first, 2 * want[r])):
            raise CheckFailed(f"{where}: the result of a first call (on other values) changed, or was wrong, once the "
                              "function was called again: return a new tensor each call and keep no buffer between "
                              "calls")
        if not x_same:
            raise CheckFailed(f"{where}: x was changed by the call: write the result into a new tensor")
        if not dy_same:
            raise CheckFailed(f"{where}: backward wrote into the gradient it was handed: a collective works in place, "
                              "so give it a copy")
        if not isinstance(y, torch.Tensor) or y.shape != want[r].shape or y.dtype != dtype:
            raise CheckFailed(f"{where}: expected a {dtype_name(dtype)} tensor of shape {tuple(want[r].shape)}, got "
                              f"{_describe(y)}")
        if not torch.equal(y, want[r]):
            raise CheckFailed(f"{where}: the forward result is wrong ({_forward_hint(op)}); largest difference "
                              f"{_max_diff(y, want[r]):.3g}")
        if grad is None:
            raise CheckFailed(f"{where}: x received no gradient: build the result through your autograd Function so "
                              "backward reaches x")
        if grad.shape != xs[r].shape or not torch.equal(grad.to(dtype), want_grad[r]):
            raise CheckFailed(f"{where}: x's gradient is wrong ({_backward_hint(op)}); "
                              f"{'shape ' + str(tuple(grad.shape)) if grad.shape != xs[r].shape else 'largest difference %.3g' % _max_diff(grad, want_grad[r])}")
        if fwd != want_fwd or bwd != want_bwd:
            raise CheckFailed(f"{where}: the collectives sent (kind, bytes) {fwd} in forward and {bwd} in backward; "
                              f"expected {want_fwd} and {want_bwd}: {_calls_hint(op)}")


def _laid_out(x: torch.Tensor, strided: bool) -> torch.Tensor:
    """A copy of x: contiguous, or a non-contiguous view holding the same values (a transposed copy transposed back;
    every other element of a longer vector)."""
    if not strided:
        return x.clone()
    if x.dim() > 1:
        return x.transpose(0, -1).contiguous().transpose(0, -1)
    wide = torch.empty(2 * x.numel(), dtype=x.dtype)
    view = wide[::2]
    view.copy_(x)
    return view


def _describe(y) -> str:
    if isinstance(y, torch.Tensor):
        return f"{dtype_name(y.dtype)} of shape {tuple(y.shape)}"
    return type(y).__name__


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def _forward_hint(op: str) -> str:
    return {"tp_copy": "f returns x as it is in forward",
            "tp_reduce": "g returns the sum over ranks (comm.all_reduce on a copy)",
            "sp_gather": "every rank's x, concatenated along dim 0 in rank order (comm.all_gather)",
            "sp_scatter": "rank r keeps rows r of the sum over ranks (comm.reduce_scatter)"}[op]


def _backward_hint(op: str) -> str:
    return {"tp_copy": "f's backward sums the gradient over ranks: every rank's x fed every rank's matmul",
            "tp_reduce": "g's backward hands the gradient on unchanged",
            "sp_gather": "the gradient of an all-gather is a reduce-scatter: rank r gets rows r of the sum",
            "sp_scatter": "the gradient of a reduce-scatter is an all-gather of every rank's gradient"}[op]


def _calls_hint(op: str) -> str:
    fwd, bwd = _COLLECTIVES[op]
    return f"{op} calls {fwd or 'no collective'} in forward and {bwd or 'no collective'} in backward, once each"


def _invalid_scatter(functions: dict, n: int, rows: int) -> None:
    what = f"sp_scatter(x of shape ({rows}, 3), comm) on {n} ranks"

    def rank(comm):
        try:
            functions["sp_scatter"](torch.zeros(rows, 3), comm)
        except ValueError:
            return None
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 (reported below)
            return f"raised {type(exc).__name__}"
        return "returned a value"
    for got in _on_ranks(n, rank, what, "sp_scatter (ScatterToSP)"):
        if got is not None:
            raise CheckFailed(f"{what} {got}: raise ValueError when dim 0 is not a multiple of comm.world_size")


CONJUGATE_DOMAIN = {"operator": Choice(*OPS), "world_size": Sizes(1, 6, edges=(1, 2, 3)),
                    "rows per rank": Sizes(1, 6, edges=(1,)), "rank of x": Choice(2, 1, 3),
                    "dtype": Choice("float32", "float64", "float16", "bfloat16"),
                    "layout": Choice("contiguous", "a non-contiguous view")}
DRAWN_CONJUGATE_CASES = 12


def check_conjugate_ops(tp_copy, tp_reduce, sp_gather, sp_scatter, cases: str = "visible") -> None:
    functions = dict(zip(OPS, (tp_copy, tp_reduce, sp_gather, sp_scatter)))
    for case in _select(_plan_conjugate_ops(), cases):
        if case.kind == "invalid":
            _invalid_scatter(functions, *case.args)
        else:
            _op_case(functions, *case.args)
    if check_cases(cases)[1]:
        def check_one(drawn: dict) -> None:
            n, rows = drawn["world_size"], drawn["rows per rank"]
            lead = rows * n if drawn["operator"] == "sp_scatter" else rows
            shape = (lead,) + ((3,) if drawn["rank of x"] >= 2 else ()) + ((2,) if drawn["rank of x"] == 3 else ())
            _op_case(functions, drawn["operator"], n, shape, getattr(torch, drawn["dtype"]),
                     drawn["layout"] != "contiguous", seed=drawn["seed"] % 10_000)
        grade_drawn(CONJUGATE_DOMAIN, "conjugate_ops", DRAWN_CONJUGATE_CASES, check_one)


# ------------------------------------------------------------------------------------------- shard_block

def _shard_axes(name, tp, rank, dtype) -> dict:
    return {"config": name, "tp": tp if tp < 4 else "4 or more", "rank": "first" if rank == 0 else
            ("last" if rank == tp - 1 else "middle"), "dtype": dtype_name(dtype)}


def _plan_shard_block() -> list[Case]:
    visible = [("grouped-query", 2, 0, torch.float32), ("grouped-query", 2, 1, torch.bfloat16),
               ("multi-head", 4, 2, torch.float32), ("head_dim override", 2, 1, torch.float64),
               ("8 heads", 4, 3, torch.float16), ("one kv head", 1, 0, torch.float32)]
    hidden = [("grouped-query", 1, 0, torch.float32), ("grouped-query", 2, 1, torch.bfloat16),
              ("8 heads", 4, 3, torch.float32), ("8 heads", 4, 1, torch.float16), ("multi-head", 4, 0, torch.float32),
              ("one kv head", 1, 0, torch.float32), ("head_dim override", 2, 0, torch.float64)]
    plan = [Case("shard", args, h, _shard_axes(*args)) for h, cases in ((False, visible), (True, hidden))
            for args in cases]
    plan += [Case("invalid", args, h, {"invalid": axis}) for h, args, axis in (
        (False, ("grouped-query", 4, 0), "tp does not divide n_kv_heads"),
        (False, ("grouped-query", 2, 2), "rank >= tp"), (False, ("multi-head", 2, -1), "rank < 0"),
        (False, (_cfg(n_kv_heads=4, ffn_hidden=50), 4, 0), "tp does not divide ffn_hidden"),
        (False, ("grouped-query", 0, 0), "tp < 1"), (True, ("multi-head", -2, 0), "tp < 1"),
        (True, ("8 heads", 4, 4), "rank >= tp"),
        (True, ("8 heads", 8, 0), "tp does not divide n_kv_heads"), (True, ("one kv head", 2, 0),
                                                                      "tp does not divide n_kv_heads"),
        (True, ("grouped-query", 2, -1), "rank < 0"),
        (True, (_cfg(n_heads=8, n_kv_heads=4, ffn_hidden=38), 4, 1), "tp does not divide ffn_hidden"))]
    return plan


def _shard_case(shard_block, cfg, tp: int, rank: int, dtype, seed: int = 0) -> None:
    params = _library.block_params(cfg, seed=seed, dtype=dtype)
    what = f"shard_block(params, cfg ({_config_kind(cfg)}: {cfg.n_heads} heads, {cfg.n_kv_heads} kv heads, head_dim " \
           f"{cfg.head_dim}, ffn_hidden {cfg.ffn_hidden}), tp={tp}, rank={rank}) in {dtype_name(dtype)}"
    kept = {k: v.clone() for k, v in params.items()}
    got = call_learner(shard_block, params, cfg, tp, rank, what=what)
    want = _reference.shard_block(params, cfg, tp, rank)
    if any(not same_bits(params[k], kept[k]) for k in params):
        raise CheckFailed(f"{what}: params was changed by the call: slice into new tensors")
    if not isinstance(got, dict) or set(got) != set(want):
        raise CheckFailed(f"{what}: expected a dict with keys {sorted(want)}, got "
                          f"{sorted(got) if isinstance(got, dict) else type(got).__name__}")
    for name, w in want.items():
        g = got[name]
        if not isinstance(g, torch.Tensor) or g.shape != w.shape or g.dtype != w.dtype or g.device != w.device:
            raise CheckFailed(f"{what}[{name!r}]: expected {dtype_name(w.dtype)} of shape {tuple(w.shape)}, got "
                              f"{_describe(g)}")
        if not torch.equal(g, w):
            raise CheckFailed(f"{what}[{name!r}]: wrong values: {_shard_hint(name, g, params, cfg, tp, rank)}")
        if not g.is_contiguous():
            raise CheckFailed(f"{what}[{name!r}] is not contiguous: a rank's shard is its own dense tensor "
                              "(.contiguous() after slicing columns)")
        for source, p in params.items():
            if contracts.overlaps(g, p):
                raise CheckFailed(f"{what}[{name!r}] shares memory with params[{source!r}]: a view keeps the whole "
                                  "weight alive on the rank; copy the rank's slice into its own tensor")
        if g.untyped_storage().nbytes() != g.numel() * g.element_size():
            raise CheckFailed(f"{what}[{name!r}] sits in a storage of {g.untyped_storage().nbytes():,} bytes for "
                              f"{g.numel() * g.element_size():,} bytes of shard: the rank would hold more than its "
                              "shard (copy the slice out of any larger tensor)")


def _shard_hint(name, got, params, cfg, tp, rank) -> str:
    if name == "wqkv":
        naive = params["wqkv"].chunk(tp)[rank]
        if got.shape == naive.shape and torch.equal(got, naive):
            return ("a contiguous block of wqkv's rows mixes q, k and v heads: split wqkv into q, k and v, take the "
                    "rank's heads of each, and stack them as [q; k; v]")
        return "rank r's query heads, then its kv heads of k, then of v (heads r·n/tp ... (r+1)·n/tp - 1 of each)"
    if name == "w13":
        return "rank r's ffn_hidden/tp gate rows, then the same up rows (split w13 into gate and up first)"
    if name in ("wo", "w2"):
        return "row-parallel: the columns that meet the rank's heads (wo) or FFN units (w2)"
    return "every rank keeps the norms' weights whole"


def _invalid_shard(shard_block, cfg_or_name, tp: int, rank: int, why: str) -> None:
    cfg = CONFIGS[cfg_or_name] if isinstance(cfg_or_name, str) else cfg_or_name
    params = _library.block_params(cfg)
    expect_value_error(shard_block, params, cfg, tp, rank,
                       what=f"shard_block(params, cfg with {cfg.n_heads} heads, {cfg.n_kv_heads} kv heads, ffn_hidden "
                            f"{cfg.ffn_hidden}, tp={tp}, rank={rank})", why=why)


def _drawn_config(drawn: dict) -> GPTConfig:
    tp = drawn["tp"]
    kv = tp * drawn["kv heads per rank"]
    heads = kv * drawn["group"]
    head_dim = drawn["head_dim"]
    override = head_dim if drawn["head_dim override"] else None
    d_model = heads * head_dim if override is None else drawn["d_model"]
    return _cfg(n_heads=heads, n_kv_heads=kv, d_model=d_model, ffn_hidden=tp * drawn["ffn per rank"], head_dim=override)


BLOCK_DOMAIN = {"tp": Choice(1, 2, 4, 3), "kv heads per rank": Sizes(1, 2, edges=(1,)), "group": Sizes(1, 3, edges=(1,)),
                "head_dim": Choice(4, 8, 6), "head_dim override": Choice(False, True), "d_model": Choice(16, 24),
                "ffn per rank": Sizes(2, 12, edges=(2,))}
DRAWN_SHARD_CASES = 10


def check_shard_block(shard_block, cases: str = "visible") -> None:
    for case in _select(_plan_shard_block(), cases):
        if case.kind == "invalid":
            _invalid_shard(shard_block, *case.args, why=f"({case.axes['invalid']})")
        else:
            name, tp, rank, dtype = case.args
            _shard_case(shard_block, CONFIGS[name], tp, rank, dtype)
    if check_cases(cases)[1]:
        def check_one(drawn: dict) -> None:
            cfg = _drawn_config(drawn)
            tp = drawn["tp"]
            _shard_case(shard_block, cfg, tp, drawn["seed"] % tp, torch.float32, seed=drawn["seed"] % 1000)
        grade_drawn(BLOCK_DOMAIN, "shard_block", DRAWN_SHARD_CASES, check_one)


# ------------------------------------------------------------------------------------------- tp_block

_OPERATORS = {name: getattr(_reference, name) for name in OPS}


def _block_axes(name, tp, seq, batch, sp, dtype) -> dict:
    return {"config": name, "tp": tp if tp < 4 else "4 or more", "sequence_parallel": sp, "dtype": dtype_name(dtype),
            "batch": "one" if batch == 1 else "several"}


def _plan_tp_block() -> list[Case]:
    visible = [("grouped-query", 2, 8, 2, False, torch.float64), ("grouped-query", 2, 8, 2, True, torch.float64),
               ("multi-head", 4, 8, 1, True, torch.float32), ("8 heads", 4, 8, 1, False, torch.float64),
               ("head_dim override", 2, 6, 1, True, torch.float64), ("one kv head", 1, 4, 2, False, torch.float64)]
    hidden = [("grouped-query", 1, 8, 1, False, torch.float64), ("multi-head", 4, 8, 1, True, torch.float64),
              ("8 heads", 4, 12, 2, False, torch.float64), ("head_dim override", 2, 6, 1, True, torch.float64),
              ("grouped-query", 2, 16, 2, True, torch.float32), ("one kv head", 1, 4, 2, True, torch.float64),
              ("8 heads", 2, 8, 1, False, torch.float32)]
    return [Case("block", args, h, _block_axes(*args)) for h, cases in ((False, visible), (True, hidden))
            for args in cases]


def _full_reference(cfg, params, x, dy, rope64):
    """The unsharded block in fp64 (exact) and in the case's dtype (what PyTorch's own rounding gives)."""
    out = {}
    for name, dtype in (("exact", torch.float64), ("same", x.dtype)):
        p = {k: v.detach().to(dtype).requires_grad_() for k, v in params.items()}
        xx = x.detach().to(dtype).requires_grad_()
        rope = tuple(t.to(dtype) for t in rope64)
        y = _library.full_block(xx, p, cfg, rope)
        y.backward(dy.to(dtype))
        out[name] = (y.detach(), xx.grad, {k: v.grad for k, v in p.items()})
    return out


def _block_case(tp_block, cfg, tp: int, seq: int, batch: int, sp: bool, dtype, seed: int = 0) -> None:
    what = f"tp_block on {tp} ranks ({_config_kind(cfg)}: {cfg.n_heads} heads, {cfg.n_kv_heads} kv heads), x of " \
           f"{seq} tokens x batch {batch} in {dtype_name(dtype)}, sequence_parallel={sp}"
    params = _library.block_params(cfg, seed=seed + 1, dtype=dtype)
    x = _tensor((seq, batch, cfg.d_model), dtype, seed + 2)
    dy = _tensor((seq, batch, cfg.d_model), dtype, seed + 3)
    rope = _library.rope_sbh(cfg, seq, dtype)
    ref = _full_reference(cfg, params, x, dy, _library.rope_sbh(cfg, seq, torch.float64))
    h = x.numel() // seq * x.element_size() * seq  # bytes of the residual stream

    def rank(comm):
        shard = {k: v.requires_grad_() for k, v in _reference.shard_block(params, cfg, tp, comm.rank).items()}
        mine = (_rows(x, tp, comm.rank) if sp else x).clone().requires_grad_()
        kept = mine.detach().clone(), {k: v.detach().clone() for k, v in shard.items()}
        y = tp_block(mine, shard, cfg, comm, rope, sp)
        _keep_contracts(tp_block, (mine, shard, cfg, comm, rope), y, what)
        forward_calls = list(comm.calls)
        if isinstance(y, torch.Tensor) and y.requires_grad:
            y.backward(_rows(dy, tp, comm.rank) if sp else dy)
        changed = not same_bits(mine.detach(), kept[0]) or any(not same_bits(shard[k].detach(), kept[1][k])
                                                                for k in shard)
        return y.detach() if isinstance(y, torch.Tensor) else y, mine.grad, {k: v.grad for k, v in shard.items()}, \
            forward_calls, comm.calls[len(forward_calls):], changed

    with given_references(tp_block, **_OPERATORS):
        results = _on_ranks(tp, rank, what, "tp_block")
    rank_norms = _reference_norm_grads(cfg, tp, params, x, dy, seq) if sp else None
    exact, same = ref["exact"], ref["same"]
    for r, (y, dx, grads, fwd, bwd, changed) in enumerate(results):
        where = f"{what}, rank {r}"
        if changed:
            raise CheckFailed(f"{where}: x or a shard tensor was changed by the call: compute into new tensors")
        want = _rows(exact[0], tp, r) if sp else exact[0]
        torch_same = _rows(same[0], tp, r) if sp else same[0]
        if not isinstance(y, torch.Tensor) or y.shape != want.shape:
            raise CheckFailed(f"{where}: expected the output of shape {tuple(want.shape)} "
                              f"({'the rank' + chr(39) + 's rows of the sequence' if sp else 'the whole sequence'}), got "
                              f"{_describe(y)}")
        _close(y, want, torch_same, f"{where}: the output", _block_hint(sp))
        if dx is None:
            raise CheckFailed(f"{where}: x received no gradient: build the output from x with differentiable ops and "
                              "the operators of exercise 1")
        _close(dx, _rows(exact[1], tp, r) if sp else exact[1], _rows(same[1], tp, r) if sp else same[1],
               f"{where}: x's gradient", _block_hint(sp))
        want_grads = _reference.shard_block(exact[2], cfg, tp, r)
        same_grads = _reference.shard_block(same[2], cfg, tp, r)
        for name in ("wqkv", "wo", "w13", "w2") + (() if sp else ("norm1", "norm2")):
            if grads.get(name) is None:
                raise CheckFailed(f"{where}: shard[{name!r}] received no gradient: use every shard tensor as given")
            _close(grads[name], want_grads[name], same_grads[name], f"{where}: shard[{name!r}]'s gradient",
                   _block_hint(sp))
        if sp:
            for name in ("norm1", "norm2"):
                if grads.get(name) is None:
                    raise CheckFailed(f"{where}: shard[{name!r}] received no gradient: use every shard tensor as given")
                _close(grads[name], rank_norms["exact"][r][name], rank_norms["same"][r][name],
                       f"{where}: shard[{name!r}]'s gradient (from the rank's own tokens)",
                       "with sequence parallelism each rank normalizes its own rows, before sp_gather")
        expected_fwd = _expected_calls(tp, sp, h, "forward")
        expected_bwd = _expected_calls(tp, sp, h, "backward")
        if sorted(fwd) != sorted(expected_fwd) or sorted(bwd) != sorted(expected_bwd):
            raise CheckFailed(f"{where}: the collectives sent (kind, bytes) {fwd} in forward and {bwd} in backward; "
                              f"expected {expected_fwd} and {expected_bwd}: one f before each column-parallel matmul "
                              f"({'sp_gather' if sp else 'tp_copy'}) and one g after each row-parallel one "
                              f"({'sp_scatter' if sp else 'tp_reduce'}), on the residual stream")
    if sp:
        for name in ("norm1", "norm2"):
            total = sum(res[2][name].double() for res in results)
            _close(total.to(dtype), exact[2][name], same[2][name],
                   f"{what}: shard[{name!r}]'s gradient summed over ranks", "each rank's norm sees its own tokens")


def _reference_norm_grads(cfg, tp, params, x, dy, seq) -> dict:
    """Under sequence parallelism each rank's norm weights see its own tokens: their gradients per rank, from the
    reference block on simulated ranks, in fp64 ("exact") and in the case's dtype ("same")."""
    out = {}
    for name, dtype in (("exact", torch.float64), ("same", x.dtype)):
        p = {k: v.to(dtype) for k, v in params.items()}
        rope = _library.rope_sbh(cfg, seq, dtype)

        def rank(comm):
            shard = {k: v.requires_grad_() for k, v in _reference.shard_block(p, cfg, tp, comm.rank).items()}
            mine = _rows(x, tp, comm.rank).to(dtype).clone().requires_grad_()
            _reference.tp_block(mine, shard, cfg, comm, rope, True).backward(_rows(dy, tp, comm.rank).to(dtype))
            return {k: shard[k].grad for k in ("norm1", "norm2")}
        out[name] = simulate(tp, rank, timeout_s=60)
    return out


def _expected_calls(tp: int, sp: bool, stream_bytes: int, direction: str) -> list:
    if tp == 1:
        kinds = ["all_gather", "reduce_scatter"] * 2 if sp else ["all_reduce"] * 2
        return [(k, 0) for k in kinds]
    if not sp:
        return [("all_reduce", 2 * (tp - 1) * stream_bytes // tp)] * 2
    shard = stream_bytes // tp
    return [("all_gather", (tp - 1) * shard), ("reduce_scatter", (tp - 1) * shard)] * 2


def _block_hint(sp: bool) -> str:
    return ("with sequence parallelism x is the rank's rows: norm them, sp_gather before wqkv and w13, sp_scatter after "
            "wo and w2, add the residual on the rank's rows" if sp else
            "the norms on the whole x, tp_copy before wqkv and w13, tp_reduce after wo and w2; the rank's heads in "
            "shard_block's order, each query head with kv head i // (heads / kv_heads) of the rank's")


def _close(got, exact, torch_same, what: str, hint: str, half_ulps: float = 8.0) -> None:
    if not isinstance(got, torch.Tensor) or got.shape != exact.shape:
        raise CheckFailed(f"{what}: expected shape {tuple(exact.shape)}, got {_describe(got)}")
    if got.dtype != torch_same.dtype:
        raise CheckFailed(f"{what}: expected {dtype_name(torch_same.dtype)}, got {dtype_name(got.dtype)}")
    ulps = 512.0 if got.dtype == torch.float64 else 8.0 if got.dtype == torch.float32 else half_ulps
    # (fp64: sums split across ranks add in another order than one matmul's)
    try:
        assert_close_by_rule(got, exact, torch_same, what, floor_ulps=ulps, scale=float(exact.abs().max()) or 1.0)
    except CheckFailed as exc:
        raise CheckFailed(f"{exc} ({hint})") from None


def _drawn_block(tp_block, drawn: dict) -> None:
    cfg = _drawn_config(drawn)
    tp, sp = drawn["tp"], drawn["sequence_parallel"]
    seq = tp * drawn["tokens per rank"] if sp else drawn["tokens per rank"] * 2
    _block_case(tp_block, cfg, tp, seq, drawn["batch"], sp, getattr(torch, drawn["dtype"]), seed=drawn["seed"] % 1000)


TP_BLOCK_DOMAIN = {**BLOCK_DOMAIN, "sequence_parallel": Choice(False, True), "tokens per rank": Sizes(1, 6, edges=(1,)),
                   "batch": Sizes(1, 3, edges=(1,)), "dtype": Choice("float64", "float32")}
DRAWN_BLOCK_CASES = 5


def check_tp_block(tp_block, cases: str = "visible") -> None:
    for case in _select(_plan_tp_block(), cases):
        name, tp, seq, batch, sp, dtype = case.args
        _block_case(tp_block, CONFIGS[name], tp, seq, batch, sp, dtype)
    if check_cases(cases)[1]:
        grade_drawn(TP_BLOCK_DOMAIN, "tp_block", DRAWN_BLOCK_CASES, lambda drawn: _drawn_block(tp_block, drawn))


# ------------------------------------------------------------------------------------------- tp_activation_bytes

def _activation_axes(name, seq, batch, tp, sp, recompute, dtype_bytes, measured) -> dict:
    return {"config": name, "tp": tp if tp < 4 else "4 or more", "sequence_parallel": sp, "recompute": recompute,
            "dtype_bytes": dtype_bytes, "source": "measured" if measured else "formula",
            "model size": "Llama" if name.startswith("Llama") else "small"}


_LLAMAS = {"Llama-3.1-8B": "LLAMA_3_1_8B", "Llama-3.1-70B": "LLAMA_3_1_70B", "Llama-3.1-405B": "LLAMA_3_1_405B"}


def _config_named(name: str) -> GPTConfig:
    import memfit.gpt
    return getattr(memfit.gpt, _LLAMAS[name]) if name in _LLAMAS else CONFIGS[name]


def _plan_activation() -> list[Case]:
    visible = [("grouped-query", 8, 2, 2, False, "none", 4, True), ("grouped-query", 8, 2, 2, True, "none", 4, True),
               ("multi-head", 16, 1, 4, True, "none", 4, True), ("grouped-query", 8, 2, 2, True, "full", 2, False),
               ("Llama-3.1-70B", 8192, 1, 8, True, "none", 2, False), ("8 heads", 8, 1, 1, False, "none", 4, True),
               ("head_dim override", 8, 1, 2, True, "none", 2, True), ("one kv head", 4, 2, 1, True, "full", 4, False),
               ("Llama-3.1-405B", 8192, 1, 8, True, "full", 2, False), ("Llama-3.1-8B", 4096, 2, 4, False, "none", 2,
                                                                         False), ("multi-head", 7, 1, 2, False, "full", 4, False)]
    hidden = [("grouped-query", 8, 1, 1, False, "none", 4, True), ("8 heads", 12, 2, 4, False, "none", 4, True),
              ("head_dim override", 8, 2, 2, True, "none", 4, True), ("grouped-query", 8, 2, 2, True, "none", 2, True),
              ("one kv head", 8, 1, 1, True, "full", 4, False), ("8 heads", 16, 2, 4, False, "full", 4, False),
              ("Llama-3.1-8B", 131072, 1, 8, False, "none", 2, False), ("Llama-3.1-405B", 8192, 1, 8, True, "full", 2,
                                                                          False),
              ("Llama-3.1-405B", 8192, 2, 4, True, "none", 4, False), ("multi-head", 8, 2, 2, False, "none", 2, True),
              ("Llama-3.1-70B", 32768, 1, 4, False, "full", 2, False), ("grouped-query", 9, 1, 2, False, "none", 4, True)]
    plan = [Case("bytes", args, h, _activation_axes(*args)) for h, cases in ((False, visible), (True, hidden))
            for args in cases]
    plan += [Case("invalid", args, h, {"invalid": axis}) for h, args, axis in (
        (False, ("grouped-query", 8, 1, 2, False, "selective"), "recompute not none or full"),
        (False, ("grouped-query", 8, 1, 4, False, "none"), "tp does not divide the heads"),
        (False, ("multi-head", 6, 1, 4, True, "none"), "sequence parallel and tp does not divide seq"),
        (True, ("8 heads", 8, 1, 8, False, "full"), "tp does not divide the heads"),
        (True, ("grouped-query", 9, 1, 2, True, "none"), "sequence parallel and tp does not divide seq"),
        (True, ("grouped-query", 8, 1, 2, True, "checkpoint"), "recompute not none or full"))]
    return plan


def _measured_kept(cfg, seq, batch, tp, sp, dtype_bytes) -> int:
    dtype = {4: torch.float32, 2: torch.bfloat16, 8: torch.float64}[dtype_bytes]
    return _library.kept_by_tp_block(_reference.tp_block, _reference.shard_block, cfg, tp, seq, batch, sp, dtype)


def _activation_case(tp_activation_bytes, cfg, seq, batch, tp, sp, recompute, dtype_bytes, measured) -> None:
    what = f"tp_activation_bytes(cfg ({cfg.name or _config_kind(cfg)}), seq={seq}, batch={batch}, tp={tp}, " \
           f"sequence_parallel={sp}, recompute={recompute!r}, dtype_bytes={dtype_bytes})"
    got = call_learner(tp_activation_bytes, cfg, seq, batch, tp, sp, recompute, dtype_bytes, what=what)
    want = _measured_kept(cfg, seq, batch, tp, sp, dtype_bytes) if measured else \
        _reference.tp_activation_bytes(cfg, seq, batch, tp, sp, recompute, dtype_bytes)
    if isinstance(got, bool) or not isinstance(got, int):
        raise CheckFailed(f"{what} should return an int, got {type(got).__name__}")
    if got != want:
        source = "the reference tp_block keeps, measured by the meter on simulated ranks" if measured else \
            "the table's count"
        raise CheckFailed(f"{what}: expected {want:,} bytes ({source}), got {got:,}: {_activation_hint(recompute, sp)}")


def _activation_hint(recompute: str, sp: bool) -> str:
    if recompute == "full":
        return "with full recomputation a rank keeps the block's input alone: its tokens of the residual stream"
    return ("under sequence parallelism the residual, the norms' 1/rms and normalized inputs are the rank's tokens "
            "(T/t), the matmul inputs and everything between f and g every token" if sp else
            "without sequence parallelism every tensor covers every token; only heads and FFN units are split")


ACTIVATION_DOMAIN = {**BLOCK_DOMAIN, "sequence_parallel": Choice(False, True), "recompute": Choice("none", "full"),
                     "tokens per rank": Sizes(1, 6, edges=(1,)), "batch": Sizes(1, 3, edges=(1,)),
                     "dtype_bytes": Choice(4, 2), "source": Choice("formula", "measured")}
DRAWN_ACTIVATION_CASES = 16


def check_tp_activation_bytes(tp_activation_bytes, cases: str = "visible") -> None:
    for case in _select(_plan_activation(), cases):
        if case.kind == "invalid":
            name, seq, batch, tp, sp, recompute = case.args
            expect_value_error(tp_activation_bytes, CONFIGS[name], seq, batch, tp, sp, recompute,
                               what=f"tp_activation_bytes(cfg with {CONFIGS[name].n_kv_heads} kv heads, seq={seq}, "
                                    f"batch={batch}, tp={tp}, sequence_parallel={sp}, recompute={recompute!r})",
                               why=f"({case.axes['invalid']})")
            continue
        name, *rest = case.args
        _activation_case(tp_activation_bytes, _config_named(name), *rest)
    if check_cases(cases)[1]:
        def check_one(drawn: dict) -> None:
            cfg, tp = _drawn_config(drawn), drawn["tp"]
            measured = drawn["source"] == "measured"
            if measured and drawn["recompute"] == "full":
                raise Impossible  # (the meter measures a block without checkpointing)
            seq = tp * drawn["tokens per rank"] * 2
            _activation_case(tp_activation_bytes, cfg, seq, drawn["batch"], tp, drawn["sequence_parallel"],
                             drawn["recompute"], drawn["dtype_bytes"], measured)
        grade_drawn(ACTIVATION_DOMAIN, "tp_activation_bytes", DRAWN_ACTIVATION_CASES, check_one)


# ------------------------------------------------------------------------------------------- ring_attention

def _ring_axes(cp, chunk, batch, heads, d, dtype, memory) -> dict:
    return {"cp": "one" if cp == 1 else (cp if cp in (2, 3) else "4 or more"), "dtype": dtype_name(dtype),
            "chunk": "one token" if chunk == 1 else "several tokens", "batch": "one" if batch == 1 else "several",
            "check": "memory" if memory else "values"}


def _plan_ring() -> list[Case]:
    visible = [(2, 4, 1, 2, 8, torch.float64, False), (4, 3, 2, 1, 8, torch.float64, False),
               (1, 2, 1, 2, 8, torch.float32, False), (3, 1, 1, 2, 8, torch.float64, False),
               (2, 4, 1, 2, 16, torch.bfloat16, False), (2, 256, 1, 1, 8, torch.float32, True)]
    hidden = [(1, 5, 1, 2, 8, torch.float64, False), (3, 2, 2, 3, 4, torch.float64, False),
              (8, 1, 1, 1, 8, torch.float64, False), (2, 8, 1, 2, 16, torch.float32, False),
              (4, 4, 1, 2, 16, torch.bfloat16, False), (8, 8, 1, 2, 16, torch.bfloat16, False),
              (8, 64, 1, 2, 16, torch.float32, True), (4, 192, 1, 1, 8, torch.float32, True),
              (2, 320, 2, 1, 8, torch.float32, True)]
    plan = [Case("ring", args, h, _ring_axes(*args)) for h, cases in ((False, visible), (True, hidden))
            for args in cases]
    plan += [Case("invalid", args, h, {"invalid": axis}) for h, args, axis in (
        (False, ((6, 1, 2, 8), (6, 1, 2, 4), (6, 1, 2, 8)), "shapes differ"),
        (False, ((5, 1, 2, 8),) * 3, "odd local sequence"),
        (False, ((6, 2, 8),) * 3, "not 4-D"), (True, ((4, 2, 8),) * 3, "not 4-D"),
        (True, ((7, 2, 1, 4),) * 3, "odd local sequence"),
        (True, ((4, 1, 2, 8), (4, 1, 2, 8), (4, 1, 1, 8)), "shapes differ"))]
    return plan


def _ring_budget(q: torch.Tensor) -> int:
    wide = torch.promote_types(q.dtype, torch.float32)
    s, b, h, _ = q.shape
    tile = min(_library.QUERY_TILE, s // 2)
    return 16 * q.numel() * torch.empty(0, dtype=wide).element_size() + 4 * b * h * tile * (s // 2) * 4


def _ring_case(ring_attention, cp, chunk, batch, heads, d, dtype, memory, seed: int = 0) -> None:
    n = 2 * cp * chunk
    what = f"ring_attention on {cp} ranks, a causal sequence of {n} tokens ({n // cp} a rank), batch {batch}, " \
           f"{heads} heads of {d}, {dtype_name(dtype)}"
    q, k, v, dout = (_tensor((n, batch, heads, d), dtype, seed + i) for i in range(4))
    exact = _full_attention(q, k, v, dout, torch.float64)
    same = _full_attention(q, k, v, dout, dtype)

    def rank(comm):
        from memfit.meter import open_meter
        pos = _library.cp_positions(n, cp, comm.rank)
        mine = [t[pos].clone().requires_grad_() for t in (q, k, v)]
        kept = [t.detach().clone() for t in mine]
        grad_out = dout[pos].clone()
        peak = None
        if memory:
            with open_meter("cpu") as meter:
                out = ring_attention(*mine, comm)
                forward_sent = comm.sent_bytes
                out.backward(grad_out)
                peak = meter.peak
        else:
            out = ring_attention(*mine, comm)
            _keep_contracts(ring_attention, (*mine, comm), out, what)
            forward_sent = comm.sent_bytes
            if isinstance(out, torch.Tensor) and out.requires_grad:
                out.backward(grad_out)
        sent = (forward_sent, comm.sent_bytes - forward_sent)
        changed = any(not same_bits(t.detach(), old) for t, old in zip(mine, kept)) or not same_bits(grad_out,
                                                                                                     dout[pos])
        kinds = {kind for kind, _ in comm.calls}
        return pos, out.detach() if isinstance(out, torch.Tensor) else out, [t.grad for t in mine], peak, changed, \
            kinds, _ring_budget(mine[0]), sent
    kv = 2 * q.numel() // cp * q.element_size()  # bytes of a rank's K and V
    wide = torch.empty(0, dtype=torch.promote_types(dtype, torch.float32)).element_size()
    want_sent = ((cp - 1) * kv, (cp - 1) * kv + cp * kv // q.element_size() * wide) if cp > 1 else (0, 0)
    for r, (pos, out, grads, peak, changed, kinds, budget, sent) in enumerate(
            _on_ranks(cp, rank, what, "ring_attention")):
        where = f"{what}, rank {r} (positions {_positions(pos)})"
        if changed:
            raise CheckFailed(f"{where}: q, k, v or the output's gradient was changed by the call")
        if kinds - {"ring_pass"}:
            raise CheckFailed(f"{where}: called {sorted(kinds - {'ring_pass'})}: pass K and V around the ring with "
                              "comm.ring_pass only; gathering the sequence holds all of it on every rank")
        if sent != want_sent:
            raise CheckFailed(f"{where}: ring_pass sent {sent[0]:,} bytes in forward and {sent[1]:,} in backward; the ring "
                              f"needs {want_sent[0]:,} and {want_sent[1]:,}: K and V (in q's dtype) cp - 1 times each way, "
                              "and their gradients (fp32, fp64 for fp64 inputs) cp times")
        if memory:
            if peak > budget:
                raise CheckFailed(f"{where}: the peak over forward and backward was {peak:,} bytes, over the budget of "
                                  f"{budget:,} (16 fp32 tensors the size of the rank's q, and 4 query tiles of scores): "
                                  "hold one K/V block (and its gradient) at a time, accumulate into tensors of q's size, "
                                  "and let attention_with_lse tile the scores")
            continue
        if not isinstance(out, torch.Tensor) or out.shape != q[pos].shape:
            raise CheckFailed(f"{where}: expected the output of shape {tuple(q[pos].shape)}, got {_describe(out)}")
        hint = ("merge each block with the online softmax: lse = logaddexp(lse, l_j), out = out·exp(lse_old - lse) + "
                "o_j·exp(l_j - lse); each query chunk sees earlier key chunks whole and its own chunk causally")
        _close(out, exact[0][pos], same[0][pos], f"{where}: the output", hint, half_ulps=1.0)
        for name, g, i in zip(("q", "k", "v"), grads, (1, 2, 3)):
            if g is None:
                raise CheckFailed(f"{where}: {name} received no gradient: return the output of your autograd Function")
            _close(g, exact[i][pos], same[i][pos], f"{where}: d{name}",
                   "compute each pair's gradients with the final out and lse of the queries; dk and dv accumulate in "
                   "fp32 buffers that travel with K and V and come back to their owner after the last pass",
                   half_ulps=1.0)


def _positions(pos: torch.Tensor) -> str:
    p = pos.tolist()
    half = len(p) // 2
    return f"{p[0]}..{p[half - 1]} and {p[half]}..{p[-1]}"


def _full_attention(q, k, v, dout, dtype):
    qq, kk, vv = (t.detach().to(dtype).clone().requires_grad_() for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(
        *(t.permute(1, 2, 0, 3) for t in (qq, kk, vv)), is_causal=True).permute(2, 0, 1, 3)
    out.backward(dout.to(dtype))
    return out.detach(), qq.grad, kk.grad, vv.grad


def _invalid_ring(ring_attention, shapes, why: str) -> None:
    from memfit.zero import single_rank
    tensors = [torch.zeros(s) for s in shapes]
    expect_value_error(ring_attention, *tensors, single_rank(),
                       what=f"ring_attention(q, k, v of shapes {', '.join(str(tuple(s)) for s in shapes)}, comm)", why=why)


RING_DOMAIN = {"cp": Sizes(1, 8, edges=(1, 2)), "chunk": Sizes(1, 12, edges=(1,)), "batch": Sizes(1, 2, edges=(1,)),
               "heads": Sizes(1, 3, edges=(1,)), "head_dim": Choice(8, 4, 16), "dtype": Choice("float64", "float32", "bfloat16"),
               "check": Choice("values", "memory")}
DRAWN_RING_CASES = 6


def check_ring_attention(ring_attention, cases: str = "visible") -> None:
    for case in _select(_plan_ring(), cases):
        if case.kind == "invalid":
            _invalid_ring(ring_attention, case.args, why=f"({case.axes['invalid']})")
        else:
            _ring_case(ring_attention, *case.args)
    if check_cases(cases)[1]:
        def check_one(drawn: dict) -> None:
            memory = drawn["check"] == "memory"
            chunk = drawn["chunk"] * (32 if memory else 1)  # memory: chunks longer than a query tile
            _ring_case(ring_attention, drawn["cp"], chunk, drawn["batch"], drawn["heads"], drawn["head_dim"],
                       torch.float32 if memory else getattr(torch, drawn["dtype"]), memory, seed=drawn["seed"] % 1000)
        grade_drawn(RING_DOMAIN, "ring_attention", DRAWN_RING_CASES, check_one)


# ------------------------------------------------------------------------------------------- pipeline_schedule

def _schedule_axes(p, m, schedule, f, b) -> dict:
    return {"schedule": schedule, "n_stages": "one" if p == 1 else "several",
            "n_micro": "fewer than the stages" if m < p else ("equal" if m == p else "more than the stages"),
            "times": "defaults" if (f, b) == (1.0, 2.0) else ("equal" if f == b else "other")}


def _plan_schedule() -> list[Case]:
    visible = [(4, 8, "1f1b", 1.0, 2.0), (4, 8, "gpipe", 1.0, 2.0), (3, 2, "1f1b", 1.0, 2.0), (1, 3, "gpipe", 1.0, 2.0),
               (3, 3, "1f1b", 1.0, 1.0), (2, 5, "gpipe", 1.5, 0.5)]
    hidden = [(2, 2, "1f1b", 1.0, 1.0), (5, 3, "gpipe", 0.5, 1.5), (5, 12, "1f1b", 1.0, 3.0), (1, 1, "1f1b", 2.0, 2.0),
              (3, 3, "gpipe", 1.0, 2.0), (6, 4, "1f1b", 0.25, 0.75), (4, 4, "1f1b", 1.0, 2.0), (2, 7, "gpipe", 3.0, 1.0)]
    plan = [Case("schedule", args, h, _schedule_axes(*args)) for h, cases in ((False, visible), (True, hidden))
            for args in cases]
    plan += [Case("invalid", args, h, {"invalid": axis}) for h, args, axis in (
        (False, (2, 2, "interleaved", 1.0, 2.0), "unknown schedule"), (False, (0, 2, "1f1b", 1.0, 2.0), "n_stages < 1"),
        (False, (2, 0, "1f1b", 1.0, 2.0), "n_micro < 1"), (False, (3, 2, "gpipe", 1.0, 0.0), "time not positive"),
        (True, (2, 0, "gpipe", 1.0, 2.0), "n_micro < 1"), (True, (2, 2, "1f1b", 0.0, 2.0), "time not positive"),
        (True, (2, 2, "gpipe", 1.0, -1.0), "time not positive"), (True, (-1, 2, "gpipe", 1.0, 2.0), "n_stages < 1"),
        (True, (2, 2, "zero-bubble", 1.0, 2.0), "unknown schedule"), (True, (2, 3, "GPipe", 1.0, 2.0), "unknown schedule"),
        (True, (3, 3, "1F1B", 1.0, 2.0), "unknown schedule"))]
    return plan


def _schedule_case(pipeline_schedule, p, m, schedule, f, b) -> None:
    what = f"pipeline_schedule(n_stages={p}, n_micro={m}, schedule={schedule!r}, fwd_time={f}, bwd_time={b})"
    got = call_learner(pipeline_schedule, p, m, schedule, f, b, what=what)
    want = _reference.pipeline_schedule(p, m, schedule, f, b)
    if not isinstance(got, dict):
        raise CheckFailed(f"{what} should return a dict, got {type(got).__name__}")
    missing = set(want) - set(got)
    if missing:
        raise CheckFailed(f"{what}: the dict has no {sorted(missing)}")
    ops = got["ops"]
    if not isinstance(ops, (list, tuple)) or len(ops) != p:
        raise CheckFailed(f"{what}['ops'] should hold one list per stage ({p}), got {_short(ops)}")
    for s, (mine, theirs) in enumerate(zip(ops, want["ops"])):
        mine = list(mine)
        if len(mine) != len(theirs):
            raise CheckFailed(f"{what}['ops'][{s}]: stage {s} runs {len(theirs)} ops (a forward and a backward per "
                              f"micro-batch), got {len(mine)}")
        for i, (a, w) in enumerate(zip(mine, theirs)):
            if not (isinstance(a, tuple) and len(a) == 4 and a[0] == w[0] and a[1] == w[1]
                    and all(_same_time(x, y) for x, y in zip(a[2:], w[2:]))):
                raise CheckFailed(f"{what}['ops'][{s}][{i}]: expected {w}, got {_short(a)} "
                                  f"({_schedule_hint(schedule, s, p, m)})")
    for key in ("total_time", "bubble_fraction"):
        if not _same_time(got[key], want[key]):
            raise CheckFailed(f"{what}[{key!r}]: expected {want[key]:.6g}, got {_short(got[key])}" +
                              (" ((total_time - n_micro·(fwd_time + bwd_time)) / total_time)" if key[0] == "b" else ""))
    if [int(x) if isinstance(x, (int, float)) else x for x in got["in_flight"]] != want["in_flight"] \
            or len(got["in_flight"]) != p:
        raise CheckFailed(f"{what}['in_flight']: expected {want['in_flight']}, got {_short(got['in_flight'])} (per "
                          "stage, the most micro-batches forwarded and not yet backwarded at once)")


def _same_time(a, b) -> bool:
    return isinstance(a, (int, float)) and not isinstance(a, bool) and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def _schedule_hint(schedule: str, s: int, p: int, m: int) -> str:
    if schedule == "gpipe":
        return "GPipe: every forward in order, then every backward in order; each op starts when its stage is free " \
               "and its input has arrived"
    return f"1F1B: stage {s} runs min(p - 1 - s, m) = {min(p - 1 - s, m)} forwards first, then alternates forward " \
           "w + i and backward i, then the remaining backwards; each op starts when its stage is free and its input " \
           "has arrived"


def _short(x) -> str:
    text = repr(x)
    return text if len(text) < 120 else text[:117] + "..."


SCHEDULE_DOMAIN = {"schedule": Choice("1f1b", "gpipe"), "n_stages": Sizes(1, 8, edges=(1, 2)),
                   "n_micro": Sizes(1, 16, edges=(1, 2)), "times": Choice("defaults", "equal", "other")}
DRAWN_SCHEDULE_CASES = 60


def check_pipeline_schedule(pipeline_schedule, cases: str = "visible") -> None:
    for case in _select(_plan_schedule(), cases):
        if case.kind == "invalid":
            expect_value_error(pipeline_schedule, *case.args, what=f"pipeline_schedule{case.args}",
                               why=f"({case.axes['invalid']})")
        else:
            _schedule_case(pipeline_schedule, *case.args)
    if check_cases(cases)[1]:
        def check_one(drawn: dict) -> None:
            rng = random.Random(drawn["seed"])
            f, b = {"defaults": (1.0, 2.0), "equal": (1.5, 1.5)}.get(drawn["times"],
                                                                    (rng.uniform(0.1, 3), rng.uniform(0.1, 3)))
            _schedule_case(pipeline_schedule, drawn["n_stages"], drawn["n_micro"], drawn["schedule"], f, b)
        grade_drawn(SCHEDULE_DOMAIN, "pipeline_schedule", DRAWN_SCHEDULE_CASES, check_one)


# ------------------------------------------------------------------------------------------- memory_per_gpu

def _memory_axes(name, seq, mb, n_micro, tp, pp, cp, dp, zero, recompute) -> dict:
    return {"model": name, "zero": zero, "recompute": recompute, "pp": "one" if pp == 1 else "several",
            "cp": "one" if cp == 1 else "several", "in flight": "n_micro < pp" if n_micro < pp else "pp",
            "tp": "one" if tp == 1 else "several", "layers per stage": "pp divides n_layers" if
            _config_named_any(name).n_layers % pp == 0 else "pp does not divide n_layers"}


def _config_named_any(name: str) -> GPTConfig:
    import memfit.gpt
    if name == "tied":
        return _cfg(tied=True, layers=3)
    if name == "3 layers":
        return _cfg(layers=3)
    if name == "2 layers":
        return _cfg(layers=2)
    if name == "6 heads":  # a head count with a divisor that is no power of two
        return GPTConfig(vocab_size=1024, d_model=96, n_layers=2, n_heads=6, n_kv_heads=6, ffn_hidden=192,
                         max_seq_len=4096, name="6 heads")
    if name.startswith("course-"):
        return memfit.gpt.COURSE_CONFIGS[name.removeprefix("course-")]
    if name == "Llama-3.2-1B":
        return memfit.gpt.LLAMA_3_2_1B
    return _config_named(name)


def _plan_memory() -> list[Case]:
    visible = [("Llama-3.1-405B", 8192, 1, 32, 8, 16, 1, 64, 1, "full"),
               ("Llama-3.1-405B", 131072, 1, 16, 8, 16, 16, 8, 2, "full"),
               ("Llama-3.1-8B", 8192, 2, 4, 1, 1, 1, 8, 3, "none"), ("3 layers", 64, 2, 3, 2, 2, 2, 2, 0, "none"),
               ("Llama-3.1-70B", 8192, 1, 4, 8, 8, 1, 2, 1, "none"), ("tied", 64, 1, 1, 1, 2, 1, 4, 2, "full")]
    hidden = [("Llama-3.1-70B", 8192, 1, 8, 8, 10, 1, 4, 0, "none"), ("Llama-3.1-70B", 32768, 1, 2, 4, 4, 4, 2, 1, "full"),
              ("tied", 64, 1, 4, 2, 1, 1, 3, 2, "none"), ("tied", 96, 2, 1, 1, 3, 3, 1, 3, "full"),
              ("3 layers", 128, 4, 2, 1, 3, 2, 5, 1, "full"), ("Llama-3.1-8B", 131072, 1, 16, 8, 4, 8, 4, 2, "none"),
              ("Llama-3.1-405B", 8192, 1, 16, 8, 16, 1, 128, 3, "full")]
    plan = [Case("memory", args, h, _memory_axes(*args)) for h, cases in ((False, visible), (True, hidden))
            for args in cases]
    plan += [Case("invalid", args, h, {"invalid": axis}) for h, args, axis in (
        (False, ("3 layers", 64, 1, 2, 1, 1, 1, 1, 4, "none"), "zero not 0-3"),
        (False, ("3 layers", 64, 1, 2, 1, 4, 1, 1, 1, "none"), "pp > n_layers"),
        (False, ("3 layers", 60, 1, 2, 1, 1, 4, 1, 1, "none"), "seq_len not a multiple of 2·cp"),
        (False, ("3 layers", 64, 1, 0, 1, 1, 1, 1, 1, "none"), "a size below 1"),
        (True, ("3 layers", 64, 1, 2, 1, 1, 1, 1, -1, "full"), "zero not 0-3"),
        (True, ("tied", 64, 1, 2, 1, 5, 1, 1, 1, "none"), "pp > n_layers"),
        (True, ("3 layers", 36, 1, 2, 1, 1, 4, 1, 1, "none"), "seq_len not a multiple of 2·cp"),
        (True, ("3 layers", 64, 0, 2, 1, 1, 1, 1, 1, "none"), "a size below 1"),
        (True, ("3 layers", 64, 1, 2, 1, 1, 1, 0, 1, "none"), "a size below 1"))]
    return plan


_ACTIVATIONS = {"tp_activation_bytes": _reference.tp_activation_bytes}


def _memory_case(memory_per_gpu, cfg, args: tuple) -> None:
    seq, mb, n_micro, tp, pp, cp, dp, zero, recompute = args
    what = f"memory_per_gpu(cfg ({cfg.name}), seq_len={seq}, micro_batch={mb}, n_micro={n_micro}, tp={tp}, pp={pp}, " \
           f"cp={cp}, dp={dp}, zero={zero}, recompute={recompute!r})"
    with given_references(memory_per_gpu, **_ACTIVATIONS):
        got = call_learner(memory_per_gpu, cfg, *args, what=what)
    want = _reference.memory_per_gpu(cfg, *args)
    if not isinstance(got, dict) or set(got) != set(want):
        raise CheckFailed(f"{what}: expected a dict with keys {sorted(want)}, got "
                          f"{sorted(got) if isinstance(got, dict) else type(got).__name__}")
    for key, value in want.items():
        have = got[key]
        if isinstance(have, bool) or not isinstance(have, int) or have != value:
            shown = f"{have:,}" if isinstance(have, (int, float)) and not isinstance(have, bool) else _short(have)
            raise CheckFailed(f"{what}[{key!r}]: expected {value:,} bytes, got {shown}: {_memory_hint(key)}")


def _memory_hint(key: str) -> str:
    return {"params": "2·Ψ with Ψ = stage_params(cfg, tp, pp), 2·ceil(Ψ / (dp·cp)) under ZeRO-3",
            "grads": "2·Ψ, sharded over the dp·cp ranks from ZeRO-2",
            "optimizer": "12·Ψ, sharded over the dp·cp ranks from ZeRO-1",
            "activations": "min(pp, n_micro) micro-batches in flight x ceil(n_layers / pp) blocks x "
                           "tp_activation_bytes(cfg, seq_len / cp, micro_batch, tp, True, recompute), plus one block "
                           "rebuilt with recompute 'full'",
            "total": "the sum of the four"}[key]


MEMORY_DOMAIN = {"layers": Sizes(1, 12, edges=(1,)), "tp": Choice(1, 2), "pp": Sizes(1, 12, edges=(1,)),
                 "cp": Choice(1, 2, 4), "dp": Sizes(1, 64, edges=(1,)), "zero": Choice(0, 1, 2, 3),
                 "recompute": Choice("none", "full"), "micro_batch": Sizes(1, 4, edges=(1,)),
                 "n_micro": Sizes(1, 32, edges=(1,)), "tied": Choice(False, True)}
DRAWN_MEMORY_CASES = 60


def check_memory_per_gpu(memory_per_gpu, cases: str = "visible") -> None:
    for case in _select(_plan_memory(), cases):
        name, *args = case.args
        cfg = _config_named_any(name)
        if case.kind == "invalid":
            with given_references(memory_per_gpu, **_ACTIVATIONS):
                expect_value_error(memory_per_gpu, cfg, *args, what=f"memory_per_gpu(cfg with {cfg.n_layers} layers, "
                                   f"{', '.join(map(repr, args))})", why=f"({case.axes['invalid']})")
            continue
        _memory_case(memory_per_gpu, cfg, tuple(args))
    if check_cases(cases)[1]:
        def check_one(drawn: dict) -> None:
            if drawn["pp"] > drawn["layers"]:
                raise Impossible
            cfg = _cfg(layers=drawn["layers"], tied=drawn["tied"])
            seq = 8 * drawn["cp"] * drawn["tp"]
            _memory_case(memory_per_gpu, cfg, (seq, drawn["micro_batch"], drawn["n_micro"], drawn["tp"], drawn["pp"],
                                               drawn["cp"], drawn["dp"], drawn["zero"], drawn["recompute"]))
        grade_drawn(MEMORY_DOMAIN, "memory_per_gpu", DRAWN_MEMORY_CASES, check_one)


# ------------------------------------------------------------------------------------------- plan_parallelism

_PLAN_KEYS = ("tp", "pp", "cp", "dp", "zero", "recompute", "micro_batch", "n_micro")
GB = 10**9


def _plan_axes(name, seq, batch, gpus, card, per_node) -> dict:
    want = _reference_plan(name, seq, batch, gpus, card, per_node)
    return {"outcome": "nothing fits" if want is None else "a plan", "gpus_per_node": "default 8" if per_node == 8 else
            "other", "model": "Llama" if name.startswith("Llama") else "course" if name.startswith("course")
            else "test config", "card": "exactly the best plan's bytes" if card == EXACT else "given"}


EXACT = "exactly the best plan's bytes"  # a card the size of the best plan's memory_per_gpu: it fits (<=), just


def _card(name, seq, batch, gpus, card, per_node) -> int:
    if card != EXACT:
        return card
    cfg = _config_named_any(name)
    best = _reference.plan_parallelism(cfg, seq, batch, gpus, 10**15, per_node)
    return _reference.memory_per_gpu(cfg, seq, best["micro_batch"], best["n_micro"], best["tp"], best["pp"], best["cp"],
                                     best["dp"], best["zero"], best["recompute"])["total"]


def _reference_plan(name, seq, batch, gpus, card, per_node):
    return _reference.plan_parallelism(_config_named_any(name), seq, batch, gpus,
                                       _card(name, seq, batch, gpus, card, per_node), per_node)


def _plan_plan() -> list[Case]:
    visible = [("Llama-3.1-8B", 8192, 64, 8, 80 * GB, 8), ("Llama-3.1-405B", 8192, 64, 8, 80 * GB, 8),
               ("3 layers", 64, 8, 4, 400_000, 8), ("Llama-3.1-70B", 8192, 16, 16, 80 * GB, 4),
               ("course-small", 64, 32, 32, EXACT, 2), ("6 heads", 48, 4, 3, 6_436_992, 4),
               ("Llama-3.2-1B", 8192, 64, 24, 20 * GB, 8)]
    hidden = [("Llama-3.1-70B", 8192, 32, 16, 80 * GB, 8), ("3 layers", 64, 8, 8, 300_000, 4),
              ("tied", 96, 6, 6, 500_000, 2), ("Llama-3.1-8B", 32768, 16, 32, 40 * GB, 8),
              ("3 layers", 64, 4, 4, 1000, 8), ("Llama-3.1-405B", 8192, 32, 64, 80 * GB, 8),
              ("course-small", 64, 32, 32, 47_324_876, 2), ("course-medium", 192, 2, 48, 331_249_356, 4),
              ("Llama-3.1-8B", 131072, 128, 64, 80 * GB, 8), ("Llama-3.1-8B", 8192, 2048, 16384, 80 * GB, 8),
              ("course-small", 32, 4, 64, 470_491_648, 8), ("tied", 64, 8, 4, EXACT, 4),
              ("Llama-3.1-70B", 8192, 8, 64, 40 * GB, 2), ("2 layers", 64, 4, 8, 10**9, 8)]
    return [Case("plan", args, h, _plan_axes(*args)) for h, cases in ((False, visible), (True, hidden))
            for args in cases]


def _plan_case(plan_parallelism, cfg, seq, batch, gpus, card, per_node) -> None:
    what = f"plan_parallelism(cfg ({cfg.name}), seq_len={seq}, global_batch={batch}, n_gpus={gpus}, " \
           f"gpu_bytes={card:,}, gpus_per_node={per_node})"
    with given_references(plan_parallelism, memory_per_gpu=_reference.memory_per_gpu, **_ACTIVATIONS):
        got = call_learner(plan_parallelism, cfg, seq, batch, gpus, card, per_node, what=what)
    want = _reference.plan_parallelism(cfg, seq, batch, gpus, card, per_node)
    if want is None:
        if got is not None:
            raise CheckFailed(f"{what}: no layout fits, so return None; got {_short(got)}")
        return
    if not isinstance(got, dict) or any(k not in got for k in _PLAN_KEYS):
        raise CheckFailed(f"{what}: a layout fits (for one: {_layout(want)}); expected a dict with keys "
                          f"{list(_PLAN_KEYS)}, got {_short(got)}")
    tp, pp, cp, dp, zero, recompute, mb, n_micro = (got[k] for k in _PLAN_KEYS)
    problems = _layout_problems(cfg, seq, batch, gpus, per_node, tp, pp, cp, dp, zero, recompute, mb, n_micro)
    if problems:
        raise CheckFailed(f"{what} returned {_layout(got)}, which the exercise does not allow: {problems}")
    args = (cfg, seq, mb, n_micro, tp, pp, cp, dp, zero, recompute)
    memory = _reference.memory_per_gpu(*args)["total"]
    if memory > card:
        raise CheckFailed(f"{what} returned {_layout(got)}, which needs {memory:,} bytes per GPU (memory_per_gpu) on a "
                          f"card of {card:,}")
    cost = _library.layout_cost(*args, gpus_per_node=per_node)["overhead_s"]
    best = _library.layout_cost(cfg, seq, want["micro_batch"], want["n_micro"], want["tp"], want["pp"], want["cp"],
                                want["dp"], want["zero"], want["recompute"], gpus_per_node=per_node)["overhead_s"]
    if cost > best * (1 + 1e-9) + 1e-15:
        raise CheckFailed(f"{what} returned {_layout(got)}, which loses {cost:.6g} s a step (layout_cost); "
                          f"{_layout(want)} fits too and loses {best:.6g} s: search every layout the exercise lists")


def _layout(p: dict) -> str:
    return ", ".join(f"{k}={p[k]!r}" for k in _PLAN_KEYS if k in p)


def _power_of_two(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 1 and n & (n - 1) == 0


def _layout_problems(cfg, seq, batch, gpus, per_node, tp, pp, cp, dp, zero, recompute, mb, n_micro) -> str:
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (tp, pp, cp, dp, zero, mb, n_micro)):
        return "tp, pp, cp, dp, zero, micro_batch and n_micro are ints"
    if not (_power_of_two(tp) and tp <= per_node) or cfg.n_heads % tp or cfg.n_kv_heads % tp or cfg.ffn_hidden % tp:
        return "tp is a power of two up to gpus_per_node dividing n_heads, n_kv_heads and ffn_hidden"
    if not _power_of_two(cp) or not 1 <= pp <= cfg.n_layers or tp * cp * pp * dp != gpus:
        return "cp is a power of two, pp from 1 to n_layers, and tp·cp·pp·dp = n_gpus"
    if seq % (2 * cp * tp if cp > 1 else tp):
        return "seq_len is a multiple of tp, and of 2·cp·tp with cp > 1"
    if not _power_of_two(mb) or batch % (dp * mb) or n_micro != batch // (dp * mb) or n_micro < pp:
        return "micro_batch is a power of two, n_micro = global_batch / (dp·micro_batch), at least pp"
    if zero not in (0, 1, 2, 3) or recompute not in ("none", "full"):
        return "zero is 0-3 and recompute 'none' or 'full'"
    return ""


PLAN_DOMAIN = {"layers": Sizes(1, 6, edges=(1,)), "gpus": Choice(1, 2, 4, 8, 6, 12, 24, 3), "per_node": Choice(8, 2, 4),
               "global_batch": Choice(8, 4, 16, 12), "card": Choice("roomy", "tight", "too small", "exact"),
               "heads": Choice(4, 6)}
DRAWN_PLAN_CASES = 10


def check_plan_parallelism(plan_parallelism, cases: str = "visible") -> None:
    for case in _select(_plan_plan(), cases):
        name, seq, batch, gpus, card, per_node = case.args
        _plan_case(plan_parallelism, _config_named_any(name), seq, batch, gpus,
                   _card(name, seq, batch, gpus, card, per_node), per_node)
    if check_cases(cases)[1]:
        def check_one(drawn: dict) -> None:
            heads = drawn["heads"]
            cfg = _cfg(layers=drawn["layers"], n_heads=heads, n_kv_heads=heads // 2 * 2 if heads == 4 else heads,
                       d_model=8 * heads, ffn_hidden=12 * heads)
            one = _reference.memory_per_gpu(cfg, 64, 1, drawn["global_batch"], 1, 1, 1, 1, 0, "none")["total"]
            if drawn["card"] == "exact":
                best = _reference.plan_parallelism(cfg, 64, drawn["global_batch"], drawn["gpus"], 10**15,
                                                   drawn["per_node"])
                if best is None:
                    raise Impossible
                card = _reference.memory_per_gpu(cfg, 64, best["micro_batch"], best["n_micro"], best["tp"], best["pp"],
                                                 best["cp"], best["dp"], best["zero"], best["recompute"])["total"]
            else:
                card = {"roomy": 2 * one, "tight": one // 3, "too small": one // 1000}[drawn["card"]]
            _plan_case(plan_parallelism, cfg, 64, drawn["global_batch"], drawn["gpus"], card, drawn["per_node"])
        grade_drawn(PLAN_DOMAIN, "plan_parallelism", DRAWN_PLAN_CASES, check_one)


# ------------------------------------------------------------------------------------------- the axes

PLANS = {"conjugate_ops": _plan_conjugate_ops, "shard_block": _plan_shard_block, "tp_block": _plan_tp_block,
         "tp_activation_bytes": _plan_activation, "ring_attention": _plan_ring, "pipeline_schedule": _plan_schedule,
         "memory_per_gpu": _plan_memory, "plan_parallelism": _plan_plan}

AXES = {
    "conjugate_ops": {"operator": OPS, "world_size": ("one", 2, "3 or more"),
                      "dtype": ("float32", "float16", "bfloat16", "float64"),
                      "layout": ("contiguous", "a non-contiguous view"), "rank of x": ("1-D", "2-D", "3-D"),
                      "invalid": ("dim 0 not a multiple of the ranks",)},
    "shard_block": {"config": ("grouped-query", "multi-head", "one kv head", "head_dim override", "8 heads"),
                    "tp": (1, 2, "4 or more"), "rank": ("first", "middle", "last"),
                    "dtype": ("float32", "bfloat16", "float16", "float64"),
                    "invalid": ("tp does not divide n_kv_heads", "tp does not divide ffn_hidden", "rank >= tp",
                                "rank < 0", "tp < 1")},
    "tp_block": {"config": ("grouped-query", "multi-head", "one kv head", "head_dim override", "8 heads"),
                 "tp": (1, 2, "4 or more"), "sequence_parallel": (False, True), "dtype": ("float64", "float32"),
                 "batch": ("one", "several")},
    "tp_activation_bytes": {"config": ("grouped-query", "multi-head", "one kv head", "head_dim override", "8 heads",
                                       "Llama-3.1-8B", "Llama-3.1-70B", "Llama-3.1-405B"),
                            "tp": (1, 2, "4 or more"), "sequence_parallel": (False, True), "recompute": ("none", "full"),
                            "dtype_bytes": (2, 4), "source": ("measured", "formula"), "model size": ("small", "Llama"),
                            "invalid": ("recompute not none or full", "tp does not divide the heads",
                                        "sequence parallel and tp does not divide seq")},
    "ring_attention": {"cp": ("one", 2, 3, "4 or more"), "dtype": ("float64", "float32", "bfloat16"),
                       "chunk": ("one token", "several tokens"), "batch": ("one", "several"),
                       "check": ("values", "memory"), "invalid": ("shapes differ", "odd local sequence", "not 4-D")},
    "pipeline_schedule": {"schedule": ("gpipe", "1f1b"), "n_stages": ("one", "several"),
                          "n_micro": ("fewer than the stages", "equal", "more than the stages"),
                          "times": ("defaults", "equal", "other"),
                          "invalid": ("unknown schedule", "n_stages < 1", "n_micro < 1", "time not positive")},
    "memory_per_gpu": {"model": ("Llama-3.1-8B", "Llama-3.1-70B", "Llama-3.1-405B", "tied", "3 layers"),
                       "zero": (0, 1, 2, 3), "recompute": ("none", "full"), "pp": ("one", "several"),
                       "cp": ("one", "several"), "tp": ("one", "several"), "in flight": ("n_micro < pp", "pp"),
                       "layers per stage": ("pp divides n_layers", "pp does not divide n_layers"),
                       "invalid": ("zero not 0-3", "pp > n_layers", "seq_len not a multiple of 2·cp",
                                   "a size below 1")},
    "plan_parallelism": {"outcome": ("a plan", "nothing fits"), "gpus_per_node": ("default 8", "other"),
                         "model": ("Llama", "course", "test config"), "card": ("given", EXACT)},
}


def case_axes(check: str, cases: str) -> list[dict]:
    return [dict(c.axes) for c in _select(PLANS[check](), cases)]


CHECKS = [
    Check("conjugate_ops", 2, check_conjugate_ops, uses=("tp_copy", "tp_reduce", "sp_gather", "sp_scatter")),
    Check("shard_block", 2, check_shard_block, uses=("shard_block",)),
    Check("tp_block", 4, check_tp_block, uses=("tp_block",), timeout_s=180),
    Check("tp_activation_bytes", 2, check_tp_activation_bytes, uses=("tp_activation_bytes",)),
    Check("ring_attention", 4, check_ring_attention, uses=("ring_attention",), timeout_s=180),
    Check("pipeline_schedule", 3, check_pipeline_schedule, uses=("pipeline_schedule",)),
    Check("memory_per_gpu", 3, check_memory_per_gpu, uses=("memory_per_gpu",)),
    Check("plan_parallelism", 2, check_plan_parallelism, uses=("plan_parallelism",), timeout_s=240),
]
