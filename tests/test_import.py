"""`import gpunets` stays light: no cupy, cudf, cuml, numba or dask."""

import subprocess
import sys


def test_import_gpunets_imports_no_heavy_library():
    code = ("import sys, gpunets; heavy = [m for m in ('cupy', 'cudf', 'cuml', 'numba', 'dask', 'distributed') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_building_and_fitting_a_network_without_combine_kernels_stays_light():
    # placed on the CPU: device="auto" is a GPU where one is present (then CuPy is imported, as it must be)
    code = ("import sys, numpy as np, gpunets as gn; from sklearn.linear_model import Ridge\n"
            "gn.set_config(device='cpu')\n"
            "X = gn.source(np.eye(3), name='X'); y = gn.source(np.ones(3), name='y')\n"
            "p = gn.machine(Ridge(), X, y).predict(X) * 2; p.fit(executor='threads'); p(executor='streams')\n"
            "print([m for m in ('cupy', 'cudf', 'cuml', 'dask') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("[]"), out.stdout + out.stderr


def test_version_comes_from_the_package_metadata():
    from importlib.metadata import version

    import gpunets as gn

    assert gn.__version__ == version("gpunets")
