"""What a store key holds (issue 35 items 4-5): every function keyed by its code wherever it sits (a scorer's
metric, a partial, a nested parameter), and by what it reads from the user's modules (constants, helpers, the
classes it names); a user's estimator class by its body.  An edit of any of them is a miss, an unchanged
module reloaded is a hit; ``gn.no_store`` opts out what a key cannot see."""

import functools
import importlib
import os
import sys
import textwrap

import numpy as np
import pytest
from sklearn.linear_model import Ridge, RidgeCV
from sklearn.metrics import make_scorer
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer

import gpunets as gn
from gpunets.devices.store_keys import stable_key

_BASE = textwrap.dedent("""
    import numpy as np
    from sklearn.base import BaseEstimator, RegressorMixin
    from sklearn.linear_model import Ridge

    SCALE = 2.0
    STATE = {"calls": 0}

    def helper(X):
        return X * SCALE

    def features(X):
        STATE["calls"] += 1
        return helper(X) + 1.0

    def metric(y_true, y_pred):
        return -np.mean((y_true - y_pred) ** 2)

    class Shrunk(RegressorMixin, BaseEstimator):
        def __init__(self, alpha=1.0):
            self.alpha = alpha

        def fit(self, X, y):
            self.model_ = Ridge(alpha=self.alpha).fit(X, y)
            return self

        def predict(self, X):
            return self.model_.predict(X) * 0.5
""")


@pytest.fixture
def user_module(tmp_path, executor):
    """A module of the user's, on disk, that a test edits: ``edit(old, new)`` rewrites it and reloads it here (and
    on Dask's workers, which import it by name)."""
    name = f"gn_user_{os.getpid()}_{abs(hash(str(tmp_path))) % 10**8}"
    path = tmp_path / f"{name}.py"
    path.write_text(_BASE)
    sys.path.insert(0, str(tmp_path))
    client = getattr(executor, "client", None)

    def run_everywhere(fn, *args):
        fn(*args)
        if client is not None:
            client.run(fn, *args)

    run_everywhere(_import, str(tmp_path), name)
    mod = sys.modules[name]

    def edit(old, new):
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new))
        st = os.stat(path)
        os.utime(path, (st.st_atime, st.st_mtime + 2))   # another mtime: the import system reads it again
        run_everywhere(_import, str(tmp_path), name)
        return sys.modules[name]

    mod.edit = edit
    yield mod
    sys.path.remove(str(tmp_path))
    run_everywhere(_forget, name)


def _import(folder, name):
    if folder not in sys.path:
        sys.path.insert(0, folder)
    importlib.invalidate_caches()
    if name in sys.modules:
        importlib.reload(sys.modules[name])
    else:
        importlib.import_module(name)


def _forget(name):
    sys.modules.pop(name, None)


def _xy():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3))
    return X, X @ np.array([1.0, -2.0, 0.5]) + rng.normal(scale=0.1, size=60)


def _fit(est, executor):
    X, y = _xy()
    m = gn.machine(est, gn.source(X, name="X"), gn.source(y, name="y"))
    return m.fit(executor=executor).actions[m]


@pytest.fixture
def store(tmp_path):
    with gn.config(store=gn.Store(tmp_path / "store")):
        yield


def _transformer(mod):
    return make_pipeline(FunctionTransformer(mod.features), Ridge())


# --- item 5: what a function reads ---------------------------------------------------------------------

def test_an_edited_module_constant_is_a_miss(user_module, store, executor):
    assert _fit(_transformer(user_module), executor) == "train"
    mod = user_module.edit("SCALE = 2.0", "SCALE = 2.0")   # reloaded, unchanged: the same key
    assert _fit(_transformer(mod), executor) == "stored"
    mod = mod.edit("SCALE = 2.0", "SCALE = 3.0")
    assert _fit(_transformer(mod), executor) == "train"
    mod.SCALE = 2.0   # set back at run time: the key is what the function reads now
    assert _fit(_transformer(mod), executor) == "stored"


def test_an_edited_helper_is_a_miss(user_module, store, executor):
    assert _fit(_transformer(user_module), executor) == "train"
    mod = user_module.edit("return X * SCALE", "return X * SCALE - 1.0")
    assert _fit(_transformer(mod), executor) == "train"
    assert _fit(_transformer(mod), executor) == "stored"


def test_an_edited_estimator_class_is_a_miss(user_module, store, executor):
    assert _fit(user_module.Shrunk(alpha=0.5), executor) == "train"
    assert _fit(user_module.Shrunk(alpha=0.5), executor) == "stored"
    mod = user_module.edit("* 0.5", "* 0.25")
    assert _fit(mod.Shrunk(alpha=0.5), executor) == "train"


def test_a_mutable_object_read_is_not_in_the_key_and_no_store_opts_out(user_module, store, executor):
    assert _fit(_transformer(user_module), executor) == "train"
    user_module.STATE["calls"] = 100      # a counter: what a dict holds at run time is not in the key
    assert _fit(_transformer(user_module), executor) == "stored"
    gn.no_store(user_module.features)     # code whose result depends on such state: never stored
    assert _fit(_transformer(user_module), executor) == "train"
    assert _fit(_transformer(user_module), executor) == "train"
    assert stable_key(user_module.features) is None and stable_key(_transformer(user_module)) is None
    assert _fit(gn.no_store(Ridge(alpha=3.0)), executor) == "train"
    assert _fit(gn.no_store(Ridge(alpha=3.0)), executor) == "train"


def test_no_store_refuses_what_takes_no_mark():
    with pytest.raises(TypeError, match=r"no_store\(1\).*takes no attribute.*Hint"):
        gn.no_store(1)


# --- item 4: a function keyed the same way wherever it sits ---------------------------------------------

@pytest.mark.parametrize("where", ["scoring", "dict", "partial"])
def test_an_edited_scorer_metric_is_not_served(user_module, store, executor, where):
    X, y = _xy()

    def search(mod):
        scorer = make_scorer(mod.metric if where != "partial" else functools.partial(mod.metric))
        scoring = {"m": scorer} if where == "dict" else scorer
        return gn.GridSearchCV(Ridge(), {"alpha": [0.1, 1.0]}, cv=3, scoring=scoring, refit=False,
                               executor=executor).fit(X, y)

    key = "mean_test_m" if where == "dict" else "mean_test_score"
    first = search(user_module)
    assert search(user_module).search_report_.remembered == 6
    mod = user_module.edit("return -np.mean((y_true - y_pred) ** 2)", "return -np.mean(np.abs(y_true - y_pred))")
    edited = search(mod)
    assert edited.search_report_.remembered == 0
    assert not np.allclose(edited.cv_results_[key], first.cv_results_[key])


def test_an_edited_metric_in_a_hyperparameter_is_a_miss(user_module, store, executor):
    assert _fit(RidgeCV(alphas=[0.1, 10.0], scoring=make_scorer(user_module.metric)), executor) == "train"
    assert _fit(RidgeCV(alphas=[0.1, 10.0], scoring=make_scorer(user_module.metric)), executor) == "stored"
    mod = user_module.edit("(y_true - y_pred) ** 2", "(y_true - y_pred) ** 4")
    assert _fit(RidgeCV(alphas=[0.1, 10.0], scoring=make_scorer(mod.metric)), executor) == "train"
    nested = make_pipeline(FunctionTransformer(functools.partial(mod.helper)), Ridge())
    assert _fit(nested, executor) == "train" and _fit(nested, executor) == "stored"
    mod = mod.edit("return X * SCALE", "return X * SCALE + 2.0")
    assert _fit(make_pipeline(FunctionTransformer(functools.partial(mod.helper)), Ridge()), executor) == "train"


def test_keys_hold_across_processes_for_the_same_code(user_module):
    """A key is made of code and values, not of objects' identities: the same in a new process."""
    import subprocess

    script = (f"import sys; sys.path.insert(0, {os.path.dirname(user_module.__file__)!r}); "
              f"sys.path.insert(0, {os.getcwd()!r}); "
              f"import {user_module.__name__} as m; from gpunets.devices.store_keys import stable_key; "
              "from sklearn.metrics import make_scorer; "
              "print(stable_key((m.features, m.Shrunk(), make_scorer(m.metric))).hex())")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    here = stable_key((user_module.features, user_module.Shrunk(), make_scorer(user_module.metric)))
    assert here is not None and out.stdout.strip() == here.hex()
