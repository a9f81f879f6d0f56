"""make lessons: generate lessons/NN_topic.ipynb from solutions/NN_topic.ipynb with nbgrader.

    python -m tools.make_lessons            # regenerate lessons/
    python -m tools.make_lessons --check    # exit 1 if lessons/ is stale (make test runs this)

nbgrader's generate_assignment does the work (solution regions -> stubs, hidden tests removed,
outputs cleared, checksums of locked cells), so lessons/ is exactly what an nbgrader course
releases. The result is normalized (stable JSON, no cell ids) so that regenerating is a no-op.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from autograder import ROOT, course_env


def nbgrader_command() -> list[str]:
    exe = Path(sys.executable).with_name("nbgrader")
    return [str(exe)] if exe.exists() else ["nbgrader"]


def nbgrader_env(root: Path) -> dict:
    """nbgrader runs `alembic` from PATH: put this interpreter's bin folder first."""
    bin_dir = str(Path(sys.executable).parent)
    return course_env(MEMFIT_NBGRADER_ROOT=str(root), PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))


def normalize(nb: dict) -> dict:
    for cell in nb["cells"]:
        cell.pop("id", None)
        if cell.get("cell_type") == "code":
            cell["outputs"], cell["execution_count"] = [], None
    nb["nbformat_minor"] = 4
    return nb


def dumps(nb: dict) -> str:
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def generate(lesson: str, root: Path) -> dict:
    """nbgrader's release of one solution notebook, normalized."""
    source = root / "source" / lesson
    source.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "solutions" / f"{lesson}.ipynb", source / f"{lesson}.ipynb")
    env = nbgrader_env(root)
    proc = subprocess.run(nbgrader_command() + ["generate_assignment", lesson, "--force", "--log-level=WARN"],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"nbgrader generate_assignment {lesson} failed:\n{proc.stdout}\n{proc.stderr}")
    release = root / "release" / lesson / f"{lesson}.ipynb"
    return normalize(json.loads(release.read_text()))


def lessons() -> list[str]:
    return sorted(p.stem for p in (ROOT / "solutions").glob("*.ipynb"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report whether lessons/ is stale")
    args = parser.parse_args(argv)
    stale = []
    with tempfile.TemporaryDirectory(prefix="nbgrader-") as tmp:
        for lesson in lessons():
            text = dumps(generate(lesson, Path(tmp)))
            target = ROOT / "lessons" / f"{lesson}.ipynb"
            if target.exists() and target.read_text() == text:
                continue
            stale.append(lesson)
            if not args.check:
                target.parent.mkdir(exist_ok=True)
                target.write_text(text)
                print(f"wrote lessons/{lesson}.ipynb")
    generated = {f"{lesson}.ipynb" for lesson in lessons()}
    orphans = sorted(p.name for p in (ROOT / "lessons").glob("*.ipynb") if p.name not in generated)
    if args.check:
        for lesson in stale:
            print(f"lessons/{lesson}.ipynb is stale: run `make lessons`")
        for name in orphans:
            print(f"lessons/{name} has no source in solutions/: delete it or add solutions/{name}")
        return 1 if stale or orphans else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
