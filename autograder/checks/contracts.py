"""Contracts every call of learner code keeps, checked by call_learner for every check, without a case of their own.

1. **No state between calls.** Before the first calls of a learner function at a new signature (the shapes, dtypes
   and devices of its tensors, the other arguments' values), call_learner makes decoy calls first:
   - with tensors among the arguments: one call on the same tensor objects and storages holding other values (each
     floating-point tensor's elements shuffled), restored before the real call;
   - with no tensor: one call per argument, that argument given another value of its kind (an int or a float
     doubled, another dtype, every int field of a config doubled with its name kept), the others as given.
   A function that keeps a result (a cache keyed by shape, by address, by id(), by a config's name, or by any part of
   its arguments) then answers the real call with the decoy's result, and the check's own comparison fails it.
2. **A new result each call.** No tensor, array, dict or list of the real call's result is (or shares memory with)
   one of a decoy's results: a caller that changes one result would change the other.
3. **No autograd graph nobody asked for.** When no argument requires grad, no tensor of the result does.
4. **The kind of value the signature gives.** The exercise's `def` line (the solution notebook's, which the stub
   repeats) says what comes back: `-> int` is an int (not a float, a bool or a NumPy integer), `-> dict[str, int]`
   a dict whose values are ints, `-> tuple[int, int]` a tuple of two ints, `-> torch.Tensor` a tensor.
5. **Tensors for backward through save_for_backward.** No custom autograd.Function of the learner's in the graph behind
   a result keeps a tensor as a ctx attribute (ctx.x = x): no saved-tensor hook, and so no meter of what backward
   keeps, would see it. memfit.training.saved_tensors lists such tensors as kind "ctx attribute".
6. **The def line's defaults.** Each learner function (and each method of a learner class) a check is given keeps the
   defaults of the exercise's def line: a caller who leaves an argument out gets the text's value. Checked once per
   check, by Check.run, before any case (`changed_defaults`).

Decoys are skipped where they would disturb what the check measures: while a memory meter or any TorchDispatchMode
(FakeTensorMode, an operation recorder) is active. A decoy's exception, printed output and result are discarded.
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import inspect
import io
import json
import types
import weakref
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_leaves

from memfit.training import ctx_attribute_tensors as _kept_on_ctx  # (imported now: grader files are blocked later)

DECOYED_SIGNATURES = 2  # per learner function and process: the first signatures it is called at get decoys
# Runtime state, rebound (never changed in place: the grading child's snapshot tells the two apart, autograder.sandbox)
_decoyed: dict[tuple, frozenset] = {}  # a learner function's names -> the signatures it had decoys at
_in_decoy = 0
_inputs_on_a_gpu = False
_earlier: dict[tuple, list] = {}  # a learner function's names -> weak references to what its calls returned


def in_decoy() -> bool:
    """Whether the call now running is a decoy (for a test that counts the calls a check's cases make)."""
    return _in_decoy > 0


def new_check(inputs_on_a_gpu: bool = False) -> None:
    """Each check its own decoys: the grader calls this before every check, so a check's grade does not depend on
    which checks ran before it in the process (a rerun of the pending checks after a crash decides the same).
    inputs_on_a_gpu: the check's tensors stand for a GPU's (a lesson of kernels), see host_boundary."""
    global _decoyed, _earlier, _inputs_on_a_gpu
    _decoyed, _earlier = {}, {}
    _inputs_on_a_gpu = inputs_on_a_gpu


@contextlib.contextmanager
def host_boundary(args: tuple, kwargs: dict):
    """What runs on a CPU is what runs on a GPU: where a check's tensors stand for a GPU's and the machine has none,
    a tensor handed to learner code (or a view of one) cannot become a NumPy array, as a CUDA tensor cannot; `.cpu()`
    and `.to("cpu")` of one give a copy, as they do on a GPU, which NumPy may take. Code that does the work in NumPy
    on a CPU and in a kernel on a GPU is graded on what a GPU would run."""
    import memfit
    given = [t for t in tensors_in((args, kwargs)) if type(t) in (torch.Tensor, torch.nn.Parameter)
             and t.layout == torch.strided and t.device.type == "cpu" and t.numel() > 0]  # (no fake or meta tensor)
    if not (_inputs_on_a_gpu and memfit.INTERPRETED and given):
        yield
        return
    Tensor = torch.Tensor
    numpy, cpu, to = Tensor.numpy, Tensor.cpu, Tensor.to

    def on_the_device(t) -> bool:
        return t.device.type == "cpu" and t.numel() > 0 and any(overlaps(t, g) for g in given)

    def guarded_numpy(self, *a, **k):
        if on_the_device(self):
            raise TypeError("can't convert a tensor the check handed you to NumPy: on a GPU it lives in device memory "
                            "(what a GPU refuses, the grader refuses on a CPU too): compute with torch or in your "
                            "kernel, or copy it to the host with .cpu() first")
        return numpy(self, *a, **k)

    def host_copy(t):  # host memory, which a GPU's meter does not count: made where no meter sees it
        from torch.utils._python_dispatch import _disable_current_modes
        with _disable_current_modes():
            return t.clone()

    def copying_cpu(self, *a, **k):
        out = cpu(self, *a, **k)
        return host_copy(out) if out is self or on_the_device(out) else out

    def copying_to(self, *a, **k):
        out = to(self, *a, **k)
        named_cpu = any(str(x) == "cpu" for x in (*a, k.get("device")) if isinstance(x, (str, torch.device)))
        return host_copy(out) if named_cpu and (out is self or on_the_device(out)) else out

    Tensor.numpy, Tensor.cpu, Tensor.to = guarded_numpy, copying_cpu, copying_to
    try:
        yield
    finally:
        Tensor.numpy, Tensor.cpu, Tensor.to = numpy, cpu, to


def _enter_decoy(change: int) -> None:
    global _in_decoy
    _in_decoy += change

# Learner code lives in a notebook's namespace (or a test's module); the course's references in memfit.from_lessons.
# Functions of the grader, of memfit's own machinery or of torch are the check's, not the learner's.
_NOT_LEARNER = ("autograder", "memfit", "torch", "triton", "numpy", "builtins")


def is_learner_function(fn: Callable) -> bool:
    if getattr(fn, "__learner_call__", False):
        return True
    # classes, bound methods (an optimizer's step), builtins: stateful by design, or not the learner's
    if isinstance(fn, (type, types.MethodType)) or not hasattr(fn, "__code__"):
        return False
    module = getattr(fn, "__module__", None) or ""
    if module.startswith("memfit.from_lessons"):
        return True
    return not (module.split(".")[0] in _NOT_LEARNER)


def _measuring() -> bool:
    from torch.utils._python_dispatch import _get_current_dispatch_mode
    from memfit.meter import meters_open
    return meters_open() > 0 or _get_current_dispatch_mode() is not None


def _signature(value: Any):
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.device.type)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_signature(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _signature(v)) for k, v in value.items()))
    if isinstance(value, (int, float, str, bool, type(None), torch.dtype)):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, repr(value))
    return type(value).__name__


def tensors_in(tree) -> list[torch.Tensor]:
    """The strided tensors anywhere in a tree of arguments or results (tuples, lists, dicts)."""
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor) and t.layout == torch.strided]


_OTHER_DTYPE = {torch.float32: torch.bfloat16, torch.bfloat16: torch.float16, torch.float16: torch.float32,
                torch.float64: torch.float32, torch.int8: torch.int32, torch.int32: torch.int64,
                torch.int64: torch.int32, torch.uint8: torch.int8, torch.bool: torch.int8}


def variant(value: Any) -> Any:
    """Another value of the same kind, or None where there is none to make."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return None
    if isinstance(value, int):
        return 2 * value if value else 1
    if isinstance(value, float):
        return 1.5 * value if value else 1.0
    if isinstance(value, torch.dtype):
        return _OTHER_DTYPE.get(value, torch.float32)
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                        for v in value):
        return type(value)(variant(v) for v in value)  # (a torch.Size stays one)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: 2 * getattr(value, f.name) for f in dataclasses.fields(value)
                  if type(getattr(value, f.name)) is int and getattr(value, f.name) > 0}
        if fields:
            try:
                return dataclasses.replace(value, **fields)
            except Exception:  # (a config that validates its fields)
                return None
    return None


@contextlib.contextmanager
def _shuffled(tensors: list[torch.Tensor], seed: int):
    """The floating-point tensors' elements shuffled in place (same objects, same storages), restored on exit."""
    saved = []
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        try:
            for t in tensors:
                if not t.dtype.is_floating_point or t.numel() == 0:
                    continue
                original = t.detach().clone()
                saved.append((t, original))
                flat = original.reshape(-1)
                order = torch.randperm(t.numel(), generator=generator).to(t.device)
                # (one element, or all equal: a shuffle changes nothing, so halve and shift them, keeping signs)
                other = flat[order] if t.numel() > 1 and bool((flat != flat[0]).any()) else flat * 0.5 + 0.25
                t.detach().copy_(other.view(t.shape))
            yield bool(saved)
        finally:
            for t, original in reversed(saved):
                t.detach().copy_(original)


def _decoy_calls(fn: Callable, args: tuple, kwargs: dict):
    """Yield a context per decoy call: inside it, (args, kwargs) to call fn with."""
    tensors = tensors_in((args, kwargs))
    if tensors:
        @contextlib.contextmanager
        def shuffled():
            with _shuffled(tensors, seed=len(tensors)) as changed:
                yield (args, kwargs) if changed else None
        yield shuffled()
        return
    varied = False
    for i, value in enumerate(args):
        other = variant(value)
        if other is not None:
            varied = True
            yield contextlib.nullcontext((args[:i] + (other,) + args[i + 1:], kwargs))
    for key, value in kwargs.items():
        other = variant(value)
        if other is not None:
            varied = True
            yield contextlib.nullcontext((args, {**kwargs, key: other}))
    if not varied:  # nothing to vary (no arguments, or none with another value): the same call, once before
        yield contextlib.nullcontext((args, kwargs))


def _plain(value: Any) -> bool:
    """A value a decoy call cannot change for the real one: a tensor (restored after), a number, a string, a dtype,
    a frozen dataclass, or a tuple, list or dict of those. A module, an optimizer or any other object the function
    may change in place (add_lora(model) adds adapters to it) is not; nor is a function the check hands over (a
    predictor, a factory): its cost and its calls are the check's. No decoy for such a call."""
    if isinstance(value, (torch.Tensor, int, float, str, bool, type(None), torch.dtype, torch.device)):
        return True
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(_plain(v) for v in value.values())
    params = getattr(type(value), "__dataclass_params__", None)
    return bool(params is not None and params.frozen)


def _names(fn: Callable) -> tuple:
    return getattr(fn, "__module__", None), getattr(fn, "__qualname__", None), getattr(fn, "__name__", None)


def _wants_decoys(fn: Callable, args: tuple, kwargs: dict) -> bool:
    if not is_learner_function(fn) or _measuring() or not _plain((args, kwargs)):
        return False
    global _decoyed
    # (by name, not id(): a wrapper made per call, as a check's forward of an autograd Function, dies and its id is
    # reused, and a rerun must make the same decoys)
    key = _names(fn)
    seen = _decoyed.get(key, frozenset())
    try:
        signature = hash(_signature((args, kwargs)))
    except TypeError:
        return False
    if signature in seen or len(seen) >= DECOYED_SIGNATURES:
        return False
    _decoyed = {**_decoyed, key: seen | {signature}}
    return True


def run_decoys(fn: Callable, args: tuple, kwargs: dict, release: Callable[[BaseException], None]) -> list:
    """The decoys' results (those that returned), after calling fn on each decoy of (args, kwargs)."""
    if not _wants_decoys(fn, args, kwargs):
        return []
    results = []
    for decoy in _decoy_calls(fn, args, kwargs):
        with decoy as call:
            if call is None:
                continue
            _enter_decoy(+1)
            try:
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    results.append(fn(*call[0], **call[1]))
            except Exception as exc:  # the decoy's values may lie outside what the function accepts
                release(exc)
            finally:
                _enter_decoy(-1)
    return results


def _objects(tree) -> list:
    """The mutable objects of a result: tensors, NumPy arrays, dicts, lists and sets, at any depth."""
    found, stack = [], [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, (dict, list, set)):
            found.append(item)
            stack.extend(item.values() if isinstance(item, dict) else item)
        elif isinstance(item, tuple):
            stack.extend(item)
        elif isinstance(item, torch.Tensor) or type(item).__module__ == "numpy" and hasattr(item, "__array__"):
            found.append(item)
    return found


def spans(t: torch.Tensor) -> tuple[int, int]:
    """[first byte, last byte + 1) of the memory a tensor's elements occupy."""
    if t.numel() == 0:
        return (t.data_ptr(), t.data_ptr())
    lo = hi = t.data_ptr()
    for size, stride in zip(t.shape, t.stride()):
        reach = (size - 1) * stride * t.element_size()
        lo, hi = (lo + reach, hi) if reach < 0 else (lo, hi + reach)
    return lo, hi + t.element_size()


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors' elements can share memory (same device, intersecting byte ranges)."""
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    (a0, a1), (b0, b1) = spans(a), spans(b)
    return a0 < b1 and b0 < a1


def _shares(a, b) -> bool:
    if a is b:
        return True
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.layout == b.layout == torch.strided:
        return overlaps(a.detach(), b.detach())
    return False


def _remember(fn: Callable, results: list) -> None:
    """Weak references to the tensors and arrays a call returned, for the later calls of the check to be compared
    with (dicts and lists cannot be referenced weakly, and an id outlives its object)."""
    global _earlier
    refs = []
    for obj in results:
        try:
            refs.append(weakref.ref(obj))
        except TypeError:
            continue
    alive = [ref for ref in _earlier.get(_names(fn), ()) if ref() is not None]
    _earlier = {**_earlier, _names(fn): (alive + refs)[-64:]}


def broken_contract(fn: Callable, args: tuple, kwargs: dict, result: Any, decoys: list, what: str = "") -> str | None:
    """What the result breaks of contracts 2, 3 and 5, in words for the learner; None when it keeps them."""
    kept = ctx_attribute_tensors(result)
    if kept:
        return kept
    if not is_learner_function(fn):
        return None
    given = _objects((args, kwargs))
    # (an argument handed back, an out= the exercise writes into, is the same object each call by design)
    mine = [obj for obj in _objects(result) if not any(_shares(obj, arg) for arg in given)]
    # the decoys' results, and the tensors and arrays earlier calls in this check returned that are still alive
    # (under a meter there are no decoys; a result kept by the code, not the check, is alive by definition)
    # (only for plain arguments: what a call handed a model returns may be the model's own tensors, each call)
    earlier_results = list(decoys)
    if _plain((args, kwargs)):
        earlier_results.append([ref() for ref in _earlier.get(_names(fn), ()) if ref() is not None])
        _remember(fn, mine)
    for earlier in earlier_results:
        theirs = _objects(earlier)
        for obj in mine:
            if any(_shares(obj, other) for other in theirs):
                kind = type(obj).__name__
                return (f"returned a {kind} that an earlier call (other values in tensors of the same shapes, or "
                        "other arguments) returned too, or memory it shares: return a new object each call, computed "
                        "from this call's arguments, and keep no state between calls (a cache, a module-level variable)")
    kind = wrong_kind(fn, result, what)
    if kind:
        return kind
    inputs = tensors_in((args, kwargs))
    if torch.is_grad_enabled() and not any(t.requires_grad for t in inputs):
        if any(t.requires_grad for t in tensors_in(result)):
            return ("returned a tensor that requires grad (an autograd graph attached), though no argument requires "
                    "grad: compute the result without autograd (no requires_grad_(), or detach what you return)")
    return None


# ------------------------------------------------------------------------------ 5. save_for_backward

def ctx_attribute_tensors(result: Any) -> str | None:
    """A learner's custom autograd.Function in the graph behind the result that keeps a tensor as an attribute of its
    ctx (ctx.x = x) instead of through ctx.save_for_backward: the graph holds it all the same, but no saved-tensor hook
    (the course's meter of what backward keeps, activation offload, checkpointing) sees it, and PyTorch cannot check it
    was not changed in place before the backward."""
    for function, name, _ in _kept_on_ctx(tensors_in(result)):
        if (getattr(function, "__module__", "") or "").split(".")[0] not in _NOT_LEARNER:
            return (f"left a tensor in ctx.{name} of {function.__name__}.forward: keep the tensors backward needs with "
                    "ctx.save_for_backward(...) and read them back from ctx.saved_tensors (only numbers, shapes and "
                    "flags as ctx attributes)")
    return None


# ------------------------------------------------------------------------------ 4. the signature's kind

def _solution_defs() -> list[tuple[str, ast.FunctionDef]]:
    """(name, def) of every module-level function of the solution notebooks, and of every method of their classes
    as "Class.method". Read once, at import: the grading child blocks those files later."""
    from course.lessons import lessons, solution_path
    found = []
    for lesson in lessons():
        for cell in json.loads(solution_path(lesson).read_text())["cells"]:
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            if cell["cell_type"] != "code" or "def " not in source:
                continue
            try:
                tree = ast.parse("\n".join(l for l in source.splitlines() if not l.lstrip().startswith(("%", "!"))))
            except SyntaxError:
                continue
            for node in tree.body:
                if isinstance(node, ast.FunctionDef):
                    found.append((node.name, node))
                elif isinstance(node, ast.ClassDef):
                    found += [(f"{node.name}.{m.name}", m) for m in node.body if isinstance(m, ast.FunctionDef)]
    return found


def _unclashed(pairs) -> dict:
    """{name: value} of (name, ast node) pairs, a name two lessons define differently left out."""
    found: dict = {}
    clashes: set[str] = set()
    for name, value in pairs:
        if name in found and ast.dump(found[name]) != ast.dump(value):
            clashes.add(name)
        found[name] = value
    return {name: value for name, value in found.items() if name not in clashes}


def _declared_returns(defs) -> dict[str, ast.expr]:
    """{function name: its return annotation} of the solutions' module-level functions."""
    return _unclashed((name, node.returns) for name, node in defs if "." not in name and node.returns is not None)


def _declared_defaults(defs) -> dict[str, ast.expr]:
    """{"function parameter" or "Class.method parameter": the default the exercise's def line gives}."""
    pairs = []
    for name, node in defs:
        args = node.args
        positional = args.posonlyargs + args.args
        given = list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
        given += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
        pairs += [(f"{name} {a.arg}", d) for a, d in given]
    return _unclashed(pairs)


try:
    _DEFS = _solution_defs()
except (OSError, ValueError, KeyError):  # (a checkout without the solution notebooks: nothing to compare with)
    _DEFS = []
DECLARED_RETURNS = _declared_returns(_DEFS)
DECLARED_DEFAULTS = _declared_defaults(_DEFS)
del _DEFS

_SCALARS = {"int": int, "float": float, "str": str, "bool": bool}


def _kind_error(value: Any, annotation: ast.expr) -> str | None:
    """Why value is not of the annotation's kind, or None (also for a kind this does not judge)."""
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):  # int | str
        left, right = _kind_error(value, annotation.left), _kind_error(value, annotation.right)
        return None if left is None or right is None else left
    if isinstance(annotation, ast.Constant) and annotation.value is None:
        return None if value is None else f"{type(value).__name__} {value!r} where None is declared"
    if isinstance(annotation, ast.Name) and annotation.id in _SCALARS:
        want = _SCALARS[annotation.id]
        if want is int:
            ok = type(value) is int
        elif want is float:
            ok = type(value) in (int, float)
        else:
            ok = type(value) is want
        return None if ok else f"{type(value).__name__} {value!r} where {annotation.id} is declared"
    if isinstance(annotation, ast.Attribute) and ast.unparse(annotation) == "torch.Tensor":
        return None if isinstance(value, torch.Tensor) else f"{type(value).__name__} where a torch.Tensor is declared"
    if isinstance(annotation, ast.Subscript) and isinstance(annotation.value, ast.Name):
        outer, inner = annotation.value.id, annotation.slice
        items = list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]
        if outer == "dict":
            if not isinstance(value, dict):
                return f"{type(value).__name__} where a dict is declared"
            if len(items) == 2:
                for key, item in value.items():
                    why = _kind_error(item, items[1])
                    if why:
                        return f"{why} (the value of {key!r})"
            return None
        if outer in ("tuple", "list"):
            if not isinstance(value, (tuple, list)):
                return f"{type(value).__name__} where a {outer} is declared"
            if outer == "tuple" and not (len(items) == 2 and isinstance(items[1], ast.Constant)
                                         and items[1].value is Ellipsis):
                if len(value) != len(items):
                    return f"{len(value)} values where a tuple of {len(items)} is declared"
                pairs = zip(value, items)
            else:
                pairs = ((item, items[0]) for item in value)
            for i, (item, want) in enumerate(pairs):
                why = _kind_error(item, want)
                if why:
                    return f"{why} (item {i})"
            return None
    return None


def wrong_kind(fn: Callable, result: Any, what: str = "") -> str | None:
    """The result against the return annotation of the exercise of the same name (the function's, else the one the
    check's description of the call begins with), in words; None when it agrees."""
    annotation = DECLARED_RETURNS.get(getattr(fn, "__name__", "")) or DECLARED_RETURNS.get(what.split("(")[0].strip())
    if annotation is None or not is_learner_function(fn):
        return None
    why = _kind_error(result, annotation)
    return None if why is None else (f"returned {why} by the exercise's signature "
                                     f"(-> {ast.unparse(annotation)}): return exactly that kind of value")


# ------------------------------------------------------------------------------ 6. the def line's defaults

_UNKNOWN = object()


def _value_of(node: ast.expr):
    """A default's value: a literal, or an expression of torch and math (torch.float32); _UNKNOWN otherwise."""
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        pass
    try:
        import math
        return eval(compile(ast.Expression(node), "<default>", "eval"), {"__builtins__": {}, "torch": torch, "math": math})
    except Exception:  # noqa: BLE001  (a default this cannot evaluate is not compared)
        return _UNKNOWN


def _same_default(theirs, ours) -> bool:
    if isinstance(ours, (tuple, list)):
        return isinstance(theirs, (tuple, list)) and len(theirs) == len(ours) and \
            all(_same_default(a, b) for a, b in zip(theirs, ours))
    if isinstance(ours, bool) or isinstance(theirs, bool):
        return type(theirs) is type(ours) and theirs == ours
    if isinstance(ours, (int, float)) and isinstance(theirs, (int, float)):
        return theirs == ours
    return type(theirs) is type(ours) and theirs == ours


def changed_defaults(names: tuple[str, ...], functions: tuple) -> str | None:
    """Which default of the exercise's def line (the solution's, which the stub repeats) a learner function or class
    changed or dropped, in words; None when it keeps them all. A caller that leaves an argument out gets the text's
    default: AdamW's weight_decay=1e-2, say, not 0."""
    for name, fn in zip(names, functions):
        for key, node in DECLARED_DEFAULTS.items():
            where, param = key.split(" ")
            owner, _, method = where.partition(".")
            if owner != name or (method and not isinstance(fn, type)) or (not method and isinstance(fn, type)):
                continue
            target = getattr(fn, method, None) if method else fn
            try:
                parameters = inspect.signature(target).parameters if target is not None else {}
            except (TypeError, ValueError):
                continue
            if any(p.kind is p.VAR_KEYWORD for p in parameters.values()) and param not in parameters:
                continue  # (**kwargs: the default lives in the body, where only the cases can see it)
            ours = _value_of(node)
            if ours is _UNKNOWN:
                continue
            label = f"{name}{'.' + method if method else ''}"
            if param not in parameters or parameters[param].default is inspect.Parameter.empty:
                return (f"{label} has no default for {param}: keep the exercise's def line, "
                        f"{param}={ast.unparse(node)}")
            theirs = parameters[param].default
            if not _same_default(theirs, ours):
                return (f"{label}'s default {param}={theirs!r} is not the exercise's {param}={ast.unparse(node)}: keep "
                        "the def line as the text gives it (a caller who leaves the argument out gets the text's value)")
    return None
