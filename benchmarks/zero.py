"""Lesson 03 benchmark, on two or more GPUs with NCCL: per-rank memory of the course's ZeRO stages 0-3 (the
reference ZeroAdamW of solutions/03_zero.ipynb, extracted to memfit.from_lessons.zero) and of PyTorch's
engines (ZeroRedundancyOptimizer, FSDP2 fully_shard), against the predictions.

Each configuration trains the course's medium GPT for three steps on every rank (micro-batch 1 x 256 tokens,
so that the model states dominate) and measures the last step with the CUDA allocator of each rank:
memory_allocated after the step (at rest) and max_memory_allocated during it (peak), both above what the rank
held before the model existed and after a warm-up matmul created cuBLAS's workspace (reported apart). Predictions: zero_bytes_per_rank for the states at rest (exact, padding
included); for the peak, the states plus memfit.zero.engine_peak_bytes (the step's largest transient), which
leaves out the activations. Rank 0 also trains unsharded AdamW and reports the largest relative difference.
"""
from __future__ import annotations

import torch

from memfit.from_lessons.zero import zero_bytes_per_rank
from memfit.gpt import COURSE_CONFIGS
from memfit.zero import FlatModel, engine_peak_bytes

MODEL, BATCH, SEQ, STEPS = "medium", 1, 256, 3
OPT_ARGS = dict(lr=1e-3, eps=1e-8, weight_decay=0.01)


def _run(target: str, world: int, **args) -> list[dict]:
    from memfit.dist import run_ranks
    return run_ranks(target, world, backend="nccl", timeout_s=240,
                     args=dict(cfg=MODEL, batch=BATCH, seq=SEQ, steps=STEPS, opt_args=OPT_ARGS, device="cuda", **args))


def run(world: int | None = None) -> dict:
    world = world or torch.cuda.device_count()
    if world < 2:
        return {"skipped": f"needs 2 GPUs, this machine has {torch.cuda.device_count()}"}
    numel = FlatModel.of(COURSE_CONFIGS[MODEL]).numel
    rows = []
    for dtype, nbytes, k in (("float32", 4, 8), ("bfloat16", 2, 12)):
        for stage in range(4):
            ranks = _run("memfit.zero:distributed_rank", world, optimizer="memfit.from_lessons.zero:ZeroAdamW",
                         stage=stage, param_dtype=dtype)
            states = zero_bytes_per_rank(stage, numel, world, nbytes, nbytes, k)["total"]
            transient = engine_peak_bytes(stage, numel, world, nbytes, nbytes)
            rows.append(dict(engine=f"ZeroAdamW stage {stage}", dtype=dtype, predicted_at_rest=states,
                             at_rest=[r["at_rest"] for r in ranks], predicted_peak=states + transient["transient"],
                             moment=transient["moment"], peak=[r["peak"] for r in ranks],
                             sent_per_step=ranks[0]["sent_per_step"], max_rel_error=ranks[0].get("max_rel_error"),
                             cublas_workspace=ranks[0]["cublas_workspace"]))
    for name, target, stage in (("ZeroRedundancyOptimizer (ZeRO-1)", "memfit.zero:zero_redundancy_rank", 1),
                                ("FSDP2 fully_shard per block (ZeRO-3)", "memfit.zero:fsdp2_rank", 3)):
        ranks = _run(target, world)
        rows.append(dict(engine=name, dtype="float32", predicted_at_rest=zero_bytes_per_rank(stage, numel, world, 4, 4, 8)["total"],
                         at_rest=[r["at_rest"] for r in ranks], inventory=[sum(r["inventory"].values()) for r in ranks],
                         peak=[r["peak"] for r in ranks], max_rel_error=ranks[0].get("max_rel_error"),
                         cublas_workspace=ranks[0]["cublas_workspace"]))
    return {"model": MODEL, "params": numel, "world_size": world, "batch": BATCH, "seq": SEQ, "rows": rows}


def markdown(result: dict) -> str:
    if "skipped" in result:
        return f"### Lesson 03: ZeRO on NCCL\n\nskipped: {result['skipped']}"
    mib = lambda b: f"{b / 2**20:,.1f}"  # noqa: E731
    lines = [f"### Lesson 03: ZeRO on {result['world_size']} GPUs with NCCL",
             "", f"course-{result['model']} ({result['params']:,} parameters), micro-batch {result['batch']} x "
             f"{result['seq']} per rank, AdamW; MiB per rank (every rank listed where they differ).", "",
             "| engine | dtype | at rest: predicted | measured | peak: predicted (moment) | measured | sent/step | max rel. diff. |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["rows"]:
        at_rest = " / ".join(mib(x) for x in sorted(set(r["at_rest"])))
        peak = " / ".join(mib(x) for x in sorted(set(r["peak"])))
        pred_peak = f"{mib(r['predicted_peak'])} ({r['moment']})" if "predicted_peak" in r else "n/a"
        sent = mib(r["sent_per_step"]) if "sent_per_step" in r else "n/a"
        err = "n/a" if r["max_rel_error"] is None else f"{r['max_rel_error']:.1e}"
        lines.append(f"| {r['engine']} | {r['dtype']} | {mib(r['predicted_at_rest'])} | {at_rest} | {pred_peak} | "
                     f"{peak} | {sent} | {err} |")
    lines += ["", f"cuBLAS workspace per rank, created before the measurement and not in the figures: "
              f"{mib(result['rows'][0]['cublas_workspace'])} MiB.", "", "Predicted peak = states at rest + the step's largest transient (memfit.zero.engine_peak_bytes); "
              "activations are not in it. For PyTorch's engines the prediction is ZeRO's at-rest formula for the "
              "stage they implement; their peaks hold gathered units and communication buffers the formula does "
              "not model."]
    return "\n".join(lines)


if __name__ == "__main__":  # this lesson alone, on 2+ GPUs: python -m benchmarks.zero
    from benchmarks.record import record_one
    record_one("zero", multi_gpu=True)
