"""The store says what it did (issue 35, items 10 and 13).

* A loaded step whose ``fit_transform`` differs from its ``transform`` (PCA's last bits, TargetEncoder's
  cross-fitting) is fitted again, on a copy, for its training output: that fit runs, and the search's report
  and trace count it; ``gn.Store(path, outputs=True)`` keeps such outputs, so a widened search fits only its
  new candidates, bit for bit as a cold one; without the opt-in no value derived from training rows is stored.
* ``verbose=1`` says how many (candidate, fold) fits run and how many results the store gives; the report
  never counts loaded steps as fits; a DataFrame / ColumnTransformer search stores and loads its refit.
"""

import glob
import os
import sys
import uuid

import numpy as np
import pandas as pd
import pytest
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.compose import ColumnTransformer
from sklearn.linear_model import Ridge
from sklearn.model_selection import KFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

import gpunets as gn

try:   # the Dask workers cannot import this module: its classes travel by value
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
except ImportError:  # pragma: no cover - no Dask here
    pass


class Differ(TransformerMixin, BaseEstimator):
    """A scaling whose ``fit_transform`` differs from its ``transform`` in the last bits (as PCA's may), and
    that leaves a file in ``marks`` per fit (fits are counted in every process, Dask workers included)."""

    def __init__(self, marks=None):
        self.marks = marks

    def fit(self, X, y=None):
        if self.marks is not None:
            open(os.path.join(self.marks, f"fit-{uuid.uuid4().hex}"), "w").close()
        self.scale_ = np.std(np.asarray(X), axis=0) + 1.0
        return self

    def transform(self, X):
        return np.asarray(X) / self.scale_

    def fit_transform(self, X, y=None):
        return self.fit(X, y).transform(X) * (1.0 + 2.0 ** -50)


def _fits(marks):
    return len(glob.glob(os.path.join(marks, "fit-*")))


def _data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(240, 6))
    return X, X @ rng.normal(size=6) + rng.normal(size=240)


def _search(marks, alphas, **kw):
    pipe = make_pipeline(StandardScaler(), Differ(marks), Ridge())
    return gn.GridSearchCV(pipe, {"ridge__alpha": alphas}, cv=3, **kw)


@pytest.fixture
def marks(tmp_path):
    path = tmp_path / "marks"
    path.mkdir()
    return str(path)


def _same_results(a, b, n):
    for k in ("mean_test_score", "split0_test_score", "split1_test_score", "split2_test_score"):
        np.testing.assert_array_equal(a.cv_results_[k][:n], b.cv_results_[k][:n])


def test_a_fit_run_again_for_its_training_output_is_counted(gn_executor, tmp_path, marks):
    X, y = _data()
    cold = _search(None, [0.1, 10.0, 1.0]).fit(X, y)
    with gn.config(store=gn.Store(tmp_path / "s")):
        _search(marks, [0.1, 10.0]).fit(X, y)
        before = _fits(marks)
        wide = _search(marks, [0.1, 10.0, 1.0]).fit(X, y)
    ran = _fits(marks) - before - 1   # the refit (alpha=1.0 is best) loads the scaler and the Differ: fits it again
    r = wide.search_report_
    assert ran == 3                          # each fold's Differ, loaded, fitted again for its output
    assert r.loaded == {"standardscaler": 3, "differ": 3} and r.stored == 6
    assert r.again == {"differ": 3} and r.fits == {"standardscaler": 0, "differ": 3, "ridge": 3}
    assert r.fitted == 3 + 3 and r.refit_again == 1
    if r.ran is not None:                    # read from the trace: the fit tasks, less loads, plus fits again
        assert r.ran == r.fits
        again = [rec for rec in r.trace.nested if "fit_transform again" in rec.label]
        assert len(again) == 3 and all(rec.parent == "fit differ" for rec in again)
    assert "3 of them fitted again for their training output" in repr(r)
    _same_results(wide, cold, 3)


def test_a_store_keeping_outputs_fits_only_the_new_candidates(gn_executor, tmp_path, marks):
    X, y = _data()
    cold = _search(None, [0.1, 10.0, 1.0]).fit(X, y)
    with gn.config(store=gn.Store(tmp_path / "s", outputs=True)):
        _search(marks, [0.1, 10.0]).fit(X, y)
        before = _fits(marks)
        wide = _search(marks, [0.1, 10.0, 1.0]).fit(X, y)
    r = wide.search_report_
    assert _fits(marks) == before            # no Differ fitted again: its outputs were kept, refit's too
    assert r.again == {} and r.outputs == 3 and r.refit_again == 0
    assert r.fits == {"standardscaler": 0, "differ": 0, "ridge": 3} and r.fitted == 3
    _same_results(wide, cold, 3)
    np.testing.assert_array_equal(wide.best_estimator_.predict(X), cold.best_estimator_.predict(X))


def _store_bytes(path):
    out = b""
    for f in glob.glob(os.path.join(path, "*", "*.gnst")):
        with open(f, "rb") as fh:
            out += fh.read()
    return out


def test_without_the_opt_in_nothing_derived_from_training_rows_is_stored(gn_executor, tmp_path):
    X, y = _data()
    train = next(KFold(3).split(X, y))[0]   # the search's folds (cv=3 on a regressor)
    Z = StandardScaler().fit_transform(X[train])
    out = Differ().fit_transform(Z)          # fold 0's Differ output, its first row as the store would hold it
    row = np.ascontiguousarray(out[0]).tobytes()
    for keep in (False, True):
        path = tmp_path / f"s{keep}"
        with gn.config(store=gn.Store(path, outputs=keep)):
            _search(None, [0.1, 1.0]).fit(X, y)
        held = _store_bytes(path)
        assert held and (row in held) is keep
        assert np.ascontiguousarray(X[train[0]]).tobytes() not in held   # the rows themselves: never


def test_verbose_says_what_is_loaded_and_what_runs(gn_executor, tmp_path, capsys):
    X, y = _data()
    with gn.config(store=gn.Store(tmp_path / "s")):
        _search(None, [0.1, 1.0], verbose=1).fit(X, y)
        assert "Fitting 3 folds for each of 2 candidates, totalling 6 fits" in capsys.readouterr().out
        again = _search(None, [0.1, 1.0], verbose=1).fit(X, y)
        said = capsys.readouterr().out
        assert "Fitting" not in said and "none to fit, 6 results loaded from the store" in said
        wide = _search(None, [0.1, 10.0, 1.0], verbose=1).fit(X, y)
        assert "totalling 9 fits: 3 to fit, 6 results loaded from the store" in capsys.readouterr().out
    text = repr(again.search_report_)
    assert "0 fits instead of 0" not in text and "nothing fitted" in text
    assert again.search_report_.results_stored == 6
    r = wide.search_report_
    assert r.fits["standardscaler"] == 0 and r.loaded["standardscaler"] == 3   # loaded steps are no fits
    assert r.fits["ridge"] == 3 and r.total == (3 + sum(r.again.values()), 3 * 3)   # naive: the 3 pairs left, 3 steps each


def _frame():
    rng = np.random.default_rng(1)
    df = pd.DataFrame({"a": rng.normal(size=150), "b": rng.normal(size=150), "c": rng.choice(list("xyz"), 150)})
    return df, df["a"] * 2.0 + rng.normal(size=150)


def _frame_search():
    ct = ColumnTransformer([("num", StandardScaler(), ["a", "b"]), ("cat", OneHotEncoder(), ["c"])])
    return gn.GridSearchCV(make_pipeline(ct, Ridge()), {"ridge__alpha": [0.1, 1.0]}, cv=3)


def test_a_dataframe_search_stores_and_loads_its_refit(gn_executor, tmp_path):
    X, y = _frame()
    with gn.config(store=gn.Store(tmp_path / "s")):
        first = _frame_search().fit(X, y)
        again = _frame_search().fit(X, y)
    assert first.search_report_.refit_stored == 0
    assert again.search_report_.refit_stored == 2   # the ColumnTransformer and the Ridge, loaded
    np.testing.assert_array_equal(again.best_estimator_.predict(X), first.best_estimator_.predict(X))
    assert list(again.feature_names_in_) == ["a", "b", "c"]


def test_a_halving_search_from_the_store_says_nothing_was_fitted(gn_executor, tmp_path):
    from sklearn.experimental import enable_halving_search_cv  # noqa: F401

    X, y = _data()

    def halving():
        return gn.HalvingGridSearchCV(make_pipeline(StandardScaler(), Ridge()),
                                      {"ridge__alpha": [0.01, 0.1, 1.0, 10.0]}, cv=3, factor=2, random_state=0)

    with gn.config(store=gn.Store(tmp_path / "s")):
        halving().fit(X, y)
        again = halving().fit(X, y)
    text = repr(again.search_report_)
    assert "0 fits instead of 0" not in text and again.search_report_.fitted == 0
    assert "rung 0: 4 candidates, nothing fitted: all 12 results loaded from the store" in text
