"""Shared test set-up.

* Without a real GPU, numba's CUDA simulator is switched on before anything
  imports numba, so the CUDA kernels run (slowly, on small grids) on the CPU.
* ``gpunets.testing`` provides the ``gn_executor`` / ``gn_device`` fixtures and
  skips ``@pytest.mark.gpu`` tests where no GPU is present.
"""

import os
import shutil

if "NUMBA_ENABLE_CUDASIM" not in os.environ and not (shutil.which("nvidia-smi") or os.path.exists("/dev/nvidia0")):
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import pytest  # noqa: E402

pytest_plugins = ["gpunets.testing"]


@pytest.fixture
def executor(gn_executor):
    """Alias: each test that takes ``executor`` runs once per executor present."""
    return gn_executor
