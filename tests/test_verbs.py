"""Learning-network verbs MLJ has (issue 14, feature 8), ported from MLJBase's behaviour:

* ``gn.node(f, mach)``: a node that receives a fitted machine (MLJ's ``node(f, mach)``);
* composites exposing report and fitted-params nodes (MLJ's ``prefit`` returning ``report=`` /
  ``fitted_params=``);
* ``gn.replace``: a copy of a network with models, machines or sources replaced (MLJ's ``replace``).

Every behavioural test runs on every executor present (the ``executor`` fixture).
"""

import copy
import pickle

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression, Ridge
from sklearn.preprocessing import StandardScaler

import gpunets as gn
from gpunets.core.fitted_machine import FittedMachine
from gpunets.testing import assert_allclose_any


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3))
    y = X @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=60)
    return X, y


def coef_of(m):
    return m.fitted_params()["coef_"]


def linear(m, Z):
    fp = m.fitted_params()
    return Z @ fp["coef_"] + fp["intercept_"]


# --- gn.node(f, mach) ------------------------------------------------------------------------------

def test_node_of_machine_trains_the_machine(executor, data):
    X, y = data
    model = Ridge(alpha=1.0)
    mach = gn.machine(model, gn.source(X, name="X"), gn.source(y, name="y"))
    coef = gn.node(coef_of, mach, name="coef")
    assert coef.machines == (mach,)
    assert coef.fit().actions.by_label() == {"Ridge": "train"}
    assert_allclose_any(coef(), Ridge(alpha=1.0).fit(X, y).coef_)
    assert coef.fit().actions.by_label() == {"Ridge": "skip"}
    model.alpha = 30.0
    assert coef.fit().actions.by_label() == {"Ridge": "update"}
    assert_allclose_any(coef(), Ridge(alpha=30.0).fit(X, y).coef_)


def test_node_of_machine_untrained_names_the_machine(data):
    X, y = data
    mach = gn.machine(Ridge(), X, y, name="ridge")
    coef = gn.node(coef_of, mach)
    with pytest.raises(gn.NotFittedError, match=r"Machine ridge is not trained.*machine\(ridge\)"):
        coef()


def test_node_of_machine_with_node_arguments(executor, data):
    X, y = data
    Xs = gn.source(X, name="X")
    mach = gn.machine(LinearRegression(), Xs, gn.source(y, name="y"))
    by_hand = gn.node(linear, mach, Xs)
    assert [s.name for s in by_hand.origins] == ["X"]
    by_hand.fit()
    assert_allclose_any(by_hand(), mach.predict(Xs)())
    Xnew = X[:5] + 1.0
    assert_allclose_any(by_hand(Xnew), LinearRegression().fit(X, y).predict(Xnew))


def test_node_of_machine_feeds_a_machine_downstream(executor, data):
    X, y = data
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    first = gn.machine(Ridge(alpha=1.0), Xs, ys, name="first")
    score = gn.node(lambda m, Z: linear(m, Z)[:, None], first, Xs)
    second = gn.machine(LinearRegression(), score, ys, name="second")
    yhat = second.predict(score)
    assert yhat.fit().actions.by_label() == {"first": "train", "second": "train"}
    s = Ridge(alpha=1.0).fit(X, y).predict(X)[:, None]
    assert_allclose_any(yhat(), LinearRegression().fit(s, y).predict(s))
    first.model.alpha = 50.0     # the machine behind the function node changed: what it feeds retrains
    assert yhat.fit().actions.by_label() == {"first": "update", "second": "train"}
    assert yhat.fit().actions.by_label() == {"first": "skip", "second": "skip"}


def test_function_receives_a_snapshot_without_training_data(executor):
    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(20_000, 4)), rng.normal(size=20_000)
    mach = gn.machine(Ridge(), X, y, name="big")
    view = gn.node(lambda m: m, mach)
    view.fit()
    fm = view()
    assert isinstance(fm, FittedMachine) and fm.is_fitted
    assert fm.label == "big" and fm.report()["action"] == "train" and fm.report()["n_rows"] == 20_000
    assert_allclose_any(fm.fitted_params()["coef_"], mach.fitted_params()["coef_"])
    assert len(pickle.dumps(fm)) < X.nbytes / 100    # no data travels with it (what a dask worker receives)
    # inside a fit (the machine trains in the same run), the function sees the fit's own result
    mach.model.alpha = 7.0
    both = gn.node(lambda m, Z: (m.report()["action"], float(m.model.alpha)), mach, gn.source(np.ones(1)))
    both.fit()
    assert both() == ("update", 7.0)


def test_fitted_params_follow_the_function_to_its_device(executor, data):
    """A machine trained on the CPU, a function placed on a (fake) GPU: the coefficients it reads are there."""
    import os

    from gpunets.devices.data import device_of
    from gpunets.testing import fake_gpu

    if getattr(executor, "name", "") == "dask" and os.environ.get("GPUNETS_FAKE_GPU") is None:
        pytest.skip("dask workers see the fake GPU only through the environment (the fake-GPU lane)")
    X, y = data
    with fake_gpu(1):
        mach = gn.machine(LinearRegression(), X, y, device="cpu")
        W = gn.node(lambda a: a, mach.args[0], device="cuda")
        on_gpu = gn.node(linear, mach, W, device="cuda")
        where = gn.node(lambda m: str(device_of(m.fitted_params()["coef_"])), mach, device="cuda")
        gn.fit(on_gpu, where)
        assert where() == "cuda:0" and str(device_of(on_gpu(output="device"))) == "cuda:0"
        assert_allclose_any(on_gpu(), LinearRegression().fit(X, y).predict(X))
        assert str(device_of(gn.node(coef_of, mach)())) == "cpu"     # on the machine's device: as it is


def test_node_with_several_machines_and_constants(executor, data):
    X, y = data
    a = gn.machine(Ridge(alpha=1.0), X, y, name="a")
    b = gn.machine(Ridge(alpha=100.0), X, y, name="b")
    gap = gn.node(lambda ma, k, mb: k * (coef_of(ma) - coef_of(mb)), a, 2.0, b)
    assert gap.fit().actions.by_label() == {"a": "train", "b": "train"}
    expected = 2.0 * (Ridge(alpha=1.0).fit(X, y).coef_ - Ridge(alpha=100.0).fit(X, y).coef_)
    assert_allclose_any(gap(), expected)


# --- composites with report and fitted-params nodes ------------------------------------------------------

def mean_residual(p, t):
    return float(np.mean(t - p))


class Reporting(gn.CompositeRegressor):
    def __init__(self, model=None, probe=None, executor="auto"):
        self.model, self.probe, self.executor = model, probe, executor

    def network(self, X, y):
        m = gn.machine(self.model if self.model is not None else Ridge(), X, y)
        out = {"predict": m.predict(X),
               "fitted_params": {"coef": gn.node(coef_of, m)},
               "report": {"n_train": gn.node(len, X), "residual": gn.node(mean_residual, m.predict(X), y)}}
        if self.probe is not None:     # a machine only the report needs: fitting the composite trains it
            p = gn.machine(self.probe, X, y)
            out["report"]["probe_coef"] = gn.node(coef_of, p)
        return out


def test_composite_report_and_fitted_params_nodes(executor, data):
    X, y = data
    comp = Reporting(model=Ridge(alpha=2.0), executor=executor).fit(X, y)
    assert_allclose_any(comp.fitted_params_["coef"], Ridge(alpha=2.0).fit(X, y).coef_)
    assert set(comp.fitted_params_) == {"model", "coef"}
    assert set(comp.report_) == {"model", "n_train", "residual"}
    assert comp.report_["n_train"] == 60 and comp.report_["model"]["action"] == "train"
    assert_allclose_any(comp.report_["residual"], np.mean(y - comp.predict(X)), atol=1e-12)   # ~0: not relative
    comp.set_params(model__alpha=20.0).fit(X, y)    # refit: the values follow the new fit
    assert comp.fit_report_.actions.by_label() == {"model": "update"}
    assert_allclose_any(comp.fitted_params_["coef"], Ridge(alpha=20.0).fit(X, y).coef_)


def test_composite_report_node_trains_what_it_needs(executor, data):
    X, y = data
    comp = Reporting(model=Ridge(), probe=LinearRegression(), executor=executor).fit(X, y)
    assert comp.fit_report_.actions.by_label() == {"model": "train", "probe": "train"}
    assert_allclose_any(comp.report_["probe_coef"], LinearRegression().fit(X, y).coef_)
    assert comp.report_["probe"]["action"] == "train"


def test_composite_extras_in_an_outer_network(executor, data):
    X, y = data
    outer = gn.machine(Reporting(model=Ridge(alpha=3.0)), X, y, name="outer")
    yhat = outer.predict()
    yhat.fit()
    components = gn.report(yhat)["outer"]["components"]
    assert components["n_train"] == 60
    assert_allclose_any(gn.fitted_params(yhat)["outer"]["components"]["coef"], Ridge(alpha=3.0).fit(X, y).coef_)
    coef = gn.node(lambda m: m.fitted_params()["components"]["coef"], outer)
    assert_allclose_any(coef(), Ridge(alpha=3.0).fit(X, y).coef_)


def test_fitted_composite_copies_keep_their_reports(data):
    X, y = data
    comp = Reporting(model=Ridge(alpha=3.0)).fit(X, y)
    for cp in (pickle.loads(pickle.dumps(comp)), copy.deepcopy(comp)):   # what a dask worker sends back
        assert set(cp.report_) == set(comp.report_) and cp.report_["model"]["action"] == "train"
        assert_allclose_any(cp.fitted_params_["coef"], comp.fitted_params_["coef"])
        assert_allclose_any(cp.predict(X[:4]), comp.predict(X[:4]))


class ByHand(gn.CompositeRegressor):
    """Predicts with the learned coefficients through a function node (the machine passed to it)."""

    def __init__(self, model=None):
        self.model = model

    def network(self, X, y):
        return gn.node(linear, gn.machine(self.model if self.model is not None else Ridge(), X, y), X)


def test_search_over_a_composite_with_a_node_of_machine(executor, data):
    from sklearn.model_selection import GridSearchCV

    X, y = data
    grid = {"model__alpha": [0.1, 10.0, 300.0]}
    ours = gn.GridSearchCV(ByHand(Ridge()), grid, cv=3, executor=executor).fit(X, y)
    theirs = GridSearchCV(Ridge(), {"alpha": grid["model__alpha"]}, cv=3).fit(X, y)
    assert_allclose_any(ours.cv_results_["mean_test_score"], theirs.cv_results_["mean_test_score"])
    assert_allclose_any(ours.predict(X[:5]), theirs.predict(X[:5]))


def _fails_on_big_alpha(fm):
    if fm.model.alpha > 100:
        raise ValueError("alpha too big for this report")
    return fm.model.alpha


class Fragile(gn.CompositeRegressor):
    def __init__(self, model=None):
        self.model = model

    def network(self, X, y):
        m = gn.machine(self.model, X, y)
        return {"predict": m.predict(X), "report": {"alpha": gn.node(_fails_on_big_alpha, m)}}


def test_composite_report_node_failure_keeps_the_previous_fit(executor, data):
    X, y = data
    comp = Fragile(Ridge(alpha=1.0)).fit(X, y)
    before = comp.predict(X[:3])
    with pytest.raises(gn.EvaluationError, match="alpha too big"):
        comp.set_params(model__alpha=500.0).fit(X, y)
    assert comp.report_["alpha"] == 1.0                       # the fitted attributes of the last good fit
    assert_allclose_any(comp.predict(X[:3]), before)


class _Returning(gn.CompositeRegressor):
    def __init__(self, result=None):
        self.result = result

    def network(self, X, y):
        m = gn.machine(Ridge(), X, y)
        return self.result(m, X)


@pytest.mark.parametrize("result, error, match", [
    (lambda m, X: {"predict": m.predict(X), "report": [m.predict(X)]}, TypeError, r"for 'report'; expected a dict"),
    (lambda m, X: {"predict": m.predict(X), "fitted_params": {"m": m}}, TypeError,
     r"fitted_params\['m'\]; expected a gpunets node\. Hint: pass the machine to a node"),
    (lambda m, X: {"predict": m.predict(X), "report": {3: gn.node(len, X)}}, TypeError, r"name 3 in 'report'"),
    (lambda m, X: {"report": {"n": gn.node(len, X)}}, ValueError, r"returned only \['report'\].*at least one"),
    (lambda m, X: {"predict": m.predict(X), "report": {"Ridge": gn.node(len, X)}}, ValueError,
     r"report nodes named \['Ridge'\].*component names.*rename them"),
])
def test_composite_extras_bad_input(data, result, error, match):
    X, y = data
    comp = _Returning(result)
    with pytest.raises(error, match=match):
        comp.fit(X, y)
    assert not hasattr(comp, "fit_report_")      # nothing committed


# --- gn.replace ---------------------------------------------------------------------------------------

@pytest.fixture
def network(data):
    X, y = data
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    scaler, ridge = StandardScaler(), Ridge(alpha=1.0)
    scale = gn.machine(scaler, Xs, name="scale")
    W = scale.transform(Xs)
    reg = gn.machine(ridge, W, ys, name="reg")
    yhat = reg.predict(W)
    return {"X": Xs, "y": ys, "scaler": scaler, "ridge": ridge, "scale": scale, "reg": reg, "yhat": yhat}


def expected(X, y, alpha, Xtest=None):
    s = StandardScaler().fit(X)
    return Ridge(alpha=alpha).fit(s.transform(X), y).predict(s.transform(X if Xtest is None else Xtest))


def test_replace_model_shares_the_rest(executor, data, network):
    X, y = data
    n = network
    n["yhat"].fit()
    yhat2 = gn.replace(n["yhat"], {n["ridge"]: Ridge(alpha=25.0)})
    scale2, reg2 = yhat2.machines
    assert scale2 is n["scale"] and reg2 is not n["reg"] and not reg2.is_fitted
    assert reg2.name == "reg" and reg2.args == n["reg"].args                # the unchanged nodes are shared
    assert yhat2.fit().actions.by_label() == {"scale": "skip", "reg": "train"}
    assert_allclose_any(yhat2(), expected(X, y, 25.0))
    assert_allclose_any(n["yhat"](), expected(X, y, 1.0))          # the original is untouched
    assert n["yhat"].fit().actions.by_label() == {"scale": "skip", "reg": "skip"}
    assert yhat2.origins == n["yhat"].origins                           # the sources are shared


def test_replace_source_with_data(executor, data, network):
    X, y = data
    n = network
    n["yhat"].fit()
    rng = np.random.default_rng(5)
    y_new = rng.normal(size=60)
    yhat2 = gn.replace(n["yhat"], {n["y"]: y_new})
    ys2 = [s for s in yhat2.sources if s.name == "y"][0]
    assert ys2 is not n["y"] and ys2.data is y_new
    assert yhat2.fit().actions.by_label() == {"scale": "skip", "reg": "train"}
    assert_allclose_any(yhat2(), expected(X, y_new, 1.0))
    # a new source for X: everything downstream of it is new and trains on the new data
    X_new = rng.normal(size=(40, 3))
    yhat3 = gn.replace(n["yhat"], {n["X"]: gn.source(X_new, name="X"), n["y"]: y_new[:40]})
    assert not set(yhat3.machines) & {n["scale"], n["reg"]}
    assert yhat3.fit().actions.by_label() == {"scale": "train", "reg": "train"}
    assert_allclose_any(yhat3(), expected(X_new, y_new[:40], 1.0))
    assert_allclose_any(yhat3(X[:3]), expected(X_new, y_new[:40], 1.0, X[:3]))


def test_replace_machine(executor, data, network):
    X, y = data
    n = network
    W = n["reg"].args[0]
    other = gn.machine(Ridge(alpha=9.0), W, n["y"], name="other")
    yhat2 = gn.replace(n["yhat"], {n["reg"]: other})
    assert yhat2.machine is other
    assert yhat2.fit().actions.by_label() == {"scale": "train", "other": "train"}
    assert_allclose_any(yhat2(), expected(X, y, 9.0))
    assert not n["reg"].is_fitted


def test_replace_copy_unchanged_deeply(executor, data, network):
    X, y = data
    n = network
    n["yhat"].fit()
    yhat2 = gn.replace(n["yhat"], {n["ridge"]: Ridge(alpha=4.0)}, copy_unchanged=True)
    scale2, reg2 = yhat2.machines
    assert scale2 is not n["scale"] and scale2.model is not n["scaler"]
    assert not {s._uid for s in yhat2.sources} & {s._uid for s in n["yhat"].sources}
    assert scale2.is_fitted and not reg2.is_fitted
    assert yhat2.fit().actions.by_label() == {"scale": "skip", "reg": "train"}   # its copied state is valid
    assert_allclose_any(yhat2(), expected(X, y, 4.0))
    n["scaler"].with_mean = False             # the copy's model is its own
    assert yhat2.fit().actions.by_label() == {"scale": "skip", "reg": "skip"}
    assert n["yhat"].fit().actions.by_label() == {"scale": "update", "reg": "train"}
    # nothing replaced: an independent copy, trained like the original
    n["scaler"].with_mean = True
    n["yhat"].fit()
    yhat3 = gn.replace(n["yhat"], {}, copy_unchanged=True)
    assert yhat3.fit().actions.by_label() == {"scale": "skip", "reg": "skip"}
    assert_allclose_any(yhat3(), n["yhat"]())
    yhat3.machines[1].model.alpha = 50.0
    assert n["yhat"].fit().actions.by_label() == {"scale": "skip", "reg": "skip"}


def test_replace_with_node_of_machine_and_several_targets(executor, data, network):
    X, y = data
    n = network
    coef = gn.node(coef_of, n["reg"])
    outs = gn.replace({"predict": n["yhat"], "coef": coef}, [(n["ridge"], Ridge(alpha=8.0))])
    assert set(outs) == {"predict", "coef"}
    gn.fit(*outs.values())
    assert outs["coef"].args[0].machine is outs["predict"].machine      # one copy, shared by both outputs
    s = StandardScaler().fit(X)
    assert_allclose_any(outs["coef"](), Ridge(alpha=8.0).fit(s.transform(X), y).coef_)
    a, b = gn.replace((n["yhat"], coef), {})
    assert a is n["yhat"] and b is coef              # nothing replaced and nothing copied: the same nodes


def test_replace_bad_input(network):
    n = network
    with pytest.raises(ValueError, match=r"cannot be replaced: machine Ridge; source 'Z'\. What can be: "
                                         r"source 'X'; source 'y'; machine scale"):
        gn.replace(n["yhat"], {gn.machine(Ridge(), gn.source(name="Z")): n["reg"], gn.source(name="Z"): n["X"]})
    with pytest.raises(ValueError, match=r"cannot be replaced: Ridge\(\) of type Ridge\..*by identity"):
        gn.replace(n["yhat"], {Ridge(): Ridge()})
    with pytest.raises(TypeError, match=r"machine reg must be replaced by a machine; got Ridge"):
        gn.replace(n["yhat"], {n["reg"]: Ridge()})
    with pytest.raises(TypeError, match=r"the model Ridge must be replaced by a model.*It is a class"):
        gn.replace(n["yhat"], {n["ridge"]: Ridge})
    with pytest.raises(TypeError, match=r"source 'y' must be replaced by a source or by data"):
        gn.replace(n["yhat"], {n["y"]: n["yhat"]})
    with pytest.raises(TypeError, match=r"cannot be replaced: only sources, machines and models"):
        gn.replace(n["yhat"], {n["reg"].args[0]: n["X"]})
    with pytest.raises(TypeError, match=r"copy_unchanged must be True .* or False"):
        gn.replace(n["yhat"], {}, copy_unchanged="deep")
    with pytest.raises(TypeError, match=r"needs a node"):
        gn.replace(n["reg"], {})
    with pytest.raises(TypeError, match=r"replacements must be a dict"):
        gn.replace(n["yhat"], [n["ridge"], Ridge()])
    with pytest.raises(TypeError, match=r"source 'y'"):
        gn.replace(n["yhat"], {n["y"]: [1.0, 2.0]})    # data that cannot be placed, named by its source


@pytest.mark.parametrize("copy_unchanged", [False, True])
def test_replace_keeps_keyword_training_arguments_and_machine_settings(executor, data, copy_unchanged):
    """issue 23 item 3: a machine rebuilt downstream of a replacement keeps ``sample_weight=w`` as a keyword
    (not as ``y``), and its ``warm`` and ``cache`` settings; the copy trains weighted, as a network built
    by hand does."""
    from sklearn.ensemble import RandomForestRegressor

    X, y = data
    w = np.random.default_rng(3).uniform(0.1, 3.0, size=len(y))
    Xs, ys, ws = gn.source(X, name="X"), gn.source(y, name="y"), gn.source(w, name="w")
    scaler = StandardScaler()
    W = gn.machine(scaler, Xs).transform(Xs)
    forest = gn.machine(RandomForestRegressor(n_estimators=5, random_state=0), W, ys, sample_weight=ws,
                        warm=False, cache=True, name="forest")
    yhat = forest.predict(W)
    yhat.fit(executor=executor)
    copy_ = gn.replace(yhat, {scaler: StandardScaler(with_mean=False)}, copy_unchanged=copy_unchanged)
    (new,) = [m for m in copy_.machines if m.name == "forest"]
    assert new is not forest and new.fit_keywords == ("sample_weight",)
    assert (new.warm, new.cache) == (False, True)
    copy_.fit(executor=executor)
    # by hand: the same network, weighted
    hand_W = gn.machine(StandardScaler(with_mean=False), Xs).transform(Xs)
    hand = gn.machine(RandomForestRegressor(n_estimators=5, random_state=0), hand_W, ys, sample_weight=ws)
    by_hand = hand.predict(hand_W)
    by_hand.fit(executor=executor)
    assert_allclose_any(copy_(executor=executor), by_hand(executor=executor), rtol=1e-12)
