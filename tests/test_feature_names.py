"""scikit-learn's feature names and set_output on composite transformers and stacks, on every executor."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import sklearn.ensemble as ske
from sklearn.base import clone
from sklearn.decomposition import PCA
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.naive_bayes import GaussianNB
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import PolynomialFeatures, StandardScaler
from sklearn.svm import LinearSVC
from sklearn.tree import DecisionTreeRegressor

import gpunets as gn


def _halve(x):
    return x / 2.0


class ScaleAndProject(gn.CompositeTransformer):
    """Scaled columns beside their first principal components: gn.hstack of two transforms."""

    def __init__(self, scaler=None, pca=None, executor="auto"):
        self.scaler, self.pca, self.executor = scaler, pca, executor

    def network(self, X, y):
        s = gn.machine(self.scaler or StandardScaler(), X).transform(X)
        p = gn.machine(self.pca or PCA(n_components=2), s).transform(s)
        return gn.hstack(s, p)


class Halved(gn.CompositeTransformer):
    """Ends with a gn.node function: names cannot be derived."""

    def network(self, X, y):
        return gn.node(_halve, gn.machine(StandardScaler(), X).transform(X))


class Nested(gn.CompositeTransformer):
    """A composite transformer inside a composite transformer."""

    def __init__(self, inner=None):
        self.inner = inner

    def network(self, X, y):
        t = gn.machine(self.inner or ScaleAndProject(), X).transform(X)
        return gn.machine(PolynomialFeatures(degree=2, include_bias=False), t).transform(t)


@pytest.fixture
def frame():
    rng = np.random.default_rng(0)
    return pd.DataFrame(rng.normal(size=(30, 3)), columns=["a", "b", "c"], index=np.arange(100, 130)[::-1])


# --- composite transformers ----------------------------------------------------------------------------------------

def test_names_follow_the_network(frame, executor):
    t = ScaleAndProject().fit(frame)
    assert t.get_feature_names_out().tolist() == ["a", "b", "c", "pca0", "pca1"]
    assert t.get_feature_names_out(["a", "b", "c"]).tolist() == ["a", "b", "c", "pca0", "pca1"]
    with pytest.raises(ValueError, match="input_features is not equal to feature_names_in_"):
        t.get_feature_names_out(["x", "y", "z"])
    arr = ScaleAndProject().fit(frame.to_numpy())
    assert arr.get_feature_names_out().tolist() == ["x0", "x1", "x2", "pca0", "pca1"]
    assert arr.get_feature_names_out(["u", "v", "w"]).tolist() == ["u", "v", "w", "pca0", "pca1"]
    assert len(t.get_feature_names_out()) == t.transform(frame).shape[1]


def test_names_through_a_nested_composite(frame):
    t = Nested().fit(frame)
    inner = ["a", "b", "c", "pca0", "pca1"]
    expect = PolynomialFeatures(degree=2, include_bias=False).fit(np.zeros((1, 5))).get_feature_names_out(inner)
    assert t.get_feature_names_out().tolist() == expect.tolist()


def test_underivable_names_raise_with_the_culprit_and_a_hint(frame):
    t = Halved().fit(frame)
    with pytest.raises(AttributeError, match=r"cannot derive names through node .*_halve.*Hint: define "
                                             r"get_feature_names_out"):
        t.get_feature_names_out()

    class Predicts(gn.CompositeTransformer):
        def network(self, X, y):
            m = gn.machine(Ridge(), X, y)
            return gn.hstack(gn.machine(StandardScaler(), X).transform(X), m.predict(X))

    p = Predicts().fit(frame, np.arange(30.0))
    with pytest.raises(AttributeError, match=r"predict of machine 'Ridge'.*Hint"):
        p.get_feature_names_out()


def test_set_output_pandas_keeps_the_index(frame, executor):
    t = ScaleAndProject().set_output(transform="pandas").fit(frame)
    out = t.transform(frame)
    assert isinstance(out, pd.DataFrame)
    assert out.columns.tolist() == ["a", "b", "c", "pca0", "pca1"]
    pd.testing.assert_index_equal(out.index, frame.index)
    np.testing.assert_allclose(out.to_numpy(), clone(t).set_output(transform="default").fit_transform(frame))
    ft = clone(t).fit_transform(frame)                     # clone keeps the output configuration
    assert isinstance(ft, pd.DataFrame) and ft.index.equals(frame.index)
    assert isinstance(t.set_output(transform="default").transform(frame), np.ndarray)


def test_set_output_in_a_pipeline(frame):
    pipe = make_pipeline(ScaleAndProject(), StandardScaler()).set_output(transform="pandas").fit(frame)
    out = pipe.transform(frame)
    assert out.columns.tolist() == ["a", "b", "c", "pca0", "pca1"] and out.index.equals(frame.index)


def test_set_output_polars(frame):
    pl = pytest.importorskip("polars")
    t = ScaleAndProject().set_output(transform="polars").fit(frame)
    out = t.transform(frame)
    assert isinstance(out, pl.DataFrame) and out.columns == ["a", "b", "c", "pca0", "pca1"]
    np.testing.assert_allclose(out.to_numpy(), ScaleAndProject().fit_transform(frame))


def test_set_output_without_names_falls_back_like_sklearn(frame):
    out = Halved().set_output(transform="pandas").fit(frame).transform(frame)
    assert isinstance(out, pd.DataFrame) and out.columns.tolist() == [0, 1, 2]   # sklearn's fallback: no names


# --- stacks: exactly scikit-learn's names ------------------------------------------------------------------------

@pytest.mark.parametrize("passthrough", [False, True])
def test_regressor_names_equal_sklearn(frame, passthrough, executor):
    y = frame["a"] * 2 - frame["b"]
    ests = [("ridge", Ridge()), ("tree", DecisionTreeRegressor(max_depth=2, random_state=0))]
    ours = gn.StackingRegressor(ests, cv=3, passthrough=passthrough).fit(frame, y)
    ref = ske.StackingRegressor(ests, cv=3, passthrough=passthrough).fit(frame, y)
    np.testing.assert_array_equal(ours.get_feature_names_out(), ref.get_feature_names_out())
    X = frame.to_numpy()
    ours_np, ref_np = clone(ours).fit(X, y), clone(ref).fit(X, y)
    np.testing.assert_array_equal(ours_np.get_feature_names_out(), ref_np.get_feature_names_out())
    if passthrough:
        np.testing.assert_array_equal(ours_np.get_feature_names_out(["p", "q", "r"]),
                                      ref_np.get_feature_names_out(["p", "q", "r"]))


@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize("stack_method", ["auto", "predict", "decision_function"])
def test_classifier_names_equal_sklearn(frame, n_classes, stack_method):
    y = np.digitize(frame["a"], [0.0] if n_classes == 2 else [-0.4, 0.4])
    ests = [("lr", LogisticRegression()), ("svc", LinearSVC())] if stack_method != "auto" else \
        [("lr", LogisticRegression()), ("nb", GaussianNB())]
    ours = gn.StackingClassifier(ests, cv=3, stack_method=stack_method, passthrough=True, executor="serial")
    ref = ske.StackingClassifier(ests, cv=3, stack_method=stack_method, passthrough=True)
    np.testing.assert_array_equal(ours.fit(frame, y).get_feature_names_out(), ref.fit(frame, y).get_feature_names_out())


def test_stack_set_output_equals_sklearn(frame, executor):
    y = frame["a"] * 2 - frame["b"]
    ests = [("ridge", Ridge()), ("tree", DecisionTreeRegressor(max_depth=2, random_state=0))]
    ours = gn.StackingRegressor(ests, cv=3, passthrough=True).set_output(transform="pandas").fit(frame, y)
    ref = ske.StackingRegressor(ests, cv=3, passthrough=True).set_output(transform="pandas").fit(frame, y)
    pd.testing.assert_frame_equal(ours.transform(frame), ref.transform(frame), atol=1e-10)
    pd.testing.assert_frame_equal(clone(ours).fit_transform(frame, y), ref.fit_transform(frame, y), atol=1e-10)
    np.testing.assert_allclose(ours.predict(frame), ref.predict(frame), atol=1e-10)   # predict stays an array


def test_names_before_fit_raise_not_fitted():
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError):
        gn.StackingRegressor([("r", Ridge())]).get_feature_names_out()
    with pytest.raises(NotFittedError):
        ScaleAndProject().get_feature_names_out()
