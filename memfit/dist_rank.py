"""What runs inside a rank of memfit.dist: resolve the target, join the process group, run it, write its result.

Imported by the rank (a fresh `python -m memfit.dist TMPDIR RANK`, a fork of memfit.rank_server, or a fork of the
launching process), never by the launcher's own loop, so the launcher and the rank server need not import each
other.
"""
from __future__ import annotations

import json
import os
from pathlib import Path


def resolve(target: str | dict):
    """The function or class a target names: "pkg.mod:name", "path/to/notebook.ipynb::name", or
    {"source": code, "name": name} (what interactive_definitions gives, run in a fresh namespace)."""
    if isinstance(target, dict):
        namespace = {"__name__": "interactive_definitions"}
        exec(compile(target["source"], "<definitions of the notebook>", "exec"), namespace)
        return namespace[target["name"]]
    if "::" in target:  # a notebook's function: load the notebook's graded code, as the grader does
        path, name = target.split("::", 1)
        from memfit.notebook import load_notebook
        loaded = load_notebook(path)
        if not hasattr(loaded.module, name):
            problems = "; ".join(map(str, loaded.errors)) or "no cell defines it"
            raise LookupError(f"{path} defines no {name} ({problems})")
        return getattr(loaded.module, name)
    module, name = target.split(":", 1)
    import importlib
    return getattr(importlib.import_module(module), name)


def worker(tmpdir: str, rank: int) -> None:
    import memfit  # noqa: F401  (decides TRITON_INTERPRET before anything imports triton)

    spec = json.loads((Path(tmpdir) / "spec.json").read_text())
    run_rank(resolve(spec["target"]), Path(tmpdir), rank, spec, spec["args"])


def run_rank(fn, tmpdir: Path, rank: int, spec: dict, args: dict) -> None:
    import torch
    import torch.distributed as dist
    world = spec["world_size"]
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(spec["port"]))
    if spec["backend"] == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(spec["backend"], init_method=f"tcp://127.0.0.1:{spec['port']}", rank=rank,
                            world_size=world)
    try:
        result = fn(rank, world, **args)
        dist.barrier()  # every rank has returned: the results are final
        partial = tmpdir / f"rank{rank}.json.partial"
        partial.write_text(json.dumps(result))
        partial.replace(tmpdir / f"rank{rank}.json")  # atomic: the launcher never reads half a result
    finally:
        dist.destroy_process_group()
