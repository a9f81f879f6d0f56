"""One record of a benchmark run: the device's facts and where its .json and .md go under benchmarks/results/.

    python -m benchmarks.<lesson>    # record_one: that lesson's benchmark alone
    make bench                       # benchmarks/__main__: every lesson's, and the grader's seconds
"""
from __future__ import annotations

import datetime
import json
import platform
import re
from pathlib import Path

import memfit  # noqa: F401  (before triton)
import torch
import triton

from course import ROOT


def device_facts() -> dict:
    props = torch.cuda.get_device_properties(0)
    return dict(device=props.name, capability=f"sm_{props.major}{props.minor}", memory_gib=round(props.total_memory / 2**30, 1),
                profile=memfit.profile().name, torch=torch.__version__, triton=triton.__version__,
                cuda=torch.version.cuda, python=platform.python_version())


def record_stem(out: Path, facts: dict, date: str, suffix: str = "") -> Path:
    """benchmarks/results/<device>-<date><suffix>: where a run's .json and .md go."""
    slug = re.sub(r"[^a-z0-9]+", "-", facts["device"].lower()).strip("-")
    return out / f"{slug}-{date}{suffix}"


def record_one(name: str, multi_gpu: bool = False, note: str = "", run=None, part: str = "") -> Path:
    """One lesson's benchmark alone (python -m benchmarks.<name>): its .json and .md under benchmarks/results/,
    named after the device (with the GPU count when the run spans several), the lesson and `part` if given.
    run: what to measure instead of the module's run() (a part of it, such as a tile sweep)."""
    import importlib
    module = importlib.import_module(f"benchmarks.{name}")
    facts = device_facts()
    gpus = torch.cuda.device_count()
    date = datetime.date.today().isoformat()
    result = dict(date=date, gpus=gpus, **facts, **{name: (run or module.run)()})
    named = dict(facts, device=f"{facts['device']} x{gpus}") if multi_gpu else facts  # nvidia-h200-x2-...
    suffix = f"-{name.replace('_', '-')}" + (f"-{part}" if part else "")
    stem = record_stem(ROOT / "benchmarks" / "results", named, date, suffix)
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    nccl = f", NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}" if multi_gpu else ""
    heading = f"{facts['device']} x {gpus}" if multi_gpu else f"{facts['device']} ({facts['capability']})"
    text = (f"# {heading}, {date}\n\ntorch {facts['torch']}, triton {facts['triton']}, CUDA {facts['cuda']}{nccl}"
            f"{'; ' + note if note else ''}\n\n{module.markdown(result[name])}\n")
    stem.with_suffix(".md").write_text(text)
    print(text)
    return stem
