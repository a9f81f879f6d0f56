"""A process and everything it started, found from /proc: what the grader watches (the resident memory of a
grading child's tree) and kills (a check past its time limit, an interrupted class), and what the grading benchmark
kills to interrupt a grader. A child may start sessions of its own (lesson 03's ranks do), so a tree is its
session and every descendant, not one process group.
"""
from __future__ import annotations

import os


def _processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, session id) of every process, from /proc."""
    table = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                table[int(entry.name)] = (int(fields[1]), int(fields[3]))
            except (OSError, IndexError, ValueError):
                continue
    return table


def process_tree(root: int) -> list[int]:
    """The child and everything it started: its session, and descendants that started sessions of their own
    (lesson 03's ranks do)."""
    table = _processes()
    tree = {pid for pid, (_, session) in table.items() if session == root} | {root}
    grew = True
    while grew:
        more = {pid for pid, (parent, _) in table.items() if parent in tree and pid not in tree}
        tree |= more
        grew = bool(more)
    return sorted(tree)


def resident_bytes(root: int) -> int:
    """Resident memory of the child's process tree."""
    total, page = 0, os.sysconf("SC_PAGE_SIZE")
    for pid in process_tree(root):
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
    return total


def kill_tree(root: int, spare_root: bool = False) -> None:
    """SIGKILL a process tree (its session, and descendants in sessions of their own); spare_root: all but the
    root (a grader stopping everything it started)."""
    for pid in process_tree(root):
        if spare_root and pid == root:
            continue
        try:
            os.kill(pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
