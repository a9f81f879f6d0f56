"""python -m slides.log_records: the JSON companion of each text record a deck quotes (a notebook's log printed on a
GPU, a Markdown table), written next to it under benchmarks/results/ as <its name>.json.

The decks read only JSON, by key (slides.figures.record): this is the one place that reads prose, run by hand when a
log is recorded, so rewording a log breaks this script loudly instead of a deck. Each companion names its log.
"""
from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def find(pattern: str, text: str, flags: int = re.M) -> re.Match:
    match = re.search(pattern, text, flags)
    if match is None:
        raise ValueError(f"no line matches {pattern!r}")
    return match


def lesson01(text: str) -> tuple[dict, dict]:
    """Lesson 01's section of a run of the notebooks: the numbers its GPU-only cells printed."""
    body = find(r"ran top to bottom[^\n]*\n(.*?solutions/01_model_states\.ipynb: ran top to bottom[^\n]*)",
                text, re.S).group(1)
    head = find(r"torch (\S+), device: cuda \((\w+): ([^,]+),", body)
    small = find(r"(course-\w+): ([\d,]+) parameters, batch (\d+) x (\d+) tokens, (\w+)", body)
    return {"device": head.group(3), "torch": head.group(1)}, {
        "model": small.group(1), "n": int(small.group(2).replace(",", "")), "batch": small.group(3),
        "seq": small.group(4), "precision": small.group(5),
        # the log prints Python dicts of formatted sizes
        "predicted": ast.literal_eval(find(r"predicted states: (\{.*\})", body).group(1)),
        "measured": ast.literal_eval(find(r"measured states: +(\{.*\})", body).group(1)),
        "in_use": find(r"device memory in use: ([\d.]+ \w+);", body).group(1),
        "reserved": find(r"PyTorch reserved ([\d.]+ \w+),", body).group(1),
        "allocated": find(r"allocated ([\d.]+ \w+)\n", body).group(1),
        "context": find(r"outside the allocator[^:]*: about ([\d.]+ \w+)", body).group(1),
        "workspace": find(r"cuBLAS workspace of a new stream: ([\d.]+ \w+)", body).group(1),
        "one_byte": find(r"a 1-byte tensor occupies (\d+) bytes", body).group(1)}


def lesson04(text: str) -> tuple[dict, dict]:
    """The three regimes, the convergence demo and the compile check the notebook printed."""
    head = find(r"# Lesson 04 on an? (.+?) \(torch ([^,]+), triton ([^)]+)\)", text)
    copy, square = find(r"bandwidth: copy\s+([\d.]+) GB/s \(ceiling\); x\*x\s+([\d.]+) GB/s", text).groups()
    mm = find(r"compute:\s+torch\.(\w+) matmul (\d+)\^3 at\s+([\d.]+) TFLOP/s", text)
    # the log's own note: that run printed the matmul ceiling in thousands of TFLOP/s (0.7 means ~700)
    scale = 1e3 if "in thousands of TFLOP/s" in text else 1.0
    return {"device": head.group(1), "torch": head.group(2), "triton": head.group(3)}, {
        "overhead_us": float(find(r"overhead:\s+([\d.]+) us", text).group(1)),
        "tiny_elements": int(find(r"the op itself: ([\d,]+) elements", text).group(1).replace(",", "")),
        "copy_bps": float(copy) * 1e9, "square_bps": float(square) * 1e9,
        "mm_dtype": mm.group(1), "mm_n": int(mm.group(2)), "mm_flops": float(mm.group(3)) * scale * 1e12,
        "mm_digits": len(mm.group(3).split(".")[1]) if "." in mm.group(3) else 0,
        "curve_diff": find(r"largest difference between the curves: ([\d.e+-]+)", text).group(1),
        "compile_t4": [[k, dt, int(b), int(lim)] for k, dt, b, lim in re.findall(
            r"^ok\s+04_kernel_fusion (\w+) \[(\w+)\] on t4 \(sm_75\): (\d+) bytes of shared memory, limit (\d+)",
            text, re.M)]}


def lesson06(text: str) -> tuple[dict, dict]:
    """The dW drift and the chunked loss's memory, which the benchmark's JSON does not hold."""
    head = find(r"^# Lesson 06 on an? (.+?) \(torch (\S+), triton (\S+)\)", text)
    low, torch_err = find(r"PyTorch in (\w+): max \|error\| of dW (\S+)", text).groups()
    sizes = find(r"^N=(\d+), H=(\d+), V=(\d+), torch\.(\w+)", text)
    return {"device": head.group(1), "torch": head.group(2), "triton": head.group(3)}, {
        "low": low, "torch_err": float(torch_err),
        "drift": [[int(k), float(a), float(b)] for k, a, b in re.findall(
            r"^\s*(\d+) chunks of tokens: dW error (\S+) accumulated in \w+, (\S+) in fp32", text, re.M)],
        "measured": {name.strip(): [float(g), float(r)] for name, g, r in re.findall(
            r"^(naive.*?|chunked over tokens.*?|fused, tiles.*?)\s+([\d.]+) GiB =\s+([\d.]+) x", text, re.M)},
        "sizes": [int(s) for s in sizes.groups()[:3]], "sizes_dtype": sizes.group(4)}


def lesson07(text: str) -> tuple[dict, dict]:
    """The error table the lesson printed: relative error of the weights and of a layer's output."""
    head = find(r"^# Lesson 07 on an? (.+?) \(torch (\S+), triton ([^)]+)\)", text)
    errors: dict = {}
    for kind, method, w, y in re.findall(r"^(Gaussian|heavy-tailed)\s+(int8 per tensor|Q8_0|Q4_0)\s+weights\s+"
                                         r"([\d.]+)%\s+layer output\s+([\d.]+)%", text, re.M):
        errors.setdefault(kind, {})[method] = [float(w) / 100, float(y) / 100]
    shape = find(r"^Q8_0: (\d+)x(\d+) fp32 weights", text)
    return {"device": head.group(1), "torch": head.group(2), "triton": head.group(3)}, {
        "errors": errors, "shape": f"{shape.group(1)} × {shape.group(2)}"}


def int8_tiles(text: str) -> tuple[dict, dict]:
    """The sweep of the two ways to load the scales: the speed-up column of its table."""
    head = find(r"^# (.+?) \(sm_\d+\), (\d{4}-\d{2}-\d{2})", text)
    versions = find(r"^torch (\S+), triton (\S+?)\.?\s", text)
    ratios = [float(m) for m in re.findall(r"^\|[^|\n]+\|[^|\n]+\|[^|\n]+\|[^|\n]+\| ([\d.]+)x \|", text, re.M)]
    return {"device": head.group(1), "torch": versions.group(1), "triton": versions.group(2)}, {"ratios": ratios}


def adamw8bit(text: str) -> tuple[dict, dict]:
    """The grader's convergence check run on the reference: windowed losses of AdamW and AdamW8bit."""
    head = find(r"^# .*?, (CPU \([^)]*\)), torch (\S+), triton (\S+)\s*$", text)
    return {"device": head.group(1), "torch": head.group(2), "triton": head.group(3)}, {
        "floor": float(find(r"loss floor\): ([\d.]+) nats", text).group(1)),
        "rows": [[int(a), int(b), float(x), float(y), float(d)] for a, b, x, y, d in
                 re.findall(r"^\| (\d+)-(\d+) \| ([\d.]+) \| ([\d.]+) \| ([+-][\d.]+)% \|", text, re.M)]}


# record key -> (the newest text record matching this glob, its reader)
LOGS = {"lesson01_log": ("*h100*notebooks.txt", lesson01), "lesson04_log": ("*-lesson04.txt", lesson04),
        "lesson06_log": ("*-lesson06.txt", lesson06), "lesson07_log": ("*-lesson07.txt", lesson07),
        "int8_matmul_tiles": ("*-int8-matmul-tiles.md", int8_tiles),
        "adamw8bit_convergence": ("*-adamw8bit-convergence.md", adamw8bit)}


def companion(key: str) -> Path:
    pattern, read = LOGS[key]
    log = sorted(RESULTS.glob(pattern))[-1]
    try:
        device, body = read(log.read_text())
    except ValueError as e:
        raise SystemExit(f"{log.name}: {e}; this script reads it") from e
    date = re.search(r"\d{4}-\d{2}-\d{2}", log.name).group(0)
    record = {**device, "date": date, "log": f"benchmarks/results/{log.name}",
              "made_by": "python -m slides.log_records", key: body}
    out = log.with_name(log.name + ".json")  # beside its log, named after it
    out.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    return out


if __name__ == "__main__":
    for key in sys.argv[1:] or LOGS:
        print(f"{key}: {companion(key).relative_to(RESULTS.parent.parent)}")
