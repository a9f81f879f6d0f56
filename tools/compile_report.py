"""A lesson's compile report: the learner's own kernels compiled for a T4 and a V100, from a notebook cell.

    from tools.compile_report import compile_report
    print(compile_report("05_flash_attention.ipynb", dtypes=["fp16"]))

A Jupyter kernel runs in the notebook's folder, so the name finds the learner's file: its kernels, as last
saved, are compiled by tools.compile_targets in a process of its own (real Triton, not the interpreter the
notebook may run under). Without that file it compiles the course's reference kernels and says so.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from course import ROOT, course_env


def compile_report(notebook: str, dtypes: list[str] | None = None, variants: list[str] | None = None) -> str:
    mine = os.path.abspath(notebook)
    lesson = Path(notebook).stem
    if os.path.exists(mine):
        command, heading = ["--notebook", mine], f"your kernels, from {mine} as last saved:"
    else:
        command, heading = ["--lessons", lesson], f"the course's reference kernels (no {notebook} here):"
    command += ["--dtypes", *dtypes] if dtypes else []
    command += ["--variants", *variants] if variants else []
    run = subprocess.run([sys.executable, "-m", "tools.compile_targets", *command], cwd=ROOT, env=course_env(),
                         capture_output=True, text=True)
    lines = [line for line in run.stdout.splitlines() if line.startswith(("ok", "FAIL"))]
    return "\n".join([heading, *lines]) if lines else f"tools.compile_targets failed:\n{run.stderr[-2000:]}"
