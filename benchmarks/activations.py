"""Lessons 01-02 benchmark: the reference predictor against the CUDA allocator, and what recomputation
costs in time.

The predictor grid is the one the GPU check grades: the course's small and medium models, batch 4,
three sequence lengths, without and with recomputation (plus selective), amp with AdamW. Each peak
is measured on a steady-state step (memfit.training.measure_step). Step times are medians of
memfit.timing.median_ms over whole training steps.
"""
from __future__ import annotations

import statistics

import torch

from course.notebook_loader import load_solution
from memfit.gpt import COURSE_CONFIGS
from memfit.timing import median_ms
from memfit.training import Trainer, measure_step, random_batch

GRID = [(name, 4, seq, recompute) for name in ("small", "medium") for seq in (256, 1024, 2048)
        for recompute in ("none", "full", "selective")]
TIMED = [("small", 4, 2048), ("medium", 4, 2048)]


def run() -> dict:
    predict_peak = load_solution("02_activations").predict_peak
    rows = []
    for name, batch, seq, recompute in GRID:
        cfg = COURSE_CONFIGS[name]
        trainer = Trainer(cfg, "amp", "adamw", recompute)
        measured = measure_step(trainer, batch, seq)
        predicted = predict_peak(cfg, batch, seq, "amp", "adamw", recompute)
        rows.append(dict(model=name, batch=batch, seq=seq, recompute=recompute, predicted=predicted["peak"],
                         measured=measured.peak, error=round((predicted["peak"] - measured.peak) / measured.peak, 5),
                         moment=predicted["moment"]))
        del trainer
        torch.cuda.empty_cache()
    timing = []
    for name, batch, seq in TIMED:
        cfg = COURSE_CONFIGS[name]
        idx, targets = random_batch(cfg, batch, seq, "cuda")
        base = None
        for recompute in ("none", "selective", "full"):
            trainer = Trainer(cfg, "amp", "adamw", recompute)
            ms = median_ms(lambda: trainer.step(idx, targets), warmup_ms=500, rep_ms=2000)
            base = base or ms
            timing.append(dict(model=name, batch=batch, seq=seq, recompute=recompute, ms=round(ms, 2),
                               slowdown=round(ms / base - 1, 3), peak=measure_step(trainer, batch, seq).peak))
            del trainer
            torch.cuda.empty_cache()
    errors = [abs(r["error"]) for r in rows]
    graded = [abs(r["error"]) for r in rows if r["recompute"] in ("none", "full")]
    return dict(title="Lessons 01-02: predicted against measured step peak; recomputation", rows=rows, timing=timing,
                median_abs_error=round(statistics.median(errors), 5), max_abs_error=round(max(errors), 5),
                graded_grid_max_abs_error=round(max(graded), 5))


def markdown(result: dict) -> str:
    gib = 2**30
    lines = [f"### {result['title']}", "",
             f"Predictor error over {len(result['rows'])} configurations (amp, AdamW, batch 4): median "
             f"{result['median_abs_error']:.2%}, largest {result['max_abs_error']:.2%} (the graded 12, recompute none/full: "
             f"largest {result['graded_grid_max_abs_error']:.2%}).", "",
             "| model | seq | recompute | predicted (GiB) | measured (GiB) | error | moment of the peak |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['model']} | {r['seq']} | {r['recompute']} | {r['predicted'] / gib:.3f} | {r['measured'] / gib:.3f} | "
              f"{r['error']:+.2%} | {r['moment']} |" for r in result["rows"]]
    lines += ["", "| model | batch x seq | recompute | step (ms) | vs none | measured peak (GiB) |", "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {t['model']} | {t['batch']} x {t['seq']} | {t['recompute']} | {t['ms']} | {t['slowdown']:+.0%} | "
              f"{t['peak'] / gib:.3f} |" for t in result["timing"]]
    return "\n".join(lines)
