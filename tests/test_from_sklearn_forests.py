"""gn.from_sklearn splits forests into chunks of trees: balanced tasks, the original forest's predictions."""

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.compose import ColumnTransformer, TransformedTargetRegressor
from sklearn.ensemble import (
    ExtraTreesClassifier,
    ExtraTreesRegressor,
    RandomForestClassifier,
    RandomForestRegressor,
    VotingClassifier,
    VotingRegressor,
)
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

import gpunets as gn
from gpunets.sklearn_import.forests import ForestChunk, ForestJoin, chunk_bounds

rng = np.random.default_rng(1)
X = rng.normal(size=(150, 5))
y = X @ [1.0, -2.0, 0.5, 0.0, 3.0] + rng.normal(size=150)
y2 = np.column_stack([y, X[:, 0] ** 2])
y3 = np.digitize(X[:, 0] + X[:, 1], [-0.7, 0.7])
labels = np.array(["low", "mid", "high"])[y3]
df = pd.DataFrame(X, columns=list("abcde"))
df["cat"] = rng.choice(["u", "v", "w"], 150)

FORESTS = [
    ("rf-regressor", lambda: RandomForestRegressor(9, max_depth=6, random_state=0), X, y),
    ("et-regressor", lambda: ExtraTreesRegressor(7, random_state=3), X, y),
    ("rf-max-samples", lambda: RandomForestRegressor(6, max_samples=0.5, max_features=0.6, random_state=2), X, y),
    ("et-bootstrap", lambda: ExtraTreesRegressor(5, bootstrap=True, random_state=4), X, y),
    ("rf-no-bootstrap", lambda: RandomForestRegressor(5, bootstrap=False, max_features=2, random_state=5), X, y),
    ("rf-multioutput", lambda: RandomForestRegressor(6, random_state=6), X, y2),
    ("rf-randomstate-object", lambda: RandomForestRegressor(6, random_state=np.random.RandomState(7)), X, y),
    ("rf-classifier", lambda: RandomForestClassifier(8, random_state=0), X, labels),
    ("et-classifier", lambda: ExtraTreesClassifier(7, max_depth=4, random_state=1), X, labels),
    ("rf-balanced-subsample", lambda: RandomForestClassifier(6, class_weight="balanced_subsample",
                                                             random_state=2), X, y3),
    ("et-balanced", lambda: ExtraTreesClassifier(5, class_weight="balanced", bootstrap=True, random_state=3), X, y3),
]


def on_cpu_only(model):
    """Whether every machine of the converted model ran on the CPU (then results equal scikit-learn's bit for
    bit; parts run on a GPU, such as the array-API twins in the fake-GPU lane, differ in the last bits)."""
    return all(rep.get("device", "cpu") == "cpu" for rep in model.report_.values())


def assert_same(model, ref, data):
    for op in ("predict", "predict_proba", "predict_log_proba"):
        if hasattr(ref, op):
            a, b = np.asarray(getattr(model, op)(data)), np.asarray(getattr(ref, op)(data))
            assert a.shape == b.shape, op
            if on_cpu_only(model) or a.dtype.kind not in "fc":
                np.testing.assert_array_equal(a, b, err_msg=op)
            else:
                np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14, err_msg=op)


@pytest.mark.parametrize("case", FORESTS, ids=[c[0] for c in FORESTS])
def test_split_forest_predicts_as_the_original(case, executor):
    _name, make, data, target = case
    ref = make().fit(data, target)
    model = gn.from_sklearn(make(), split_forests=True).fit(data, target)
    assert_same(model, ref, data)
    name = type(ref).__name__.lower()
    chunks = [n for n in model.fit_report_.actions.by_label() if n.startswith(f"{name}[chunk")]
    assert len(chunks) == 2, "the fixture runs 2 workers: two chunks of trees"
    assert "split into 2 chunks" in model.conversion_[name]["notes"][0]
    forest = model.machines_[name].estimator_.forest_
    assert [t.random_state for t in forest.estimators_] == [t.random_state for t in ref.estimators_]
    for attr in ("n_features_in_", "n_outputs_", "classes_", "n_classes_"):
        if hasattr(ref, attr):
            np.testing.assert_array_equal(getattr(forest, attr), getattr(ref, attr))
    params = {k: v for k, v in forest.get_params().items() if k != "random_state"}
    assert params == {k: v for k, v in ref.get_params().items() if k != "random_state"}


@pytest.mark.parametrize("make", [lambda: RandomForestClassifier(6, random_state=0),
                                  lambda: ExtraTreesRegressor(6, random_state=0)])
def test_split_forest_in_a_pandas_composition(make, executor):
    est = make_pipeline(ColumnTransformer([("num", StandardScaler(), list("abcde")),
                                           ("cat", OneHotEncoder(), ["cat"])]), make())
    target = labels if isinstance(est[-1], RandomForestClassifier) else y
    ref = clone(est).fit(df, target)
    model = gn.from_sklearn(est, split_forests=True).fit(df, target)
    assert_same(model, ref, df)
    np.testing.assert_array_equal(model.predict(df.iloc[:7]), ref.predict(df.iloc[:7]))
    name = type(est[-1]).__name__.lower()
    forest = model.machines_[name].estimator_.forest_
    assert forest.n_features_in_ == ref[-1].n_features_in_
    assert hasattr(forest, "feature_names_in_") == hasattr(ref[-1], "feature_names_in_")


@pytest.mark.parametrize("make", [lambda: RandomForestRegressor(6, random_state=0),
                                  lambda: ExtraTreesClassifier(6, random_state=0)])
def test_split_forest_on_a_dataframe_keeps_feature_names(make, executor):
    target = labels if isinstance(make(), ExtraTreesClassifier) else y
    ref = make().fit(df[list("abcde")], target)
    model = gn.from_sklearn(make(), split_forests=True).fit(df[list("abcde")], target)
    assert_same(model, ref, df[list("abcde")])
    forest = model.machines_[type(ref).__name__.lower()].estimator_.forest_
    np.testing.assert_array_equal(forest.feature_names_in_, ref.feature_names_in_)


def test_split_by_default_with_workers_and_not_when_serial():
    est = VotingRegressor([("r", Ridge()), ("rf", RandomForestRegressor(10, random_state=0))])
    threads = gn.from_sklearn(est, executor="threads", workers=3).fit(X, y)
    assert [n for n in threads.fit_report_.actions.by_label() if "[chunk" in n] == \
        ["rf[chunk 1/3]", "rf[chunk 2/3]", "rf[chunk 3/3]"]
    assert threads.report_["rf"]["kind"] == "forest"
    for model in (gn.from_sklearn(est, executor="serial"),
                  gn.from_sklearn(est, executor="threads", workers=2, split_forests=False),
                  gn.from_sklearn(est, executor="threads", workers=1)):
        model.fit(X, y)
        assert set(model.fit_report_.actions.by_label()) == {"r", "rf"}
        assert model.conversion_["rf"]["kind"] == "leaf"
        np.testing.assert_array_equal(model.predict(X), threads.predict(X))


@pytest.mark.parametrize("forest", [RandomForestRegressor(6, oob_score=True, random_state=0),
                                    RandomForestRegressor(6, warm_start=True, random_state=0)],
                         ids=["oob_score", "warm_start"])
def test_not_split_when_all_trees_are_needed_at_once(forest):
    model = gn.from_sklearn(forest, executor="threads", workers=2).fit(X, y)
    assert list(model.fit_report_.actions.by_label()) == ["randomforestregressor"]
    assert "not split" in model.conversion_["randomforestregressor"]["notes"][0]
    ref = clone(forest).fit(X, y)
    np.testing.assert_array_equal(model.predict(X), ref.predict(X))
    if forest.oob_score:
        assert model.machines_["randomforestregressor"].estimator_.oob_score_ == ref.oob_score_


def test_params_keep_the_original_names_and_retrain_only_the_forest(executor):
    est = make_pipeline(StandardScaler(), VotingRegressor([("r", Ridge()),
                                                           ("rf", RandomForestRegressor(8, random_state=0))]))
    model = gn.from_sklearn(est, split_forests=True).fit(X, y)
    assert model.get_params()["votingregressor__rf__n_estimators"] == 8
    acts = model.set_params(votingregressor__rf__n_estimators=5).fit(X, y).fit_report_.actions.by_label()
    assert acts["standardscaler"] == "skip" and acts["votingregressor__r"] == "skip"
    assert {acts[f"votingregressor__rf[chunk {i}/2]"] for i in (1, 2)} == {"update"}
    assert acts["votingregressor__rf"] in ("train", "update")
    ref = clone(est).set_params(votingregressor__rf__n_estimators=5).fit(X, y)
    assert_same(model, ref, X)
    assert len(model.machines_["votingregressor__rf"].estimator_.estimators_) == 5
    acts = model.set_params(votingregressor__r__alpha=3.0).fit(X, y).fit_report_.actions.by_label()
    assert {a for n, a in acts.items() if n.startswith("votingregressor__rf")} == {"skip"}


def test_chunk_bounds_cover_every_tree_once():
    assert chunk_bounds(7, 2) == [(0, 4), (4, 7)]
    assert chunk_bounds(3, 5) == [(0, 1), (1, 2), (2, 3)]
    assert chunk_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]


def test_chunks_and_join_directly():
    rf = RandomForestClassifier(5, random_state=0)
    parts = [ForestChunk(rf, a, b).fit(X, labels).transform(X) for a, b in chunk_bounds(5, 3)]
    joined = ForestJoin(rf).fit(*parts)
    ref = clone(rf).fit(X, labels)
    assert joined.n_estimators == 5 and not joined.warm_start and len(joined.estimators_) == 5
    np.testing.assert_array_equal(joined.classes_, ref.classes_)
    np.testing.assert_array_equal(joined.predict_proba(X), ref.predict_proba(X))


COMPOSED = [
    ("voting-soft", lambda: VotingClassifier([("lr", LogisticRegression()),
                                              ("rf", RandomForestClassifier(5, random_state=0))], voting="soft"),
     labels, "rf"),
    ("ttr", lambda: TransformedTargetRegressor(ExtraTreesRegressor(4, random_state=0), func=np.log1p,
                                               inverse_func=np.expm1), np.abs(y), "regressor"),
]


@pytest.mark.parametrize("case", COMPOSED, ids=[c[0] for c in COMPOSED])
def test_forest_members_of_other_compositions_are_split(case, executor):
    _name, make, target, name = case
    model = gn.from_sklearn(make(), split_forests=True).fit(X, target)
    assert model.conversion_[name]["kind"] == "forest"
    assert_same(model, make().fit(X, target), X)
