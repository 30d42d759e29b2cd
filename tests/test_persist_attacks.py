"""gn.load decides what a loaded file may do (issue 35 items 1-2, and the persistence half of 15).

Every name gn.load trusts by default (``TRUSTED_TYPES``, gpunets' marked operations, gpunets' data classes,
enumerated from the package: a new trusted name gets its rows here without anyone writing them) is turned
against the caller, on both formats: a file that tries is refused with a ``PersistenceError`` naming the
name, before any of it runs, and no file outside the loaded one is touched.
"""

import ast
import functools
import hashlib
import importlib
import inspect
import io
import json
import os
import pickle
import pkgutil
import textwrap
import zipfile

import numpy as np
import pytest
from sklearn.linear_model import Ridge

import gpunets as gn
from gpunets.persistence._persist_codec import Archive
from gpunets.persistence._persist_trust import (
    GPUNETS_DATA_PACKAGES,
    TRUSTED_TYPES,
    canonical,
    checked_arguments,
    resolve,
    trusted_by_default,
)
from gpunets.tuning.batched import pick
from gpunets.tuning.tasks import apply_op, collect, take


@pytest.fixture(params=["pickle", "skops"])
def fmt(request):
    if request.param == "skops":
        pytest.importorskip("skops")
    return request.param


def _default_trusted():
    """Every name gn.load trusts without being told: found by walking gpunets, not listed by hand."""
    names = set(TRUSTED_TYPES)
    for info in pkgutil.walk_packages(gn.__path__, "gpunets."):
        if info.name in ("gpunets.__main__",):
            continue
        try:
            mod = importlib.import_module(info.name)
        except ImportError:
            continue
        for obj in list(vars(mod).values()):
            if getattr(obj, "__module__", None) == info.name and callable(obj) and trusted_by_default(canonical(obj)):
                names.add(canonical(obj))
    return sorted(names)


TRUSTED = _default_trusted()
DISPATCHING = [n for n in TRUSTED if checked_arguments(resolve(n))]
GPUNETS_CLASSES = [n for n in TRUSTED if n.startswith("gpunets.") and isinstance(resolve(n), type)]


def test_the_enumeration_finds_what_the_files_use():
    for name in ("gpunets.tuning.tasks.apply_op", "gpunets.tuning.tasks.call_fn", "gpunets.core.ops.combine",
                 "gpunets.core.nodes.Node", "gpunets.compose.stacking.StackingRegressor", "_operator.getitem",
                 "functools.partial"):
        assert name in TRUSTED
    for name in ("gpunets.tuning.tasks.apply_op", "gpunets.tuning.tasks.call_fn", "gpunets.core.ops.combine",
                 "gpunets.compose._stack_network.prefit_output", "gpunets.tuning.warm.warm_fit_and_score"):
        assert name in DISPATCHING
    assert "gpunets.devices.store.Store" not in TRUSTED and "gpunets.base.config.config" not in TRUSTED


# ----------------------------------------------------------------- crafting files


class _Call:
    """Pickles as the call ``fn(*args)``: what a crafted pickle does while it loads."""

    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


def _header(fmt):
    X = gn.source(np.ones(2), name="X")
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"gn-header-{os.getpid()}.{fmt}")
    gn.save(X * 2, path, format=fmt)
    with zipfile.ZipFile(path) as zf:
        meta = zf.read("gpunets.json")
    os.remove(path)
    return meta


def _write(path, fmt, payload):
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("gpunets.json", _header(fmt))
        zf.writestr("payload.pkl" if fmt == "pickle" else "payload.skops", payload)
    return str(path)


def _skops_call(module, name, args, loader="ConstructorFromReduceNode"):
    """A skops payload whose root is ``module.name(*args)`` (skops calls it while loading)."""
    import skops.io as sio

    with zipfile.ZipFile(io.BytesIO(sio.dumps(Archive(tuple(args), [])))) as zf:
        schema = json.loads(zf.read("schema.json"))
    content = schema["content"]["content"]
    content["root"] = {"__class__": name, "__module__": module, "__loader__": loader,
                       "content": content["root"], "__id__": 1}
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr("schema.json", json.dumps(schema))
    return out.getvalue()


def _crafted_call(tmp_path, fmt, obj, args):
    """A gn.save file (valid header) whose payload calls ``obj(*args)`` while it loads."""
    if fmt == "pickle":
        payload = pickle.dumps(Archive(_Call(obj, args), []), protocol=pickle.HIGHEST_PROTOCOL)
    else:
        payload = _skops_call(obj.__module__, obj.__qualname__, args)
    return _write(tmp_path / f"crafted.{fmt}", fmt, payload)


def _snapshot(folder):
    out = {}
    for root, dirs, files in os.walk(folder):
        for d in dirs:
            out[os.path.join(root, d)] = "dir"
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[p] = hashlib.sha256(fh.read()).hexdigest()
    return out


@pytest.fixture
def victim(tmp_path, monkeypatch):
    """A working folder with a file worth keeping; the test asserts nothing in tmp_path changed."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "victim.txt").write_bytes(b"precious data\n" * 100)
    monkeypatch.chdir(work)
    return work


def _refused(path, fmt, culprit):
    """gn.load refuses the file with a PersistenceError naming ``culprit``, touching nothing around it."""
    folder = os.path.dirname(os.getcwd())   # the test's tmp_path: the victim's folder and the loaded file
    before = _snapshot(folder)
    kw = {"trusted": []} if fmt == "pickle" else {}
    with pytest.raises(gn.PersistenceError) as info:
        gn.load(path, **kw)
    assert culprit in str(info.value), str(info.value)
    assert "nothing in this one was run" in str(info.value)
    assert _snapshot(folder) == before, "a file was touched while loading"
    return info.value


# ----------------------------------------------------------------- every trusted name: called while loading

_ATTACK_ARGS = ("victim.txt", "w+")   # a file name and a mode: what a file-touching callable would use


@pytest.mark.parametrize("name", TRUSTED)
def test_no_trusted_name_is_called_while_a_file_loads(name, fmt, victim, tmp_path):
    """The attack every trusted name could carry: the file calls it (a function, or a class's constructor) while
    it loads, with arguments of its choosing.  gn.load never calls one: it builds classes with ``__new__``."""
    obj = resolve(name)
    if name == "functools.partial":   # a pickle builds a partial by calling it: its attack is what it wraps
        path = _crafted_call(tmp_path, fmt, functools.partial, (apply_op, "__getattribute__"))
        _refused(path, fmt, "gpunets.tuning.tasks.apply_op" if fmt == "pickle" else "functools.partial")
        return
    path = _crafted_call(tmp_path, fmt, obj, _ATTACK_ARGS)
    _refused(path, fmt, canonical(obj) if fmt == "pickle" else f"{obj.__module__}.{obj.__qualname__}")


# ----------------------------------------------------------------- dispatching operations: what they are given

_BAD_VALUE = {"operation": "__getattribute__", "operations": ("predict", "__getattribute__"), "kernel": "_backend",
              "parameter": "__class__", "callable": functools.partial(apply_op, "__getattribute__")}


def _rows():
    for name in DISPATCHING:
        for pos, kind in sorted(checked_arguments(resolve(name)).items()):
            yield pytest.param(name, pos, kind, id=f"{name.rsplit('.', 1)[1]}-arg{pos}-{kind}")


@pytest.mark.parametrize(("name", "pos", "kind"), list(_rows()))
def test_a_dispatching_operation_gets_only_names_from_its_table(name, pos, kind, fmt, victim):
    """A trusted function that looks up or calls what an argument names, given a name outside its table (or a
    call-anything callable) in a network saved with gn.save: refused when loaded, naming it."""
    fn = resolve(name)
    X = gn.source(np.ones((2, 2)), name="X")
    args = [0] * pos + [_BAD_VALUE[kind], X]
    path = gn.save(gn.node(fn, *args), victim / f"net.{fmt}", format=fmt)
    _refused(path, fmt, name)


@pytest.mark.parametrize("kind", ["operation", "kernel", "callable"])
def test_a_checked_argument_computed_by_another_node_is_refused(kind, fmt, victim):
    name = {"operation": "gpunets.tuning.tasks.apply_op", "kernel": "gpunets.core.ops.combine",
            "callable": "gpunets.tuning.tasks.call_fn"}[kind]
    X = gn.source(np.ones((2, 2)), name="X")
    computed = gn.node(pick, ("predict", take), 0 if kind != "callable" else 1)
    path = gn.save(gn.node(resolve(name), computed, X, X), victim / f"net.{fmt}", format=fmt)
    _refused(path, fmt, name)


@pytest.mark.parametrize(("name", "pos", "kind"), list(_rows()))
def test_a_checked_argument_given_by_keyword_is_checked_too(name, pos, kind, fmt, victim):
    fn = resolve(name)
    keyword = list(inspect.signature(fn).parameters)[pos]
    op = functools.partial(fn, **{keyword: _BAD_VALUE[kind]})
    path = gn.save(gn.node(op, gn.source(np.ones((2, 2)), name="X")), victim / f"kw.{fmt}", format=fmt)
    _refused(path, fmt, name)


@pytest.mark.parametrize("name", DISPATCHING)
def test_a_dispatching_operation_is_never_a_value(name, fmt, victim):
    """Handed to another function (in a tuple a trusted function indexes, or wrapped in a partial), a dispatching
    operation could be called with anything: refused wherever it is not a node's operation."""
    X = gn.source(np.ones((2, 2)), name="X")
    fn = resolve(name)
    net = gn.node(collect, gn.node(pick, (fn, functools.partial(fn, "predict")), 0), X)
    path = gn.save(net, victim / f"net.{fmt}", format=fmt)
    _refused(path, fmt, name)


@pytest.mark.parametrize("name", [n for n in TRUSTED if isinstance(resolve(n), type)])
def test_a_trusted_class_is_not_an_operation(name, fmt, victim):
    """A class as a node's operation would be constructed with the network's values when it runs."""
    X = gn.source(np.ones((2, 2)), name="X")
    node = gn.node(pick, (0,), 0)
    object.__setattr__(node, "operation", resolve(name))   # what a crafted file holds
    try:
        path = gn.save(gn.node(collect, node, X), victim / f"cls.{fmt}", format=fmt)
    except TypeError:
        pytest.skip(f"{name} cannot be written as a value by {fmt}")
    _refused(path, fmt, name)


def test_the_issue_reproduction_is_refused_before_it_runs(fmt, victim):
    g = gn.node(apply_op, "__getattribute__", take, "__globals__")
    bad = gn.node(apply_op, "mkdir", gn.node(apply_op, "__getitem__", g, "os"), "pwned")
    out = gn.node(pick, gn.node(collect, gn.source(np.ones((2, 2)), name="X"), bad), 0)
    path = gn.save(out, victim / f"m.{fmt}", format=fmt)
    _refused(path, fmt, "gpunets.tuning.tasks.apply_op")
    assert not (victim / "pwned").exists()


def test_the_call_anything_operations_refuse_other_names_when_run():
    """Behind the loader: apply_op and combine themselves take only names from their tables."""
    from gpunets.core.ops import combine

    assert isinstance(apply_op("predict", Ridge().fit(np.eye(2), [0.0, 1.0]), np.eye(2)), np.ndarray)
    with pytest.raises(ValueError, match="'__getattribute__' is not a machine operation"):
        apply_op("__getattribute__", take, "__globals__")
    with pytest.raises(ValueError, match="'_backend' is not a kernel"):
        combine("_backend", np.ones(2))


def test_a_scorer_calls_only_an_operation_by_name(victim):
    from sklearn.metrics import make_scorer, r2_score

    pytest.importorskip("skops")
    X, y = np.random.default_rng(0).normal(size=(30, 2)), np.arange(30.0)
    search = gn.GridSearchCV(Ridge(), {"alpha": [1.0, 2.0]}, cv=2, scoring=make_scorer(r2_score)).fit(X, y)
    search.scorer_._response_method = "__reduce_ex__"
    for fmt in ("pickle", "skops"):
        path = gn.save(search, victim / f"s.{fmt}", format=fmt)
        _refused(path, fmt, "response_method='__reduce_ex__'")


# ----------------------------------------------------------------- side effects while loading (item 2)


def test_numpy_memmap_never_loads_and_never_zero_fills(fmt, victim, tmp_path):
    target = str(victim / "victim.txt")
    if fmt == "pickle":
        payload = pickle.dumps(Archive(_Call(np.memmap, (target, np.uint8, "w+", 0, (1400,))), []))
    else:
        payload = _skops_call("numpy", "memmap", (target, "uint8", "w+"))
    path = _write(tmp_path / f"mm.{fmt}", fmt, payload)
    _refused(path, fmt, "numpy.memmap")
    assert (victim / "victim.txt").read_bytes().startswith(b"precious")


@pytest.mark.parametrize("loader", ["ConstructorFromReduceNode", "ObjectNode"])
def test_a_store_is_never_opened_by_a_file(fmt, loader, victim, tmp_path):
    folder = str(victim / "made-by-the-file")
    if fmt == "pickle":
        from gpunets.devices.store import Store

        payload = pickle.dumps(Archive(_Call(Store, (folder,)), []))
    else:
        payload = _skops_call("gpunets.devices.store", "Store", (folder,), loader=loader)
    path = _write(tmp_path / f"store.{fmt}", fmt, payload)
    _refused(path, fmt, "gpunets.devices.store.Store")
    assert not os.path.exists(folder)


def test_a_file_never_chooses_where_a_result_is_stored(fmt, victim, tmp_path):
    """A search's task that writes its result into the store in force (Keeping), or a Stage carrying the store key
    its values go under, would let a file write entries of its choosing into the caller's store."""
    from gpunets.tuning.stored import Keeping
    from gpunets.tuning.tasks import Stage

    X = gn.source(np.ones((2, 2)), name="X")
    forged = Stage(np.ones((2, 2)), np.ones((2, 2)), None, (0.0,), b"a key the file chose")
    for culprit, net in (("gpunets.tuning.stored.Keeping", gn.node(Keeping(pick, b"k" * 32), ({"x": 1},), 0)),
                         ("gpunets.tuning.tasks.Stage", gn.node(collect, gn.node(pick, (forged,), 0), X))):
        path = gn.save(net, victim / f"keep.{fmt}", format=fmt)
        _refused(path, fmt, culprit)


def test_a_store_is_not_saved(tmp_path):
    est = Ridge().fit(np.eye(2), [0.0, 1.0])
    est.store_ = gn.Store(tmp_path / "s")
    with pytest.raises(TypeError, match=r"a store of fitted states is a folder of this machine.*gn.config\(store="):
        gn.save(est, tmp_path / "e.gn")
    assert not (tmp_path / "e.gn").exists()


@pytest.mark.parametrize(("module", "qualname"), [("gpunets.core.ops", "os.mkdir"),
                                                   ("gpunets.persistence.persist", "zipfile.ZipFile"),
                                                   ("gpunets.core.ops", "partial.__call__")])
def test_a_name_is_judged_as_what_it_refers_to(module, qualname, victim, tmp_path):
    """A class or function imported into one of gpunets' modules is not gpunets' (no trust by alias)."""
    payload = (b"\x80\x04\x8c" + bytes([len(module)]) + module.encode() + b"\x94\x8c" + bytes([len(qualname)])
               + qualname.encode() + b"\x94\x93\x94\x8c\x06pwned!\x85R.")
    path = _write(tmp_path / "alias.pickle", "pickle", payload)
    before = _snapshot(tmp_path)
    with pytest.raises((gn.PersistenceError, gn.UntrustedTypesError)) as info:
        gn.load(path, trusted=[])
    assert f"{module}.{qualname}" in str(info.value)
    assert _snapshot(tmp_path) == before
    assert not (victim / "pwned!").exists()


@pytest.mark.parametrize("name", ["numpy.savez", "numpy.fromfile", "numpy.lib.format.open_memmap"])
def test_a_file_touching_function_stays_refused_when_trusted_by_name(name, fmt, victim, tmp_path):
    obj = resolve(name)
    if fmt == "pickle":
        payload = pickle.dumps(Archive(obj, []))
    else:
        payload = _skops_call(name.rsplit(".", 1)[0], name.rsplit(".", 1)[1], (), loader="FunctionNode")
    path = _write(tmp_path / f"fn.{fmt}", fmt, payload)
    with pytest.raises(gn.PersistenceError, match="never loaded"):
        gn.load(path, trusted=[name])


def test_a_pickle_never_alters_a_class_or_function(victim, tmp_path):
    """BUILD on a global would set attributes of a class for the whole process (Ridge.predict = ...)."""
    payload = b"csklearn.linear_model._ridge\nRidge\n(N}(Vpredict\nI1\nutb."
    path = _write(tmp_path / "patch.pickle", "pickle", payload)
    _refused(path, "pickle", "sklearn.linear_model._ridge.Ridge")
    assert callable(Ridge.predict)


def test_items_go_only_into_containers_the_file_built(victim, tmp_path):
    """APPENDS/SETITEMS on another object would call its methods: refused."""
    payload = b"cgpunets.core.ops\ncombine\n(I1\ne."
    path = _write(tmp_path / "append.pickle", "pickle", payload)
    _refused(path, "pickle", "gpunets.core.ops.combine")


# ----------------------------------------------------------------- what keeps these rules true


def _calls_what_it_is_given(fn):
    """Whether a function's own code calls one of its parameters, or ``getattr`` with a computed name."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(fn))))
    except (OSError, TypeError):
        return False
    params = set(inspect.signature(fn).parameters)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id in params:
                return True
            if (isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) >= 2
                    and not isinstance(node.args[1], ast.Constant)):
                return True
    return False


@pytest.mark.parametrize("name", [n for n in TRUSTED if n.startswith("gpunets.") and not isinstance(resolve(n), type)])
def test_a_trusted_function_that_calls_what_it_is_given_declares_it(name):
    """A new trusted function that calls a parameter or looks a name up must declare it (saved_operation(checked=)),
    so that gn.load checks what a file gives it."""
    fn = resolve(name)
    if _calls_what_it_is_given(fn):
        assert checked_arguments(fn), f"{name} calls what it is given: declare it with saved_operation(checked=...)"


#: gpunets' trusted classes that define how they are built or filled (run while a file loads): each read and
#: found to build data only.  A new one fails the test below until it is read and added here.
AUDITED = {
    "gpunets.core.nodes.AbstractNode.__setstate__": "sets the slots it is given, and a new identity",
    "gpunets.core.machines.Machine.__setstate__": "updates __dict__, and a new identity",
    "gpunets.compose._composite_state.NetworkState.__setstate__": "updates __dict__, keys names by machine",
    "gpunets.tuning.failed.Failed.__setstate__": "updates __dict__, unwraps the error it holds",
}


@pytest.mark.parametrize("name", GPUNETS_CLASSES)
def test_a_trusted_class_builds_data_only(name):
    cls = resolve(name)
    assert any(cls.__module__ == p or cls.__module__.startswith(p + ".") for p in GPUNETS_DATA_PACKAGES)
    for klass in cls.__mro__:
        if not klass.__module__.startswith("gpunets."):
            continue
        for hook in ("__new__", "__setstate__", "__setitem__", "append", "extend"):
            if hook == "__new__" and issubclass(klass, tuple) and hasattr(klass, "_fields"):
                continue   # a named tuple's generated __new__: builds the tuple
            if hook in klass.__dict__:
                assert f"{klass.__module__}.{klass.__qualname__}.{hook}" in AUDITED, (
                    f"{klass.__qualname__}.{hook} runs while a file loads: read it, and add it to AUDITED if it "
                    f"builds data only")


# ----------------------------------------------------------------- networks gpunets makes still load


def test_gpunets_own_networks_still_load_on_both_formats(executor, fmt, victim):
    X, y = np.random.default_rng(1).normal(size=(40, 3)), np.arange(40.0)
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    W = gn.machine(gn.from_sklearn(Ridge()), Xs, ys).predict(Xs)
    net = gn.mean(W, gn.machine(Ridge(alpha=3.0), Xs, ys).predict(Xs), weights=[0.3, 0.7])
    net.fit(executor=executor)
    path = gn.save(net, victim / f"ok.{fmt}", format=fmt)
    kw = {"trusted": []} if fmt == "pickle" else {}
    np.testing.assert_allclose(gn.load(path, **kw)(X[:5], executor=executor), net(X[:5], executor="serial"))


# ----------------------------------------------------------------- foreign files: what they are (item 15)


@pytest.mark.parametrize("kind", ["pickle", "pickle-protocol-0", "joblib", "joblib-compressed", "skops-file"])
def test_a_foreign_file_is_named_with_what_to_use(kind, tmp_path):
    est = Ridge().fit(np.eye(3), np.arange(3.0))
    path = tmp_path / "model.gn"
    if kind.startswith("pickle"):
        path.write_bytes(pickle.dumps(est, protocol=0 if kind.endswith("0") else 5))
        what, use = "a plain pickle file", "pickle.load"
    elif kind.startswith("joblib"):
        joblib = pytest.importorskip("joblib")
        joblib.dump(est, path, compress=3 if kind.endswith("compressed") else 0)
        what, use = ("zlib-compressed file", "joblib.load(path)") if kind.endswith("compressed") else (
            "a joblib file", "joblib.load(path)")
    else:
        sio = pytest.importorskip("skops.io")
        sio.dump(est, path)
        what, use = "a skops file", "skops.io.load(path, trusted="
    with pytest.raises(gn.PersistenceError, match="is foreign: it was not written by gn.save") as info:
        gn.load(path, allow_pickle=True)
    assert what in str(info.value) and use in str(info.value) and "gn.save(obj, path)" in str(info.value)


@pytest.mark.parametrize("data", ["numpy", "pandas"])
@pytest.mark.parametrize("kind", ["network", "stack", "stack-cv-ensemble", "from_sklearn-pipeline",
                                  "from_sklearn-columns", "from_sklearn-voting", "search"])
def test_every_kind_of_gpunets_file_passes_the_checks(kind, data, fmt, tmp_path):
    """The checks refuse what a crafted file tries, not what gn.save writes: a pickle loaded with trusted=[] and
    a skops file with no trust list load every kind of object gpunets makes."""
    from .test_persist_trust import _fitted, _training

    X, y = _training(data)
    obj = _fitted(kind, X, y)
    path = gn.save(obj, tmp_path / f"{kind}.{fmt}", format=fmt)
    loaded = gn.load(path, trusted=[]) if fmt == "pickle" else gn.load(path)
    Xnew = X[:5] if data == "numpy" else X.iloc[:5]
    got = loaded(Xnew) if kind == "network" else loaded.predict(Xnew)
    expected = obj(Xnew) if kind == "network" else obj.predict(Xnew)
    np.testing.assert_allclose(np.asarray(got, dtype=float), np.asarray(expected, dtype=float), rtol=1e-12)


def test_classifier_stacks_and_halving_searches_pass_the_checks(fmt, tmp_path):
    from sklearn.ensemble import VotingClassifier
    from sklearn.linear_model import LogisticRegression

    X = np.random.default_rng(2).normal(size=(60, 3))
    y = (X[:, 0] > 0).astype(int)
    objs = [gn.StackingClassifier([("a", LogisticRegression())], LogisticRegression(), cv=3).fit(X, y),
            gn.from_sklearn(VotingClassifier([("a", LogisticRegression()), ("b", LogisticRegression(C=2.0))],
                                             voting="soft")).fit(X, y),
            gn.RandomizedSearchCV(LogisticRegression(), {"C": [0.1, 1.0, 10.0]}, n_iter=2, cv=3, random_state=0,
                                  scoring=["accuracy", "roc_auc"], refit="accuracy").fit(X, y)]
    if hasattr(gn, "HalvingGridSearchCV"):
        objs.append(gn.HalvingGridSearchCV(LogisticRegression(), {"C": [0.1, 1.0, 10.0, 100.0]}, cv=3).fit(X, y))
    for i, obj in enumerate(objs):
        path = gn.save(obj, tmp_path / f"{i}.{fmt}", format=fmt)
        loaded = gn.load(path, trusted=[]) if fmt == "pickle" else gn.load(path)
        np.testing.assert_array_equal(loaded.predict(X[:7]), obj.predict(X[:7]))


def test_trusting_a_dispatching_operation_by_name_is_the_callers_choice(fmt, victim):
    """trusted=[name] opens that name unchecked (the caller's decision, not the file's); nothing else."""
    X = gn.source(np.ones((2, 2)), name="X")
    net = gn.node(collect, gn.node(apply_op, "__getattribute__", take, "__name__"), X)
    path = gn.save(net, victim / f"t.{fmt}", format=fmt)
    _refused(path, fmt, "gpunets.tuning.tasks.apply_op")
    loaded = gn.load(path, trusted=["gpunets.tuning.tasks.apply_op"])
    assert isinstance(loaded, type(net))
    with pytest.raises(gn.PersistenceError, match="never loaded"):   # what touches files stays refused
        gn.load(_write(victim / f"mm.{fmt}", fmt, pickle.dumps(Archive(_Call(np.memmap, ("x", "uint8", "w+")), []))
                       if fmt == "pickle" else _skops_call("numpy", "memmap", ("x", "uint8", "w+"))),
                trusted=["numpy.memmap"])
    assert not (victim / "x").exists()
