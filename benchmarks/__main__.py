"""make bench: every lesson's benchmark on this GPU, and the seconds the grader takes per lesson.

Writes benchmarks/results/<device>-<date>.json (device, versions, every figure) and the same as a
Markdown table beside it. Timing needs a GPU: on a CPU the interpreter's speed says nothing.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import memfit  # noqa: F401  (before triton)
import torch
import triton

from autograder import gradebook
from course import ROOT, course_env
LESSON_BENCHMARKS = ["first_kernel", "activations", "kernel_fusion", "flash_attention", "fused_linear_ce", "quantization", "zero"]


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


def grading_seconds() -> dict:
    """`make grade NOTEBOOKS=solutions`: seconds per lesson and the statuses it gave."""
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "autograder", "--notebooks", "solutions", "--out", out],
                              cwd=ROOT, env=course_env(), capture_output=True, text=True)
        total = time.perf_counter() - start
        rows = gradebook.read(Path(out) / "gradebook.csv")
    lessons = sorted({r.lesson for r in rows})
    return dict(exit_status=proc.returncode, total_seconds=round(total, 1), workers=1,
                per_lesson={lesson: {r.check: r.status for r in rows if r.lesson == lesson} for lesson in lessons},
                seconds_per_lesson=round(total / max(1, len(lessons)), 1))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("make bench needs a CUDA GPU: on a CPU, Triton's interpreter runs kernels in NumPy and its timings say "
              "nothing about a GPU. Recorded results are in benchmarks/results/.")
        return 0
    import importlib
    facts = device_facts()
    result = dict(date=datetime.date.today().isoformat(), **facts, lessons={})
    for name in LESSON_BENCHMARKS:
        result["lessons"][name] = importlib.import_module(f"benchmarks.{name}").run()
        print(f"benchmarked {name}")
    result["grading"] = grading_seconds()
    args.out.mkdir(parents=True, exist_ok=True)
    stem = record_stem(args.out, facts, result["date"])
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    md = [f"# {facts['device']} ({facts['capability']}), {result['date']}", "",
          f"torch {facts['torch']}, triton {facts['triton']}, CUDA {facts['cuda']}, Python {facts['python']}; "
          "medians of triton.testing.do_bench after warm-up; peak extra memory from the CUDA allocator (memfit.measure_peak).", ""]
    for name in LESSON_BENCHMARKS:
        md += [importlib.import_module(f"benchmarks.{name}").markdown(result["lessons"][name]), ""]
    g = result["grading"]
    md += ["### Grading `make grade NOTEBOOKS=solutions` on this GPU", "",
           f"{g['total_seconds']} s in all ({g['seconds_per_lesson']} s per lesson, exit status {g['exit_status']}); statuses:", ""]
    md += [f"- {lesson}: " + ", ".join(f"{c} {s}" for c, s in checks.items()) for lesson, checks in g["per_lesson"].items()]
    stem.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    print(f"wrote {stem}.json and {stem}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
