"""make bench: every lesson's benchmark on this GPU, and the seconds the grader takes per lesson.

Writes benchmarks/results/<device>-<date>.json (device, versions, every figure) and the same as a
Markdown table beside it. Timing needs a GPU: on a CPU the interpreter's speed says nothing.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from course import ROOT, course_env
from benchmarks.record import device_facts, record_stem
from course.lessons import benchmark_module, lessons, topic

# Every lesson's benchmark there is (benchmarks/<topic>.py), in lesson order: none is registered by hand.
LESSON_BENCHMARKS = [topic(lesson) for lesson in lessons() if benchmark_module(lesson)]


def grading_seconds() -> dict:
    """`make grade NOTEBOOKS=solutions`: seconds per lesson and the statuses it gave."""
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "autograder", "--notebooks", "solutions", "--out", out],
                              cwd=ROOT, env=course_env(), capture_output=True, text=True)
        total = time.perf_counter() - start
        with open(Path(out) / "gradebook.csv", newline="") as f:  # the gradebook instructors read: a CSV file
            rows = list(csv.DictReader(f))
    graded = sorted({r["lesson"] for r in rows})
    return dict(exit_status=proc.returncode, total_seconds=round(total, 1), workers=1,
                per_lesson={lesson: {r["check"]: r["status"] for r in rows if r["lesson"] == lesson} for lesson in graded},
                seconds_per_lesson=round(total / max(1, len(graded)), 1))


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
