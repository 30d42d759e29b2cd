"""A fit learns from the data as it is now, and a call sees one consistent set of fitted states
(issue 12): data changed in place, failed fits, concurrent fit and call, partial new data, copies
of a network, cycles.  Every test runs on every executor present (``executor`` fixture)."""

import copy
import pickle
import threading

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LinearRegression, Ridge
from sklearn.preprocessing import StandardScaler

import gpunets as gn
from tests.helpers import Counting


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    return X, X @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=40)


def actions(report):
    return report.actions.by_label()


# --- 10. cycles -------------------------------------------------------------------------------------------

def test_a_cycle_made_by_reassigning_args_is_named_not_a_hang(executor, data):
    X, y = data
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    scale = gn.machine(StandardScaler(), Xs, name="scale")
    W = scale.transform(Xs)
    ridge = gn.machine(Ridge(), W, ys, name="ridge")
    p = ridge.predict(W)
    p.fit()
    scale.args = (gn.hstack(W, p),)    # scale now trains on its own output
    with pytest.raises(gn.CycleError, match=r"cycle: .*transform\(scale.*hstack.*transform\(scale") as e:
        p.fit()
    assert isinstance(e.value, ValueError) and "scale" in str(e.value)
    with pytest.raises(gn.CycleError):
        _ = p.machines
