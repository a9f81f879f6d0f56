"""Lesson 07's deck: the 8B model in fp16, Q8_0 and Q4_0 (the usual "8 GB" estimate, recounted), per-tensor against
per-block scales, Q4_0's levels and the share of blocks whose codes would change if made with the fp16 scale, on
blocks the lesson's own kernels quantize, the lesson's error table (its H100 run), a rotation before quantizing (the
idea of SpinQuant, arXiv 2405.16406) measured with the lesson's kernels, the fused int8
matmul and the block kernels on the H100 record, 8-bit AdamW states: the bytes (lesson 01's state_bytes), the
dynamic code, the states measured on the course-tiny GPT, convergence (the CPU record) and the H100 step."""
from __future__ import annotations

import functools
import inspect
import math
import re

import matplotlib.patches as patches

from slides.figures import STYLE, COLORS, figure, gib, lesson, markdown_table, measured_on, record, source
from slides.figures import file_date, newest_result  # text records

LESSON = "07_quantization"
GB = 1e9


def _ref():
    return lesson(LESSON)


def _pct(x: float, digits: int = 1) -> str:
    return f"{100 * x:.{digits}f}%"


# ------------------------------------------------------------------------------------------ the 8B arithmetic

@functools.cache
def _bits() -> dict:
    """Bits per weight of each format, from the lesson's Quantized on a tensor of whole blocks."""
    import torch
    ref = _ref()
    w = torch.randn(ref.QK * 8, generator=torch.Generator().manual_seed(0))
    return {"fp32": 32.0, "fp16": 16.0, "Q8_0": ref.quantize_q8_0(w).bits_per_weight,
            "Q4_0": ref.quantize_q4_0(w).bits_per_weight}


@functools.cache
def _sizes() -> dict:
    from memfit.from_lessons.model_states import count_params
    from memfit.gpt import LLAMA_3_1_8B
    from memfit.hardware import profile_for
    n = count_params(LLAMA_3_1_8B)
    bits = _bits()
    return {"n": n, "bytes": {k: n * b / 8 for k, b in bits.items()}, "t4": profile_for("t4").total_memory}


# ------------------------------------------------------------------- per tensor against per block; Q4_0's levels

@functools.cache
def _outlier_demo() -> dict:
    """Four blocks of 32 small weights (std 0.01) with one outlier of 0.5 (50x) in the second block, in Q8_0 with
    the lesson's kernels. Per tensor, d is the largest block scale (the absmax of all 128 values, / 127)."""
    import torch
    ref = _ref()
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(4 * ref.QK, generator=gen) * 0.01
    x[ref.QK + 9] = 0.5
    qt = ref.quantize_q8_0(x)
    x_hat = ref.dequantize_q8_0(qt)
    d_block = qt.scales.float()
    d_tensor = d_block.max()
    block_of = torch.arange(x.numel()) // ref.QK
    zero_block = int(((x_hat == 0) & (x != 0)).sum())
    zero_tensor = int(((x.abs() / d_tensor).round() == 0).sum())
    return {"x": x, "d_block": d_block, "d_tensor": float(d_tensor), "block_of": block_of,
            "zero_block": zero_block, "zero_tensor": zero_tensor, "n": x.numel()}


@functools.cache
def _q4_demo() -> dict:
    """One block whose largest magnitude is negative, with a positive value of nearly the same size: Q4_0's
    clamp, by the lesson's kernels."""
    import torch
    ref = _ref()
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(ref.QK, generator=gen) * 0.12
    x[5], x[20] = -0.5, 0.48
    qt = ref.quantize_q4_0(x)
    x_hat = ref.dequantize_q4_0(qt)
    q8 = ref.dequantize_q8_0(ref.quantize_q8_0(x))
    d = float(qt.scales[0])
    return {"x": x, "x_hat": x_hat, "d": d, "err": (x_hat - x).abs(), "q8_err": (q8 - x).abs(),
            "d8": float(ref.quantize_q8_0(x).scales[0])}


@functools.cache
def _fp16_first_share() -> float:
    """The share of 1,024 Gaussian blocks whose Q8_0 codes (the lesson's kernel: llama.cpp's, from the fp32 scale)
    differ from codes made with the fp16-rounded scale (roundf(x · (1 / fp16(d))))."""
    import torch
    ref = _ref()
    x = torch.randn(1024, ref.QK, generator=torch.Generator().manual_seed(5)) * 0.02
    d16 = (x.abs().amax(dim=1, keepdim=True) / 127).half().float()
    v = x * (1 / d16)
    a = v.abs()
    fp16_first = torch.sign(v) * torch.where(a - a.floor() >= 0.5, a.floor() + 1, a.floor())
    return float((fp16_first != ref.quantize_q8_0(x).data.float()).any(dim=1).float().mean())


# ---------------------------------------------------------------------------------- the lesson's H100 log

@functools.cache
def _lesson_log() -> dict:
    """The error table the lesson printed on an H100 (benchmarks/results/*-lesson07.txt)."""
    path = newest_result("*-lesson07.txt")
    text = path.read_text()
    head = re.search(r"^# Lesson 07 on an? (.+?) \(torch (\S+), triton ([^)]+)\)", text, re.M)
    date = file_date(path)
    errors = {}
    for kind, method, w, y in re.findall(r"^(Gaussian|heavy-tailed)\s+(int8 per tensor|Q8_0|Q4_0)\s+weights\s+"
                                         r"([\d.]+)%\s+layer output\s+([\d.]+)%", text, re.M):
        errors[kind, method] = (float(w) / 100, float(y) / 100)
    shape = re.search(r"^Q8_0: (\d+)x(\d+) fp32 weights", text, re.M)
    if len(errors) != 6 or not head or not shape:
        raise ValueError(f"{path.name}: the lesson's error table was not found")
    return {"errors": errors, "shape": f"{shape.group(1)} × {shape.group(2)}",
            "source": f"{head.group(1)}, torch {head.group(2)}, triton {head.group(3)}, {date}: "
                      f"benchmarks/results/{path.name} (the notebook's own output)"}


# ------------------------------------------------------------------------------------ rotation (SpinQuant)

@functools.cache
def _rotation() -> dict:
    """The lesson's heavy-tailed weights (Student's t, 3 dof, x 0.01, one outlier of 0.5 per 2000), rotated by a
    random orthogonal R: y = x Wᵀ = (x R)(W R)ᵀ. Layer-output error of Q8_0 and Q4_0 (the lesson's kernels)."""
    import torch
    ref = _ref()
    rows, cols = 32, 256
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    w = torch.distributions.StudentT(3.0).sample((rows, cols)) * 0.01
    idx = torch.randint(0, rows * cols, (rows * cols // 2000,), generator=gen)
    w.view(-1)[idx] = 0.5 * torch.sign(torch.randn(idx.numel(), generator=gen))
    x = torch.randn(64, cols, generator=gen)
    r, _ = torch.linalg.qr(torch.randn(cols, cols, generator=gen))
    y = x @ w.T
    out = {"shape": f"{rows} × {cols}", "outliers": idx.numel()}
    for name, wt, xt in (("plain", w, x), ("rotated", w @ r, x @ r)):
        for fmt in ("q8_0", "q4_0"):
            w_hat = getattr(ref, f"dequantize_{fmt}")(getattr(ref, f"quantize_{fmt}")(wt))
            out[name, fmt] = float((xt @ w_hat.T - y).norm() / y.norm())
        out[name, "w"] = wt
        out[name, "kurtosis"] = float(((wt - wt.mean()) ** 4).mean() / wt.var() ** 2)
    return out


# --------------------------------------------------------------------------------------- the H100 records

def _quant() -> dict:
    return record("quantization")


def _matmul_rows(shape: str) -> dict:
    rows = {}
    for r in _quant()["quantization"]["matmul"]:
        if r["shape"] == shape:
            rows.setdefault(r["m"], {})[r["contender"]] = r
    return rows


FP16, DEQ, FUSED = "fp16 matmul (cuBLAS)", "dequantize, then matmul", "fused int8 matmul"


def _ratios(lo: int, hi: int) -> tuple[float, float]:
    """min, max of fused / cuBLAS time over every shape for lo <= M <= hi."""
    vals = [by[FUSED]["us"] / by[FP16]["us"] for shape in _shapes() for m, by in _matmul_rows(shape).items()
            if lo <= m <= hi]
    return min(vals), max(vals)


def _shapes() -> list[str]:
    seen = []
    for r in _quant()["quantization"]["matmul"]:
        if r["shape"] not in seen:
            seen.append(r["shape"])
    return seen


@functools.cache
def _tiles_md() -> dict:
    """The H100 sweep of the two ways to load the scales (benchmarks/results/*-int8-matmul-tiles.md)."""
    path = newest_result("*-int8-matmul-tiles.md")
    text = path.read_text()
    head = re.search(r"^# (.+?) \(sm_\d+\), (\d{4}-\d{2}-\d{2})", text, re.M)
    versions = re.search(r"^torch (\S+), triton (\S+?)\.?\s", text, re.M)
    ratios = [float(m) for m in re.findall(r"^\|[^|\n]+\|[^|\n]+\|[^|\n]+\|[^|\n]+\| ([\d.]+)x \|", text, re.M)]
    if not (head and versions and ratios):
        raise ValueError(f"{path.name}: the sweep's table was not found")
    return {"ratios": ratios, "source": f"{head.group(1)}, torch {versions.group(1)}, triton {versions.group(2)}, "
                                        f"{head.group(2)}: benchmarks/results/{path.name}"}


@functools.cache
def _convergence() -> dict:
    """The grader's convergence check run on the reference, on a CPU (benchmarks/results/*-adamw8bit-convergence.md)."""
    path = newest_result("*-adamw8bit-convergence.md")
    text = path.read_text()
    head = re.search(r"^# .*?, (CPU \([^)]*\)), torch (\S+), triton (\S+)\s*$", text, re.M)
    floor = float(re.search(r"loss floor\): ([\d.]+) nats", text).group(1))
    rows = [(int(a), int(b), float(x), float(y), float(d)) for a, b, x, y, d in
            re.findall(r"^\| (\d+)-(\d+) \| ([\d.]+) \| ([\d.]+) \| ([+-][\d.]+)% \|", text, re.M)]
    if not (head and rows):
        raise ValueError(f"{path.name}: the convergence table was not found")
    date = file_date(path)
    return {"rows": rows, "floor": floor,
            "source": f"{head.group(1)}, torch {head.group(2)}, triton {head.group(3)}, {date}: "
                      f"benchmarks/results/{path.name}"}


# ---------------------------------------------------------------------------------- 8-bit optimizer states

@functools.cache
def _code_demo() -> dict:
    """One block of v = g² (heavy-tailed gradients): how many values a linear 8-bit grid and the dynamic code
    store as 0, with the lesson's quantize_blockwise (which takes any sorted code)."""
    import torch
    ref = _ref()
    gen = torch.Generator().manual_seed(11)
    g = torch.randn(ref.STATE_BLOCK, generator=gen) / torch.rand(ref.STATE_BLOCK, generator=gen).add_(0.02) * 1e-3
    v = g * g
    out = {"n": v.numel(), "decades": float(torch.log10(v.max() / v.min()))}
    for name, code in (("linear", torch.linspace(0, 1, 255)), ("dynamic", ref.dynamic_code(signed=False))):
        codes, absmax = ref.quantize_blockwise(v, code)
        back = ref.dequantize_blockwise(codes, absmax, code)
        out[name] = int(((back == 0) & (v > 0)).sum())
    return out


@functools.cache
def _states_tiny() -> dict:
    """Optimizer-state bytes per parameter after a step of the course trainer in amp, AdamW and the lesson's
    AdamW8bit, at this machine's training_step size (the lesson's demo)."""
    import memfit
    from memfit.gpt import COURSE_CONFIGS, unique_parameters
    from memfit.training import Trainer, measure_step
    ref = _ref()
    size = memfit.hardware.size("training_step")
    cfg = COURSE_CONFIGS[size["config"]]
    out = {"config": cfg.name}
    for name, make in (("AdamW", "adamw"), ("AdamW8bit", lambda p: ref.AdamW8bit(p, lr=3e-4, weight_decay=0.1))):
        trainer = Trainer(cfg, precision="amp", optimizer=make)
        step = measure_step(trainer, size["batch"], size["seq"])
        n = sum(p.numel() for p in unique_parameters(trainer.model))
        out[name] = step.states["optimizer"] / n
        out["n"] = n
    return out


# =================================================================================================== facts

def facts() -> dict[str, str]:
    import torch
    from autograder.checks.quantization import CHECKS, CONVERGENCE
    from memfit.from_lessons.activations import activation_bytes
    from memfit.from_lessons.fused_linear_ce import chunk_plan
    from memfit.from_lessons.model_states import state_bytes
    from memfit.gpt import LLAMA_3_1_8B as L8
    from memfit.hardware import KERNEL_CONFIGS, profile_for
    ref = _ref()
    f: dict[str, str] = {}

    # --- the 8B arithmetic
    s = _sizes()
    n, b, t4 = s["n"], s["bytes"], s["t4"]
    bits = _bits()
    f.update(n_8b=f"{n:,}", n_8b_b=f"{n / 1e9:.0f}B", estimate_gb=f"{n / GB:.0f} GB",
             q8_bits=f"{bits['Q8_0']:g}", q4_bits=f"{bits['Q4_0']:g}",
             q8_gb=f"{b['Q8_0'] / GB:.2f} GB", q8_gib=gib(b["Q8_0"], 2), q4_gb=f"{b['Q4_0'] / GB:.2f} GB",
             fp16_gb=f"{b['fp16'] / GB:.2f} GB", fp16_t4=f"{b['fp16'] / t4:.0%}", q8_t4=f"{b['Q8_0'] / t4:.0%}",
             t4_gib=gib(t4, 0), t4_gb=f"{t4 / GB:.2f} GB", t4_left=gib(t4 - b["Q8_0"], 1),
             q8_block_bytes=str(ref.CODE_BYTES["q8_0"] + 2), q4_block_bytes=str(ref.CODE_BYTES["q4_0"] + 2),
             qk=str(ref.QK))

    # --- per tensor against per block
    o = _outlier_demo()
    f.update(demo_n=str(o["n"]), demo_blocks=str(o["n"] // ref.QK), zero_tensor=str(o["zero_tensor"]),
             zero_block=str(o["zero_block"]))
    blocks_cfg = KERNEL_CONFIGS["quant_blocks"]
    f.update(blocks_cpu=str(blocks_cfg["cpu"]["BLOCKS"]), blocks_gpu=str(blocks_cfg["gpu"]["BLOCKS"]))
    f["fp16_first_share"] = _pct(_fp16_first_share(), 0)
    q4 = _q4_demo()
    f.update(q4_max_err=f"{float(q4['err'].max()) / q4['d']:.2f}", q8_max_err=f"{float(q4['q8_err'].max()) / q4['d8']:.2f}")

    # --- the lesson's error table
    log = _lesson_log()
    e = log["errors"]
    rows = [[m, _pct(e["Gaussian", m][0], 2), _pct(e["Gaussian", m][1], 2), _pct(e["heavy-tailed", m][0], 2),
             _pct(e["heavy-tailed", m][1], 2)] for m in ("int8 per tensor", "Q8_0", "Q4_0")]
    f.update(err_table=markdown_table(["", "Gaussian W", "Gaussian y", "heavy-tailed W", "heavy-tailed y"], rows),
             err_shape=log["shape"], err_source=log["source"],
             err_pt_heavy=_pct(e["heavy-tailed", "int8 per tensor"][1], 0),
             err_q8_heavy=_pct(e["heavy-tailed", "Q8_0"][1]), err_q4_heavy=_pct(e["heavy-tailed", "Q4_0"][1], 0),
             err_q4_gauss=_pct(e["Gaussian", "Q4_0"][1], 0), err_q8_gauss=_pct(e["Gaussian", "Q8_0"][1], 2))

    # --- rotation
    r = _rotation()
    f.update(rot_table=markdown_table(
        ["layer-output error", "W as it is", "W R (rotated)"],
        [["Q8_0", _pct(r["plain", "q8_0"], 2), _pct(r["rotated", "q8_0"], 2)],
         ["Q4_0", _pct(r["plain", "q4_0"], 1), _pct(r["rotated", "q4_0"], 1)],
         ["kurtosis of the weights", f"{r['plain', 'kurtosis']:.0f}", f"{r['rotated', 'kurtosis']:.1f}"]]),
        rot_shape=r["shape"], rot_outliers=str(r["outliers"]), rot_where=measured_on())

    # --- the fused matmul: bytes, tiles
    w_bytes = (ref.CODE_BYTES["q8_0"] + 2) / ref.QK
    up_hat = L8.ffn_hidden * L8.d_model * 2
    f.update(q8_bytes_per_weight=f"{w_bytes:g}", up_shape=f"{L8.ffn_hidden:,} × {L8.d_model:,}",
             up_hat_mib=f"{up_hat / 2**20:,.0f} MiB")
    f["bw_gain"] = f"{2 / w_bytes:.2f}×"
    small_threshold = max(m for m in range(1, 257) if ref.int8_matmul_tiles(m) == KERNEL_CONFIGS["int8_matmul"]["cpu"]["small_m"])
    f["small_m_max"] = str(small_threshold)

    def tiles(t):
        return f"{t['BLOCK_M']} × {t['BLOCK_N']} × {t['BLOCK_K']}, {t['num_warps']} warps, {t['num_stages']} st."
    mm_cfg = KERNEL_CONFIGS["int8_matmul"]
    tile_rows = [[label, tiles(mm_cfg[key]["small_m"]), tiles(mm_cfg[key]["large_m"])]
                 for key, label in (("cpu", "cpu (interpreter)"), ("t4", "T4, V100"), ("gpu", "other GPUs"),
                                    ("h100", "H100"))]
    from memfit.hardware import KNOWN_GPUS, KiB
    f["smem_t4"] = f"{KNOWN_GPUS['t4']['shared_memory_per_block'] // KiB} KiB"
    f["smem_v100"] = f"{KNOWN_GPUS['v100']['shared_memory_per_block'] // KiB} KiB"
    f["tile_table"] = markdown_table(["profile", "small_m: M × N × K", "large_m"], tile_rows)
    h_large = mm_cfg["h100"]["large_m"]
    f.update(h_scale_tile=f"{h_large['BLOCK_K'] // ref.QK} × {h_large['BLOCK_N']}",
             h_code_tile=f"{h_large['BLOCK_K']} × {h_large['BLOCK_N']}")

    # --- the matmul record
    q = _quant()
    f["quant_source"] = source(q)
    lo, hi = _ratios(1, 16)
    f.update(decode_lo=f"{lo:.2f}×", decode_hi=f"{hi:.2f}×")
    lo, hi = _ratios(256, 1 << 20)
    f.update(prefill_lo=f"{lo:.1f}×", prefill_hi=f"{hi:.1f}×")
    lo, hi = _ratios(64, 64)
    f.update(m64_lo=f"{lo:.1f}×", m64_hi=f"{hi:.1f}×")
    up_name = next(sh for sh in _shapes() if "up" in sh)
    up = _matmul_rows(up_name)
    mm_rows = [[f"{m:,}", f"{by[FP16]['us']:.1f}", f"{by[DEQ]['us']:.1f}", f"{by[FUSED]['us']:.1f}",
                f"{by[FUSED]['us'] / by[FP16]['us']:.2f}×", f"{by[DEQ]['peak_mib']:,.1f}", f"{by[FUSED]['peak_mib']:,.2f}"]
               for m, by in sorted(up.items())]
    f["mm_table"] = markdown_table(["M", "cuBLAS fp16 µs", "deq. + mm µs", "fused µs", "fused / fp16",
                                    "deq. + mm MiB", "fused MiB"], mm_rows)
    f["mm_shape"] = f"{up_name}, W {up[1][FUSED]['n']:,} × {up[1][FUSED]['k']:,}"
    t = _tiles_md()
    f.update(tiles_lo=f"{min(t['ratios']):.1f}", tiles_hi=f"{max(t['ratios']):.1f}", tiles_source=t["source"])
    one = up[1]
    f.update(up_m1_fused=f"{one[FUSED]['us']:.1f} µs", up_m1_fp16=f"{one[FP16]['us']:.1f} µs",
             up_m1_deq=f"{one[DEQ]['us']:.1f} µs", up_m1_gbs=f"{one[FUSED]['weight_gbs'] / 1000:.2f} TB/s",
             up_m1_fp16_gbs=f"{one[FP16]['weight_gbs'] / 1000:.2f} TB/s")

    # --- the block kernels record
    fmts = q["quantization"]["formats"]
    copy = next(r for r in fmts if r["op"].startswith("copy"))
    f["formats_table"] = markdown_table(
        ["format", "op", "µs", "TB/s", "of a copy", "relative error"],
        [[r["format"], r["op"], f"{r['us']:.1f}", f"{r['gbs'] / 1000:.2f}", _pct(r["gbs"] / copy["gbs"], 0),
          _pct(r["relative_error"], 2)] for r in fmts])

    # --- 8-bit states: the bytes
    n8 = n
    base, eight = state_bytes(n8, "amp", "adamw"), state_bytes(n8, "amp", "adamw8bit")
    f.update(states_8b=f"{sum(base.values()) / GB:.0f} GB", states8_8b=f"{sum(eight.values()) / GB:.0f} GB",
             bpp_base=f"{sum(base.values()) / n8:.0f}", bpp_8bit=f"{sum(eight.values()) / n8:.2f}",
             opt_base=f"{(base['optimizer']) / n8:.0f}", opt_8bit=f"{eight['optimizer'] / n8:.3f}",
             state_block=str(ref.STATE_BLOCK))

    # --- the dynamic code
    sc, uc = ref.dynamic_code(True), ref.dynamic_code(False)
    f.update(levels=str(sc.numel()), smallest_signed=f"{float(sc[sc > 0].min()):.0e}",
             smallest_unsigned=f"{float(uc[uc > 0].min()):.1e}",
             top_decade=str(int((uc >= 0.1).sum())))
    cd = _code_demo()
    f.update(code_n=str(cd["n"]), code_decades=f"{cd['decades']:.0f}", code_zero_linear=str(cd["linear"]),
             code_zero_dynamic=str(cd["dynamic"]))

    # --- AdamW8bit
    params = inspect.signature(ref.AdamW8bit.__init__).parameters
    chunk = params["chunk"].default
    f.update(chunk=f"2^{{{int(math.log2(chunk))}}}", chunk_mib=f"{chunk * 4 / 2**20:.0f} MiB",
             min_8bit=f"{params['min_8bit_size'].default:,}")
    st = _states_tiny()
    f.update(tiny_cfg=st["config"], tiny_n=f"{st['n']:,}", tiny_adamw=f"{st['AdamW']:.2f}",
             tiny_8bit=f"{st['AdamW8bit']:.2f}", tiny_where=measured_on())

    # --- convergence
    c = _convergence()
    f.update(conv_source=c["source"], conv_floor=f"{c['floor']:.2f}",
             conv_gap=f"{max(abs(r[4]) for r in c['rows']):.2f}%", conv_margin=f"{CONVERGENCE['margin']:.0%}",
             conv_steps=str(CONVERGENCE["steps"]), conv_visible=str(CONVERGENCE["visible_steps"]),
             conv_window=str(CONVERGENCE["window"]),
             conv_lr=f"{CONVERGENCE['lr']:g}", conv_last=f"{c['rows'][-1][2]:.2f}",
             log_vocab=f"{math.log(2048):.1f}")

    # --- the H100 optimizer record
    opt = q["quantization"]["optimizers"]
    f["opt_table"] = markdown_table(
        ["optimizer", "state B/param", "W + G + states B/param", "step peak MiB", "train step ms", "opt. step ms"],
        [[r["optimizer"], f"{r['state_bytes_per_param']:.3f}", f"{r['model_state_bytes_per_param']:.2f}",
          f"{r['step_peak_mib']:,.0f}", f"{r['train_step_ms']:.1f}", f"{r['optimizer_step_ms']:.2f}"] for r in opt])
    h_size = __import__("memfit").hardware.size("training_step", profile_for("h100"))
    f["h100_batch"] = f"{h_size['batch']} × {h_size['seq']:,}"
    from memfit.gpt import COURSE_CONFIGS
    f["opt_cfg"] = COURSE_CONFIGS[h_size["config"]].name
    f["opt_8bit_rec"] = f"{opt[1]['state_bytes_per_param']:.2f}"
    f["opt_params"] = f"{opt[0]['params']:,}"
    f["opt_ratio"] = f"{opt[1]['optimizer_step_ms'] / opt[0]['optimizer_step_ms']:.0f}×"
    f["opt_saved"] = f"{opt[0]['step_peak_mib'] - opt[1]['step_peak_mib']:,.0f} MiB"

    # --- grading
    what = {"q8_0": "llama.cpp's bytes: every scale and code exact (halves, near halves, tiny values); round trip "
                    "bound; zeros, ragged n; fp32/fp16/bf16; no PyTorch math",
            "q4_0": "llama.cpp's bytes: signed scale, the tie rule, every code exact; nibble layout decoded by the "
                    "check",
            "int8_matmul": "vs x·Ŵᵀ, tolerance by the course's rule; ragged M, N, K; bad input raises",
            "int8_matmul_memory": "no tensor half the size of Ŵ during the call",
            "blockwise": "nearest level of the code; fp32 absmax per 256; zero blocks",
            "adamw8bit_step": "step 1 = AdamW; 8 steps vs float64 run; ≤ 1 B/param scratch",
            "adamw8bit_convergence": "course-tiny, 20-step means within the margin of AdamW"}
    f["grading_table"] = markdown_table(["check", "pts", "what it tests"],
                                        [[f"`{c_.name}`", f"{c_.points:g}", what[c_.name]] for c_ in CHECKS])
    from autograder.checks.quantization import BLOCK_CASES, MATMUL_CASES
    f["gpu_block_case"] = " × ".join(f"{d:,}" for d in next(c for c in BLOCK_CASES if c.gpu_only).shape)
    f["gpu_mm_case"] = ", ".join(f"M={c.m} N={c.n:,} K={c.k:,}" for c in MATMUL_CASES if c.gpu_only)
    f["points"] = f"{sum(c_.points for c_ in CHECKS):g}"
    f["n_checks"] = str(len(CHECKS))

    # --- the course in one table (lesson 07's outlook, Llama-3.1-8B at 8 x 4,096 tokens)
    batch, seq = 8, 4096
    states = sum(base.values())
    acts = L8.n_layers * activation_bytes(L8, batch, seq, "amp", "none")
    acts_full = L8.n_layers * activation_bytes(L8, batch, seq, "amp", "full")
    c_tok, c_cols = chunk_plan(batch * seq, L8.d_model, L8.vocab_size, 2)
    tile_bytes = c_tok * c_cols * 2 + (c_tok * L8.d_model * 4 if c_cols < L8.vocab_size else 0)
    e8 = _lesson_log()["errors"]
    f["course_table"] = markdown_table(["", "technique", "what it saves (8B, 8 × 4,096 tokens)", "its price"], [
        ["01", "mixed precision + AdamW", f"baseline: {states / GB:.0f} GB of states", "—"],
        ["02", "full recomputation", f"activations {acts / GB:.0f} → {acts_full / GB:.1f} GB", "a 2nd forward"],
        ["03", "ZeRO-3, 8 GPUs", f"states {states / GB:.0f} → {states / 8 / GB:.0f} GB per GPU", "all-gathers"],
        ["05", "FlashAttention", f"N × N scores: {batch * L8.n_heads * seq * seq * 2 / GB:.0f} GB per layer",
         "none: faster"],
        ["06", "fused linear CE", f"logits {batch * seq * L8.vocab_size * 4 / GB:.0f} GB → {tile_bytes / GB:.2f} GB",
         "a recomputed matmul"],
        ["07", "8-bit AdamW states", f"states {states / GB:.0f} → {sum(eight.values()) / GB:.0f} GB",
         "rounding of m, v"],
        ["07", "Q8_0 / Q4_0 weights", f"fp16 {b['fp16'] / GB:.1f} → {b['Q8_0'] / GB:.1f} / {b['Q4_0'] / GB:.1f} GB",
         f"{_pct(e8['heavy-tailed', 'Q8_0'][1])} / {_pct(e8['heavy-tailed', 'Q4_0'][1], 0)} output error"]])

    # --- the summary table
    sb = (1 + 4 / ref.STATE_BLOCK) * 8
    f["summary_table"] = markdown_table(["", "bits / value", "scale", "error bound", "for"], [
        ["int8 per tensor", "8", "fp32 per tensor", "d/2, d set by the outlier", "(what not to do)"],
        ["Q8_0", f"{bits['Q8_0']:g}", f"fp16 per {ref.QK}", "d/2 + 127·\\|d − d̂\\|",
         f"weights: 8B in {b['Q8_0'] / GB:.1f} GB"],
        ["Q4_0", f"{bits['Q4_0']:g}", f"signed fp16 per {ref.QK}", "\\|d\\| + 8·\\|d − d̂\\|",
         f"weights: 8B in {b['Q4_0'] / GB:.1f} GB"],
        ["8-bit dynamic", f"{sb:g}", f"fp32 per {ref.STATE_BLOCK}", "half a gap between levels",
         f"m, v: {sum(base.values()) / n8:.0f} → {sum(eight.values()) / n8:.0f} B/param"]])
    return f


# ================================================================================================= figures

def styled(fn):
    """Draw the whole figure under the decks' style, so titles and labels added after figure() are large too."""
    @functools.wraps(fn)
    def wrapper():
        import matplotlib.pyplot as plt
        with plt.rc_context(STYLE):
            return fn()
    return wrapper


@styled
def fig_formats():
    """Llama-3.1-8B's weights in each format against a T4's memory."""
    s = _sizes()
    names = ["fp32", "fp16", "Q8_0", "Q4_0"]
    vals = [s["bytes"][k] / 2**30 for k in names]
    fig, ax = figure(figsize=(6.4, 4.6))
    colors = [COLORS["neutral"], COLORS["params"], COLORS["ours"], COLORS["optimizer"]]
    bars = ax.barh(names, vals, color=colors)
    ax.invert_yaxis()
    t4 = s["t4"] / 2**30
    ax.axvline(t4, color=COLORS["activations"], ls="--", lw=2)
    ax.text(t4 + 0.4, 3.45, f"T4: {t4:.0f} GiB", color=COLORS["activations"], fontsize=15, va="center")
    for bar, v, k in zip(bars, vals, names):
        ax.text(v + 0.4, bar.get_y() + bar.get_height() / 2, f"{s['bytes'][k] / GB:.1f} GB", va="center",
                fontsize=14)
    ax.set_xlim(0, max(vals) * 1.25)
    ax.set_xlabel("GiB of weights")
    ax.set_title(f"Llama-3.1-8B: {s['n'] / 1e9:.2f}B parameters")
    ax.grid(axis="y", visible=False)
    fig.tight_layout()
    return fig


@styled
def fig_scales():
    """|x| of four blocks with an outlier: values under d/2 round to 0, per tensor and per block."""
    o = _outlier_demo()
    x, qk = o["x"].abs(), o["n"] // len(o["d_block"])
    fig, ax = figure(figsize=(6.6, 4.8))
    block_colors = [COLORS["params"], COLORS["grads"], COLORS["optimizer"], COLORS["ours"]]
    ax.scatter(range(o["n"]), x, s=18, c=[block_colors[int(i)] for i in o["block_of"]], zorder=3)
    ax.axhline(o["d_tensor"] / 2, color=COLORS["activations"], lw=2.5, ls="--")
    ax.text(o["n"] - 1, float(x[x > 0].min()) / 8, f"- - per tensor d/2: {o['zero_tensor']} of {o['n']} → 0",
            ha="right", color=COLORS["activations"], fontsize=14)
    for i, d in enumerate(o["d_block"].tolist()):
        ax.plot([i * qk, (i + 1) * qk - 1], [d / 2, d / 2], color="black", lw=2.5)
    ax.text(o["n"] - 1, float(x[x > 0].min()) / 3, f"— per block d/2: {o['zero_block']} → 0", fontsize=14,
            ha="right")
    ax.set_yscale("log")
    ax.set_ylim(float(x[x > 0].min()) / 20, 1.5)
    ax.set_xlabel(f"value index (blocks of {qk})")
    ax.set_ylabel("|x|")
    ax.set_title("one outlier (0.5) among weights of std 0.01")
    fig.tight_layout()
    return fig


@styled
def fig_layouts():
    """The bytes of one block as GGUF stores it: Q8_0 (an fp16 scale, then 32 int8 codes) and Q4_0 (the scale, then
    16 bytes of two nibbles), byte 0 on the left."""
    ref = _ref()
    fig, ax = figure(figsize=(13.5, 3.0))
    ax.axis("off")
    ax.grid(False)
    n8, n4 = ref.CODE_BYTES["q8_0"], ref.CODE_BYTES["q4_0"]

    def rect(x, y, w, color):
        ax.add_patch(patches.Rectangle((x, y), w - 0.08, 0.9, facecolor=color, edgecolor="none"))

    rect(0, 2, 2, COLORS["activations"])
    ax.text(0.96, 2.45, "d", ha="center", va="center", fontsize=14, color="white", weight="bold")
    for j in range(n8):
        rect(2 + j, 2, 1, COLORS["ours"])
        if j % 4 == 0:
            ax.text(2 + j + 0.46, 2.45, str(j), ha="center", va="center", fontsize=13, color="white")
    ax.text(-0.6, 2.45, "Q8_0", ha="right", va="center", fontsize=18, weight="bold")
    ax.text(n8 + 2.4, 2.45, f"fp16 d + {n8} int8 = {n8 + 2} bytes", va="center", fontsize=17)
    rect(0, 0.5, 2, COLORS["activations"])
    ax.text(0.96, 0.95, "d", ha="center", va="center", fontsize=14, color="white", weight="bold")
    for j in range(n4):
        rect(2 + 2 * j, 0.5, 1, COLORS["optimizer"])
        rect(2 + 2 * j + 1, 0.5, 1, COLORS["params"])
        if j < 2:
            ax.text(2 + 2 * j + 0.46, 0.95, str(j), ha="center", va="center", fontsize=12, color="white")
            ax.text(2 + 2 * j + 1.46, 0.95, str(j + n4), ha="center", va="center", fontsize=12, color="white")
    ax.text(-0.6, 0.95, "Q4_0", ha="right", va="center", fontsize=18, weight="bold")
    ax.text(2 * n4 + 2.4, 0.95, f"fp16 d + {n4} bytes = {n4 + 2} bytes", va="center", fontsize=17)
    ax.text(0, 0.05, f"GGUF, block after block; Q4_0 byte j: value j in the low nibble (green), value j + {n4} in the "
            "high (blue)", fontsize=16, va="center")
    ax.set_xlim(-4.2, n8 + 16)
    ax.set_ylim(-0.2, 3.0)
    return fig


@styled
def fig_q4_levels():
    """One block: Q4_0's 16 levels (q − 8)·d, the values and where they land; the clamp on the short side."""
    import torch
    q = _q4_demo()
    x, x_hat, d = q["x"], q["x_hat"], q["d"]
    fig, ax = figure(figsize=(6.6, 4.6))
    levels = (torch.arange(16) - 8) * d
    for lv in levels.tolist():
        ax.axvline(lv, color=COLORS["neutral"], lw=1, alpha=0.6)
    order = torch.argsort(x)
    ys = torch.linspace(0, 1, x.numel())
    for y, i in zip(ys.tolist(), order.tolist()):
        clamped = float((x_hat[i] - x[i]).abs()) > abs(d) / 2 + 1e-6
        color = COLORS["activations"] if clamped else COLORS["params"]
        ax.plot([float(x[i]), float(x_hat[i])], [y, y], color=color, lw=2)
        ax.plot(float(x[i]), y, "o", color=color, ms=6)
        ax.plot(float(x_hat[i]), y, "|", color="black", ms=10, mew=2)
    ax.annotate("code 0: −8d = m\n(exact)", (float(levels[0]), 0.02), xytext=(float(levels[0]) + 0.06, 0.2),
                fontsize=13, arrowprops=dict(arrowstyle="->"))
    ax.annotate("+7d: the top is\nclamped, error ≤ |d|", (float(levels[-1]), 0.98),
                xytext=(float(levels[-1]) - 0.3, 0.3), fontsize=13, color=COLORS["activations"],
                arrowprops=dict(arrowstyle="->", color=COLORS["activations"]))
    ax.set_yticks([])
    ax.set_xlabel(f"value  (16 levels, d = m / −8 = {d:.4f})")
    ax.set_title("Q4_0 on one block: value ● → level |")
    ax.grid(False)
    fig.tight_layout()
    return fig


@styled
def fig_errors():
    """The lesson's chart: layer-output error after a round trip, from its H100 run."""
    e = _lesson_log()["errors"]
    methods = ["int8 per tensor", "Q8_0", "Q4_0"]
    fig, ax = figure(figsize=(6.6, 4.6))
    for i, (kind, color) in enumerate((("Gaussian", COLORS["params"]), ("heavy-tailed", COLORS["activations"]))):
        vals = [100 * e[kind, m][1] for m in methods]
        bars = ax.bar([j + 0.4 * i for j in range(3)], vals, width=0.4, color=color, label=kind)
        for bar, v in zip(bars, vals):
            ax.text(bar.get_x() + bar.get_width() / 2, v * 1.12, f"{v:.2g}%", ha="center", fontsize=12)
    ax.set_xticks([j + 0.2 for j in range(3)], methods)
    ax.set_yscale("log")
    ax.set_ylim(0.2, 150)
    ax.set_ylabel("layer output error, %")
    ax.legend(loc="upper right", frameon=False)
    ax.set_title("‖x Ŵᵀ − x Wᵀ‖ / ‖x Wᵀ‖")
    fig.tight_layout()
    return fig


@styled
def fig_tile():
    """One program of the fused kernel: x tile, int8 codes, the compact scale tile broadcast, tl.dot."""
    ref = _ref()
    from memfit.hardware import KERNEL_CONFIGS
    t = KERNEL_CONFIGS["int8_matmul"]["h100"]["large_m"]
    bk, bn, bm = t["BLOCK_K"], t["BLOCK_N"], t["BLOCK_M"]
    fig, ax = figure(figsize=(11, 3.9))
    ax.axis("off")
    ax.grid(False)

    def box(x, y, w, h, color, title, sub):
        ax.add_patch(patches.FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.03", facecolor=color, alpha=0.9,
                                            edgecolor="none"))
        ax.text(x + w / 2, y + h * 0.66, title, ha="center", va="center", fontsize=15, color="white",
                weight="bold")
        ax.text(x + w / 2, y + h * 0.28, sub, ha="center", va="center", fontsize=12, color="white")

    def arrow(a, b):
        ax.annotate("", b, a, arrowprops=dict(arrowstyle="-|>", lw=2, color="#333"))

    box(0, 2.2, 2.3, 0.9, COLORS["params"], "codes q", f"int8 [{bk}, {bn}]")
    box(0, 0.7, 2.3, 0.9, COLORS["activations"], "scales d", f"fp16 [{bk // ref.QK}, {bn}]")
    box(3.6, 1.45, 2.6, 0.9, COLORS["ours"], "q · d", "→ x's dtype")
    box(3.6, -0.35, 2.6, 0.9, COLORS["grads"], "x tile", f"[{bm}, {bk}]")
    box(7.3, 0.7, 1.7, 0.9, COLORS["neutral"], "tl.dot", "+= fp32 acc")
    box(9.6, 0.7, 1.7, 0.9, COLORS["optimizer"], "y tile", f"[{bm}, {bn}]")
    arrow((2.35, 2.6), (3.55, 2.05))
    arrow((2.35, 1.15), (3.55, 1.75))
    ax.text(2.45, 0.95, f"reshape: ×{ref.QK}", fontsize=12)
    arrow((6.25, 1.9), (7.25, 1.3))
    ax.text(6.45, 1.95, "Ŵᵀ tile", fontsize=12)
    arrow((6.25, 0.1), (7.25, 0.95))
    arrow((9.05, 1.15), (9.55, 1.15))
    ax.text(0, 3.4, f"loop along K, BLOCK_K = {bk} at a time: Ŵ exists only as this tile, in registers",
            fontsize=14)
    ax.set_xlim(-0.2, 11.5)
    ax.set_ylim(-0.5, 3.7)
    return fig

@styled
def fig_matmul():
    """The H100 record: fused int8 and dequantize-then-matmul, time / cuBLAS fp16, against M."""
    fig, ax = figure(figsize=(6.8, 4.7))
    colors = [COLORS["params"], COLORS["grads"], COLORS["optimizer"]]
    for shape, color in zip(_shapes(), colors):
        rows = _matmul_rows(shape)
        ms = sorted(rows)
        ax.plot(ms, [rows[m][FUSED]["us"] / rows[m][FP16]["us"] for m in ms], "o-", color=color, lw=2.5,
                label=f"fused, {shape}")
        ax.plot(ms, [rows[m][DEQ]["us"] / rows[m][FP16]["us"] for m in ms], "s--", color=color, lw=1.5,
                alpha=0.7, ms=5)
    ax.axhline(1, color="black", lw=1)
    ax.text(200, 0.55, "cuBLAS fp16 = 1", fontsize=13)
    ax.plot([], [], "s--", color=COLORS["neutral"], label="dequantize, then matmul")
    ax.set_xscale("log", base=2)
    ms = sorted(_matmul_rows(_shapes()[0]))
    ax.set_xticks(ms, [f"{m:,}" for m in ms])
    ax.minorticks_off()
    ax.set_xlabel("M: tokens in x")
    ax.set_ylabel("time / cuBLAS fp16")
    ax.legend(fontsize=11, loc="upper left", frameon=False)
    ax.set_ylim(0, 6.2)
    fig.tight_layout()
    return fig


@styled
def fig_state_bytes():
    """Llama-3.1-8B's model states under mixed precision: AdamW against 8-bit AdamW (lesson 01's state_bytes)."""
    from memfit.from_lessons.model_states import state_bytes
    n = _sizes()["n"]
    fig, ax = figure(figsize=(6.6, 3.6))
    names = ["AdamW", "AdamW8bit"]
    left = [0.0, 0.0]
    for key, color, label in (("params", COLORS["params"], "fp32 weights"), ("grads", COLORS["grads"], "fp32 grads"),
                              ("optimizer", COLORS["optimizer"], "m and v")):
        vals = [state_bytes(n, "amp", o)[key] / GB for o in ("adamw", "adamw8bit")]
        ax.barh(names, vals, left=left, color=color, label=label)
        for i, v in enumerate(vals):
            ax.text(left[i] + v / 2, i, f"{v:.0f}", ha="center", va="center", color="white", fontsize=14)
        left = [a + v for a, v in zip(left, vals)]
    for i, tot in enumerate(left):
        ax.text(tot + 2, i, f"{tot:.0f} GB", va="center", fontsize=14)
    ax.invert_yaxis()
    ax.set_xlim(0, max(left) * 1.2)
    ax.set_xlabel("GB, Llama-3.1-8B, mixed precision")
    ax.legend(ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.3), frameon=False, fontsize=12)
    ax.grid(axis="y", visible=False)
    fig.tight_layout()
    return fig


@styled
def fig_dynamic_code():
    """The dynamic code's 255 levels (log scale) against a linear 8-bit grid."""
    import torch
    ref = _ref()
    uc, sc = ref.dynamic_code(False), ref.dynamic_code(True)
    fig, ax = figure(figsize=(6.6, 4.4))
    pos = sc[sc > 0]
    ax.plot(uc[1:], range(1, uc.numel()), ".", ms=5, color=COLORS["optimizer"], label="dynamic, unsigned (v)")
    ax.plot(pos, range(sc.numel() - pos.numel(), sc.numel()), ".", ms=5, color=COLORS["params"],
            label="dynamic, signed (m), > 0")
    lin = torch.linspace(0, 1, 255)[1:]
    ax.plot(lin, range(1, 255), ".", ms=4, color=COLORS["neutral"], label="linear 8-bit grid")
    ax.set_xscale("log")
    ax.set_xlabel("level (value / block absmax)")
    ax.set_ylabel("code")
    ax.legend(loc="upper left", frameon=False, fontsize=12)
    fig.tight_layout()
    return fig


@styled
def fig_convergence():
    """The grader's convergence check on the reference (CPU record): 20-step mean losses."""
    c = _convergence()
    mids = [(a + b) / 2 for a, b, *_ in c["rows"]]
    fig, ax = figure(figsize=(6.6, 4.5))
    ax.plot(mids, [r[2] for r in c["rows"]], "o-", color=COLORS["neutral"], lw=3, ms=8, label="AdamW (fp32 m, v)")
    ax.plot(mids, [r[3] for r in c["rows"]], "x--", color=COLORS["ours"], lw=2, ms=9, mew=2, label="AdamW8bit")
    ax.axhline(c["floor"], color="black", ls=":", lw=1.5)
    ax.text(mids[-1], c["floor"] + 0.12, "the chain's entropy", ha="right", fontsize=13)
    ax.set_xlabel("step (mean of each 20)")
    ax.set_ylabel("loss, nats")
    ax.set_ylim(0, 8)
    ax.legend(frameon=False)
    ax.set_title("course-tiny on the Markov corpus")
    fig.tight_layout()
    return fig



@styled
def fig_rotation():
    """The weights' histogram before and after the rotation (the same matrix as the table)."""
    import torch
    r = _rotation()
    fig, ax = figure(figsize=(6.0, 4.4))
    bins = torch.linspace(-0.55, 0.55, 45)
    for key, color, label in (("plain", COLORS["activations"], "W"), ("rotated", COLORS["params"], "W R")):
        ax.hist(r[key, "w"].flatten().numpy(), bins=bins.numpy(), color=color, alpha=0.6, label=label, log=True)
    ax.set_xlabel("weight value")
    ax.set_ylabel("count (log)")
    ax.legend(frameon=False)
    ax.set_title("the outliers spread over the row")
    fig.tight_layout()
    return fig
