"""gn.save / gn.load, issue 23 items 7-10 and 15: no training data in any file, the caller chooses whether a
pickle may load, gpunets' own types are trusted by skops, concurrent saves, damaged and foreign files.
"""

import os
import pickle
import threading
import zipfile

import numpy as np
import pandas as pd
import pytest
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import VotingRegressor
from sklearn.linear_model import Ridge
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import gpunets as gn

from .test_persist import _Boom, _payload_bytes

FORMATS = ["pickle", "skops"]


@pytest.fixture(params=FORMATS)
def fmt(request):
    if request.param == "skops":
        pytest.importorskip("skops")
    return request.param


def _training(kind):
    """Training data whose every value is distinctive (no other value in a file has these bytes)."""
    rng = np.random.default_rng(7)
    X = rng.normal(size=(40, 3)) * 3.0 + 1234.5678
    y = X @ np.array([0.5, -1.0, 2.0]) + rng.normal(size=40) + 987.654
    if kind == "pandas":
        idx = [f"secret-row-{i}" for i in range(40)]
        return pd.DataFrame(X, columns=["a", "b", "c"], index=idx), pd.Series(y, index=idx, name="target")
    return X, y


def _network(X, y):
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    W = gn.machine(StandardScaler(), Xs).transform(Xs)
    return gn.mean(gn.machine(Ridge(), W, ys).predict(W), gn.machine(Ridge(alpha=3.0), W, ys).predict(W))


class _Blend(gn.CompositeRegressor):
    """A user's composite (defined in a test module, so skops loads it only when named in trusted=)."""

    def __init__(self, executor="auto"):
        self.executor = executor

    def network(self, X, y):
        return gn.mean(gn.machine(Ridge(), X, y).predict(X), gn.machine(Ridge(alpha=5.0), X, y).predict(X))


def _fitted(kind, X, y):
    if kind == "network":
        yhat = _network(X, y)
        yhat.fit()
        return yhat
    est = {
        "composite": lambda: _Blend(),
        "stack": lambda: gn.StackingRegressor([("a", Ridge()), ("b", Ridge(alpha=4.0))], Ridge(), cv=3,
                                              passthrough=True),
        "stack-cv-ensemble": lambda: gn.StackingRegressor([("a", Ridge())], Ridge(), cv=3, cv_ensemble=True),
        "from_sklearn-pipeline": lambda: gn.from_sklearn(make_pipeline(StandardScaler(), Ridge())),
        "from_sklearn-columns": lambda: gn.from_sklearn(make_pipeline(
            ColumnTransformer([("s", StandardScaler(), [0, 2])], remainder="passthrough"), Ridge())),
        "from_sklearn-voting": lambda: gn.from_sklearn(VotingRegressor([("a", Ridge()), ("b", Ridge(alpha=2.0))])),
        "search": lambda: gn.GridSearchCV(make_pipeline(StandardScaler(), Ridge()), {"ridge__alpha": [0.5, 2.0]},
                                          cv=3),
    }[kind]()
    return est.fit(X, y)


KINDS = ["network", "composite", "stack", "stack-cv-ensemble", "from_sklearn-pipeline", "from_sklearn-columns",
         "from_sklearn-voting", "search"]


@pytest.mark.parametrize("data", ["numpy", "pandas"])
@pytest.mark.parametrize("kind", KINDS)
def test_no_saved_file_holds_training_data(kind, data, fmt, tmp_path):
    X, y = _training(data)
    obj = _fitted(kind, X, y)
    path = gn.save(obj, tmp_path / f"{kind}.{fmt}", format=fmt)
    stored = _payload_bytes(path)
    Xn, yn = np.asarray(X, dtype=float), np.asarray(y, dtype=float)
    for i in range(len(Xn)):                    # row-major copies (NumPy) and single values
        assert Xn[i].tobytes() not in stored, f"row {i} of X is in the file"
        assert Xn[i, 1].tobytes() not in stored, f"X[{i}, 1] is in the file"
        assert yn[i].tobytes() not in stored, f"y[{i}] is in the file"
    for j in range(Xn.shape[1]):                # column-major copies (pandas blocks)
        assert Xn[:4, j].tobytes() not in stored, f"column {j} of X is in the file"
    assert b"secret-row" not in stored          # the index of a pandas input
    trusted = ["tests.test_persist_trust._Blend"] if kind == "composite" else []
    loaded = gn.load(path, allow_pickle=True, trusted=trusted) if fmt == "skops" else gn.load(path, allow_pickle=True)
    Xnew = X[:5] if data == "numpy" else X.iloc[:5]
    expected = obj(Xnew) if kind == "network" else obj.predict(Xnew)
    got = loaded(Xnew) if kind == "network" else loaded.predict(Xnew)
    np.testing.assert_allclose(np.asarray(got, dtype=float), np.asarray(expected, dtype=float), rtol=1e-12)


# ----------------------------------------------------------------- the caller chooses: allow_pickle


def _pickle_file(tmp_path, name="model.skops"):
    """A gn.save pickle file under a name that suggests the safe format."""
    X, y = _training("numpy")
    yhat = _network(X, y)
    yhat.fit()
    path = gn.save(yhat, tmp_path / "net.gn")            # format="pickle"
    os.replace(path, tmp_path / name)
    return str(tmp_path / name), yhat, X


def test_a_pickle_file_loads_only_when_the_caller_allows_it(tmp_path):
    path, yhat, X = _pickle_file(tmp_path)
    with pytest.raises(gn.PersistenceError, match=r"is a pickle file.*gn.load\(path, allow_pickle=True\)") as info:
        gn.load(path)                                     # the name says skops: the file does not choose
    assert isinstance(info.value, ValueError)
    np.testing.assert_array_equal(gn.load(path, allow_pickle=True)(X[:4]), yhat(X[:4]))
    # trusted=: unpickled with only gpunets', NumPy's and scikit-learn's classes (and the names given)
    np.testing.assert_array_equal(gn.load(path, trusted=[])(X[:4]), yhat(X[:4]))


def test_a_pickle_loaded_with_trusted_refuses_other_globals_before_running_them(tmp_path):
    path, _, _ = _pickle_file(tmp_path, "net.gn")
    with zipfile.ZipFile(path) as zf:
        meta = zf.read("gpunets.json")
    with zipfile.ZipFile(path, "w") as zf:               # a file that names a global of its own choosing
        zf.writestr("gpunets.json", meta)
        zf.writestr("payload.pkl", pickle.dumps(_Boom()))
    _Boom.ran = False
    with pytest.raises(gn.UntrustedTypesError, match=r"refers to 'tests.test_persist._Boom._explode'.*"
                                                     r"trusted=\['tests.test_persist._Boom._explode'\]"):
        gn.load(path, trusted=[])
    assert not _Boom.ran
    with pytest.raises(gn.PersistenceError, match="allow_pickle=True"):
        gn.load(path)
    assert not _Boom.ran


# ----------------------------------------------------------------- gpunets' own types are trusted by skops


@pytest.mark.parametrize("kind", ["from_sklearn-pipeline", "from_sklearn-voting", "search", "stack"])
def test_skops_loads_gpunets_own_types_without_trusting_them_by_name(kind, tmp_path):
    pytest.importorskip("skops")
    X, y = _training("numpy")
    obj = _fitted(kind, X, y)
    loaded = gn.load(gn.save(obj, tmp_path / "o.skops", format="skops"))
    np.testing.assert_allclose(loaded.predict(X[:5]), obj.predict(X[:5]), rtol=1e-12)


def test_skops_trusts_gpunets_classes_but_not_every_gpunets_function(tmp_path):
    pytest.importorskip("skops")
    from gpunets.persistence.persist import _trusted_by_default

    assert _trusted_by_default("gpunets.sklearn_import.composite.FromSklearnRegressor")
    assert _trusted_by_default("gpunets.compose.stacking.concat_predictions")     # on the list
    assert not _trusted_by_default("gpunets.persistence.persist.load")               # a function, not on the list
    assert not _trusted_by_default("gpunetsevil.Thing")
    assert not _trusted_by_default("sklearn.tree._tree.Tree", ("gpunets", "sklearn"))


# ----------------------------------------------------------------- concurrent saves


def test_threads_saving_to_one_path_all_succeed_and_the_file_is_whole(tmp_path):
    X, y = _training("numpy")
    nets = []
    for alpha in (0.1, 1.0, 10.0, 100.0):
        Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
        n = gn.machine(Ridge(alpha=alpha), Xs, ys).predict(Xs)
        n.fit()
        nets.append(n)
    path = tmp_path / "shared.gn"
    errors, barrier = [], threading.Barrier(len(nets))

    def work(net):
        barrier.wait()
        try:
            for _ in range(5):
                gn.save(net, path)
        except BaseException as exc:  # noqa: BLE001 - collected and asserted on below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in nets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(os.listdir(tmp_path)) == ["shared.gn"]        # no temporary file left behind
    got = gn.load(path, allow_pickle=True)(X[:3])
    assert any(np.array_equal(got, n(X[:3])) for n in nets)     # one complete save won


def test_a_saved_file_gets_the_usual_permissions(tmp_path):
    X, y = _training("numpy")
    yhat = _network(X, y)
    yhat.fit()
    path = gn.save(yhat, tmp_path / "p.gn")
    mask = os.umask(0)
    os.umask(mask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~mask


# ----------------------------------------------------------------- damaged and foreign files


def _saved(tmp_path, fmt):
    X, y = _training("numpy")
    yhat = _network(X, y)
    yhat.fit()
    return gn.save(yhat, tmp_path / f"net.{fmt}", format=fmt)


@pytest.mark.parametrize("fraction", [0.05, 0.3, 0.6, 0.9, 0.99])
def test_a_truncated_file_is_damaged(fmt, fraction, tmp_path):
    path = _saved(tmp_path, fmt)
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: int(len(data) * fraction)])
    with pytest.raises(gn.PersistenceError, match=r"is damaged: it was written by gn.save but") as info:
        gn.load(path, allow_pickle=True)
    assert str(path) in str(info.value)


def test_altered_bytes_make_a_damaged_file(fmt, tmp_path):
    path = _saved(tmp_path, fmt)
    data = bytearray(open(path, "rb").read())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("payload.pkl" if fmt == "pickle" else "payload.skops")
    start = info.header_offset + 30 + len(info.filename)        # the member's compressed bytes
    for k in range(start + 10, start + 40):
        data[k] ^= 0xFF
    with open(path, "wb") as f:
        f.write(bytes(data))
    with pytest.raises(gn.PersistenceError, match=r"is damaged"):
        gn.load(path, allow_pickle=True)


@pytest.mark.parametrize("content", [b"", b"not a zip at all", b"PK\x03\x04garbage", b"\x80\x04K\x01."])
def test_files_of_other_kinds_are_foreign(content, tmp_path):
    path = tmp_path / "x.gn"
    path.write_bytes(content)
    with pytest.raises(gn.PersistenceError, match=r"is foreign: it was not written by gn.save"):
        gn.load(path, allow_pickle=True)


def test_old_module_paths_of_trusted_functions_stay_trusted():
    """Files saved before gpunets' modules moved into packages name functions by their old paths."""
    from gpunets.persistence.persist import _trusted_by_default

    assert _trusted_by_default("gpunets.stacking.take_rows")          # now gpunets.compose._stack_network
    assert _trusted_by_default("gpunets.compose.stacking.take_rows")  # re-exported there
    assert not _trusted_by_default("gpunets.compose.stacking.np")     # a module is not a trusted type
