"""Every reference kernel, with the config chosen for T4 and V100, compiles for sm_75 and sm_70
and fits their shared memory (checked on CPU: Triton compiles for a target it does not have)."""
import subprocess
import sys

from autograder import ROOT, course_env


def test_kernels_compile_for_t4_and_v100():
    proc = subprocess.run([sys.executable, "-m", "tools.compile_targets", "--profiles", "t4", "v100"],
                          cwd=ROOT, env=course_env(), capture_output=True, text=True, timeout=900)
    report = [line for line in proc.stdout.splitlines() if line.startswith(("ok", "FAIL"))]
    print("\n".join(report))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report and all(line.startswith("ok") for line in report)
    assert any("sm_75" in line for line in report) and any("sm_70" in line for line in report)
