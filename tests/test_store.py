"""The store of fitted states (issue 26): settings, keys, loads, faults, processes, searches."""

import errno
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from sklearn.decomposition import PCA
from sklearn.linear_model import Ridge
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer, StandardScaler

import gpunets as gn
from gpunets.devices import store as store_mod

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _net(data=None, alpha=1.0, pre=None):
    rng = np.random.default_rng(0)
    Xd, yd = (rng.normal(size=(120, 6)), rng.normal(size=120)) if data is None else data
    X, y = gn.source(Xd, name="X"), gn.source(yd, name="y")
    W = X if pre is None else gn.node(pre, X)
    scale = gn.machine(StandardScaler(), W)
    Z = scale.transform(W)
    pca = gn.machine(PCA(3), Z)
    P = pca.transform(Z)
    ridge = gn.machine(Ridge(alpha=alpha), P, y)
    return ridge.predict(P), {"X": X, "y": y, "ridge": ridge, "pca": pca, "scale": scale}


@pytest.fixture
def store(tmp_path):
    s = gn.Store(tmp_path / "store")
    with gn.config(store=s):
        yield s


# --- settings ------------------------------------------------------------------------------------------

def test_settings_forms(tmp_path):
    path = str(tmp_path / "a")
    with gn.config(store=path):
        s = gn.get_config()["store"]
        assert isinstance(s, gn.Store) and s.path == path and os.path.isdir(path)
        assert gn.store_info().path == path
    assert gn.get_config()["store"] is None and gn.store_info().path is None
    gn.set_config(store=path)
    try:
        assert gn.get_config()["store"] is s   # one Store per path: its counters carry on
    finally:
        gn.set_config(store=None)
    s2 = gn.Store(path, max_bytes="1MB")
    with gn.config(store=s2):
        assert gn.get_config()["store"].max_bytes == 1 << 20


def test_bad_settings_say_which_and_why(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match=r"store=.*is a file, not a folder.*Hint"):
        gn.set_config(store=str(f))
    for bad in (0, -5, "lots", True, 1.5):
        with pytest.raises(ValueError, match=r"max_bytes=.*not a positive size.*Hint"):
            gn.Store(tmp_path / "s", max_bytes=bad)
    with pytest.raises(TypeError, match=r"store=12 .*expected a folder path"):
        gn.config(store=12)
    with pytest.raises(ValueError, match=r"not a writable folder"):
        gn.set_config(store=str(f / "below"))
    if os.geteuid() != 0:   # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        with pytest.raises(ValueError, match=r"not a writable folder"):
            gn.set_config(store=str(ro))
    assert gn.get_config()["store"] is None


# --- loads -------------------------------------------------------------------------------------------

def test_second_network_loads_every_state_bit_for_bit(tmp_path, executor):
    cold, _ = _net()
    cold.fit(executor=executor)
    expected = cold()
    with gn.config(store=gn.Store(tmp_path / "s")):
        first, _ = _net()
        assert set(first.fit(executor=executor).actions.by_label().values()) == {"train"}
        assert gn.store_info().entries == 3
        again, parts = _net()
        report = again.fit(executor=executor)
        assert report.actions.by_label() == {"StandardScaler": "stored", "PCA": "stored", "Ridge": "stored"}
        assert "loaded instead of fitted" in report.why["PCA"]
        labels = sorted(r.label for r in report.trace.records if r.kind == "fit")
        assert labels == ["load PCA (stored)", "load Ridge (stored)", "load StandardScaler (stored)"]
        assert gn.store_info().hits == 3
        np.testing.assert_array_equal(again(), expected)
        np.testing.assert_array_equal(first(), expected)
        parts["ridge"].model.alpha = 3.0            # then the usual rules: only Ridge updates
        assert again.fit(executor=executor).actions.by_label() == {
            "StandardScaler": "skip", "PCA": "skip", "Ridge": "update"}


_VARIANTS = {   # each ingredient of a key changed, and the machines that must fit again
    "hyperparameter": (dict(alpha=2.0), {"Ridge"}),
    "data": (dict(scale=2.0), {"StandardScaler", "PCA", "Ridge"}),
    "target": (dict(shift=1.0), {"Ridge"}),
    "function code": (dict(pre=lambda x, c=1.0: x - c), {"StandardScaler", "PCA", "Ridge"}),
    "function default": (dict(pre=lambda x, c=2.0: x + c), {"StandardScaler", "PCA", "Ridge"}),
}


@pytest.mark.parametrize("name", sorted(_VARIANTS))
def test_each_key_ingredient_changed_is_a_miss(store, name):
    rng = np.random.default_rng(0)
    Xd, yd = rng.normal(size=(120, 6)), rng.normal(size=120)
    _net((Xd, yd), pre=lambda x, c=1.0: x + c)[0].fit()
    change, refit = _VARIANTS[name]
    out, _ = _net((Xd * change.get("scale", 1.0), yd + change.get("shift", 0.0)), alpha=change.get("alpha", 1.0),
                  pre=change.get("pre", lambda x, c=1.0: x + c))
    actions = out.fit().actions.by_label()
    assert {k for k, a in actions.items() if a == "train"} == refit, actions
    assert {k for k, a in actions.items() if a == "stored"} == set(actions) - refit, actions


def test_data_changed_in_place_rows_and_nested_params_are_misses(store):
    out, parts = _net()
    out.fit()
    parts["X"].data *= 2.0                        # in place: a new fingerprint
    assert out.fit().actions["StandardScaler"] == "train"
    out2, _ = _net()
    assert out2.fit(rows=slice(0, 100)).actions.by_label()["StandardScaler"] == "train"   # other rows
    assert _net()[0].fit(rows=slice(0, 100)).actions.by_label()["StandardScaler"] == "stored"
    X = gn.source(np.random.default_rng(1).normal(size=(50, 4)), name="X")
    y = gn.source(np.ones(50), name="y")
    m = gn.machine(make_pipeline(StandardScaler(), Ridge(alpha=1.0)), X, y)
    m.fit()
    m2 = gn.machine(make_pipeline(StandardScaler(), Ridge(alpha=5.0)), X, y)   # a nested estimator's parameter
    assert m2.fit().actions[m2] == "train"
    m3 = gn.machine(make_pipeline(StandardScaler(), Ridge(alpha=1.0)), X, y)
    assert m3.fit().actions[m3] == "stored"


def test_library_and_gpunets_upgrades_are_misses(store, monkeypatch):
    out, _ = _net()
    out.fit()
    import sklearn

    monkeypatch.setattr(sklearn, "__version__", sklearn.__version__ + ".post99")
    assert set(_net()[0].fit().actions.by_label().values()) == {"train"}
    monkeypatch.undo()
    assert set(_net()[0].fit().actions.by_label().values()) == {"stored"}
    monkeypatch.setattr(store_mod, "VERSION", "0.0.1")
    assert set(_net()[0].fit().actions.by_label().values()) == {"train"}


def test_an_entry_of_another_version_is_a_miss_not_an_error(tmp_path, monkeypatch):
    from gpunets.devices import store_format

    s = gn.Store(tmp_path)
    monkeypatch.setattr(store_format, "VERSION", "0.0.1")   # the version an entry's header is written with
    s.put(b"k" * 16, [1])
    monkeypatch.undo()
    assert s.get(b"k" * 16) is None
    assert s.info().corrupt == 0 and s.info().misses == 1


# --- faults ------------------------------------------------------------------------------------------

def _entries(s):
    return [p for _, _, p in s._entries()]


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_corrupt_entry_is_dropped_and_refitted(store, damage):
    out, _ = _net()
    out.fit()
    expected = out()
    for path in _entries(store):
        data = open(path, "rb").read()
        data = data[:-7] if damage == "truncate" else data[:-3] + bytes([data[-3] ^ 0xFF]) + data[-2:]
        open(path, "wb").write(data)
    again, _ = _net()
    assert set(again.fit().actions.by_label().values()) == {"train"}
    assert store.info().corrupt == 3
    np.testing.assert_array_equal(again(), expected)
    assert set(_net()[0].fit().actions.by_label().values()) == {"stored"}   # rewritten whole


def test_a_full_disk_warns_once_and_the_fit_succeeds(store, monkeypatch):
    def full(f, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_mod, "_write", full)
    with pytest.warns(gn.StoreWarning, match="the disk is full") as caught:
        out, _ = _net()
        report = out.fit()
        _net(alpha=4.0)[0].fit()
    assert len([w for w in caught if issubclass(w.category, gn.StoreWarning)]) == 1
    assert set(report.actions.by_label().values()) == {"train"}
    info = store.info()
    assert info.entries == 0 and info.failed == 6
    assert not [n for _, _, fs in os.walk(store.path) for n in fs if n.endswith(".partial")]


def test_eviction_drops_the_least_recently_used(tmp_path):
    s = gn.Store(tmp_path, max_bytes=3000)
    blob = b"x" * 900
    for i in range(3):
        s.put(bytes([i]) * 16, blob)
        os.utime(s._file(bytes([i]) * 16), (1000 + i, 1000 + i))
    assert s.get(bytes([0]) * 16) == blob        # used now: the most recent
    s.put(bytes([9]) * 16, blob)                  # over 3000 bytes: the oldest (1) goes
    assert s.get(bytes([1]) * 16) is None
    assert s.get(bytes([0]) * 16) == blob and s.get(bytes([2]) * 16) == blob
    assert s.info().evictions == 1 and s.info().bytes <= 3000


def test_clear_and_info(store):
    _net()[0].fit()
    info = gn.store_info()
    assert (info.entries, info.writes, info.misses) == (3, 3, 3) and info.bytes > 0
    gn.store_clear()
    info = gn.store_info()
    assert (info.entries, info.bytes, info.hits, info.writes) == (0, 0, 0, 0)


def test_threads_share_one_store(tmp_path):
    s = gn.Store(tmp_path)
    errors = []

    def work(i):
        try:
            for j in range(30):
                k = bytes([j % 5]) * 16
                s.put(k, list(range(j % 5 * 100)))
                v = s.get(k)
                assert v is None or v == list(range(j % 5 * 100))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and s.info().corrupt == 0 and s.info().entries == 5


_WRITER = textwrap.dedent("""
    import sys, numpy as np, gpunets as gn
    from sklearn.linear_model import Ridge
    gn.set_config(store=sys.argv[1])
    rng = np.random.default_rng(0)
    X, y = gn.source(rng.normal(size=(300, 8)), name="X"), gn.source(rng.normal(size=300), name="y")
    for rep in range(3):
        for a in range(8):
            m = gn.machine(Ridge(alpha=float(a)), X, y)
            m.fit()
    info = gn.store_info()
    print(info.corrupt, info.failed)
""")


def test_two_processes_write_one_store(tmp_path):
    path = str(tmp_path / "shared")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=env, text=True) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        assert out.split() == ["0", "0"]
    s = gn.Store(path)
    assert s.info().entries == 8
    assert not [n for _, _, fs in os.walk(path) for n in fs if n.endswith(".partial")]
    rng = np.random.default_rng(0)
    X, y = gn.source(rng.normal(size=(300, 8)), name="X"), gn.source(rng.normal(size=300), name="y")
    with gn.config(store=s):
        for a in range(8):
            m = gn.machine(Ridge(alpha=float(a)), X, y)
            assert m.fit().actions[m] == "stored"
    assert s.info().corrupt == 0


# --- searches ----------------------------------------------------------------------------------------

def _search(alphas, X, y):
    return gn.GridSearchCV(make_pipeline(StandardScaler(), PCA(4), Ridge()), {"ridge__alpha": alphas}, cv=3)


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(300, 10)), rng.normal(size=300)


def test_a_search_again_fits_nothing_and_a_wider_grid_only_the_new(store, executor):
    X, y = _data()
    cold = _search([0.1, 1.0], X, y).set_params(executor=executor).fit(X, y)
    first = cold.search_report_
    assert first.stored == 0 and first.fitted == 3 + 3 + 6
    again = _search([0.1, 1.0], X, y).set_params(executor=executor).fit(X, y)
    assert again.search_report_.fitted == 0 and again.search_report_.remembered == 6   # results from the store
    np.testing.assert_array_equal(again.cv_results_["mean_test_score"], cold.cv_results_["mean_test_score"])
    wide = _search([0.1, 1.0, 10.0], X, y).set_params(executor=executor).fit(X, y)
    # the new alpha's Ridge in each fold, and each PCA fitted again where its transform differs from its fit's output
    assert wide.search_report_.fitted == 3 + sum(wide.search_report_.again.values())
    assert wide.search_report_.fits["ridge"] == 3
    assert wide.search_report_.stored == 6          # the scaler and the PCA of each fold, loaded
    np.testing.assert_array_equal(wide.cv_results_["mean_test_score"][:2], cold.cv_results_["mean_test_score"])


_SEARCH = textwrap.dedent("""
    import sys, numpy as np, gpunets as gn
    from sklearn.decomposition import PCA
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    gn.set_config(store=sys.argv[1])
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(300, 10)), rng.normal(size=300)
    s = gn.GridSearchCV(make_pipeline(StandardScaler(), PCA(4), Ridge()), {"ridge__alpha": [0.1, 1.0]}, cv=3)
    s.fit(X, y)
    print(s.search_report_.fitted, s.search_report_.remembered, repr(s.cv_results_["mean_test_score"].tolist()))
""")


def test_a_search_in_a_new_process_fits_nothing(tmp_path):
    path = str(tmp_path / "s")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    outs = [subprocess.run([sys.executable, "-c", _SEARCH, path], capture_output=True, text=True, env=env,
                           timeout=240, check=True).stdout.split(maxsplit=2) for _ in range(2)]
    assert outs[0][:2] == ["12", "0"] and outs[1][:2] == ["0", "6"]   # every (candidate, fold) from the store
    assert outs[0][2] == outs[1][2]   # the same scores, to the last bit (repr of the floats)


def test_function_transformer_by_code_and_defaults(store):
    X = gn.source(np.arange(20.0).reshape(10, 2), name="X")

    def fit(f):
        m = gn.machine(make_pipeline(FunctionTransformer(f), StandardScaler()), X)
        return m.fit().actions[m]

    pytest.importorskip("cloudpickle")           # a lambda's fitted state pickles by value
    assert fit(lambda x: x + 1) == "train"
    assert fit(lambda x: x + 1) == "stored"       # same code: the same key
    assert fit(lambda x: x + 2) == "train"
    assert fit(np.log1p) == "train" and fit(np.log1p) == "stored"


def test_step_fits_alone_are_loaded_when_results_are_not_kept(store):
    """A search whose results are not in the store (an interrupted run keeps its finished step fits) still
    loads its step fits, and fits nothing."""
    import pickle

    X, y = _data()
    _search([0.1, 1.0], X, y).fit(X, y)
    results = [p for p in _entries(store) if isinstance(pickle.loads(store_mod._decode(open(p, "rb").read())), dict)]
    assert len(results) == 6
    for p in results:
        os.remove(p)
    again = _search([0.1, 1.0], X, y).fit(X, y)
    assert again.search_report_.fitted == 0 and again.search_report_.stored == 12


def test_from_sklearn_conversions_and_stacks_look_in_the_store(tmp_path, executor):
    """A converted pipeline and a stack fit their machines through the same lookup: fitted again (a new
    object, or a new process) they load every state and predict as the first."""
    from sklearn.linear_model import LinearRegression
    from sklearn.model_selection import KFold

    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(90, 5)), rng.normal(size=90)
    pipe = make_pipeline(StandardScaler(), PCA(3), Ridge(alpha=0.5))
    stack = lambda: gn.StackingRegressor([("r", Ridge()), ("p", make_pipeline(StandardScaler(), Ridge(2.0)))],  # noqa: E731
                                         final_estimator=LinearRegression(), cv=KFold(3), executor=executor)
    with gn.config(store=gn.Store(tmp_path / "s")):
        first = gn.from_sklearn(pipe).fit(X, y)
        misses = gn.store_info().misses
        again = gn.from_sklearn(pipe).fit(X, y)
        assert gn.store_info().hits >= 3 and gn.store_info().misses == misses
        np.testing.assert_array_equal(again.predict(X), first.predict(X))
        s1 = stack().fit(X, y)
        hits, misses = gn.store_info().hits, gn.store_info().misses
        s2 = stack().fit(X, y)
        assert gn.store_info().hits > hits and gn.store_info().misses == misses   # every machine of the stack
        np.testing.assert_array_equal(s2.predict(X), s1.predict(X))


def test_no_entry_holds_the_training_data(store, executor):
    """A store holds fitted states, never the data they were fitted on (nor their transforms of it)."""
    rng = np.random.default_rng(7)
    Xd, yd = rng.normal(size=(200, 6)), rng.normal(size=200)
    out, _ = _net(data=(Xd, yd))
    out.fit(executor=executor)
    gn.GridSearchCV(make_pipeline(StandardScaler(), PCA(3), Ridge()), {"ridge__alpha": [0.1, 1.0]}, cv=3,
                    executor=executor).fit(Xd, yd)
    import pathlib

    raw = b"".join(p.read_bytes() for p in pathlib.Path(store.path).rglob("*")
                   if p.is_file())
    assert raw, "the store wrote its entries"
    for values in (Xd, yd, Xd[:, 0].copy(), StandardScaler().fit(Xd).transform(Xd)[:, 0].copy()):
        for row in range(0, len(values), 37):
            chunk = np.ascontiguousarray(values[row:row + 4]).tobytes()
            assert chunk not in raw, "a stored entry holds training data"
