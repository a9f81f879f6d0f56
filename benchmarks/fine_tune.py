"""Lesson 08's benchmark: Llama-3.1-8B's training step on one GPU, predicted on fake tensors (the lesson's
fake_step_memory, on this device: no memory used) and measured by the CUDA allocator, for each of the lesson's
PLANS (full fine-tunes, LoRA and QLoRA with r = 16 on every block matrix) that fits the card, with the time per
step; then the most tokens per step (one sequence, lengths doubling from 1,024) each plan is predicted to fit on a
T4's 15 GB and on this card, each checked by a real step at that length (the T4's under
torch.cuda.set_per_process_memory_fraction). One more row, the contrast: the lesson's full fine-tune with
PyTorch's attention and cross-entropy instead of the course's kernels.

    python -m benchmarks.fine_tune            # on a GPU: benchmarks/results/<device>-<date>-fine-tune.{json,md}
    python -m benchmarks.fine_tune --plans kernels   # only the plans whose name holds "kernels"'s words: a part
                                                     # of the table (...-fine-tune-<part>.{json,md})
"""
from __future__ import annotations

import concurrent.futures
import multiprocessing
import statistics
import time

import torch

LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
SEQ = 4096  # the step measured for every plan that fits this card


CONTRAST = "full: bf16, 8-bit AdamW, full recomputation, PyTorch's attention and loss"


PARTS = {"kernels": ("FlashAttention", "fused loss")}  # --plans NAME: the plans whose names hold all these words
ONLY: tuple[str, ...] = ()  # set by --plans


def plans() -> tuple[str, ...]:
    from memfit.from_lessons.fine_tune import PLANS
    return tuple(p for p in PLANS + (CONTRAST,) if all(word in p for word in ONLY))


def make_trainer(plan: str, cfg=None, device: str = "cuda"):
    """The lesson's trainer of a plan (Llama-3.1-8B's shapes unless cfg is given), randomly initialised."""
    from memfit.from_lessons.fine_tune import adamw8bit, plan_trainer
    from memfit.gpt import LLAMA_3_1_8B
    from memfit.training import Trainer
    with torch.device(device):  # the weights initialised where they live (8B parameters on a CPU take minutes)
        if plan == CONTRAST:
            return Trainer(cfg or LLAMA_3_1_8B, "bf16", adamw8bit, "full", device)
        return plan_trainer(plan, cfg or LLAMA_3_1_8B, device)


def _predict(args) -> tuple[str, int, int]:
    """(recipe, seq, predicted peak bytes): one fake step, in a process of its own (they run side by side)."""
    recipe, seq, cfg, device = args
    import memfit.from_lessons.fine_tune as lesson
    torch.set_num_threads(1)
    step = lesson.fake_step_memory(lambda: make_trainer(recipe, cfg, device), 1, seq)
    return recipe, seq, step.peak


def predictions(cfg=None, device: str = "cuda", lengths=LENGTHS, workers: int = 8) -> dict:
    """{recipe: {seq: predicted peak}} for every plan and length, computed by `workers` processes."""
    jobs = [(recipe, seq, cfg, device) for recipe in plans() for seq in lengths]
    out: dict = {recipe: {} for recipe in plans()}
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for recipe, seq, peak in pool.map(_predict, jobs):
            out[recipe][seq] = peak
    return out


def _measured(trainer, seq: int) -> tuple[int, float]:
    """(the allocator's peak of a steady-state step, the median ms of three more steps)."""
    from memfit.training import measure_step, random_batch
    step = measure_step(trainer, 1, seq)
    batch = random_batch(trainer.cfg, 1, seq, trainer.device)
    times = []
    for _ in range(3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        trainer.step(*batch)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return step.peak, statistics.median(times)


def _peak_under(trainer, seq: int, cap: int) -> int | None:
    """The allocator's peak of a steady-state step at `seq` tokens with the process's memory capped at `cap` bytes,
    or None where it ran out of memory."""
    from memfit.training import measure_step
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total))
    try:
        return measure_step(trainer, 1, seq).peak
    except torch.OutOfMemoryError:
        return None
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()


CAP_KEYS = {"T4 (15 GiB)": "T4 cap", "this card": "this card"}  # a cap's name -> its row keys' prefix


def _at(by_seq: dict, seq: int):
    """by_seq[seq], whether its keys are ints (just run) or strings (read back from a JSON record)."""
    return by_seq[str(seq)] if str(seq) in by_seq else by_seq[seq]


def run() -> dict:
    from memfit.hardware import profile_for
    card = torch.cuda.get_device_properties(0).total_memory
    caps = {"T4 (15 GiB)": profile_for("t4").total_memory, "this card": card}
    predicted = predictions()
    rows = []
    for recipe in plans():
        row = dict(recipe=recipe, seq=SEQ, predicted_bytes=predicted[recipe][SEQ], measured_bytes=None, error=None,
                   step_ms=None, states=None)
        for name, cap in caps.items():
            row[f"most_tokens {name}"] = max([s for s, p in predicted[recipe].items() if p <= cap], default=0)
        for key in CAP_KEYS.values():
            row[f"{key}: a real step at that length"] = row[f"{key}: measured bytes at that length"] = None
        if predicted[recipe][SEQ] > 0.95 * card:  # predicted not to fit this card: not run
            rows.append(row)
            continue
        trainer = make_trainer(recipe)
        peak, ms = _measured(trainer, SEQ)
        row.update(measured_bytes=peak, error=predicted[recipe][SEQ] / peak - 1, step_ms=round(ms, 1),
                   states=trainer.state_bytes())
        for name, key in CAP_KEYS.items():
            longest = row[f"most_tokens {name}"]
            if longest:
                peak = _peak_under(trainer, longest, caps[name])
                row[f"{key}: a real step at that length"] = peak is not None
                row[f"{key}: measured bytes at that length"] = peak
        print(row, flush=True)
        rows.append(row)
        del trainer
        torch.cuda.empty_cache()
    return dict(model="Llama-3.1-8B (published shapes, random weights)", caps=caps, lengths=list(LENGTHS),
                predicted=predicted, rows=rows)


def markdown(result: dict) -> str:
    gib = 2**30
    lines = [f"**{result['model']}**, one sequence per step. Predicted: the lesson's `fake_step_memory` (fake tensors on "
             "this device, the live-tensor meter); measured: the CUDA allocator's requested bytes at the peak of a "
             "steady-state step (`measure_step`). Time: median of three steps.", "",
             "| plan | tokens | predicted GiB | measured GiB | error | step ms | most tokens on a T4 (15 GiB) | "
             "a real step there under the cap: measured (prediction's error) | most tokens on this card | a real step there |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    def ran(r, name):  # a real step at the longest predicted length: "ran: GiB (the prediction's error)", ...
        key = CAP_KEYS[name]
        if r[f"{key}: a real step at that length"] is None:
            return "—"
        peak = r[f"{key}: measured bytes at that length"]
        if peak is None:
            return "out of memory"
        predicted = _at(result["predicted"][r["recipe"]], r[f"most_tokens {name}"])
        return f"ran: {peak / gib:.2f} GiB ({predicted / peak - 1:+.2%})"

    for r in result["rows"]:
        t4 = r["most_tokens T4 (15 GiB)"]
        ok = ran(r, "T4 (15 GiB)")
        measured = "not run (predicted not to fit)" if r["measured_bytes"] is None else f"{r['measured_bytes'] / gib:.2f}"
        error = "—" if r["error"] is None else f"{r['error']:+.2%}"
        ms = "—" if r["step_ms"] is None else f"{r['step_ms']:,.0f}"
        lines.append(f"| {r['recipe']} | {r['seq']:,} | {r['predicted_bytes'] / gib:.2f} | {measured} | {error} | {ms} | "
                     f"{t4:,} | {ok} | {r['most_tokens this card']:,} | {ran(r, 'this card')} |")
    lines += ["", "Predicted peak (GiB) by sequence length:", "",
              "| plan | " + " | ".join(f"{s:,}" for s in result["lengths"]) + " |",
              "| --- |" + " --- |" * len(result["lengths"])]
    for recipe, by_seq in result["predicted"].items():
        lines.append(f"| {recipe} | " + " | ".join(f"{_at(by_seq, s) / gib:.1f}" for s in result["lengths"]) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse
    from benchmarks.record import record_one
    parser = argparse.ArgumentParser(description="lesson 08's plans predicted and measured on this GPU")
    parser.add_argument("--plans", choices=sorted(PARTS), help="only a part of the plans")
    args = parser.parse_args()
    import benchmarks.fine_tune as module  # the module record_one runs, not this __main__
    module.ONLY = PARTS.get(args.plans, ())
    record_one("fine_tune", part=args.plans or "")
