import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("MPLBACKEND", "Agg")

import memfit  # noqa: E402,F401  (decides TRITON_INTERPRET before any test imports triton)
