"""gn.save / gn.load (issue 14, feature 5): fitted networks and composites without their training data.

The loaded network answers as the original on every executor, in both formats; the file holds no training
data; GPU values go to the host and back (the fake GPU); the skops format refuses untrusted types; files of
another gpunets version, or not written by gn.save, are refused before anything is built.
"""

import io
import json
import os
import pickle
import subprocess
import sys
import warnings
import zipfile

import numpy as np
import pytest
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.model_selection import KFold
from sklearn.preprocessing import StandardScaler
from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

import gpunets as gn
from gpunets.testing import assert_allclose_any, fake_gpu

FORMATS = ["pickle", "skops"]
TREE = ["sklearn.tree._tree.Tree"]   # skops does not trust trees by default (their node indices are not checked)


@pytest.fixture(params=FORMATS)
def fmt(request):
    if request.param == "skops":
        pytest.importorskip("skops")
    return request.param


def _data(n=60, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    return X, X @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=n)


def _network(Xd, yd):
    X, y = gn.source(Xd, name="X"), gn.source(yd, name="y")
    W = gn.machine(StandardScaler(), X).transform(X)
    ridge = gn.machine(Ridge(alpha=0.5), W, y).predict(W)
    tree = gn.machine(DecisionTreeRegressor(max_depth=3, random_state=0), W, y).predict(W)
    return gn.mean(ridge, tree, weights=[0.7, 0.3]) * 2 + 1


def _load(path, fmt, trusted=()):
    return gn.load(path, trusted=list(TREE) + list(trusted)) if fmt == "skops" else gn.load(path, allow_pickle=True)


def _payload_bytes(path):
    """Every byte the file stores, uncompressed (the skops payload is itself a zip of entries)."""
    out = []
    with zipfile.ZipFile(path) as zf:
        for name in zf.namelist():
            raw = zf.read(name)
            out.append(raw)
            if name.endswith(".skops"):
                with zipfile.ZipFile(io.BytesIO(raw)) as inner:
                    out.extend(inner.read(n) for n in inner.namelist())
    return b"".join(out)


def _double(a):
    return a * 2


class Averaged(gn.CompositeRegressor):
    """A user's composite: two models averaged."""

    def __init__(self, first=None, second=None, executor="auto"):
        self.first, self.second, self.executor = first, second, executor

    def network(self, X, y):
        a = gn.machine(self.first or Ridge(), X, y)
        b = gn.machine(self.second or DecisionTreeRegressor(max_depth=2, random_state=0), X, y)
        return gn.node(_double, gn.mean(a.predict(X), b.predict(X)))


class Centre(TransformerMixin, BaseEstimator):
    """Subtracts the column means; runs on whatever array it is given (array-API dispatch)."""

    def fit(self, X, y=None):
        self.mean_ = X.mean(axis=0)
        return self

    def transform(self, X):
        return X - self.mean_

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.array_api_support = True
        return tags


# ----------------------------------------------------------------- networks


def test_loaded_network_predicts_as_the_original_on_every_executor(executor, fmt, tmp_path):
    Xd, yd = _data()
    yhat = _network(Xd, yd)
    yhat.fit(executor=executor)
    Xnew = _data(20, seed=1)[0]
    expected = yhat(Xnew, executor="serial")
    loaded = _load(gn.save(yhat, tmp_path / f"net.{fmt}", format=fmt), fmt)
    np.testing.assert_array_equal(loaded(Xnew, executor=executor), expected)
    np.testing.assert_array_equal(loaded(X=Xnew, executor=executor), expected)
    assert [m.report()["action"] for m in loaded.machines] == ["train"] * 3


def test_the_file_holds_no_training_data(fmt, tmp_path):
    Xd, yd = _data()
    yhat = _network(Xd, yd)
    yhat.fit()
    path = gn.save(yhat, tmp_path / "net.gn", format=fmt)
    stored = _payload_bytes(path)
    for column in (Xd[:, 0], Xd[:, 1], yd):
        assert column.tobytes()[:64] not in stored
    loaded = _load(path, fmt)
    assert sorted(s.name for s in loaded.sources) == ["X", "y"]
    assert all(s.data is None for s in loaded.sources)
    assert yhat.origins[0].data is Xd          # saving left the original untouched


def test_calling_or_fitting_without_data_says_the_data_were_not_saved(tmp_path):
    Xd, yd = _data()
    yhat = _network(Xd, yd)
    yhat.fit()
    loaded = gn.load(gn.save(yhat, tmp_path / "net.gn"), allow_pickle=True)
    with pytest.raises(gn.NetworkError, match=r"Source 'X' has no data: the network was loaded with gn.load, and "
                                              r"gn.save never stores training data.*pass data: node\(X=\.\.\.\)"):
        loaded()
    with pytest.raises(gn.NetworkError, match=r"never stores training data, so it cannot be trained.*X.data = "):
        loaded.fit()
    X, y = sorted(loaded.sources, key=lambda s: s.name)
    X.data, y.data = Xd, yd                     # rebound: the next fit trains everything on these data
    assert set(loaded.fit().actions.values()) == {"train"}
    np.testing.assert_allclose(loaded(), yhat(), rtol=1e-12)


def test_loaded_objects_are_new_copies(tmp_path):
    Xd, yd = _data()
    yhat = _network(Xd, yd)
    yhat.fit()
    path = gn.save(yhat, tmp_path / "net.gn")
    a, b = gn.load(path, allow_pickle=True), gn.load(path, allow_pickle=True)
    uids = {n._uid for n in (yhat, a, b)} | {m._uid for m in a.machines + b.machines + yhat.machines}
    assert len(uids) == 3 + 9
    assert not set(a.machines) & set(b.machines)


def test_a_machine_and_several_nodes_keep_what_they_share(fmt, tmp_path):
    Xd, yd = _data()
    X, y = gn.source(Xd, name="X"), gn.source(yd, name="y")
    mach = gn.machine(Ridge(), X, y).freeze().thaw()
    p, q = mach.predict(X), gn.node(_double, mach.predict(X))
    mach.fit()
    mach.freeze()
    got = _load(gn.save({"p": p, "q": q}, tmp_path / "both.gn", format=fmt), fmt, trusted=[_double])
    assert got["p"].machine is got["q"].args[0].machine and got["p"].machine.frozen
    np.testing.assert_array_equal(got["q"](Xd[:4]), 2 * p(Xd[:4]))
    m = _load(gn.save(mach, tmp_path / "mach.gn", format=fmt), fmt)
    assert m.report()["history"] == ["train"] and m.is_fitted
    np.testing.assert_array_equal(m.predict(m.args[0])(Xd[:4]), p(Xd[:4]))


def test_deep_networks_save_without_deep_recursion(tmp_path):
    X = gn.source(np.zeros(2), name="X")
    n = X
    for _ in range(3000):
        n = n + 1.0
    loaded = gn.load(gn.save(n, tmp_path / "deep.gn"), allow_pickle=True)
    np.testing.assert_array_equal(loaded(np.ones(2)), [3001.0, 3001.0])


# ----------------------------------------------------------------- composites and stacks


def test_stacks_and_composites_predict_as_the_original(executor, fmt, tmp_path):
    Xd, yd = _data()
    labels = np.where(yd > np.median(yd), "hi", "lo")
    cv = KFold(3, shuffle=True, random_state=0)
    reg = gn.StackingRegressor([("r", Ridge()), ("t", DecisionTreeRegressor(max_depth=2, random_state=0))],
                               Ridge(), cv=cv, executor=executor).fit(Xd, yd)
    clf = gn.StackingClassifier([("l", LogisticRegression()), ("t", DecisionTreeClassifier(max_depth=2,
                                                                                           random_state=0))],
                                cv=3, executor=executor).fit(Xd, labels)
    avg = Averaged(Ridge(alpha=2.0), executor=executor).fit(Xd, yd)
    Xnew = _data(15, seed=2)[0]
    got = _load(gn.save([reg, clf, avg], tmp_path / "models.gn", format=fmt), fmt,
                trusted=[Averaged, "tests.test_persist._double"])
    lreg, lclf, lavg = got
    np.testing.assert_array_equal(lreg.predict(Xnew), reg.predict(Xnew))
    np.testing.assert_array_equal(lclf.predict(Xnew), clf.predict(Xnew))
    np.testing.assert_array_equal(lclf.predict_proba(Xnew), clf.predict_proba(Xnew))
    np.testing.assert_array_equal(lavg.predict(Xnew), avg.predict(Xnew))
    assert sorted(lreg.report_) == sorted(reg.report_) and lavg.fit_report_.actions.by_label() == {
        "first": "train", "DecisionTreeRegressor": "train"}
    assert lreg.estimators_[0] is lreg.machines_["r"].estimator_
    if executor.name == "dask":     # its client belongs to this process: it comes back as the name
        assert lreg.executor == "dask"
    else:                           # rebuilt from what it was made from
        assert type(lreg.executor) is type(executor) and lreg.executor is not executor
        assert lreg.executor._constructor_args(False) == executor._constructor_args(False)
    assert all(v is None for v in lreg._gn_state.data.values())
    assert lavg.set_params(first__alpha=2.0).fit(Xd, yd).fit_report_.actions["first"] == "train"
    np.testing.assert_allclose(lavg.predict(Xnew), avg.predict(Xnew), rtol=1e-12)


def test_a_stack_inside_a_network_is_saved_without_its_data(tmp_path):
    Xd, yd = _data()
    X, y = gn.source(Xd, name="X"), gn.source(yd, name="y")
    stack = gn.StackingRegressor([("r", Ridge()), ("r2", Ridge(alpha=5.0))], Ridge(), cv=KFold(3))
    outer = gn.machine(stack, X, y)
    yhat = gn.mean(outer.predict(X), gn.machine(Ridge(), X, y).predict(X))
    yhat.fit()
    for fmt in ["pickle"] + (["skops"] if _has_skops() else []):
        loaded = gn.load(gn.save(yhat, tmp_path / f"outer.{fmt}", format=fmt), allow_pickle=True)
        np.testing.assert_array_equal(loaded(Xd[:6]), yhat(Xd[:6]))
        inner = next(m for m in loaded.machines if isinstance(m.model, gn.StackingRegressor)).estimator_
        assert all(v is None for v in inner._gn_state.data.values())
        assert all(s.data is None for s in inner._gn_state.sources.values())
        assert sorted(inner.report_) == sorted(outer.estimator_.report_)


def _has_skops():
    try:
        import skops.io  # noqa: F401
    except ImportError:
        return False
    return True


# ----------------------------------------------------------------- the safe format


def test_skops_refuses_untrusted_types_and_names_them(tmp_path):
    pytest.importorskip("skops")
    Xd, yd = _data()
    avg = Averaged().fit(Xd, yd)
    path = gn.save(avg, tmp_path / "avg.skops", format="skops")
    with pytest.raises(gn.UntrustedTypesError) as info:
        gn.load(path, allow_pickle=True)
    msg = str(info.value)
    assert isinstance(info.value, TypeError)
    for name in ("tests.test_persist.Averaged", "tests.test_persist._double", "sklearn.tree._tree.Tree"):
        assert name in msg
    assert "trusted=[" in msg and "node indices" in msg     # skops' own note on trees is passed on
    with pytest.raises(gn.UntrustedTypesError, match=r"\['tests.test_persist._double'\]"):
        gn.load(path, trusted=[Averaged, *TREE])
    loaded = gn.load(path, trusted=["tests.test_persist.Averaged", "tests.test_persist._double", *TREE])
    np.testing.assert_array_equal(loaded.predict(Xd), avg.predict(Xd))


def test_gpunets_own_networks_need_no_trust_beyond_numpy_and_sklearn(tmp_path):
    pytest.importorskip("skops")
    Xd, yd = _data()
    X, y = gn.source(Xd, name="X"), gn.source((yd > 0).astype(int), name="y")
    W = gn.machine(StandardScaler(), X).transform(X)
    lr = gn.machine(LogisticRegression(), W, y).predict(W)
    yhat = {"vote": gn.vote(lr, gn.machine(LogisticRegression(C=0.1), W, y).predict(W), lr),
            "arith": -(abs(W[:, :2]) ** 2 @ np.ones(2)) / 2 + gn.hstack(W, W)[:, 0] - 1 * W[:, 1]}
    gn.fit(*yhat.values())
    loaded = gn.load(gn.save(yhat, tmp_path / "v.skops", format="skops"), allow_pickle=True)
    for k in yhat:
        np.testing.assert_array_equal(loaded[k](Xd), yhat[k]())
    stack = gn.StackingRegressor([("r", Ridge())], Ridge(), cv=3).fit(Xd, yd)
    np.testing.assert_array_equal(gn.load(gn.save(stack, tmp_path / "s.skops", format="skops"), allow_pickle=True).predict(Xd),
                                  stack.predict(Xd))


def test_lambdas_cannot_be_saved_and_no_file_is_written(fmt, tmp_path):
    X = gn.source(np.ones(3), name="X")
    node = gn.node(lambda a: a + 1, X, name="plus")
    path = tmp_path / "never.gn"
    with pytest.raises(TypeError, match=r"Cannot save node 'plus\(X\)': its operation .*<lambda> is a lambda.*Define it "
                                        r"with def at the top level of a module"):
        gn.save(node, path, format=fmt)
    assert not path.exists()
    good = gn.save(X * 3, tmp_path / "kept.gn", format=fmt)
    with pytest.raises(TypeError, match="Cannot save node"):
        gn.save(node, good, format=fmt)                      # a failed save leaves the file there as it was
    np.testing.assert_array_equal(_load(good, fmt)(np.ones(2)), [3.0, 3.0])
    assert os.listdir(tmp_path) == ["kept.gn"]


def test_a_tampered_skops_file_builds_only_what_gn_save_writes(tmp_path):
    sio = pytest.importorskip("skops.io")
    from gpunets.persistence._persist_codec import Archive as _Archive, Record as _Record
    from gpunets.persistence.persist import TRUSTED_TYPES

    X = gn.source(np.ones(3), name="X")
    path = gn.save(X * 2, tmp_path / "x.skops", format="skops")
    with zipfile.ZipFile(path) as zf:
        meta = zf.read("gpunets.json")

    def tampered(archive):
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("gpunets.json", meta)
            zf.writestr("payload.skops", sio.dumps(archive))

    tampered(_Archive(_Record("decode", {"fields": {}}), []))
    with pytest.raises(gn.PersistenceError, match="damaged .an unknown record 'decode'"):
        gn.load(path, allow_pickle=True)
    mach = gn.machine(Ridge(), X, X)
    good = gn.save(mach.predict(X), tmp_path / "ridge.skops", format="skops")
    with zipfile.ZipFile(good) as zf:
        archive = sio.loads(zf.read("payload.skops"), trusted=list(TRUSTED_TYPES))
    next(r for r in archive.table if r.kind == "node").fields["attrs"]["operation"] = "set_params"
    tampered(archive)
    with pytest.raises(gn.PersistenceError, match="damaged .a machine operation 'set_params'"):
        gn.load(path, allow_pickle=True)


# ----------------------------------------------------------------- bad files and bad arguments


def _rewrite_meta(path, **changes):
    with zipfile.ZipFile(path) as zf:
        entries = {n: zf.read(n) for n in zf.namelist()}
    meta = json.loads(entries["gpunets.json"])
    meta.update(changes)
    entries["gpunets.json"] = json.dumps(meta).encode()
    with zipfile.ZipFile(path, "w") as zf:
        for n, b in entries.items():
            zf.writestr(n, b)


def test_a_file_of_an_incompatible_version_names_both_versions(fmt, tmp_path):
    X = gn.source(np.ones(3), name="X")
    path = gn.save(X * 2, tmp_path / "old.gn", format=fmt)
    _rewrite_meta(path, gpunets="9.3.1")
    with pytest.raises(gn.PersistenceError, match=rf"written by gpunets 9.3.1 \(file format 1\); this is gpunets "
                                                  rf"{gn.__version__} \(file format 1\).*Load it with gpunets 9.3.1"):
        gn.load(path, allow_pickle=True)
    _rewrite_meta(path, gpunets=gn.__version__, format_version=2)
    with pytest.raises(ValueError, match=r"file format 2\); this is gpunets"):
        gn.load(path, allow_pickle=True)


class _Boom:
    ran = False

    def __reduce__(self):
        return (_Boom._explode, ())

    @staticmethod
    def _explode():
        _Boom.ran = True
        return "boom"


def test_files_not_written_by_save_are_refused_unread(tmp_path):
    plain = tmp_path / "plain.pkl"
    plain.write_bytes(pickle.dumps(_Boom()))
    with pytest.raises(gn.PersistenceError, match="is foreign: it was not written by gn.save .it is not a zip archive"):
        gn.load(plain, allow_pickle=True)
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as zf:
        zf.writestr("payload.pkl", pickle.dumps(_Boom()))
    with pytest.raises(gn.PersistenceError, match="is foreign: .*a zip archive without gpunets.json"):
        gn.load(other, allow_pickle=True)
    assert not _Boom.ran


def test_bad_arguments_are_clear_errors(tmp_path):
    X = gn.source(np.ones(3), name="X")
    with pytest.raises(ValueError, match=r"format='json' is not a format; use 'pickle' or 'skops'"):
        gn.save(X, tmp_path / "x.gn", format="json")
    with pytest.raises(TypeError, match=r"gn.save saves a node, a machine, a composite.*got 3 of type int"):
        gn.save(3, tmp_path / "x.gn")
    path = gn.save(X, tmp_path / "x.gn")
    with pytest.raises(TypeError, match=r"allow_pickle= takes True or False; got 'yes'"):
        gn.load(path, allow_pickle="yes")
    with pytest.raises(TypeError, match=r"trusted= takes a list of type names or types"):
        gn.load(path, trusted="mymodule.MyModel")
    assert not (tmp_path / "y.gn").exists()


def test_import_gpunets_and_pickle_files_do_not_import_skops(tmp_path):
    code = ("import sys, numpy as np, gpunets as gn\n"
            "before = 'skops' in sys.modules\n"
            f"p = gn.save(gn.source(np.ones(2), name='X') * 2, {str(tmp_path / 'a.gn')!r})\n"
            "gn.load(p, allow_pickle=True)(np.ones(2))\n"
            "print(before, 'skops' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])))
    assert out.stdout.split() == ["False", "False"], out.stderr


# ----------------------------------------------------------------- GPU values (the fake GPU)


def _centred_network(Xd, yd):
    X, y = gn.source(Xd, name="X"), gn.source(yd, name="y")
    W = gn.machine(Centre(), X, device="cuda").transform(X)
    return gn.machine(Ridge(), W, y, device="cpu").predict(W)


@pytest.fixture
def array_api_route(monkeypatch):
    """Let Centre take scikit-learn's array-API route in this process (the env var is read by SciPy at import)."""
    import gpunets.compute.models

    monkeypatch.setenv("SCIPY_ARRAY_API", "1")
    monkeypatch.setattr(gpunets.compute.models, "scipy_array_api_enabled", lambda: True)


def test_gpu_values_go_to_the_host_and_back_to_the_device(no_gpu, array_api_route, fmt, tmp_path):
    Xd, yd = _data()
    with fake_gpu(1) as cp:
        yhat = _centred_network(Xd, yd)
        yhat.fit()
        centre = yhat.args[0].machine
        assert (centre._state.path, centre._state.device) == ("array_api", "cuda:0")
        assert isinstance(centre.estimator_.mean_, cp.ndarray)
        expected = yhat(Xd[:7])
        path = gn.save(yhat, tmp_path / "gpu.gn", format=fmt)
        assert isinstance(centre.estimator_.mean_, cp.ndarray)   # the live network stays on the device
        on_gpu = _load(path, fmt, trusted=[Centre])
        st = on_gpu.args[0].machine._state
        assert (st.path, st.device) == ("array_api", "cuda:0")
        assert isinstance(st.estimator.mean_, cp.ndarray) and st.estimator.mean_.device.id == 0
        assert_allclose_any(on_gpu(Xd[:7]), expected, rtol=1e-12)
        assert cp.implicit_conversions() == []
    with zipfile.ZipFile(path) as zf:
        assert json.loads(zf.read("gpunets.json"))["devices"] == ["cuda:0"]
    with pytest.warns(gn.DeviceFallbackWarning, match=r"the network loaded from 'gpu.gn' \(fitted on cuda:0\) is "
                                                      r"placed on cuda:0, but no GPU is available here"):
        on_cpu = _load(path, fmt, trusted=[Centre])
    st = on_cpu.args[0].machine._state
    assert (st.path, st.device) == ("cpu_fallback", "cpu") and type(st.estimator.mean_) is np.ndarray
    assert_allclose_any(on_cpu(Xd[:7]), expected, rtol=1e-12)
    with gn.config(fallback="raise"), pytest.raises(gn.DeviceUnavailableError, match="fitted on cuda:0"):
        _load(path, fmt, trusted=[Centre])


def test_scikit_learn_array_api_models_saved_on_the_fake_gpu_load_anywhere(no_gpu, tmp_path):
    """The real array-API route (SCIPY_ARRAY_API=1 set before SciPy is imported, as users must)."""
    path = tmp_path / "pipe.gn"
    code = f"""
import warnings, numpy as np, gpunets as gn
from sklearn.linear_model import Ridge
from sklearn.preprocessing import StandardScaler
import gpunets.devices.fakegpu as fg
rng = np.random.RandomState(0); X = rng.rand(50, 4); y = X @ [1.0, 2.0, 3.0, 4.0]
Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
Z = gn.machine(StandardScaler(), Xs).transform(Xs)
m = gn.machine(Ridge(solver="svd"), Z, ys)
yhat = m.predict(Z)
yhat.fit(device="cuda")
gn.save(yhat, {str(path)!r})
loaded = gn.load({str(path)!r}, allow_pickle=True)
st = loaded.machines[-1]._state
np.testing.assert_allclose(gn.testing._to_numpy(loaded(X)), gn.testing._to_numpy(yhat()), rtol=1e-12)
assert fg.implicit_conversions() == [] and fg.legacy_work() == []
print(st.path, st.device, type(st.estimator.coef_).__module__)
"""
    env = dict(os.environ, GPUNETS_FAKE_GPU="1", SCIPY_ARRAY_API="1", CUPY_CUDA_PER_THREAD_DEFAULT_STREAM="1",
               PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["array_api", "cuda:0", "gpunets.devices.fakegpu"]
    from sklearn.pipeline import make_pipeline

    rng = np.random.RandomState(0)
    X = rng.rand(50, 4)
    ref = make_pipeline(StandardScaler(), Ridge(solver="svd")).fit(X, X @ [1.0, 2.0, 3.0, 4.0]).predict(X)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gn.DeviceFallbackWarning)
        loaded = gn.load(path, allow_pickle=True)
    assert {m._state.path for m in loaded.machines} == {"cpu_fallback"}
    np.testing.assert_allclose(loaded(X), ref, rtol=1e-6, atol=1e-8)


class _FittedCumlRidge:
    """Stands for a fitted cuML Ridge (only what gn.save touches: cuML's interop ``as_sklearn``)."""

    def __init__(self, fitted):
        self._fitted = fitted

    def as_sklearn(self):
        return self._fitted

    def predict(self, X):  # pragma: no cover - the saved file holds the scikit-learn twin
        return self._fitted.predict(X)


_FittedCumlRidge.__module__ = "cuml.linear_model"   # what is_cuml_estimator looks at; cuML is never imported


def test_fitted_cuml_estimators_are_saved_as_their_sklearn_twins(no_gpu, fmt, tmp_path):
    import dataclasses

    Xd, yd = _data()
    X, y = gn.source(Xd, name="X"), gn.source(yd, name="y")
    mach = gn.machine(Ridge(), X, y)
    yhat = mach.predict(X)
    yhat.fit()
    expected = yhat(Xd[:5])
    fitted = mach._state.estimator
    mach._state = dataclasses.replace(mach._state, stored=_FittedCumlRidge(fitted), path="cuml", device="cuda:0")
    path = gn.save(yhat, tmp_path / "cuml.gn", format=fmt)
    assert isinstance(mach._state.estimator, _FittedCumlRidge)      # the live machine keeps its cuML estimator
    with zipfile.ZipFile(path) as zf:
        assert json.loads(zf.read("gpunets.json"))["devices"] == ["cuda:0"]
    with pytest.warns(gn.DeviceFallbackWarning, match="fitted on cuda:0"):
        loaded = _load(path, fmt)
    st = loaded.machine._state
    assert (st.path, st.device, type(st.estimator)) == ("cpu_fallback", "cpu", Ridge)
    np.testing.assert_array_equal(loaded(Xd[:5]), expected)


# ----------------------------------------------------------------- a real GPU (skipped here)


@pytest.mark.gpu
def test_real_gpu_states_come_back_on_the_gpu_and_on_the_cpu_elsewhere(fmt, tmp_path):
    from gpunets.compute.models import is_cuml_estimator

    Xd, yd = _data(200)
    X, y = gn.source(Xd, name="X"), gn.source(yd, name="y")
    with gn.device("cuda"):
        W = gn.machine(StandardScaler(), X).transform(X)
        yhat = gn.machine(Ridge(alpha=0.5), W, y).predict(W)
    yhat.fit()
    expected = gn.testing._to_numpy(yhat(Xd[:9]))
    routes = [(m._state.path, m._state.device) for m in yhat.machines]
    path = gn.save(yhat, tmp_path / "gpu.gn", format=fmt)
    loaded = _load(path, fmt)
    assert [(m._state.path, m._state.device) for m in loaded.machines] == routes
    for m in loaded.machines:
        if m._state.path == "cuml":
            assert is_cuml_estimator(m._state.estimator)
    np.testing.assert_allclose(gn.testing._to_numpy(loaded(Xd[:9])), expected, rtol=1e-6, atol=1e-9)
    code = ("import warnings, numpy as np, gpunets as gn\n"
            "warnings.simplefilter('ignore')\n"
            f"net = gn.load({str(path)!r}{', trusted=%r' % TREE if fmt == 'skops' else ', allow_pickle=True'})\n"
            f"print(sorted({{m._state.device for m in net.machines}}), net(np.load({str(tmp_path / 'x.npy')!r})).tolist())")
    np.save(tmp_path / "x.npy", Xd[:9])
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.pathsep.join([os.getcwd(),
                                                                                os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    devices, _, values = out.stdout.strip().partition("] ")
    assert devices == "['cpu'"
    np.testing.assert_allclose(json.loads(values), expected, rtol=1e-6, atol=1e-9)


def test_the_skops_format_without_skops_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "skops", None)       # as if it were not installed
    monkeypatch.setitem(sys.modules, "skops.io", None)
    with pytest.raises(ImportError, match=r'format="skops" needs the skops package: pip install "gpunets\[persist\]"'):
        gn.save(gn.source(np.ones(2), name="X") * 2, tmp_path / "x.skops", format="skops")
    assert not (tmp_path / "x.skops").exists()

# cuML is not installed here. These stand-ins mimic the interop API of cuML's cuml/internals/interop.py
# (InteropMixin.as_sklearn, raising UnsupportedOnCPU where no CPU twin exists for the settings), and cuML's
# estimators that have no as_sklearn at all (MinMaxScaler, MaxAbsScaler, Normalizer, GaussianNB, MultinomialNB).
class UnsupportedOnCPU(ValueError):
    pass


class _CumlNoTwin:
    """A fitted cuML estimator without ``as_sklearn`` (as cuML's MinMaxScaler): it pickles as itself."""

    def __init__(self, fitted):
        self.fitted = fitted

    def predict(self, X):
        return self.fitted.predict(X)


class _CumlUnsupported(_CumlNoTwin):
    def as_sklearn(self):
        raise UnsupportedOnCPU("this estimator's settings have no scikit-learn equivalent")


for _cls in (_CumlNoTwin, _CumlUnsupported, UnsupportedOnCPU):
    _cls.__module__ = "cuml.preprocessing"


@pytest.mark.parametrize("stand_in", [_CumlNoTwin, _CumlUnsupported])
def test_cuml_estimators_without_a_cpu_twin_are_saved_as_themselves(no_gpu, stand_in, tmp_path, monkeypatch):
    import dataclasses
    import types as _types

    fake = _types.ModuleType("cuml.preprocessing")   # pickle finds the stand-ins by their (cuML) module name
    for cls in (_CumlNoTwin, _CumlUnsupported, UnsupportedOnCPU):
        setattr(fake, cls.__name__, cls)
    monkeypatch.setitem(sys.modules, "cuml", _types.ModuleType("cuml"))
    monkeypatch.setitem(sys.modules, "cuml.preprocessing", fake)
    Xd, yd = _data()
    X, y = gn.source(Xd, name="X"), gn.source(yd, name="y")
    mach = gn.machine(Ridge(), X, y)
    yhat = mach.predict(X)
    yhat.fit()
    mach._state = dataclasses.replace(mach._state, stored=stand_in(mach._state.estimator), path="cuml",
                                      device="cuda:0")
    path = gn.save(yhat, tmp_path / "nb.gn")
    with pytest.warns(UserWarning, match=f"the fitted {stand_in.__name__} was saved as the cuML estimator itself"):
        loaded = gn.load(path, allow_pickle=True)
    assert type(loaded.machine._state.estimator) is stand_in


def test_gpu_arrays_keep_their_layout_through_a_file(no_gpu, array_api_route, fmt, tmp_path):
    """CuPy copies to the host in C order: a Fortran-ordered array of a fitted state (PCA's ``components_`` on
    the array-API route, a transpose) would come back C-ordered from a file, and the loaded state's products
    round otherwise. The file keeps the layout, so the loaded network answers as the saved one, bit for bit."""
    from sklearn.decomposition import PCA

    Xd, _ = _data(200)
    with fake_gpu(1) as cp:
        X = gn.source(Xd, name="X")
        mach = gn.machine(PCA(2, svd_solver="covariance_eigh"), X, device="cuda")
        Z = mach.transform(X)
        Z.fit()
        comps = mach._state.estimator.components_
        assert isinstance(comps, cp.ndarray) and comps.flags.f_contiguous and not comps.flags.c_contiguous
        expected = cp.asnumpy(Z(Xd[:9]))
        path = gn.save(Z, tmp_path / "pca.gn", format=fmt)
        loaded = _load(path, fmt, trusted=[PCA])
        got = loaded.machines[0]._state.estimator.components_
        assert isinstance(got, cp.ndarray) and got.flags.f_contiguous and not got.flags.c_contiguous
        np.testing.assert_array_equal(cp.asnumpy(loaded(Xd[:9])), expected)
