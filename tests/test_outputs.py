"""Training outputs that only a fit gives (gpunets.planning.outputs): a downstream machine trains on what a
fresh fit of the whole network would give it, however its upstream got its state (fitted before, loaded)."""

from functools import partial

import numpy as np
import pytest
from sklearn.decomposition import PCA
from sklearn.linear_model import Ridge
from sklearn.model_selection import KFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler, TargetEncoder

import gpunets as gn
from gpunets.compute.estimators import _SAME_AS_TRANSFORM, training_output_differs
from tests.helpers import as_sklearn_rtol


def _dask(executor):
    return "dask" in type(executor).__name__.lower()


def _encoder():
    return TargetEncoder(cv=KFold(5, shuffle=True, random_state=0))


def _net(kind, alpha=1.0, cache=None):
    rng = np.random.default_rng(0)
    if kind == "encoder":
        Xd = rng.integers(0, 8, size=(400, 3))
        yd = Xd[:, 0] * 0.5 + rng.normal(size=400)
        first = _encoder()
    else:
        Xd = rng.normal(size=(400, 10))
        yd = Xd[:, 0] + rng.normal(size=400)
        first = PCA(3, svd_solver="full")   # fit_transform is U * S: other last bits than transform's X @ V
    X, y = gn.source(Xd, name="X"), gn.source(yd, name="y")
    up = gn.machine(first, X, y, cache=cache) if kind == "encoder" else gn.machine(first, X, cache=cache)
    Z = up.transform(X)
    ridge = gn.machine(Ridge(alpha=alpha), Z, y)
    return ridge.predict(Z), ridge


@pytest.mark.parametrize("kind", ["encoder", "pca"])
def test_a_downstream_refit_trains_on_the_fit_transform_output(executor, kind):
    """Only Ridge changed: the upstream machine skips, and Ridge trains on its fit_transform output again
    (TargetEncoder's cross-fitted encodings, not its transform's leaky ones), as a fresh network would."""
    fresh, _ = _net(kind, alpha=3.0)
    fresh.fit(executor=executor)
    yhat, ridge = _net(kind, alpha=1.0)
    yhat.fit(executor=executor)
    ridge.model.alpha = 3.0
    report = yhat.fit(executor=executor)
    assert report.actions.by_label() == {type(ridge.args[0].machine.model).__name__: "skip", "Ridge": "update"}
    labels = [r.label for r in report.trace.records]
    assert any("fit_transform again" in lab for lab in labels), labels
    np.testing.assert_array_equal(yhat(), fresh())
    assert ridge.args[0].machine.n_fits == 1          # its state was not replaced


def test_a_machine_keeping_its_outputs_serves_them_from_memory(executor):
    """The in-memory cache is the first tier (off on Dask, docs/caching.md: there it is computed again)."""
    gn.cache_clear()
    yhat, ridge = _net("encoder", cache=True)
    yhat.fit(executor=executor)
    ridge.model.alpha = 3.0
    report = yhat.fit(executor=executor)
    again = any("fit_transform again" in r.label for r in report.trace.records)
    assert again == _dask(executor)
    fresh, _ = _net("encoder", alpha=3.0)
    fresh.fit(executor=executor)
    np.testing.assert_array_equal(yhat(), fresh())
    gn.cache_clear()


@pytest.mark.parametrize("kind", ["encoder", "pca"])
def test_a_loaded_state_feeds_downstream_fits_as_a_cold_fit_does(tmp_path, executor, kind):
    cold, _ = _net(kind, alpha=3.0)
    cold.fit(executor=executor)
    with gn.config(store=gn.Store(tmp_path / "s")):
        first, _ = _net(kind, alpha=1.0)
        first.fit(executor=executor)
        again, _ = _net(kind, alpha=3.0)
        report = again.fit(executor=executor)
        name = "TargetEncoder" if kind == "encoder" else "PCA"
        assert report.actions.by_label() == {name: "stored", "Ridge": "train"}
        np.testing.assert_array_equal(again(), cold())


@pytest.mark.parametrize("kind", ["encoder", "pca"])
def test_a_widened_search_with_stored_steps_equals_a_cold_search(tmp_path, executor, kind):
    rng = np.random.default_rng(1)
    if kind == "encoder":
        X = rng.integers(0, 8, size=(300, 3))
        pipe = make_pipeline(_encoder(), Ridge())
    else:
        X = rng.normal(size=(300, 10))
        pipe = make_pipeline(StandardScaler(), PCA(3, svd_solver="full"), Ridge())
    y = X[:, 0] * 0.5 + rng.normal(size=300)

    def search(alphas):
        return gn.GridSearchCV(pipe, {"ridge__alpha": alphas}, cv=3, executor=executor)

    from gpunets.tuning.onepass_search import enabled

    with enabled(False):   # the network path's fits, bit for bit (a store in force keeps a search on that path)
        cold = search([0.1, 1.0, 10.0]).fit(X, y)
    with gn.config(store=gn.Store(tmp_path / "s")):
        search([0.1, 1.0]).fit(X, y)
        wide = search([0.1, 1.0, 10.0]).fit(X, y)
    same = np.testing.assert_array_equal
    if _dask(executor) and kind == "pca":
        # two runs of one search on Dask, with no store at all, already differ in PCA's last bits (the workers'
        # LAPACK; docs/store.md, "Bit for bit"): equal within rounding there
        same = partial(np.testing.assert_allclose, rtol=1e-13, atol=0)
    same(wide.cv_results_["mean_test_score"], cold.cv_results_["mean_test_score"])
    np.testing.assert_array_equal(wide.best_estimator_.predict(X), cold.best_estimator_.predict(X))


def test_which_estimators_have_a_training_output_of_their_own():
    from sklearn.cluster import KMeans
    from sklearn.compose import ColumnTransformer
    from sklearn.pipeline import FeatureUnion

    assert not training_output_differs(StandardScaler())
    assert not training_output_differs(Ridge())
    assert training_output_differs(_encoder())
    assert training_output_differs(PCA(2))
    assert not training_output_differs(KMeans(2))
    assert not training_output_differs(make_pipeline(StandardScaler(), KMeans(2)))
    assert training_output_differs(make_pipeline(StandardScaler(), PCA(2)))
    assert training_output_differs(ColumnTransformer([("a", "passthrough", [0]), ("b", PCA(1), [1, 2])]))
    assert not training_output_differs(ColumnTransformer([("a", StandardScaler(), [0])], remainder="drop"))
    assert training_output_differs(FeatureUnion([("s", StandardScaler()), ("p", PCA(1))]))

    class Mine(StandardScaler):   # a class of its own with a fit_transform of its own: taken to differ
        def fit_transform(self, X, y=None):
            return super().fit_transform(X, y)

    assert training_output_differs(Mine())


@pytest.mark.parametrize("name", sorted(_SAME_AS_TRANSFORM))
def test_the_classes_taken_as_plain_give_fit_then_transform_bit_for_bit(name):
    """The list of scikit-learn classes whose own fit_transform is fit(X, y).transform(X): checked by running them."""
    import warnings

    from sklearn.utils import all_estimators

    classes = dict(all_estimators())
    if name.startswith("_"):
        pytest.skip(f"{name}: a base class, checked through its subclasses")
    if name not in classes:
        pytest.skip(f"{name} is not in this scikit-learn")
    cls = classes[name]
    rng = np.random.default_rng(0)
    X = np.abs(rng.normal(size=(120, 4)))
    y = (X[:, 0] > 0.8).astype(int)
    if name in ("LabelEncoder", "LabelBinarizer"):
        args = (y,)
    elif name == "MultiLabelBinarizer":
        args = ([{1, 2}, {3}, {1}],)
    elif name in ("DictVectorizer",):
        args = ([{"a": 1.0, "b": 2.0}, {"a": 3.0}],)
    elif name == "HashingVectorizer":
        args = (["a b", "b c d"],)
    elif name == "MissingIndicator":
        Xn = X.copy()
        Xn[::7, 1] = np.nan
        args = (Xn,)
    else:
        args = (X, y)
    params = {}
    if name in ("VotingClassifier", "StackingClassifier"):
        from sklearn.linear_model import LogisticRegression
        params = {"estimators": [("a", LogisticRegression()), ("b", LogisticRegression(C=0.1))]}
    if name in ("VotingRegressor", "StackingRegressor"):
        params = {"estimators": [("a", Ridge()), ("b", Ridge(alpha=3.0))]}
    est = cls(**params)
    if "random_state" in est.get_params():
        est.set_params(random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = est.fit_transform(*args)
        from sklearn.base import clone
        b = clone(est).fit(*args).transform(args[0])
    a = a.toarray() if hasattr(a, "toarray") else np.asarray(a)
    b = b.toarray() if hasattr(b, "toarray") else np.asarray(b)
    np.testing.assert_array_equal(a, b)


def _columns_data():
    rng = np.random.default_rng(0)
    X = np.c_[rng.integers(0, 8, size=400), rng.normal(size=400)]
    return X, X[:, 0] * 0.5 + rng.normal(size=400)


def test_a_converted_transformer_fit_transforms_as_scikit_learn(executor):
    """gn.from_sklearn(ColumnTransformer with a TargetEncoder).fit_transform: the cross-fitted encodings, as
    scikit-learn's fit_transform gives them (not its transform of the training rows), from the fit's own run."""
    from sklearn.compose import ColumnTransformer

    X, y = _columns_data()
    ct = ColumnTransformer([("te", _encoder(), [0]), ("s", StandardScaler(), [1])])
    expected = ct.fit_transform(X, y)
    g = gn.from_sklearn(ct, executor=executor)
    got = g.fit_transform(X, y)
    rtol = as_sklearn_rtol()   # bit for bit, but on a real GPU
    np.testing.assert_allclose(np.asarray(got), expected, rtol=rtol, atol=0)
    assert set(g.fit_report_.actions.by_label().values()) == {"train"}   # one run: nothing fitted twice
    assert not np.allclose(np.asarray(g.transform(X)), expected, rtol=1e-6)   # a call transforms, as scikit-learn's
    np.testing.assert_allclose(np.asarray(g.transform(X)), ct.transform(X), rtol=rtol, atol=0)


def test_a_composite_transformer_fit_transforms_as_its_fit_passes_on(executor):
    class Encode(gn.CompositeTransformer):
        def __init__(self, executor="auto"):
            self.executor = executor

        def network(self, X, y):
            return gn.machine(_encoder(), X, y).transform(X)

    X, y = _columns_data()
    Xc = X[:, :1].astype(int)
    enc = Encode(executor=executor)
    np.testing.assert_array_equal(np.asarray(enc.fit_transform(Xc, y)), _encoder().fit_transform(Xc, y))
    np.testing.assert_array_equal(np.asarray(enc.transform(Xc)), _encoder().fit(Xc, y).transform(Xc))


def test_set_output_gives_one_container_for_fit_transform_and_transform():
    import pandas as pd
    from sklearn.compose import ColumnTransformer

    X, y = _columns_data()
    Xp = pd.DataFrame(X, columns=["a", "b"])
    g = gn.from_sklearn(ColumnTransformer([("s", StandardScaler(), ["b"])])).set_output(transform="pandas")
    first, again = g.fit_transform(Xp, y), g.transform(Xp)
    assert isinstance(first, pd.DataFrame) and isinstance(again, pd.DataFrame)
    assert list(first.columns) == list(again.columns) == ["s__b"]
    pd.testing.assert_frame_equal(first, again)


def test_a_transform_checked_equal_at_fit_time_is_used_without_fitting_again(tmp_path, executor):
    """PCA's covariance solver: its transform gives its fit_transform's output bit for bit. With a store in force
    that is checked once, when it fits, and kept with its state and entry, so a skipped or loaded PCA passes on its
    transform; without one, a skipped PCA computes its training output again. The answers are a fresh fit's."""
    rng = np.random.default_rng(0)
    Xd = rng.normal(size=(400, 10))
    yd = Xd[:, 0] + rng.normal(size=400)

    def net(alpha):
        X, y = gn.source(Xd, name="X"), gn.source(yd, name="y")
        pca = gn.machine(PCA(3, svd_solver="covariance_eigh"), X)
        Z = pca.transform(X)
        ridge = gn.machine(Ridge(alpha=alpha), Z, y)
        return ridge.predict(Z), ridge, pca

    fresh, _, _ = net(3.0)
    fresh.fit(executor=executor)
    yhat, ridge, pca = net(1.0)
    yhat.fit(executor=executor)
    assert pca.report()["trained"] and not pca._state.same_output      # not checked: no store
    ridge.model.alpha = 3.0
    report = yhat.fit(executor=executor)
    assert any("fit_transform again" in r.label for r in report.trace.records)
    np.testing.assert_array_equal(yhat(), fresh())
    with gn.config(store=gn.Store(tmp_path / "s")):
        first, ridge, pca = net(1.0)
        first.fit(executor=executor)
        assert pca._state.same_output
        ridge.model.alpha = 3.0
        report = first.fit(executor=executor)                             # skipped: its transform
        assert report.actions.by_label() == {"PCA": "skip", "Ridge": "update"}
        assert not any("fit_transform again" in r.label for r in report.trace.records)
        np.testing.assert_array_equal(first(), fresh())
        again, _, _ = net(10.0)                                           # loaded: its transform
        report = again.fit(executor=executor)
        assert report.actions.by_label() == {"PCA": "stored", "Ridge": "train"}
        assert not any("fit_transform again" in r.label for r in report.trace.records)
    fresh10, _, _ = net(10.0)
    fresh10.fit(executor=executor)
    np.testing.assert_array_equal(again(), fresh10())
