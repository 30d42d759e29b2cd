"""``mach.fit(only=True)`` (issue 14, feature 8; MLJ's ``fit_only!``): one machine trains alone on the values
its upstream machines compute with their current fitted states.  Every behavioural test runs on every
executor present (``executor`` fixture)."""

import numpy as np
import pytest
from sklearn.decomposition import PCA
from sklearn.linear_model import Ridge
from sklearn.preprocessing import StandardScaler

import gpunets as gn
from gpunets.testing import assert_allclose_any


@pytest.fixture
def net():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 4)) * [1.0, 10.0, 0.1, 3.0] + 2.0
    y = X @ np.array([1.0, -0.2, 5.0, 0.3]) + 0.1 * rng.normal(size=60)
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    scale = gn.machine(StandardScaler(), Xs)
    pca = gn.machine(PCA(n_components=3), scale.transform(Xs))
    W = pca.transform(scale.transform(Xs))
    ridge = gn.machine(Ridge(), W, ys)
    return X, y, scale, pca, ridge, ridge.predict(W)


def test_only_trains_the_machine_alone_on_the_upstream_fitted_states(executor, net):
    X, y, scale, pca, ridge, out = net
    scale.fit()
    pca.fit(only=True)
    assert pca.report()["action"] == "train"
    report = ridge.fit(only=True)
    assert report.actions.by_label() == {"Ridge": "train"}
    scale.model.with_mean = False                        # upstream changed, but only ridge is asked for
    versions = (scale._version, pca._version)
    assert ridge.fit(only=True).actions.by_label() == {"Ridge": "skip"}
    assert (scale._version, pca._version) == versions and scale.estimator_.with_mean is True
    # the upstream values of the fitted states (fitted on the host here: on a GPU the states hold device arrays)
    Z = StandardScaler().fit_transform(X)
    W = PCA(n_components=3).fit(Z).transform(Z)
    assert_allclose_any(ridge.estimator_.coef_, Ridge().fit(W, y).coef_, rtol=1e-7, atol=1e-10)
    ridge.model.alpha = 3.0
    assert ridge.fit(only=True).actions.by_label() == {"Ridge": "update"}
    assert_allclose_any(ridge.estimator_.coef_, Ridge(alpha=3.0).fit(W, y).coef_, rtol=1e-7, atol=1e-10)
    # a full fit then brings the rest in step: scale updates, what depends on it retrains
    assert out.fit().actions.by_label() == {"StandardScaler": "update", "PCA": "train", "Ridge": "train"}


def test_only_retrains_a_machine_whose_upstream_retrained_since(executor, net):
    _, _, scale, pca, ridge, out = net
    out.fit()
    scale.model.with_std = False
    scale.fit()                                          # scale and pca retrain, ridge is now stale
    assert ridge.fit(only=True).actions.by_label() == {"Ridge": "train"}
    assert ridge.fit(only=True, rows=slice(0, 40)).actions.by_label() == {"Ridge": "train"}
    assert out.fit(rows=slice(0, 40)).actions.by_label() == {"StandardScaler": "train", "PCA": "train",
                                                             "Ridge": "train"}


def test_unfitted_upstream_machines_are_named_and_nothing_trains(executor, net):
    _, _, scale, pca, ridge, _ = net
    with pytest.raises(gn.NotFittedError, match=r"trains Ridge alone .* not fitted: StandardScaler, PCA\. "
                                                r"Hint: fit without only=True"):
        ridge.fit(only=True)
    assert not ridge.is_fitted and not scale.is_fitted
    scale.fit()
    with pytest.raises(gn.NotFittedError, match=r"not fitted: PCA\."):
        ridge.fit(only=True)
    assert not ridge.is_fitted and scale.n_fits == 1


def test_only_takes_machines_and_a_bool(net):
    *_, ridge, out = net
    with pytest.raises(TypeError, match=r"fit\(only=True\) trains machines alone.*<Node predict"):
        gn.fit(out, only=True)
    with pytest.raises(TypeError, match=r"only='yes' must be True or False"):
        ridge.fit(only="yes")
    assert not ridge.is_fitted


def test_an_unfitted_static_machine_upstream_is_applied_as_it_is(executor, net):
    from sklearn.preprocessing import FunctionTransformer

    X, y, *_ = net
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    log = gn.machine(FunctionTransformer(np.abs))
    ridge = gn.machine(Ridge(), log.transform(Xs), ys)
    assert ridge.fit(only=True).actions.by_label() == {"Ridge": "train"}
    assert not log.is_fitted
    assert_allclose_any(ridge.estimator_.coef_, Ridge().fit(np.abs(X), y).coef_, rtol=1e-7)
