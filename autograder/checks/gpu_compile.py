"""What runs in Triton's interpreter must compile for a GPU.

On a machine without a GPU every kernel runs in Triton's interpreter, which executes the kernel's Python as Python:
a kernel that reads a module global (`LN2 = 0.693...`), calls NumPy or uses a construct the compiler refuses passes
there and fails on every GPU ("Cannot access global variable LN2 from within @jit'ed function"). So while a check
runs, the kernels that learner code launches are recorded (the first launch of each, with its arguments); after the
check passes, each one is compiled for the course's GPU targets with `triton.compile`, which needs no GPU, and a
kernel that does not compile costs the check its points with the compiler's message.

The compiler cannot run in the grading process itself: Triton's interpreter patches `triton.language` for as long as
the process lives once a kernel has called a helper, and the compiler needs it unpatched. A fresh interpreter (the
`__main__` below, in the grading child's own limits) gets each recorded kernel's source, the globals it names (other
kernels by source, modules by name, constexprs and numbers by value, anything else as an opaque stand-in, which the
compiler refuses as the GPU's would) and the launch's signature, and reports what each target says.
"""
from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import inspect
import json
import os
import re
import subprocess
import sys
import sysconfig
import textwrap
import types

# (capability, the card it stands for): the course's smallest target, the V100 some learners have, a current card.
# The front end (globals, Python the compiler refuses, types) is the same for every target; the back end is not.
TARGETS = ((75, "Colab's T4"), (70, "a V100"), (90, "an H100"))
_TIMEOUT_S = 600  # a compile is seconds; this is a safety net, not a budget

_TRITON_TYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64", "int8": "i8",
                 "uint8": "u8", "int16": "i16", "int32": "i32", "int64": "i64", "bool": "i1", "uint16": "u16",
                 "uint32": "u32", "uint64": "u64"}  # torch.<name> -> Triton's pointee type

# kernel -> (InterpretedFunction, signature, constexprs, options) of its first launch: one launch of each is compiled
# (what the interpreter lets through and the compiler refuses is in the source, whatever the sizes and dtypes)
_recorded: dict = {}
_verdicts: dict[str, str] = {}  # bundle digest -> "" (compiles) or why not: a rerun or a later check asks once
_COURSE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# where kernels that are not the graded code's live: the course's library (its references too), the grader, packages
_NOT_LEARNERS = (os.path.join(_COURSE, "memfit") + os.sep, os.path.join(_COURSE, "autograder") + os.sep,
                 *{sysconfig.get_paths()[k] + os.sep for k in ("purelib", "platlib", "stdlib")})


def new_check() -> None:
    global _recorded  # rebound, never filled in place: the grader's runtime state (autograder/sandbox.py)
    _recorded = {}


def _is_constexpr(annotation) -> bool:
    return "constexpr" in (annotation if isinstance(annotation, str) else getattr(annotation, "__name__", ""))


def launch_signature(fn, args: tuple, kwargs: dict) -> tuple[dict, dict, dict] | None:
    """(signature, constexprs, options) of one launch as triton.compile wants them; None when an argument has a kind
    this module does not translate (the kernel is then not compiled: no verdict rather than a wrong one)."""
    import torch
    params = list(inspect.signature(fn).parameters.values())
    bound = dict(zip((p.name for p in params), args))
    bound.update({k: v for k, v in kwargs.items() if k in {p.name for p in params}})
    signature, constexprs = {}, {}
    for p in params:
        value = bound.get(p.name, p.default)
        value = getattr(value, "value", value) if type(value).__name__ == "constexpr" else value
        if _is_constexpr(p.annotation) or value is None:
            if not isinstance(value, (int, float, bool, str, type(None))):
                return None
            signature[p.name], constexprs[p.name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            name = str(value.dtype).removeprefix("torch.")
            if name not in _TRITON_TYPES:
                return None
            signature[p.name] = "*" + _TRITON_TYPES[name]
        elif isinstance(value, bool):
            signature[p.name] = "i1"
        elif isinstance(value, int):
            signature[p.name] = "i32" if -2**31 <= value < 2**31 else "i64"
        elif isinstance(value, float):
            signature[p.name] = "fp32"
        else:
            return None
    options = {k: kwargs[k] for k in ("num_warps", "num_stages") if isinstance(kwargs.get(k), int)}
    return signature, constexprs, options


def _from_learner(fn) -> bool:
    """A kernel of the code being graded: not the course's library (its references included) nor a package's. By file,
    not contracts.is_learner_function, which counts memfit.from_lessons as learner code (a check may hand a
    reference in as a learner's): a reference kernel is not graded, and the grading child may not read its source."""
    return not fn.__code__.co_filename.startswith(_NOT_LEARNERS)


@contextlib.contextmanager
def recording_kernels():
    """Record the first launch of each learner kernel inside the block, in Triton's interpreter."""
    import memfit
    if not memfit.INTERPRETED:
        yield
        return
    from triton.runtime.interpreter import InterpretedFunction
    run = InterpretedFunction.run

    def recording_run(self, *args, grid, warmup, **kwargs):
        global _recorded
        if _from_learner(self.fn) and self.fn not in _recorded:
            found = launch_signature(self.fn, args, kwargs)
            if found is not None:
                signature, constexprs, options = found
                _recorded = {**_recorded, self.fn: (self, signature, constexprs, options)}
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = recording_run
    try:
        yield
    finally:
        InterpretedFunction.run = run


# ------------------------------------------------------------------------------------ the bundle

def _source_of(fn) -> tuple[str, str, int]:
    """(filename, the function's source from its `def` line, that line's number): decorators are left out, the
    worker applies triton.jit itself."""
    lines, first = inspect.getsourcelines(fn)
    text = textwrap.dedent("".join(lines))
    start = text.index("def " + fn.__name__) if ("def " + fn.__name__) in text else 0
    skipped = text[:start].count("\n")
    return fn.__code__.co_filename, text[start:], first + skipped


def _global_spec(value, add_kernel):
    """How the worker rebuilds one global a kernel names."""
    from triton.runtime.interpreter import InterpretedFunction
    import triton.language as tl
    if isinstance(value, InterpretedFunction):
        return ["kernel", add_kernel(value.fn)]
    if isinstance(value, types.ModuleType):
        return ["module", value.__name__]
    if isinstance(value, tl.constexpr):
        inner = value.value
        return ["constexpr", inner] if isinstance(inner, (int, float, bool, str, type(None))) else ["opaque", "?"]
    if isinstance(value, tl.dtype):
        return ["dtype", value.name]
    if isinstance(value, (int, float, bool, str, type(None))):  # a plain global: the compiler refuses it, as a GPU's
        return ["value", value]
    module = getattr(value, "__module__", "") or ""
    if module.startswith("triton") and hasattr(value, "__qualname__"):
        return ["object", module, value.__qualname__]
    return ["opaque", type(value).__name__]


def bundle(recorded: list[tuple]) -> dict:
    """Everything the worker needs, as JSON: each kernel and helper's source and globals, and each launch."""
    functions: dict[str, dict] = {}

    def add_kernel(fn) -> str:
        key = f"{fn.__code__.co_filename}:{fn.__code__.co_firstlineno}:{fn.__name__}"
        if key in functions:
            return key
        filename, source, line = _source_of(fn)
        functions[key] = entry = {"name": fn.__name__, "filename": filename, "line": line, "source": source,
                                  "globals": {}}
        # every name the source mentions: the body's, and the annotations' and defaults' (`BLOCK: tl.constexpr`),
        # which Python evaluates where the function is defined
        names = set(fn.__code__.co_names) | {node.id for node in ast.walk(ast.parse(source))
                                             if isinstance(node, ast.Name)}
        for name in sorted(names & set(fn.__globals__)):
            entry["globals"][name] = _global_spec(fn.__globals__[name], add_kernel)
        return key

    launches = [{"kernel": add_kernel(interp.fn), "signature": signature, "constexprs": constexprs,
                 "options": options} for interp, signature, constexprs, options in recorded]
    return {"functions": functions, "launches": launches, "targets": [t for t, _ in TARGETS]}


def _code_digest(launch: tuple) -> str:
    """What decides whether a kernel compiles: its source, its helpers', the globals they name (not the sizes)."""
    code = bundle([launch])["functions"]
    return hashlib.sha256(json.dumps(code, sort_keys=True, default=str).encode()).hexdigest()


def failures(what: str) -> str | None:
    """Why a kernel the check's learner code launched does not compile for a GPU, for the learner; None when every
    one compiles (or none was launched, or this machine has a GPU: the kernels were compiled to run). A kernel whose
    code compiled in an earlier check is not compiled again."""
    global _verdicts
    launches = {_code_digest(launch): launch for launch in _recorded.values()}
    new = [digest for digest in launches if digest not in _verdicts]
    if new:
        _verdicts = {**_verdicts, **dict(zip(new, _compile_elsewhere(bundle([launches[d] for d in new]))))}
    refused = [_verdicts[digest] for digest in launches if _verdicts[digest]]
    return f"{what}: {refused[0]}" if refused else None


def _compile_elsewhere(work: dict) -> list[str]:
    """Per launch of `work`: "" when it compiles for every target, else why, in a fresh interpreter (the module's
    docstring says why). A worker that fails for its own reasons gives no verdict: a kernel loses points for what the
    compiler says of it, never for the grader's trouble."""
    # run as a file, not as part of the package: the worker needs Triton alone (no torch, no grader), and starts fast
    done = subprocess.run([sys.executable, os.path.abspath(__file__)], input=json.dumps(work, default=str),
                          capture_output=True, text=True, env={**os.environ, "TRITON_INTERPRET": "0"},
                          timeout=_TIMEOUT_S)
    try:
        report = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        print(f"gpu_compile: no verdict, the compiler's process failed: {done.stderr.strip()[-500:]}", file=sys.stderr)
        return [""] * len(work["launches"])
    cards = dict(TARGETS)
    return [f"your kernel {item['kernel']} runs in Triton's interpreter but does not compile for a GPU "
            f"({cards[item['target']]}, sm_{item['target']}): {item['error']}. Only tl.constexpr globals, other "
            "@triton.jit functions and triton.language may be used inside a kernel: pass other values as arguments"
            if item["error"] else "" for item in report]


# ------------------------------------------------------------------------------------ the worker

def _rebuild(functions: dict) -> dict:
    """The bundle's functions as JITFunctions, each with its globals, in a process whose Triton compiles."""
    import importlib
    import linecache

    import triton
    import triton.language as tl

    class Opaque:  # a global the kernel may not read on a GPU: the compiler refuses it by name
        def __init__(self, kind):
            self.kind = kind

    files: dict[str, list[str]] = {}
    for entry in functions.values():
        lines = files.setdefault(entry["filename"], [])
        body = entry["source"].splitlines(keepends=True)
        start = entry["line"] - 1
        lines.extend(["\n"] * max(0, start + len(body) - len(lines)))
        lines[start:start + len(body)] = body
    for filename, lines in files.items():
        linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
    scopes: dict[str, dict] = {key: {"__builtins__": __builtins__, "__name__": "graded_code"} for key in functions}
    jitted: dict[str, object] = {}

    def value_of(spec):
        kind = spec[0]
        if kind == "module":
            return importlib.import_module(spec[1])
        if kind == "constexpr":
            return tl.constexpr(spec[1])
        if kind == "dtype":
            return getattr(tl, spec[1]) if isinstance(getattr(tl, spec[1], None), tl.dtype) else Opaque(spec[1])
        if kind == "value":
            return spec[1]
        if kind == "object":
            return functools.reduce(getattr, spec[2].split("."), importlib.import_module(spec[1]))
        return Opaque(spec[1])

    for key, entry in functions.items():  # every global but the kernels first: a default argument may name one
        scopes[key].update({name: value_of(spec) for name, spec in entry["globals"].items() if spec[0] != "kernel"})
    for key, entry in functions.items():
        code = compile("\n" * (entry["line"] - 1) + entry["source"], entry["filename"], "exec")
        exec(code, scopes[key])
        jitted[key] = triton.jit(scopes[key][entry["name"]])
    for key, entry in functions.items():
        scopes[key].update({name: jitted[spec[1]] for name, spec in entry["globals"].items() if spec[0] == "kernel"})
    return jitted


def _why(exc: Exception) -> str:
    """One line: the compiler's error, its first sentence, and the kernel's line it points at (under Triton's `^`)."""
    lines = [line.rstrip() for line in str(exc).splitlines() if line.strip() and "Repro command" not in line]
    caret = next((i for i, line in enumerate(lines) if set(line.strip()) == {"^"}), None)
    where = f" at `{lines[caret - 1].strip()}`" if caret else ""
    after = lines[caret + 1:] if caret is not None else lines
    errors = [line for line in after if "error" in line.lower()] or after or [type(exc).__name__]
    first = re.sub(r'^\w+\(["\'](.*?)["\']?\)?$', r"\1", errors[-1].strip()).split(". ")[0].rstrip(".")
    return f"{first[:300]}{where}"


def main() -> int:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    work = json.loads(sys.stdin.read())
    jitted = _rebuild(work["functions"])
    report = []
    for launch in work["launches"]:
        fn = jitted[launch["kernel"]]
        item = {"kernel": work["functions"][launch["kernel"]]["name"], "target": None, "error": ""}
        for target in work["targets"]:
            try:
                triton.compile(ASTSource(fn, launch["signature"], launch["constexprs"]),
                               target=GPUTarget("cuda", target, 32), options=launch["options"])
            except Exception as exc:  # noqa: BLE001  (any refusal is the verdict)
                item.update(target=target, error=_why(exc))
                break
        report.append(item)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
