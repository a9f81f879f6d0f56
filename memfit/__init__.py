"""memfit: the library of the course "Fitting LLM training into GPU memory".

What notebooks import that is not an exercise: the runtime switch between compiled and
interpreted Triton, hardware profiles, the memory meter, timing. Import it first: it decides
TRITON_INTERPRET before triton is imported.
"""
from memfit.runtime import DEVICE, HAS_GPU, INTERPRETED  # noqa: F401  (must run first)
from memfit.hardware import config, profile, size  # noqa: F401
from memfit.meter import format_bytes, measure_peak  # noqa: F401

__version__ = "0.1.0"
