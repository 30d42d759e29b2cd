"""A converted composition fails as scikit-learn's own: its exception class and first line, then where in the
network it happened (issue 35 item 12)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.compose import ColumnTransformer
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

import gpunets as gn

_RNG = np.random.default_rng(0)
_DF = pd.DataFrame({"a": _RNG.normal(size=40), "b": _RNG.normal(size=40), "c": _RNG.choice(["x", "y"], 40)})
_Y = (_DF["a"] > 0).astype(int).to_numpy()
_X = _RNG.normal(size=(40, 3))
_XNAN = _X.copy()
_XNAN[0, 0] = np.nan


def _columns(remainder: str = "drop") -> Pipeline:
    pre = ColumnTransformer([("num", StandardScaler(), ["a"]), ("cat", OneHotEncoder(handle_unknown="error"), ["c"])],
                            remainder=remainder)
    return Pipeline([("pre", pre), ("lr", LogisticRegression())])


# (name, make the composition, fit X, fit y, the X of the failing call (None: the fit fails), the step named)
CASES = [
    ("missing column", _columns, _DF, _Y, _DF.drop(columns=["c"]), None),
    ("missing remainder column", lambda: _columns("passthrough"), _DF, _Y, _DF.drop(columns=["b"]), None),
    ("unseen category", _columns, _DF, _Y, _DF.assign(c=["z"] * 40), "pre__cat"),
    ("wrong n_features", lambda: make_pipeline(StandardScaler(), Ridge()), _X, _X[:, 0], _X[:, :2], "standardscaler"),
    ("NaN at predict", lambda: make_pipeline(StandardScaler(), Ridge()), _X, _X[:, 0], _XNAN, "ridge"),
    ("NaN at fit", lambda: make_pipeline(StandardScaler(), Ridge()), _XNAN, _X[:, 0], None, "ridge"),
]


def _raised(call):
    with pytest.raises(Exception) as info:
        call()
    return info.value


@pytest.mark.parametrize(("name", "make", "X", "y", "X_bad", "step"), CASES, ids=[c[0] for c in CASES])
def test_converted_composition_raises_sklearns_exception(name, make, X, y, X_bad, step, executor):
    sk = make()
    ours = gn.from_sklearn(make(), executor=executor)
    if X_bad is None:
        expected, got = _raised(lambda: sk.fit(X, y)), _raised(lambda: ours.fit(X, y))
        op = "fit"
    else:
        sk.fit(X, y)
        ours.fit(X, y)
        expected, got = _raised(lambda: sk.predict(X_bad)), _raised(lambda: ours.predict(X_bad))
        op = "predict"
    assert type(got) is type(expected), (name, type(got), type(expected))
    assert str(got).splitlines()[0] == str(expected).splitlines()[0]
    if step is not None:   # then where in the network it happened, by the original's names
        assert str(got).splitlines()[-1] == f"Where: step {step!r} of the converted Pipeline, in {op}."
        assert isinstance(got.__cause__, gn.GpunetsError)   # gpunets' own error, naming its nodes, is chained


@pytest.mark.parametrize(("given", "hint"), [
    ({"n_jobs": -1}, "gpunets' name for n_jobs is workers"),
    ({"n_jobs": 2}, "n_jobs=k is workers=k"),
    ({"memory": "cache"}, "gn.set_config(store="),
    ({"ridge__alpha": 2.0}, "model.set_params(ridge__alpha=...)"),
    ({"colour": "red"}, "from_sklearn takes executor=, device=, workers="),
], ids=["n_jobs=-1", "n_jobs=2", "memory", "a step's parameter", "unknown"])
def test_sklearn_habits_get_a_hint(given, hint, executor):
    """issue 35 item 15: from_sklearn(..., n_jobs=-1) says to use workers=; other habits say what to do."""
    with pytest.raises(TypeError, match="unexpected keyword argument") as info:
        gn.from_sklearn(make_pipeline(StandardScaler(), Ridge()), executor=executor, **given)
    assert hint in str(info.value)
    model = gn.from_sklearn(make_pipeline(StandardScaler(), Ridge()), executor=executor, workers=2).fit(_X, _X[:, 0])
    assert model.predict(_X).shape == (40,)
