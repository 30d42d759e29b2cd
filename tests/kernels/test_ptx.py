"""The PTX check (``python -m gpunets.kernels --ptx``): real numba-cuda typing and NVVM, no GPU, no simulator."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NO_NVVM = 3


def _run(args: list[str], code: str | None = None, simulator: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    if simulator:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "gpunets.kernels", *args] if code is None else [sys.executable, "-c", code, *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)


def _skip_without_nvvm(proc: subprocess.CompletedProcess) -> None:
    if proc.returncode == NO_NVVM:
        pytest.skip("libNVVM is not installed (pip install 'numba-cuda[cu12]>=0.20,<0.31'): " + proc.stderr.strip())


def test_ptx_subset_compiles_and_leaves_the_simulator():
    # NUMBA_ENABLE_CUDASIM=1 in the environment: the check reruns itself without it
    proc = _run(["--ptx", "--kernels", "mean", "var", "wmean", "hstack", "--dtypes", "bool", "uint8", "float32",
                 "--k", "2", "--cc", "90"], simulator=True)
    _skip_without_nvvm(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["kernel", "dtype", "K", "cc", "result"]
    rows = [line.split() for line in lines[1:-1]]
    assert {(r[0], r[1]) for r in rows} == {(k, d) for k in ("mean", "var", "wmean", "hstack")
                                            for d in ("bool", "uint8", "float32")}
    assert all(r[2:] == ["2", "90", "ok"] for r in rows)
    assert lines[-1].startswith("12 compiled, 0 failed")


_BROKEN = """
import sys
from numba import cuda
from gpunets.kernels import _cuda, _ptx

@cuda.jit
def broken(arrays, out):
    out[0] = float(arrays[0][0])   # numba-cuda types float() for numbers only: bool fails

_cuda._KERNELS["broken"] = broken
_cuda.KERNEL_DTYPES["broken"] = ("bool", "float64")
types = _cuda.launch_types
_cuda.launch_types = lambda name, dtype, k: types("max" if name == "broken" else name, dtype, k)
sys.exit(_ptx.main(sys.argv[1:]))
"""


def test_ptx_failure_is_in_the_table_and_the_exit_status():
    proc = _run(["--ptx", "--kernels", "broken", "mean", "--dtypes", "bool", "float64", "--k", "1", "--cc", "80"],
                code=_BROKEN)
    _skip_without_nvvm(proc)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = {tuple(line.split()[:4]): line for line in proc.stdout.splitlines()[1:-1]}
    failed = rows[("broken", "bool", "1", "80")]
    assert "FAILED: TypingError" in failed   # the first line of numba's typing error (its wording varies)
    assert rows[("broken", "float64", "1", "80")].endswith(" ok")
    assert rows[("mean", "bool", "1", "80")].endswith(" ok")
    assert proc.stdout.splitlines()[-1].startswith("3 compiled, 1 failed")


_NO_NVVM = """
import sys
from numba import cuda
from numba.cuda.cudadrv.error import NvvmSupportError
from gpunets.kernels import _ptx

def missing(*args, **kwargs):
    raise NvvmSupportError("libNVVM is not available")

cuda.compile_ptx = missing
sys.exit(_ptx.main(sys.argv[1:]))
"""


def test_ptx_without_nvvm_names_the_package_to_install():
    proc = _run(["--ptx", "--kernels", "min", "--k", "1"], code=_NO_NVVM)
    assert proc.returncode == NO_NVVM, proc.stdout + proc.stderr
    assert "libNVVM was not found" in proc.stderr and "numba-cuda[cu12]" in proc.stderr
    assert "NvvmSupportError: libNVVM is not available" in proc.stderr


_NUMPY_25 = """
import sys
from gpunets.kernels import _cuda, _ptx

def numpy_25():   # what numba-cuda 0.30 raises on NumPy 2.5, at its first kernel compile
    raise AttributeError("module 'numpy' has no attribute 'row_stack'")

_cuda._load_numpy_support = numpy_25
_cuda.numba_cuda_problem.cache_clear()
if sys.argv[1] == "check_available":
    try:
        _cuda.check_available()
    except ImportError as exc:
        print(exc)
        sys.exit(0)
    sys.exit("check_available did not raise")
sys.exit(_ptx.main(sys.argv[1:]))
"""


def test_a_numba_cuda_that_cannot_run_with_this_numpy_is_named_not_blamed_on_nvvm():
    """numba-cuda 0.30 on NumPy 2.5 fails at its first compile with an AttributeError far from its cause (seen on
    an H200): the PTX check and every CUDA kernel call name the versions and the fix, before compiling anything."""
    import numba
    import numpy as np

    proc = _run(["--ptx", "--kernels", "min", "--k", "1"], code=_NUMPY_25)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "libNVVM" not in proc.stderr and proc.stdout == ""
    assert f"cannot compile CUDA kernels with NumPy {np.__version__} and numba {numba.__version__}" in proc.stderr
    assert "AttributeError: module 'numpy' has no attribute 'row_stack'" in proc.stderr
    assert 'pip install "numpy<2.5"' in proc.stderr
    proc = _run(["check_available"], code=_NUMPY_25)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "numba-cuda" in proc.stdout and 'pip install "numpy<2.5"' in proc.stdout


def test_ptx_bad_options_exit_2_before_compiling():
    proc = _run(["--ptx", "--kernels", "median"])
    assert proc.returncode == 2 and "unknown kernel(s) ['median']" in proc.stderr
    proc = _run(["--ptx", "--cc", "9"])
    assert proc.returncode == 2 and "--cc takes compute capabilities" in proc.stderr
