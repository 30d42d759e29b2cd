"""The store of fitted states (issue 26): a state fitted on a GPU, loaded where no GPU is present, follows the
fallback policy (run in the fake-GPU lane: GPUNETS_FAKE_GPU=1 SCIPY_ARRAY_API=1)."""

import logging
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from sklearn.linear_model import Ridge
from sklearn.preprocessing import StandardScaler

import gpunets as gn
from gpunets.compute.models import scipy_array_api_enabled
from gpunets.testing import fake_gpu, no_gpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(not scipy_array_api_enabled(), reason="array-API fits on the fake GPU need "
                                "SCIPY_ARRAY_API=1 (the fake-GPU lane)")


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(80, 5)), rng.normal(size=80)


def _net():
    Xd, yd = _data()
    X, y = gn.source(Xd, name="X"), gn.source(yd, name="y")
    scale = gn.machine(StandardScaler(), X, device="cuda")
    Z = scale.transform(X)
    ridge = gn.machine(Ridge(solver="svd"), Z, y, device="cuda")
    lasso = gn.machine(Ridge(alpha=3.0), Z, y, device="cpu")   # on the CPU, downstream of a GPU state
    return ridge.predict(Z) + lasso.predict(Z)


def _no_gpu(monkeypatch):
    """This process without a GPU: no fake GPU (in the fake-GPU lane too), and a real GPU hidden from gpunets."""
    return no_gpu()


@pytest.fixture
def fitted_on_gpu(tmp_path):
    path = str(tmp_path / "s")
    with fake_gpu(), gn.config(store=path):
        net = _net()
        report = net.fit()
        assert report.actions.by_label() == {"StandardScaler": "train", "Ridge": "train", "Ridge#2": "train"}
        assert gn.store_info().entries == 3         # each GPU state's entry holds its CPU twin
        pred = np.asarray(gn.evaluate(net, output="numpy"))
    return path, pred


@pytest.mark.parametrize("policy", ["warn", "silent"])
def test_a_gpu_state_loads_where_no_gpu_is_by_the_fallback_policy(fitted_on_gpu, monkeypatch, caplog, policy):
    path, expected = fitted_on_gpu
    with _no_gpu(monkeypatch), gn.config(store=path, fallback=policy):
        assert not gn.devices.placement.gpu_available()
        net = _net()
        with warnings.catch_warnings(record=True) as seen, caplog.at_level(logging.INFO, logger="gpunets"):
            warnings.simplefilter("always")
            report = net.fit()
        assert report.actions.by_label() == {"StandardScaler": "stored", "Ridge": "stored", "Ridge#2": "stored"}
        for label in ("StandardScaler", "Ridge"):
            assert "loaded instead of fitted (from a GPU state fitted on cuda (array_api)" in report.why[label]
            assert "converted for the CPU: its arrays copied to the host" in report.why[label]
        assert "GPU state" not in report.why["Ridge#2"]   # a CPU state, keyed by its upstream's GPU fit
        about = [str(w.message) for w in seen if "loaded from the store" in str(w.message)]
        logged = [r.getMessage() for r in caplog.records if "loaded from the store" in r.getMessage()]
        if policy == "warn":
            assert len(about) == 2 and any(m.startswith("machine StandardScaler is placed on cuda:0") for m in about)
            assert all(issubclass(w.category, gn.DeviceFallbackWarning) for w in seen if "GPU state" in str(w.message))
        else:
            assert about == [] and len(logged) == 2
        assert gn.store_info().hits == 3
        np.testing.assert_allclose(net(), expected, rtol=0, atol=1e-6)
        assert all(st.device == "cpu" for st in (m._state for m in net.machines))
        assert net.fit().actions.by_label() == {"StandardScaler": "skip", "Ridge": "skip", "Ridge#2": "skip"}


def test_fallback_raise_refuses_a_gpu_state(fitted_on_gpu, monkeypatch):
    path, _ = fitted_on_gpu
    with _no_gpu(monkeypatch), gn.config(store=path, fallback="raise"):
        with pytest.raises(gn.DeviceUnavailableError, match="placed on cuda"):
            _net().fit()
        assert gn.store_info().hits == 0


_CPU_ONLY = textwrap.dedent("""
    import sys, warnings, numpy as np, gpunets as gn
    sys.path.insert(0, sys.argv[2])
    from test_store_gpu import _net
    warnings.simplefilter("ignore")
    with gn.config(store=sys.argv[1]):
        net = _net()
        report = net.fit()
        print(sorted(report.actions.by_label().items()))
        np.save(sys.argv[3], np.asarray(net()))
""")


def test_a_gpu_state_loads_in_a_process_without_a_gpu(fitted_on_gpu, tmp_path):
    path, expected = fitted_on_gpu
    env = {k: v for k, v in os.environ.items() if k != "GPUNETS_FAKE_GPU"}
    env["CUDA_VISIBLE_DEVICES"] = ""   # and no real GPU either
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    out = tmp_path / "pred.npy"
    done = subprocess.run([sys.executable, "-c", _CPU_ONLY, path, os.path.join(ROOT, "tests"), str(out)],
                          capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[('Ridge', 'stored'), ('Ridge#2', 'stored'), ('StandardScaler', 'stored')]"
    np.testing.assert_allclose(np.load(out), expected, rtol=0, atol=1e-6)


def _search(alphas):
    from sklearn.pipeline import make_pipeline

    return gn.GridSearchCV(make_pipeline(StandardScaler(), Ridge(solver="svd")), {"ridge__alpha": alphas}, cv=3,
                           device="cuda")


@pytest.mark.parametrize("policy", ["warn", "raise"])
def test_a_search_step_fitted_on_a_gpu_loads_where_no_gpu_is(tmp_path, monkeypatch, policy):
    """A search's step fitted on a GPU is stored with its CPU twin; a search placed on the GPU that runs on the
    CPU (no GPU here) loads the twin by the fallback policy, and fits only what is new."""
    path = str(tmp_path / "s")
    X, y = _data()
    with fake_gpu(), gn.config(store=path):
        first = _search([0.1, 1.0]).fit(X, y)
        assert first.search_report_.fits == {"standardscaler": 3, "ridge": 6}
    cpu = gn.GridSearchCV(first.estimator, {"ridge__alpha": [0.1, 1.0, 10.0]}, cv=3).fit(X, y)
    with _no_gpu(monkeypatch), gn.config(store=path, fallback=policy):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            if policy == "raise":   # no GPU and no fallback: refused before anything is loaded or fitted
                with pytest.raises(gn.DeviceUnavailableError, match="fallback='warn'"):
                    _search([0.1, 1.0, 10.0]).fit(X, y)
                return
            wide = _search([0.1, 1.0, 10.0]).fit(X, y)
        report = wide.search_report_
        assert report.fitted == 3 and report.stored == 3   # the new Ridges fitted; the scalers: the GPU fits' twins
        assert any("fitted on cuda (array_api), converted for the CPU" in str(w.message) for w in seen)
    np.testing.assert_allclose(wide.cv_results_["mean_test_score"], cpu.cv_results_["mean_test_score"], rtol=1e-10)


def test_gpu_arrays_keep_their_layout_through_the_store():
    """CuPy pickles through C order: a Fortran-ordered array of a fitted state (PCA's components_) would come back
    C-ordered, and the loaded state's products round otherwise. The store keeps the layout."""
    import pickle

    from sklearn.decomposition import PCA

    from gpunets.compute.models import call_context
    from gpunets.devices import _gpulibs
    from gpunets.devices import store as store_mod

    with fake_gpu():
        cp = _gpulibs.cupy()
        X = cp.asarray(np.random.default_rng(0).normal(size=(400, 10)))
        with call_context("array_api", None):
            pca = PCA(3, svd_solver="covariance_eigh").fit(X)
            assert pca.components_.flags.f_contiguous and not pca.components_.flags.c_contiguous
            loaded = pickle.loads(store_mod.dumps(pca))
            assert loaded.components_.flags.f_contiguous
            assert bool((loaded.transform(X) == pca.transform(X)).all())
