"""make grade ... BACKEND=ray: the same grading, one Ray task per student x lesson.

Each task carries the notebook's bytes, so the node that runs it needs no shared folder of submissions; it runs
the runner's grade_file there (passed in, so that this module does not import the runner that imports it), which
starts the same sandboxed child process as a local run. The
driver (this process) writes every row to the gradebook as its task finishes, so an interrupted run resumes
exactly as a local one does.

Every node needs the course checked out with its environment (the venv of `make env`, `pip install -r
requirements-ray.txt`) at the same path as the driver, which passes its PYTHONPATH on. Without --ray-address
(or RAY_ADDRESS) a local cluster of WORKERS CPUs is started and stopped. On a GPU cluster each task asks for one
GPU, which Ray gives it through CUDA_VISIBLE_DEVICES.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import asdict
from pathlib import Path

from course import ROOT
from autograder.gradebook import Row


def _grade_task(grade_file, student: str, lesson: str, name: str, data: bytes, problem: str | None,
                fingerprint: str, settings):
    """Runs on a Ray worker: the notebook from its bytes, graded by the runner's grade_file."""
    with tempfile.TemporaryDirectory(prefix="ray-grade-") as tmp:
        notebook = Path(tmp) / name
        notebook.write_bytes(data)
        settings.gpus = [os.environ.get("CUDA_VISIBLE_DEVICES", "0")] if settings.gpus else []
        rows = grade_file(student, lesson, notebook, problem, fingerprint, settings,
                          settings.gpus[0] if settings.gpus else None)
        return [asdict(row) for row in rows]


STARTUP_TRIES = 10  # a local cluster started again after Ray's fixed 30 s wait for its node ran out (4 were too few
# under a load average of 9 on 2 cores: a run of seven other agents beside make test-all)


def start_ray(ray, **init_args) -> None:
    """ray.init, tried again when the local node does not register within Ray's own 30 s (not configurable): on a
    machine busy with other work that wait follows its load, and a grade must not."""
    for attempt in range(1, STARTUP_TRIES + 1):
        try:
            ray.init(**init_args)
            return
        except Exception as exc:  # Ray raises a bare Exception for this
            ray.shutdown()
            if "timed out during startup" not in str(exc) or attempt == STARTUP_TRIES:
                raise


def grade_on_ray(jobs, settings, progress, record, grade_file, address: str | None = None) -> None:
    """Grade `jobs` as Ray tasks, each running grade_file(student, lesson, notebook, problem, fingerprint, settings,
    gpu) -> rows on its node; record(job) as each finishes."""
    try:
        import ray
    except ImportError:
        raise SystemExit("error: BACKEND=ray needs Ray: pip install -r requirements-ray.txt") from None
    address = address or os.environ.get("RAY_ADDRESS") or None
    if not address:
        os.environ.pop("RAY_ADDRESS", None)  # an empty one would be read by ray.init as an address
    local = not address
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    start_ray(ray, address=address, num_cpus=settings.workers if local else None, include_dashboard=False,
              log_to_driver=False, configure_logging=False, runtime_env={"env_vars": env})
    try:
        task = ray.remote(num_cpus=1, num_gpus=1 if settings.gpus else 0, max_retries=1)(_grade_task)
        pending = {}
        for job in jobs:
            try:
                data = job.notebook.read_bytes()
            except OSError:
                data = b""
            ref = task.remote(grade_file, job.student, job.lesson, job.notebook.name, data, job.problem,
                              job.fingerprint, settings)
            pending[ref] = job
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            job = pending.pop(done[0])
            try:
                job.rows = [Row(**row) for row in ray.get(done[0])]
            except Exception as exc:  # noqa: BLE001  (a worker lost: its rows say so, the run goes on)
                job.rows = [Row(job.student, job.lesson, c.name, 0.0, c.points, "error",
                                f"grader error, please report it: the Ray task failed ({type(exc).__name__})",
                                job.fingerprint, str(settings.hidden_seed)) for c in job.checks]
            for row in job.rows:
                progress(f"{job.student}/{job.lesson}:{row.check} {row.status}")
            record(job)
    finally:
        if local:
            ray.shutdown()
