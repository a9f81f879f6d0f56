"""The table `make grade` prints at the end."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from autograder.gradebook import points


def print_summary(jobs, out_dir: Path) -> None:
    header = f"{'student':<16} {'lesson':<22} {'points':>11}  {'passed':>6} {'failed':>6} {'error':>5} {'timeout':>7} {'skipped':>7}  {'needs GPU':>9}"
    print(header)
    print("-" * len(header))
    for job in jobs:
        counts = Counter(r.status for r in job.rows)
        got, total, gpu = points(job.rows)
        print(f"{job.student:<16.16} {job.lesson:<22.22} {f'{got:g} / {total:g}':>11}  {counts['passed']:>6} {counts['failed']:>6} "
              f"{counts['error']:>5} {counts['timeout']:>7} {counts['skipped']:>7}  {f'{gpu:g} pts' if gpu else '':>9}")
    print(f"\nGradebook: {out_dir / 'gradebook.csv'}   feedback: {out_dir / 'feedback'}/<student>/<lesson>.html")
    print("Points are those graded on this machine; 'needs GPU' points were skipped and count toward no total here.")
