"""Sample weights: in bare networks (a source carries them), composites and stacks; metadata routing.

Results are compared with scikit-learn given the same weights; behavioural tests run on every executor.
"""

import numpy as np
import pytest
import sklearn
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.decomposition import PCA
from sklearn.ensemble import StackingClassifier as SkStackingClassifier
from sklearn.ensemble import StackingRegressor as SkStackingRegressor
from sklearn.exceptions import UnsetMetadataPassedError
from sklearn.linear_model import LinearRegression, LogisticRegression, Ridge
from sklearn.naive_bayes import GaussianNB
from sklearn.neighbors import KNeighborsRegressor
from sklearn.preprocessing import StandardScaler
from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

import gpunets as gn

FITS: dict = {}


class WeightedCounting(RegressorMixin, BaseEstimator):
    """Weighted least squares that counts its fits (serial tests read the counts)."""

    def __init__(self, tag="w"):
        self.tag = tag

    def fit(self, X, y, sample_weight=None):
        FITS[self.tag] = FITS.get(self.tag, 0) + 1
        self.model_ = LinearRegression().fit(X, y, sample_weight=sample_weight)
        return self

    def predict(self, X):
        return self.model_.predict(X)


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3))
    y = X @ np.array([1.0, -2.0, 0.5]) + rng.normal(size=60)
    w = rng.uniform(0.1, 3.0, size=60)
    return X, y, w


# --- bare networks -----------------------------------------------------------------------------------------

def test_source_carries_weights_keyword_and_positional(data, executor):
    X, y, w = data
    Xs, ys, ws = gn.source(X, name="X"), gn.source(y, name="y"), gn.source(w, name="w")
    Z = gn.machine(StandardScaler(), Xs, sample_weight=ws).transform(Xs)
    by_kw = gn.machine(Ridge(), Z, ys, sample_weight=ws)
    by_pos = gn.machine(Ridge(), Z, ys, ws)
    assert repr(by_kw) == "<Machine Ridge(transform(StandardScaler, X), y, sample_weight=w)>"
    yk, yp = by_kw.predict(Z), by_pos.predict(Z)
    gn.fit(yk, yp)
    Zr = StandardScaler().fit(X, sample_weight=w).transform(X)
    ref = Ridge().fit(Zr, y, sample_weight=w).predict(Zr)
    np.testing.assert_allclose(yk(), ref, rtol=0, atol=1e-10)
    np.testing.assert_allclose(yp(), Ridge().fit(Zr, y, sample_weight=w).predict(Zr), rtol=0, atol=1e-10)
    unweighted = Ridge().fit(Zr, y).predict(Zr)
    assert np.abs(ref - unweighted).max() > 1e-3   # the weights matter


def test_rows_and_new_data_slice_the_weights(data, executor):
    X, y, w = data
    Xs, ys, ws = gn.source(X, name="X"), gn.source(y, name="y"), gn.source(w, name="w")
    mach = gn.machine(Ridge(), Xs, ys, sample_weight=ws)
    yhat = mach.predict(Xs)
    rows = np.arange(5, 45)
    assert yhat.fit(rows=rows).actions[mach] == "train"
    np.testing.assert_allclose(yhat(), Ridge().fit(X[rows], y[rows], sample_weight=w[rows]).predict(X),
                               rtol=0, atol=1e-10)
    # new weights alone retrain the machine
    ws.data = w[::-1].copy()
    assert yhat.fit().actions[mach] == "train"
    np.testing.assert_allclose(yhat(), Ridge().fit(X, y, sample_weight=w[::-1]).predict(X), rtol=0, atol=1e-10)
    assert yhat.fit().actions[mach] == "skip"
    # new data for every source, together
    Xs.data, ys.data, ws.data = X[:30], y[:30], w[:30]
    yhat.fit()
    np.testing.assert_allclose(yhat(), Ridge().fit(X[:30], y[:30], sample_weight=w[:30]).predict(X[:30]),
                               rtol=0, atol=1e-10)
    # new data at prediction time need no weights
    np.testing.assert_allclose(yhat(X[40:]), Ridge().fit(X[:30], y[:30], sample_weight=w[:30]).predict(X[40:]),
                               rtol=0, atol=1e-10)


def test_weights_of_the_wrong_length_fail_before_anything_trains(data):
    X, y, w = data
    Xs, ys, ws = gn.source(X, name="X"), gn.source(y, name="y"), gn.source(w[:50], name="weights")
    scaler = gn.machine(StandardScaler(), Xs)
    Z = scaler.transform(Xs)
    mach = gn.machine(Ridge(), Z, ys, sample_weight=ws)
    with pytest.raises(ValueError, match=r"machine Ridge: its sample weights 'weights' have 50 values, but its "
                                         r"training data 'X' have 60 rows"):
        mach.predict(Z).fit()
    assert not scaler.is_fitted and not mach.is_fitted
    with pytest.raises(ValueError, match="'weights' have 50 values"):   # positional weights too
        gn.machine(Ridge(), Xs, ys, ws).fit()
    with pytest.raises(ValueError, match="'weights' have 50 values, but its training data 'X' have 60 rows"):
        mach.fit(rows=np.arange(40))   # a row subset does not hide it


def test_weights_computed_by_a_node_are_checked_before_the_fit(data):
    X, y, w = data
    Xs, ys, ws = gn.source(X, name="X"), gn.source(y, name="y"), gn.source(w, name="w")
    half = gn.node(lambda v: v[:30], ws, name="half")
    mach = gn.machine(Ridge(), Xs, ys, sample_weight=half)
    with pytest.raises(ValueError, match=r"sample weights 'half' have 30 values, but its training data "
                                         r"'its first argument' have 60 rows"):
        mach.fit()
    assert not mach.is_fitted


def test_a_model_without_the_keyword_is_named_at_construction(data):
    X, y, w = data
    with pytest.raises(TypeError, match=r"PCA.fit takes no parameter 'sample_weight'.*cannot learn from sample "
                                        r"weights"):
        gn.machine(PCA(), X, sample_weight=w)
    with pytest.raises(TypeError, match=r"Ridge.fit takes no parameter 'weights'; its parameters are "
                                        r"\['X', 'y', 'sample_weight'\]"):
        gn.machine(Ridge(), X, y, weights=w)


# --- composites --------------------------------------------------------------------------------------------

class Averaged(gn.CompositeRegressor):
    def __init__(self, first=None, second=None, executor="auto"):
        self.first, self.second, self.executor = first, second, executor

    def network(self, X, y):
        Z = gn.machine(StandardScaler(), X).transform(X)
        a = gn.machine(self.first if self.first is not None else Ridge(), Z, y)
        b = gn.machine(self.second if self.second is not None else LinearRegression(), Z, y)
        return gn.mean(a.predict(Z), b.predict(Z))


class RoutesItself(gn.CompositeRegressor):
    def __init__(self, model=None):
        self.model = model

    def network(self, X, y, sample_weight=None):   # only the model gets the weights
        Z = gn.machine(StandardScaler(), X).transform(X)
        return gn.machine(self.model if self.model is not None else Ridge(), Z, y,
                          sample_weight=sample_weight).predict(Z)


class Nested(gn.CompositeRegressor):
    def __init__(self, inner=None, executor="auto"):
        self.inner, self.executor = inner, executor

    def network(self, X, y):
        return gn.machine(self.inner if self.inner is not None else Averaged(), X, y).predict(X)


def _averaged_reference(X, y, w, first=Ridge(), second=LinearRegression(), scaler_w=True):
    sc = StandardScaler().fit(X, sample_weight=w if scaler_w else None)
    Z = sc.transform(X)
    return lambda Xn: (sklearn.clone(first).fit(Z, y, sample_weight=w).predict(sc.transform(Xn))
                       + sklearn.clone(second).fit(Z, y, sample_weight=w).predict(sc.transform(Xn))) / 2


def test_composite_routes_weights_to_every_member(data, executor):
    X, y, w = data
    model = Averaged().fit(X, y, sample_weight=w)
    assert all(m.fit_keywords == ("sample_weight",) for m in model.machines_.values())
    np.testing.assert_allclose(model.predict(X[:7]), _averaged_reference(X, y, w)(X[:7]), rtol=0, atol=1e-10)
    assert set(model.fit(X, y, sample_weight=w).fit_report_.actions.by_label().values()) == {"skip"}
    model.fit(X, y, sample_weight=w[::-1].copy())   # new weights: everything retrains
    np.testing.assert_allclose(model.predict(X[:7]), _averaged_reference(X, y, w[::-1])(X[:7]), rtol=0, atol=1e-10)
    model.fit(X, y)   # no weights
    np.testing.assert_allclose(model.predict(X[:7]), Averaged().fit(X, y).predict(X[:7]), rtol=0, atol=1e-12)
    nested = Nested().fit(X, y, sample_weight=list(w))   # a composite member routes them on
    np.testing.assert_allclose(nested.predict(X[:7]), _averaged_reference(X, y, w)(X[:7]), rtol=0, atol=1e-10)


def test_a_network_that_takes_sample_weight_routes_it_itself(data, executor):
    X, y, w = data
    model = RoutesItself().fit(X, y, sample_weight=w)
    Z = StandardScaler().fit(X).transform(X)
    np.testing.assert_allclose(model.predict(X), Ridge().fit(Z, y, sample_weight=w).predict(Z), rtol=0, atol=1e-10)
    model.fit(X, y)   # sample_weight=None: the machine's keyword is left out
    np.testing.assert_allclose(model.predict(X), Ridge().fit(Z, y).predict(Z), rtol=0, atol=1e-10)


def weights_from_target(y):
    return 1.0 + np.abs(np.asarray(y))


class KeywordOnlyRidge(Ridge):
    def fit(self, X, y, *, sample_weight=None):   # weights by name only
        return super().fit(X, y, sample_weight=sample_weight)


class TargetWeighted(gn.CompositeRegressor):
    def __init__(self, alpha=1.0):
        self.alpha = alpha

    def network(self, X, y):   # weights computed in the network, from the target
        return gn.machine(KeywordOnlyRidge(alpha=self.alpha), X, y,
                          sample_weight=gn.node(weights_from_target, y)).predict(X)


def test_weights_computed_in_a_network_in_a_search(data, executor):
    from sklearn.model_selection import GridSearchCV

    X, y, _ = data
    ref = Ridge().fit(X, y, sample_weight=weights_from_target(y)).predict(X)
    np.testing.assert_allclose(TargetWeighted().fit(X, y).predict(X), ref, rtol=0, atol=1e-10)
    grid = {"alpha": [0.1, 10.0]}
    ours = gn.GridSearchCV(TargetWeighted(), grid, cv=3).fit(X, y)   # the networks inlined into one search
    theirs = GridSearchCV(TargetWeighted(), grid, cv=3).fit(X, y)
    np.testing.assert_allclose(ours.cv_results_["mean_test_score"], theirs.cv_results_["mean_test_score"],
                               rtol=0, atol=1e-10)


def test_composite_member_without_weights_is_named_before_training(data):
    X, y, w = data
    FITS.clear()
    model = Averaged(first=WeightedCounting("first"), second=KNeighborsRegressor())
    with pytest.raises(TypeError, match=r"Averaged.fit\(..., sample_weight=...\): the member 'second' "
                                        r"\(KNeighborsRegressor\) cannot take sample_weight.*nothing was trained"
                                        r".*set_fit_request"):
        model.fit(X, y, sample_weight=w)
    assert FITS == {} and not hasattr(model, "fit_report_")


def test_composite_bad_weights_and_unknown_metadata(data):
    X, y, w = data
    with pytest.raises(ValueError, match=r"Averaged.fit: sample_weight has 59 values, but X has 60 rows"):
        Averaged().fit(X, y, sample_weight=w[1:])
    with pytest.raises(ValueError, match=r"sample_weight has shape \(60, 1\)"):
        Averaged().fit(X, y, sample_weight=w[:, None])
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['groups'\].*only sample_weight is "
                                        r"routed"):
        Averaged().fit(X, y, groups=np.zeros(60))


def test_composite_metadata_routing(data, executor):
    X, y, w = data
    with sklearn.config_context(enable_metadata_routing=True):
        router = Averaged().get_metadata_routing()
        assert set(router._route_mappings) == {"StandardScaler", "Ridge", "LinearRegression"}
        with pytest.raises(UnsetMetadataPassedError, match=r"StandardScaler.fit, which is used within Averaged.fit"):
            Averaged().fit(X, y, sample_weight=w)
        first = Ridge().set_fit_request(sample_weight=True)
        second = LinearRegression().set_fit_request(sample_weight=False)
        with pytest.raises(UnsetMetadataPassedError):   # the scaler is still unset
            Averaged(first=first, second=second).fit(X, y, sample_weight=w)

        class Requested(Averaged):
            def network(self, X, y):
                Z = gn.machine(StandardScaler().set_fit_request(sample_weight=False), X).transform(X)
                a = gn.machine(self.first, Z, y)
                b = gn.machine(self.second, Z, y)
                return gn.mean(a.predict(Z), b.predict(Z))

        model = Requested(first=first, second=second).fit(X, y, sample_weight=w)
        assert set(model.get_metadata_routing()._route_mappings) == {"StandardScaler", "first", "second"}
        Z = StandardScaler().fit(X).transform(X)
        ref = (Ridge().fit(Z, y, sample_weight=w).predict(Z) + LinearRegression().fit(Z, y).predict(Z)) / 2
        np.testing.assert_allclose(model.predict(X), ref, rtol=0, atol=1e-10)
        assert model.machines_["second"].fit_keywords == ()
        # metadata nobody requested: scikit-learn's TypeError
        none = Requested(first=Ridge().set_fit_request(sample_weight=False), second=second)
        with pytest.raises(TypeError, match="not routed to any object"):
            none.fit(X, y, sample_weight=w)


# --- stacks -------------------------------------------------------------------------------------------------

def _reg_estimators():
    return [("ridge", Ridge(alpha=0.5)), ("tree", DecisionTreeRegressor(max_depth=3, random_state=0))]


def _clf_estimators():
    return [("lr", LogisticRegression()), ("nb", GaussianNB()),
            ("tree", DecisionTreeClassifier(max_depth=2, random_state=0))]


def test_stacking_regressor_weights_equal_sklearn(data, executor):
    X, y, w = data
    ours = gn.StackingRegressor(_reg_estimators(), cv=3).fit(X, y, sample_weight=w)
    theirs = SkStackingRegressor(_reg_estimators(), cv=3).fit(X, y, sample_weight=w)
    np.testing.assert_allclose(ours.predict(X), theirs.predict(X), rtol=0, atol=1e-10)
    np.testing.assert_allclose(ours.transform(X), theirs.transform(X), rtol=0, atol=1e-10)
    unweighted = SkStackingRegressor(_reg_estimators(), cv=3).fit(X, y).predict(X)
    assert np.abs(theirs.predict(X) - unweighted).max() > 1e-3
    fold = ours.machines_["ridge[fold 0]"]
    assert fold.fit_keywords == ("sample_weight",)
    assert ours.fit(X, y, sample_weight=w).fit_report_.actions["ridge"] == "skip"


@pytest.mark.parametrize("passthrough", [False, True])
def test_stacking_classifier_weights_equal_sklearn(data, executor, passthrough):
    X, _, w = data
    y = np.where(X[:, 0] + 0.5 * X[:, 1] > 0, "yes", "no")
    ours = gn.StackingClassifier(_clf_estimators(), cv=3, passthrough=passthrough).fit(X, y, sample_weight=w)
    theirs = SkStackingClassifier(_clf_estimators(), cv=3, passthrough=passthrough).fit(X, y, sample_weight=w)
    np.testing.assert_allclose(ours.predict_proba(X), theirs.predict_proba(X), rtol=0, atol=1e-10)
    assert (ours.predict(X) == theirs.predict(X)).all()


def test_stack_member_without_weights_is_named_before_training(data):
    X, y, w = data
    FITS.clear()
    ests = [("counted", WeightedCounting("counted")), ("knn", KNeighborsRegressor())]
    with pytest.raises(TypeError, match=r"StackingRegressor.fit\(..., sample_weight=...\): the member 'knn' "
                                        r"\(KNeighborsRegressor\) cannot take sample_weight"):
        gn.StackingRegressor(ests, cv=3, executor="serial").fit(X, y, sample_weight=w)
    with pytest.raises(TypeError, match="does not support sample weights"):   # scikit-learn raises too
        SkStackingRegressor([("knn", KNeighborsRegressor())], cv=3).fit(X, y, sample_weight=w)
    FITS.clear()
    with pytest.raises(TypeError, match=r"the member 'final_estimator' \(KNeighborsRegressor\)"):
        gn.StackingRegressor([("counted", WeightedCounting("counted"))], final_estimator=KNeighborsRegressor(),
                             cv=3, executor="serial").fit(X, y, sample_weight=w)
    assert FITS == {}
    with pytest.raises(ValueError, match="sample_weight has 10 values, but X has 60 rows"):
        gn.StackingRegressor(_reg_estimators(), cv=3).fit(X, y, sample_weight=w[:10])


def test_stack_metadata_routing_equals_sklearn(data, executor):
    X, y, w = data
    with sklearn.config_context(enable_metadata_routing=True):
        ests = [("ridge", Ridge(alpha=0.5).set_fit_request(sample_weight=True)),
                ("tree", DecisionTreeRegressor(max_depth=3, random_state=0).set_fit_request(sample_weight=False)),
                ("knn", KNeighborsRegressor())]   # takes no weights: nothing to request
        ours = gn.StackingRegressor(ests, cv=3)
        theirs = SkStackingRegressor(ests, cv=3)
        assert str(ours.get_metadata_routing()) == str(theirs.get_metadata_routing())
        ours.fit(X, y, sample_weight=w)
        theirs.fit(X, y, sample_weight=w)
        np.testing.assert_allclose(ours.predict(X), theirs.predict(X), rtol=0, atol=1e-10)
        assert ours.machines_["tree[fold 1]"].fit_keywords == ()
        assert ours.machines_["ridge[fold 1]"].fit_keywords == ("sample_weight",)
        unset = [("ridge", Ridge()), ("tree", DecisionTreeRegressor(random_state=0))]
        for cls in (gn.StackingRegressor, SkStackingRegressor):
            with pytest.raises(UnsetMetadataPassedError, match="Ridge.fit, which is used within StackingRegressor"):
                cls(unset, cv=3).fit(X, y, sample_weight=w)


class GroupAware(RegressorMixin, BaseEstimator):
    """Remembers the metadata its fit got."""

    def fit(self, X, y, groups=None):
        self.groups_ = None if groups is None else np.asarray(groups).copy()
        self.mean_ = float(np.mean(y))
        return self

    def predict(self, X):
        return np.full(len(X), self.mean_)


class OneModel(gn.CompositeRegressor):
    def __init__(self, model=None):
        self.model = model

    def network(self, X, y):
        return gn.machine(self.model, X, y).predict(X)


def test_routing_carries_any_requested_metadata(data):
    X, y, _ = data
    groups = list(np.arange(60) % 4)
    with pytest.raises(TypeError, match=r"\['groups'\].*only sample_weight is routed"):
        OneModel(GroupAware()).fit(X, y, groups=groups)
    with sklearn.config_context(enable_metadata_routing=True):
        model = OneModel(GroupAware().set_fit_request(groups=True)).fit(X, y, groups=groups)
        np.testing.assert_array_equal(model.machines_["model"].estimator_.groups_, groups)
        with pytest.raises(TypeError, match=r"StackingRegressor routes only \['sample_weight'\]"):
            gn.StackingRegressor([("g", GroupAware().set_fit_request(groups=True))], cv=3).fit(X, y, groups=groups)


class NoWeightsTwin(RegressorMixin, BaseEstimator):
    """Stands for a cuML twin whose fit takes no sample_weight (cuML's random forests)."""

    def fit(self, X, y):
        raise AssertionError("the twin must not be fitted with weights it cannot take")


def test_a_gpu_twin_without_the_keyword_falls_back_to_the_cpu(data, monkeypatch, caplog):
    import logging

    import gpunets.planning.placement as plan   # where a fit's route is resolved
    from gpunets.compute.models import Resolved
    from gpunets.testing import fake_gpu

    X, y, w = data
    monkeypatch.setattr(plan, "resolve_estimator",
                        lambda model, dev, what: Resolved(NoWeightsTwin(), gn.Device.parse(dev), "cuml"))
    with fake_gpu(1), caplog.at_level(logging.WARNING, logger="gpunets"), gn.config(fallback="warn"):
        mach = gn.machine(Ridge(), X, y, sample_weight=w, device="cuda:0")
        mach.fit()
    assert mach.report()["path"] == "cpu_fallback"
    assert "cuML's NoWeightsTwin.fit takes no sample_weight" in caplog.text
    np.testing.assert_allclose(mach.estimator_.coef_, Ridge().fit(X, y, sample_weight=w).coef_, rtol=0, atol=1e-12)


class Logit(gn.CompositeClassifier):
    def network(self, X, y):
        Z = gn.machine(StandardScaler(), X).transform(X)
        m = gn.machine(LogisticRegression(), Z, y)
        return {"predict": m.predict(Z), "predict_proba": m.predict_proba(Z)}


class Scale(gn.CompositeTransformer):
    def network(self, X, y):
        return gn.machine(StandardScaler(), X).transform(X)


def test_classifier_and_transformer_composites_take_weights(data, executor):
    X, _, w = data
    y = np.where(X[:, 0] - X[:, 2] > 0, "up", "down")
    clf = Logit().fit(X, y, sample_weight=w)
    sc = StandardScaler().fit(X, sample_weight=w)
    ref = LogisticRegression().fit(sc.transform(X), y, sample_weight=w)
    np.testing.assert_allclose(clf.predict_proba(X), ref.predict_proba(sc.transform(X)), rtol=0, atol=1e-10)
    np.testing.assert_allclose(Scale().fit_transform(X, sample_weight=w), sc.transform(X), rtol=0, atol=1e-12)
    np.testing.assert_allclose(Scale().fit(X, sample_weight=w).transform(X[:5]), sc.transform(X[:5]),
                               rtol=0, atol=1e-12)


def test_a_composite_inside_a_sklearn_router(data):
    from sklearn.pipeline import make_pipeline

    X, y, w = data
    with sklearn.config_context(enable_metadata_routing=True):
        pipe = make_pipeline(StandardScaler().set_fit_request(sample_weight=False),
                             OneModel(Ridge().set_fit_request(sample_weight=True)))
        pipe.fit(X, y, sample_weight=w)   # the pipeline asks the composite's router who wants the weights
    Z = StandardScaler().fit(X).transform(X)
    np.testing.assert_allclose(pipe.predict(X), Ridge().fit(Z, y, sample_weight=w).predict(Z), rtol=0, atol=1e-10)
