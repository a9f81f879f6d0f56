"""Every reference kernel, with the config chosen for T4 and V100, compiles for sm_75 and sm_70
and fits their shared memory (checked on CPU: Triton compiles for a target it does not have)."""
import subprocess
import sys

from course import ROOT, course_env


def test_kernels_compile_for_t4_and_v100():
    proc = subprocess.run([sys.executable, "-m", "tools.compile_targets", "--profiles", "t4", "v100"],
                          cwd=ROOT, env=course_env(), capture_output=True, text=True, timeout=900)
    report = [line for line in proc.stdout.splitlines() if line.startswith(("ok", "FAIL"))]
    print("\n".join(report))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report and all(line.startswith("ok") for line in report)
    assert any("sm_75" in line for line in report) and any("sm_70" in line for line in report)


def test_a_lesson_report_compiles_the_learners_own_kernels(tmp_path):
    """Lesson 06's compile report (a notebook cell passes its own file's name): the stubs of lessons/ fail to compile and the
    report says so; the solution's kernels compile; without the file the reference is compiled and named."""
    from tools.compile_report import compile_report
    stubs = compile_report(str(ROOT / "lessons" / "06_fused_linear_ce.ipynb"), dtypes=["fp16"])
    solution = compile_report(str(ROOT / "solutions" / "06_fused_linear_ce.ipynb"), dtypes=["fp16"])
    absent = compile_report(str(tmp_path / "06_fused_linear_ce.ipynb"), dtypes=["fp16"])
    assert stubs.startswith("your kernels, from") and "lessons/06_fused_linear_ce.ipynb" in stubs
    assert "FAIL" in stubs and "still the stub" in stubs and "[fp32]" not in stubs
    from autograder.checks.fused_linear_ce import KERNELS
    kernels_x_cards = 2 * len(KERNELS)  # T4 and V100, fp16 only
    assert solution.startswith("your kernels") and "FAIL" not in solution and solution.count("ok ") == kernels_x_cards
    assert absent.startswith("the course's reference kernels") and absent.count("ok ") == kernels_x_cards


def test_every_kernel_config_belongs_to_a_listed_kernel():
    """memfit.hardware's KERNEL_CONFIGS and the check modules' KERNELS describe the same kernels: a config no kernel
    uses is never compiled for the small cards, and a kernel naming no config cannot be."""
    import importlib
    from course.lessons import checks_module, lessons
    from memfit.hardware import KERNEL_CONFIGS
    # Not through tools.compile_targets: importing it sets TRITON_INTERPRET=0 for this test worker's later kernels.
    used = {spec.config for lesson in lessons()
            for spec in getattr(importlib.import_module(checks_module(lesson)), "KERNELS", ())}
    assert not set(KERNEL_CONFIGS) - used, f"configs no KernelSpec names: {sorted(set(KERNEL_CONFIGS) - used)}"
    assert not used - set(KERNEL_CONFIGS), f"KernelSpecs naming no config: {sorted(used - set(KERNEL_CONFIGS))}"
