"""Bad input gets a clear error, raised before anything is trained; nothing trained is lost."""

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression, Ridge
from sklearn.preprocessing import StandardScaler

import gpunets as gn
from tests.helpers import Counting, NoFit


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(40, 3)), rng.normal(size=40)


def test_untrained_machine_raises_not_fitted(data):
    X, y = data
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    m = gn.machine(Ridge(), Xs, ys)
    p = m.predict(Xs)
    with pytest.raises(gn.NotFittedError, match=r"Machine Ridge is not trained.*fit\(\)") as e:
        p()
    assert isinstance(e.value, ValueError) and isinstance(e.value, AttributeError)
    with pytest.raises(gn.NotFittedError, match="Ridge"):
        _ = m.estimator_


def test_several_origins_positional_call_names_origins(data):
    X, y = data
    a, b = gn.source(X, name="X"), gn.source(X, name="Z")
    n = a + b
    with pytest.raises(ValueError, match=r"2 origins \(\['X', 'Z'\]\).*node\(X=\.\.\., Z=\.\.\.\)"):
        n(X)
    np.testing.assert_allclose(n(X=X, Z=2 * X), 3 * X)


def test_unknown_source_name_lists_valid_names(data):
    X, y = data
    a, b = gn.source(X, name="X"), gn.source(X, name="Z")
    with pytest.raises(ValueError, match=r"no origin named 'W'.*Valid names are: \['X', 'Z'\]"):
        (a + b)(W=X)


def test_training_only_source_name_is_explained(data):
    X, y = data
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    p = gn.machine(Ridge(), Xs, ys).predict(Xs)
    p.fit()
    with pytest.raises(ValueError, match=r"'y' is upstream only through a machine's training data"):
        p(y=y)


def test_model_without_fit_is_a_type_error(data):
    X, y = data
    with pytest.raises(TypeError, match=r"needs a model with a fit method.*NoFit"):
        gn.machine(NoFit(), X)
    with pytest.raises(TypeError, match=r"It is a class: pass an instance"):
        gn.machine(Ridge, X, y)


def test_argument_neither_node_nor_data(data):
    X, y = data
    with pytest.raises(TypeError, match=r"argument 1 of machine\(Ridge, \.\.\.\).*expected a node or data"):
        gn.machine(Ridge(), X, "y")
    with pytest.raises(TypeError, match=r"source 'X': cannot place a list.*Accepted: NumPy arrays"):
        gn.machine(Ridge(), [[1.0, 2.0]], y)
    with pytest.raises(TypeError, match="callable"):
        gn.node("not callable", gn.source(X))


def test_source_without_data_at_fit_time(data):
    X, y = data
    Xs, ys = gn.source(name="X"), gn.source(y, name="y")
    scale = gn.machine(StandardScaler(), gn.source(X, name="Xok"))
    m = gn.machine(Ridge(), Xs, ys)
    p = gn.node(lambda a, b: a, scale.transform(), m.predict(Xs))
    with pytest.raises(ValueError, match=r"Source 'X' has no data.*X.data = "):
        p.fit()
    assert not scale.is_fitted and not m.is_fitted  # nothing was trained


def test_rows_out_of_range_before_anything_trains(data):
    X, y = data
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    m = gn.machine(Ridge(), Xs, ys)
    m.fit()
    state = m.estimator_
    with pytest.raises(IndexError, match=r"rows out of range.*source 'X' \(40 rows\)"):
        m.fit(rows=[0, 1, 400])
    assert m.estimator_ is state
    with pytest.raises(IndexError, match="40 rows"):
        m.predict(Xs)(rows=[41])


def test_failure_mid_network_keeps_what_was_trained(executor, data):
    X, y = data
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    scale = gn.machine(StandardScaler(), Xs)
    W = scale.transform(Xs)
    ok = gn.machine(Counting(tag="mid-ok"), W, ys)
    bad_model = Counting(tag="mid-bad")
    bad = gn.machine(bad_model, gn.hstack(W, ok.predict(W)), ys)
    feature = gn.hstack(-bad.predict(gn.hstack(W, ok.predict(W))))
    last = gn.machine(LinearRegression(), feature, ys)
    out = last.predict(feature)
    out.fit()
    previous_bad = bad.estimator_
    previous_last = last.estimator_
    scale.model.with_std = False   # everything downstream of scale will retrain ...
    bad_model.fail = True          # ... and `bad` fails
    with pytest.raises(gn.FitError, match=r"Machine Counting#2 failed to fit \(ValueError: planted failure") as e:
        out.fit()
    assert isinstance(e.value, ValueError)  # still catchable as the original type
    assert isinstance(e.value.__cause__, ValueError) and "planted failure" in str(e.value.__cause__)
    assert scale.estimator_.with_std is False  # trained in that call: keeps its new state
    assert ok.report()["n_fits"] == 2
    assert bad.estimator_ is previous_bad and last.estimator_ is previous_last  # previous state kept
    bad_model.fail = False
    report = out.fit()
    assert report.actions.by_label() == {"StandardScaler": "skip", "Counting": "skip", "Counting#2": "train",
                                         "LinearRegression": "train"}


def test_estimator_error_during_evaluation_names_the_node(executor, data):
    X, y = data
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    model = Counting(tag="evalfail")
    m = gn.machine(model, Xs, ys)
    out = gn.mean(m.predict(Xs), gn.machine(Ridge(), Xs, ys).predict(Xs))
    out.fit()
    # a fitted state is never changed in place (on Dask it lives on a worker): plant the failure, refit
    m.model.fail_predict = True
    out.fit()
    with pytest.raises(gn.EvaluationError, match=r"Evaluating node predict\(Counting, X\) \(machine Counting\) "
                                                 r"failed \(RuntimeError: planted predict failure.*needed by "
                                                 r"(move predict\(Counting, X\) to cuda:0 <- )?mean") as e:
        out()
    assert isinstance(e.value, RuntimeError) and isinstance(e.value.__cause__, RuntimeError)


def test_fit_needs_targets_and_nodes():
    with pytest.raises(TypeError, match="at least one node"):
        gn.fit()
    with pytest.raises(TypeError, match="takes nodes or machines"):
        gn.fit(np.ones(3))


def test_bad_executor_and_config_values(data):
    X, y = data
    n = gn.source(X, name="X") + 1
    with pytest.raises(ValueError, match=r"executor='gpu' is not an executor.*'serial'"):
        n(executor="gpu")
    with pytest.raises(ValueError, match="fallback='maybe'"):
        gn.config(fallback="maybe")
    with pytest.raises(TypeError, match=r"Unknown gpunets setting\(s\) \['exeutor'\]"):
        gn.config(exeutor="serial")
    with pytest.raises(ValueError, match="workers=0"):
        gn.ThreadsExecutor(workers=0)
    # a bad executor in a config block is caught when the block is set up, not at the first fit
    with pytest.raises(ValueError, match=r"executor='nope' is not an executor.*ThreadsExecutor"):
        gn.config(executor="nope")
    with pytest.raises(ValueError, match="executor='nope'"):
        gn.set_config(executor="nope")
    assert gn.get_config()["executor"] == "auto"
    with pytest.raises(TypeError, match="progress=1"):
        gn.config(progress=1)
    with gn.config(executor=gn.SerialExecutor()):
        assert n(executor=None).tolist() == (X + 1).tolist()


def test_iterating_a_node_is_an_error():
    with pytest.raises(TypeError, match="cannot be iterated"):
        list(gn.source(np.ones(2), name="X"))


# --- scikit-learn habits --------------------------------------------------------------------------

def test_fit_with_data_says_where_data_goes():
    from sklearn.linear_model import Ridge

    X = gn.source(np.ones((4, 2)), name="X")
    y = gn.source(np.ones(4), name="y")
    m = gn.machine(Ridge(), X, y)
    for target in (m, m.predict(X)):
        with pytest.raises(TypeError) as e:
            target.fit(np.ones((4, 2)), np.ones(4))
        msg = str(e.value)
        assert "takes no data" in msg and "gn.source" in msg and "fit(rows=...)" in msg
        assert "X, y" in msg                        # the sources it trains on
        assert "one-dimensional" not in msg
    assert not m.is_fitted                          # nothing ran
    assert m.fit(rows=[0, 1, 2]).actions[m] == "train"


def test_several_unnamed_origins_suggest_naming_them():
    a, b = gn.source(np.ones(2)), gn.source(np.ones(2))
    with pytest.raises(gn.NetworkError) as e:
        (a + b)(np.ones(2))
    msg = str(e.value)
    assert "source=..." not in msg and "name=" in msg
    X, Z = gn.source(np.ones(2), name="X"), gn.source(np.ones(2), name="Z")
    with pytest.raises(gn.NetworkError, match=r"node\(X=\.\.\., Z=\.\.\.\)"):
        (X + Z)(np.ones(2))


# --- fallback warnings: the user's line, once, the user's estimator, and in the report ---------------

@pytest.fixture
def no_gpu(monkeypatch):
    import gpunets.devices.placement as gd

    monkeypatch.setattr(gd, "gpu_available", lambda: False)
    monkeypatch.setattr(gd, "gpu_count", lambda: 0)


def test_fallback_warning_points_at_the_callers_line_once(no_gpu):
    import warnings

    from sklearn.linear_model import Ridge

    X, y = gn.source(np.ones((6, 2)), name="X"), gn.source(np.arange(6.0), name="y")
    m = gn.machine(Ridge(), X, y, device="cuda")
    p = m.predict(X)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        rep = p.fit()
        p.fit(force=True)
        p()
    falls = [x for x in w if issubclass(x.category, gn.DeviceFallbackWarning)]
    assert len(falls) == 1                                   # once per (machine, reason)
    assert falls[0].filename == __file__                     # the user's line, not gpunets/planning/plan.py
    assert "machine Ridge" in str(falls[0].message)
    row = rep.to_frame().set_index("machine").loc["Ridge"]
    assert (row["asked"], row["device"]) == ("cuda:0", "cpu")
    assert "cpu (asked cuda:0)" in repr(rep)
    assert gn.report(p)["Ridge"]["asked"] == "cuda:0"


def test_composite_fallback_names_the_users_estimator(no_gpu):
    import warnings

    from sklearn.linear_model import LinearRegression, Ridge

    class MyStack(gn.StackingRegressor):
        pass

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(40, 3)), rng.normal(size=40)
    def fallbacks(stack):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for _ in range(2):
                stack.fit(X, y).predict(X)
        return [x for x in w if issubclass(x.category, gn.DeviceFallbackWarning)]

    falls = fallbacks(MyStack([("r", Ridge()), ("l", LinearRegression())], cv=3, device="cuda", executor="threads"))
    assert falls
    for x in falls:
        msg = str(x.message)
        assert msg.startswith("MyStack (") and "[fold" not in msg and "X_meta" not in msg
        assert x.filename == __file__
    assert len(falls) == len({str(x.message) for x in falls})   # no repeats across fits of one network
    assert {"machine r in its network", "machine l in its network"} <= {
        m for x in falls for m in ("machine r in its network", "machine l in its network") if m in str(x.message)}
    # another network (a new stack) is another owner: its machines are named again, once each
    again = fallbacks(MyStack([("r", Ridge()), ("l", LinearRegression())], cv=3, device="cuda", executor="threads"))
    assert sorted(str(x.message) for x in again) == sorted(str(x.message) for x in falls)
