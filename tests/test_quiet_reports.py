"""Quiet where nothing is news (issue 35 item 14): one fallback warning per search the user wrote, and fit reports
that show the user's machines, in aligned columns."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.compose import make_column_transformer
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

import gpunets as gn
from gpunets.devices.placement import DeviceFallbackWarning

_RNG = np.random.default_rng(0)
_X = _RNG.normal(size=(60, 4))
_DF = pd.DataFrame({"a": _RNG.normal(size=60), "b": _RNG.normal(size=60), "c": _RNG.choice(["x", "y"], 60)})
_Y = (_DF["a"] > 0).astype(int).to_numpy()


@pytest.mark.parametrize("halving", [False, True], ids=["grid", "halving"])
def test_search_on_an_absent_gpu_warns_once_naming_the_search(halving, executor, no_gpu, caplog):
    pipe = make_pipeline(StandardScaler(), Ridge())
    if halving:
        search = gn.HalvingGridSearchCV(pipe, {"ridge__alpha": [0.1, 1.0, 10.0]}, cv=3, device="cuda",
                                        random_state=0)
    else:
        search = gn.GridSearchCV(pipe, {"ridge__alpha": [0.1, 1.0]}, cv=5, device="cuda")
    with warnings.catch_warnings(record=True) as seen, caplog.at_level(logging.WARNING, logger="gpunets"):
        warnings.simplefilter("always")
        search.fit(_X, _X[:, 0])
        search.fit(_X, _X[:, 0])   # the same search again: nothing new to say
    fallbacks = [str(w.message) for w in seen if issubclass(w.category, DeviceFallbackWarning)]
    name = type(search).__name__
    assert len(fallbacks) == 1, fallbacks   # before: 5 naming internal nodes (take(X, ...)), plus 10 log lines
    assert fallbacks[0].startswith(f"{name}(device='cuda') (its steps StandardScaler, Ridge) is placed on cuda")
    assert "take(" not in fallbacks[0]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert search.predict(_X[:3]).shape == (3,)


def test_search_on_an_absent_gpu_still_raises_when_asked(executor, no_gpu):
    search = gn.GridSearchCV(Ridge(), {"alpha": [0.1, 1.0]}, cv=3, device="cuda")
    with gn.config(fallback="raise"), pytest.raises(gn.DeviceUnavailableError):
        search.fit(_X, _X[:, 0])


def test_fit_report_shows_the_users_machines_in_aligned_columns(executor):
    pipe = make_pipeline(make_column_transformer((StandardScaler(), ["a", "b"]), (OneHotEncoder(), ["c"])),
                         LogisticRegression())
    model = gn.from_sklearn(pipe, executor=executor).fit(_DF, _Y)
    text = repr(model.fit_report_)
    lines = text.splitlines()
    assert "<stack>" not in text
    assert lines[0].startswith("FitReport (") and ", 3 machines," in lines[0]
    assert "  (and 1 internal helper machine of the network: rows() lists them)" in lines
    table = lines[1:5]   # the header and the user's 3 machines (then the routes and GPU lines, on a GPU)
    assert [ln.split()[0] for ln in table[1:]] == ["columntransformer__standardscaler",
                                                   "columntransformer__onehotencoder", "logisticregression"]
    for col in ("action", "device", "lane"):   # every row's cell starts under its header
        at = table[0].index(col)
        assert all(ln[at - 1] == " " and ln[at] != " " for ln in table[1:]), (col, text)
    assert len(model.fit_report_.rows()) == 4   # the data keep every machine
    assert "&lt;stack&gt;" not in model.fit_report_._repr_html_()


def test_stack_fit_report_hides_its_cv_report(executor):
    stack = gn.StackingRegressor([("ridge", Ridge()), ("ridge2", Ridge(alpha=3.0))], cv=3, executor=executor)
    stack.fit(_X, _X[:, 0])
    text = repr(stack.fit_report_)
    assert "[cv report]" not in text and "final_estimator" in text
    assert "[cv report]" in stack.fit_report_.actions.by_label()


def test_report_of_a_composite_says_where_its_report_is(executor):
    """A scikit-learn habit (report(model)) on a composite: the TypeError says model.report_ / fit_report_."""
    model = gn.from_sklearn(make_pipeline(StandardScaler(), Ridge()), executor=executor).fit(_X, _X[:, 0])
    with pytest.raises(TypeError, match=r"Hint: a composite reports on its own network: model\.report_"):
        gn.report(model)
    assert set(model.report_) == {"standardscaler", "ridge"}
