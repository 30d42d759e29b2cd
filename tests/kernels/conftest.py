"""Switch numba's CUDA simulator on where there is no GPU, before anything imports numba.

The top-level ``tests/conftest.py`` does the same; this copy is harmless when that already ran
(the variable is then set) and keeps ``pytest tests/kernels`` self-contained.
"""

import os
import shutil

if "NUMBA_ENABLE_CUDASIM" not in os.environ and not (shutil.which("nvidia-smi") or os.path.exists("/dev/nvidia0")):
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
