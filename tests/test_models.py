"""Tests of gpunets.compute.models: twins, array-API dispatch, fallback, input preparation.

cuML is stood in for by tiny fake modules injected into ``sys.modules``; the
array-API route is exercised on ``array_api_strict`` arrays in a subprocess
started with ``SCIPY_ARRAY_API=1`` (SciPy reads it only at import).  Tests
marked ``gpu`` run on real CuPy/cuML and are skipped without a GPU.
"""

import logging
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import sklearn
from sklearn.base import BaseEstimator
from sklearn.decomposition import PCA
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
from sklearn.ensemble import RandomForestRegressor
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.preprocessing import StandardScaler

import gpunets.devices.placement as gd
import gpunets.compute.models as gm
from gpunets.base.config import config
from gpunets.devices.placement import CPU, Device
from gpunets.base.exceptions import DeviceUnavailableError
from gpunets.compute.models import (CUML_TO_SKLEARN, SKLEARN_TO_CUML, Resolved, call_context, fit_context,
                            is_cuml_estimator, prepare_inputs, public_path, resolve_estimator,
                            scipy_array_api_enabled, supports_array_api, to_cuml, to_sklearn)

ROOT = Path(__file__).resolve().parents[1]


def _require_gpu():
    try:
        import cupy
    except Exception:
        pytest.skip("needs CuPy and a CUDA GPU")
    if not cupy.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return cupy


# A subprocess that believes it has one GPU and no cuML: the array-API route, on array_api_strict.
_FAKE_GPU_PREAMBLE = """
        import sys, numpy as np, array_api_strict as xp, sklearn
        import gpunets.devices.placement as gd, gpunets.compute.models as gm
        from sklearn.linear_model import Ridge
        sys.modules["cuml"] = None
        gd.gpu_available = lambda: True
        gd.gpu_count = lambda: 1
        rng = np.random.default_rng(0)
"""


def _run(code: str) -> str:
    env = dict(os.environ, SCIPY_ARRAY_API="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return out.stdout


# ----------------------------------------------------------------- fakes


class UnsupportedOnGPU(ValueError):
    pass


def make_fake_cuml():
    cuml = types.ModuleType("cuml")
    lm = types.ModuleType("cuml.linear_model")
    ens = types.ModuleType("cuml.ensemble")
    man = types.ModuleType("cuml.manifold")

    class FakeRidge(BaseEstimator):  # with cuML >= 25 interop
        _cpu_class_path = "sklearn.linear_model.Ridge"

        def __init__(self, *, alpha=1.0, fit_intercept=True, solver="eig", handle=None, verbose=False,
                     output_type=None):
            self.alpha, self.fit_intercept, self.solver = alpha, fit_intercept, solver
            self.handle, self.verbose, self.output_type = handle, verbose, output_type

        @classmethod
        def from_sklearn(cls, model):
            if not isinstance(model, Ridge):
                raise TypeError(f"Expected instance of 'sklearn.linear_model.Ridge', got {type(model).__name__!r}")
            if model.positive:
                raise UnsupportedOnGPU("`positive=True` is not supported")
            assert not hasattr(model, "coef_"), "from_sklearn must get an unfitted clone"
            out = cls(alpha=model.alpha, fit_intercept=model.fit_intercept)
            out.output_type = "numpy"
            return out

        def as_sklearn(self):
            return Ridge(alpha=self.alpha, fit_intercept=self.fit_intercept)

    class FakeRF(BaseEstimator):  # an older cuML: no interop methods
        def __init__(self, n_estimators=100, max_depth=16, random_state=None, n_streams=4, handle=None,
                     verbose=False, output_type=None):
            self.n_estimators, self.max_depth, self.random_state = n_estimators, max_depth, random_state
            self.n_streams = n_streams
            self.handle, self.verbose, self.output_type = handle, verbose, output_type

    class FakeUMAP(BaseEstimator):
        def __init__(self, n_neighbors=15):
            self.n_neighbors = n_neighbors

    FakeRidge.__name__ = FakeRidge.__qualname__ = "Ridge"
    FakeRidge.__module__ = "cuml.linear_model.ridge"
    FakeRF.__name__ = FakeRF.__qualname__ = "RandomForestRegressor"
    FakeRF.__module__ = "cuml.ensemble.randomforestregressor"
    FakeUMAP.__name__ = FakeUMAP.__qualname__ = "UMAP"
    FakeUMAP.__module__ = "cuml.manifold.umap"
    lm.Ridge, ens.RandomForestRegressor, man.UMAP = FakeRidge, FakeRF, FakeUMAP
    cuml.linear_model, cuml.ensemble, cuml.manifold = lm, ens, man
    return {"cuml": cuml, "cuml.linear_model": lm, "cuml.ensemble": ens, "cuml.manifold": man}


@pytest.fixture
def fake_cuml(monkeypatch):
    mods = make_fake_cuml()
    monkeypatch.delenv("GPUNETS_FAKE_GPU", raising=False)  # these mocks stand for the real CuPy/cuML modules
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    return mods


@pytest.fixture
def no_cuml(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuml", None)


@pytest.fixture
def gpu(monkeypatch):
    monkeypatch.setattr(gd, "gpu_available", lambda: True)
    monkeypatch.setattr(gd, "gpu_count", lambda: 1)


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(gd, "gpu_available", lambda: False)
    monkeypatch.setattr(gd, "gpu_count", lambda: 0)


def _records(caplog, level=logging.DEBUG):
    return [r for r in caplog.records if r.name == "gpunets" and r.levelno >= level]


# ----------------------------------------------------------------- tables and paths


def test_public_path():
    assert public_path(Ridge()) == "sklearn.linear_model.Ridge"
    assert public_path(LinearDiscriminantAnalysis) == "sklearn.discriminant_analysis.LinearDiscriminantAnalysis"
    assert public_path(RandomForestRegressor()) == "sklearn.ensemble.RandomForestRegressor"


def test_every_table_entry_is_a_real_sklearn_class():
    import importlib

    for path in SKLEARN_TO_CUML:
        module, _, name = path.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        assert public_path(cls) == path
    assert all(CUML_TO_SKLEARN[v] == k for k, v in SKLEARN_TO_CUML.items())
    assert SKLEARN_TO_CUML["sklearn.linear_model.Ridge"] == "cuml.linear_model.Ridge"
    assert SKLEARN_TO_CUML["sklearn.ensemble.RandomForestClassifier"] == "cuml.ensemble.RandomForestClassifier"


def test_is_cuml_estimator(fake_cuml):
    assert is_cuml_estimator(fake_cuml["cuml.linear_model"].Ridge())
    assert not is_cuml_estimator(Ridge())


# ----------------------------------------------------------------- array-API support


@pytest.mark.parametrize("model, ok", [
    (Ridge(), True), (Ridge(solver="svd"), True), (Ridge(solver="lsqr"), False),
    (Ridge(positive=True, solver="lbfgs"), False), (StandardScaler(), True),
    (LogisticRegression(), True), (LogisticRegression(solver="liblinear"), False),
    (PCA(svd_solver="full"), True), (PCA(svd_solver="arpack"), False),
    (LinearDiscriminantAnalysis(), True), (LinearDiscriminantAnalysis(solver="lsqr"), False),
    (RandomForestRegressor(), False),
    (StandardScaler().set_output(transform="pandas"), False), (StandardScaler().set_output(transform="default"), True),
])
def test_supports_array_api(model, ok):
    got, why = supports_array_api(model)
    assert got is ok
    assert (why == "") is ok
    if not ok:
        assert why.startswith(repr(model)) and "does not support array-API dispatch" in why


def test_supports_array_api_without_tags_uses_the_list():
    class NoTags:
        def get_params(self, deep=False):
            return {}

    m = NoTags()
    assert supports_array_api(m) == (False, f"{m!r} does not support array-API dispatch")
    NoTags.__module__, NoTags.__name__ = "sklearn.preprocessing._fake", "StandardScaler"
    assert supports_array_api(NoTags()) == (True, "")


def test_scipy_array_api_flag(monkeypatch):
    monkeypatch.delenv("SCIPY_ARRAY_API", raising=False)
    assert scipy_array_api_enabled() is False


# ----------------------------------------------------------------- resolve_estimator: CPU


def test_sklearn_on_cpu_is_a_clone():
    model = Ridge(alpha=3.0).fit([[0.0], [1.0]], [0.0, 1.0])
    r = resolve_estimator(model, "cpu", what="machine Ridge")
    assert isinstance(r, Resolved)
    assert (r.path, r.device, r.reason) == ("sklearn", CPU, "")
    assert r.estimator is not model and r.estimator.alpha == 3.0
    assert not hasattr(r.estimator, "coef_")  # unfitted


# ----------------------------------------------------------------- resolve_estimator: fallback


def test_no_gpu_warn_falls_back_with_one_logged_line(no_gpu, caplog):
    caplog.set_level(logging.DEBUG, logger="gpunets")
    r = resolve_estimator(Ridge(), "cuda:0", what="machine Ridge", fallback="warn")
    assert (r.path, r.device) == ("cpu_fallback", CPU)
    assert "no GPU is available here" in r.reason
    recs = _records(caplog)
    assert len(recs) == 1 and recs[0].levelno == logging.WARNING
    msg = recs[0].getMessage()
    assert msg.startswith("`Ridge.fit` falling back to CPU (machine Ridge on cuda:0): no GPU is available here")


def test_no_gpu_raise_names_the_estimator(no_gpu):
    with pytest.raises(DeviceUnavailableError) as info:
        resolve_estimator(Ridge(), "cuda", what="machine Ridge", fallback="raise")
    msg = str(info.value)
    assert msg.startswith("machine Ridge: `Ridge` cannot run on cuda:0: no GPU is available here")
    assert "Place it on 'cpu', or run where a GPU is present" in msg
    assert "gn.config(fallback='warn')" in msg


def test_fallback_policy_from_config(no_gpu, caplog):
    caplog.set_level(logging.DEBUG, logger="gpunets")
    with config(fallback="raise"):
        with pytest.raises(DeviceUnavailableError):
            resolve_estimator(Ridge(), "cuda", what="machine Ridge")
    with config(fallback="silent"):
        r = resolve_estimator(Ridge(), "cuda", what="machine Ridge")
    assert r.path == "cpu_fallback"
    recs = _records(caplog)
    assert len(recs) == 1 and recs[0].levelno == logging.INFO


def test_bad_fallback_policy(no_gpu):
    with pytest.raises(ValueError, match="not a fallback policy"):
        resolve_estimator(Ridge(), "cuda", what="machine Ridge", fallback="loud")


def test_gpu_without_cuml_or_array_api(gpu, no_cuml, caplog):
    caplog.set_level(logging.DEBUG, logger="gpunets")
    r = resolve_estimator(Ridge(solver="lsqr"), "cuda:0", what="machine Ridge", fallback="warn")
    assert r.path == "cpu_fallback" and r.device == CPU
    assert r.reason == ("cuML is not installed and Ridge(solver='lsqr') does not support array-API dispatch "
                        "(solver='lsqr' (only 'svd' dispatches))")
    (rec,) = _records(caplog)
    assert rec.getMessage() == f"`Ridge.fit` falling back to CPU (machine Ridge on cuda:0): {r.reason}"


def test_gpu_array_api_needs_scipy_flag(gpu, no_cuml, monkeypatch):
    monkeypatch.delenv("SCIPY_ARRAY_API", raising=False)
    r = resolve_estimator(Ridge(solver="svd"), "cuda:0", what="machine Ridge", fallback="silent")
    assert r.path == "cpu_fallback"
    assert "SCIPY_ARRAY_API=1 was not set before scipy was imported" in r.reason
    with pytest.raises(DeviceUnavailableError, match="SCIPY_ARRAY_API=1"):
        resolve_estimator(Ridge(solver="svd"), "cuda:0", what="machine Ridge", fallback="raise")


def test_gpu_array_api_route(gpu, no_cuml, monkeypatch, caplog):
    monkeypatch.setattr(gm, "scipy_array_api_enabled", lambda: True)
    caplog.set_level(logging.DEBUG, logger="gpunets")
    model = StandardScaler(with_mean=False)
    r = resolve_estimator(model, "cuda:0", what="machine StandardScaler", fallback="raise")
    assert (r.path, r.device, r.reason) == ("array_api", Device("cuda", 0), "")
    assert r.estimator is not model and r.estimator.get_params() == model.get_params()
    assert _records(caplog, logging.WARNING) == []


def test_gpu_index_missing(gpu):
    with pytest.raises(DeviceUnavailableError, match=r"cuda:3: this machine has 1 GPU\(s\)"):
        resolve_estimator(Ridge(), "cuda:3", what="machine Ridge", fallback="raise")


# ----------------------------------------------------------------- resolve_estimator: cuML


def test_cuml_twin_via_from_sklearn(gpu, fake_cuml):
    model = Ridge(alpha=3.0).fit([[0.0], [1.0]], [0.0, 1.0])
    r = resolve_estimator(model, "cuda:0", what="machine Ridge", fallback="raise")
    assert (r.path, r.device, r.dropped) == ("cuml", Device("cuda", 0), ())
    assert type(r.estimator) is fake_cuml["cuml.linear_model"].Ridge and r.estimator.alpha == 3.0


def test_cuml_rejects_parameters_then_array_api_then_fallback(gpu, fake_cuml, caplog):
    caplog.set_level(logging.DEBUG, logger="gpunets")
    r = resolve_estimator(Ridge(positive=True, solver="lbfgs"), "cuda:0", what="machine Ridge")
    assert r.path == "cpu_fallback"
    assert r.reason.startswith("cuML's Ridge cannot run Ridge(positive=True, solver='lbfgs') "
                               "(`positive=True` is not supported) and Ridge(positive=True")
    assert len(_records(caplog)) == 1


def test_cuml_twin_by_common_parameters(gpu, fake_cuml, caplog):
    caplog.set_level(logging.DEBUG, logger="gpunets")
    model = RandomForestRegressor(n_estimators=5, max_depth=3, random_state=0, criterion="absolute_error")
    r = resolve_estimator(model, "cuda:0", what="machine RF")
    assert r.path == "cuml"
    assert (r.estimator.n_estimators, r.estimator.max_depth, r.estimator.random_state) == (5, 3, 0)
    assert "criterion" in r.dropped and "n_estimators" not in r.dropped
    assert any("dropped" in rec.getMessage() and "criterion" in rec.getMessage() for rec in _records(caplog))


def test_no_twin_in_cuml(gpu, fake_cuml):
    r = resolve_estimator(LogisticRegression(solver="liblinear"), "cuda:0", what="machine LR", fallback="silent")
    assert r.path == "cpu_fallback"
    assert r.reason.startswith("cuML has no twin of LogisticRegression and ")


def test_cuml_model_on_cpu_uses_as_sklearn(fake_cuml):
    cu = fake_cuml["cuml.linear_model"].Ridge(alpha=2.0)
    r = resolve_estimator(cu, "cpu", what="machine Ridge")
    assert (r.path, r.device, r.reason) == ("sklearn", CPU, "cuML model placed on the CPU")
    assert type(r.estimator) is Ridge and r.estimator.alpha == 2.0


def test_cuml_model_on_cpu_by_common_parameters(fake_cuml):
    cu = fake_cuml["cuml.ensemble"].RandomForestRegressor(n_estimators=7, n_streams=2)
    est, dropped = to_sklearn(cu)
    assert type(est) is RandomForestRegressor and est.n_estimators == 7
    assert dropped == ("n_streams",)  # handle/verbose/output_type are not reported


def test_cuml_model_without_sklearn_twin(fake_cuml):
    with pytest.raises(DeviceUnavailableError, match="UMAP` cannot run on the CPU"):
        resolve_estimator(fake_cuml["cuml.manifold"].UMAP(), "cpu", what="machine UMAP")


def test_cuml_model_on_gpu_and_without_gpu(fake_cuml, monkeypatch, caplog):
    cu = fake_cuml["cuml.linear_model"].Ridge(alpha=2.0)
    monkeypatch.setattr(gd, "gpu_available", lambda: True)
    monkeypatch.setattr(gd, "gpu_count", lambda: 1)
    r = resolve_estimator(cu, "cuda:0", what="machine Ridge")
    assert r.path == "cuml" and r.estimator is not cu and r.estimator.alpha == 2.0
    monkeypatch.setattr(gd, "gpu_available", lambda: False)
    caplog.set_level(logging.DEBUG, logger="gpunets")
    r = resolve_estimator(cu, "cuda:0", what="machine Ridge", fallback="warn")
    assert r.path == "cpu_fallback" and type(r.estimator) is Ridge
    assert len(_records(caplog, logging.WARNING)) == 1


def test_to_cuml_errors(no_cuml):
    with pytest.raises(LookupError, match="cuML is not installed"):
        to_cuml(Ridge())


# ----------------------------------------------------------------- contexts


def test_fit_context_is_a_no_op_off_the_array_api_route():
    r = resolve_estimator(Ridge(), "cpu", what="machine Ridge")
    with fit_context(r):
        assert sklearn.get_config()["array_api_dispatch"] is False
        r.estimator.fit([[0.0], [1.0]], [0.0, 1.0])
    with call_context(r):
        assert r.estimator.predict([[2.0]]).shape == (1,)


def test_array_api_route_on_array_api_strict():
    """Ridge(svd) and StandardScaler dispatched on array_api_strict equal their NumPy fits."""
    out = _run(_FAKE_GPU_PREAMBLE + """
        from sklearn.preprocessing import StandardScaler
        X = rng.normal(size=(60, 4)); y = X @ np.array([1.0, -2.0, 3.0, 0.5]) + 0.3
        for model in (Ridge(solver="svd", alpha=0.5), StandardScaler()):
            r = gm.resolve_estimator(model, "cuda:0", what="machine m", fallback="raise")
            assert r.path == "array_api", r
            with gm.fit_context(r):
                assert sklearn.get_config()["array_api_dispatch"] is True
                r.estimator.fit(xp.asarray(X), xp.asarray(y))
                got = r.estimator.predict(xp.asarray(X)) if hasattr(r.estimator, "predict") \\
                    else r.estimator.transform(xp.asarray(X))
            assert sklearn.get_config()["array_api_dispatch"] is False
            assert type(got).__module__.startswith("array_api_strict"), type(got)
            ref = model.fit(X, y)
            ref = ref.predict(X) if hasattr(ref, "predict") else ref.transform(X)
            np.testing.assert_allclose(np.from_dlpack(got), ref, rtol=1e-10, atol=1e-10)
        print("ok")
    """)
    assert out.strip() == "ok"


# ----------------------------------------------------------------- prepare_inputs


def _fake_cupy(monkeypatch):
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        from test_data import _FAKE_STATE, FakeCupyArray, make_fake_cupy
    finally:
        sys.path.pop(0)
    cp = make_fake_cupy()
    monkeypatch.delenv("GPUNETS_FAKE_GPU", raising=False)  # this mock stands for the real CuPy module
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cp.cuda)
    monkeypatch.setitem(sys.modules, "cudf", None)
    monkeypatch.setattr(gd, "gpu_available", lambda: True)
    monkeypatch.setattr(gd, "gpu_count", lambda: 2)
    _FAKE_STATE.update(current=[0], streams=[])
    return FakeCupyArray


def test_prepare_inputs_cpu_route_with_gpu_data(monkeypatch, caplog):
    FakeCupyArray = _fake_cupy(monkeypatch)
    r = resolve_estimator(Ridge(), "cpu", what="machine Ridge")
    g = FakeCupyArray(np.ones((3, 2)), 0)
    with pytest.raises(DeviceUnavailableError, match=r"machine Ridge: runs on the CPU \(sklearn\), but was given a "
                                                     r"FakeCupyArray on cuda:0"):
        prepare_inputs(r, g, what="machine Ridge", fallback="raise")
    caplog.set_level(logging.DEBUG, logger="gpunets")
    X, y = prepare_inputs(r, g, None, what="machine Ridge", fallback="warn")
    assert isinstance(X, np.ndarray) and y is None
    assert len(_records(caplog, logging.WARNING)) == 1


def test_prepare_inputs_array_api_route_makes_arrays(monkeypatch):
    FakeCupyArray = _fake_cupy(monkeypatch)
    r = Resolved(StandardScaler(), Device("cuda", 1), "array_api")
    frame = pd.DataFrame({"a": [1.0, 2.0], "b": [True, False]})
    X, y, none = prepare_inputs(r, frame, np.array([0.0, 1.0]), None)
    assert isinstance(X, FakeCupyArray) and X.device.id == 1 and X.dtype == np.float64
    assert isinstance(y, FakeCupyArray) and none is None
    assert prepare_inputs(r, X)[0] is X


@pytest.mark.filterwarnings("ignore:cuML runs on RMM")   # a stand-in CuPy, and no RMM: the one warning (test_gpu_memory)
def test_fit_context_makes_the_gpu_current(monkeypatch):
    _fake_cupy(monkeypatch)
    from test_data import _FAKE_STATE

    r = Resolved(Ridge(), Device("cuda", 1), "cuml")
    with fit_context(r):
        assert _FAKE_STATE["current"][-1] == 1
    assert _FAKE_STATE["current"] == [0]


# ----------------------------------------------------------------- real GPU


@pytest.mark.gpu
def test_gpu_ridge_array_api_matches_cpu():
    _require_gpu()
    out = _run("""
        import sys, numpy as np, cupy as cp
        sys.modules["cuml"] = None  # force the array-API route
        import gpunets.compute.models as gm, gpunets.devices.data as gdata
        from sklearn.linear_model import Ridge
        rng = np.random.default_rng(0)
        X = rng.normal(size=(500, 8)); y = X @ rng.normal(size=8) + 0.1
        r = gm.resolve_estimator(Ridge(solver="svd"), "cuda:0", what="machine Ridge", fallback="raise")
        assert r.path == "array_api", r
        Xg, yg = gm.prepare_inputs(r, X, y)
        assert isinstance(Xg, cp.ndarray)
        with gm.fit_context(r):
            pred = r.estimator.fit(Xg, yg).predict(Xg)
        ref = Ridge(solver="svd").fit(X, y).predict(X)
        np.testing.assert_allclose(gdata.to_device(pred, "cpu"), ref, atol=1e-5)
        print("ok")
    """)
    assert out.strip() == "ok"


@pytest.mark.gpu
def test_gpu_cuml_ridge_matches_cpu():
    _require_gpu()
    pytest.importorskip("cuml")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(500, 8)).astype(np.float64)
    y = X @ rng.normal(size=8) + 0.1
    r = resolve_estimator(Ridge(alpha=1.0), "cuda:0", what="machine Ridge", fallback="raise")
    assert r.path == "cuml"
    Xg, yg = prepare_inputs(r, X, y)
    with fit_context(r):
        pred = r.estimator.fit(Xg, yg).predict(Xg)
    from gpunets.devices.data import to_device

    ref = Ridge(alpha=1.0).fit(X, y).predict(X)
    np.testing.assert_allclose(np.asarray(to_device(pred, "cpu")), ref, atol=1e-4)


# ----------------------------------------------------------------- review fixes


def test_from_sklearn_twin_mirrors_its_input_type(gpu, fake_cuml):
    """cuML's from_sklearn sets output_type='numpy'; the twin must keep GPU results on the GPU."""
    est, dropped = to_cuml(Ridge(alpha=2.0))
    assert est.output_type == "input" and dropped == ()
    r = resolve_estimator(Ridge(alpha=2.0), "cuda:0", what="machine Ridge", fallback="raise")
    assert r.estimator.output_type == "input"
    assert sklearn.base.clone(r.estimator).output_type == "input"


def test_cuml_class_in_a_private_module_finds_its_twin(fake_cuml, monkeypatch):
    pre = types.ModuleType("cuml.preprocessing")

    class FakeScaler(BaseEstimator):  # an older cuML: defined in cuml._thirdparty..., no interop
        def __init__(self, *, copy=True, with_mean=True, with_std=True):
            self.copy, self.with_mean, self.with_std = copy, with_mean, with_std

    FakeScaler.__name__ = FakeScaler.__qualname__ = "StandardScaler"
    FakeScaler.__module__ = "cuml._thirdparty.sklearn.preprocessing._data"
    pre.StandardScaler = FakeScaler
    monkeypatch.setitem(sys.modules, "cuml.preprocessing", pre)
    r = resolve_estimator(FakeScaler(with_mean=False), "cpu", what="machine scaler")
    assert type(r.estimator) is StandardScaler and r.estimator.with_mean is False


def test_call_context_takes_a_route_and_a_device(monkeypatch):
    _fake_cupy(monkeypatch)
    from test_data import _FAKE_STATE

    with call_context("cuml", Device("cuda", 1)):
        assert _FAKE_STATE["current"][-1] == 1
    with call_context("cuml"):  # no device known: CuPy's current device stays
        assert _FAKE_STATE["current"] == [0]
    with call_context("sklearn", Device("cuda", 1)):
        assert _FAKE_STATE["current"] == [0]


def test_apply_estimator_on_the_gpu_routes_makes_the_inputs_gpu_current(monkeypatch):
    FakeCupyArray = _fake_cupy(monkeypatch)
    from test_data import _FAKE_STATE

    from gpunets.compute.estimators import apply_estimator

    seen = []

    class Est:
        def predict(self, X):
            seen.append(_FAKE_STATE["current"][-1])
            return X

    X = FakeCupyArray(np.ones((2, 1)), 1)
    assert apply_estimator(Est(), "predict", (X,), "cuml") is X
    assert seen == [1] and _FAKE_STATE["current"] == [0]


def test_apply_estimator_on_the_array_api_route():
    """A machine fitted on the array-API route predicts through apply_estimator (its path is a string)."""
    out = _run(_FAKE_GPU_PREAMBLE + """
        from gpunets.compute.estimators import apply_estimator, fit_estimator
        X = rng.normal(size=(30, 3)); y = X @ np.array([1.0, -2.0, 0.5])
        r = gm.resolve_estimator(Ridge(solver="svd"), "cuda:0", what="machine m", fallback="raise")
        est, info = fit_estimator(r.estimator, (xp.asarray(X), xp.asarray(y)), r)
        assert info["path"] == "array_api", info
        got = apply_estimator(est, "predict", (xp.asarray(X),), info["path"])
        assert type(got).__module__.startswith("array_api_strict"), type(got)
        np.testing.assert_allclose(np.from_dlpack(got), Ridge(solver="svd").fit(X, y).predict(X), atol=1e-10)
        print("ok")
    """)
    assert out.strip() == "ok"
