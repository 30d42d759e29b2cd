"""What every conversion shares: the build context, leaves, opaque machines and the dispatch.

``build(est, X, y, path, ctx)`` returns ``{operation: node}`` for the
operations ``est`` offers, built on the nodes ``X`` and ``y``.  Each kind of
composition has its own module; anything else is one machine named by its
parameter path (``columntransformer__num__scaler``), so reports and
``get_params`` use the same names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpunets.core.machines import machine

__all__ = ["OPS", "Context", "build", "converts_as", "is_drop", "is_passthrough", "join", "leaf", "overridden"]

#: the operations a converted composition may expose, in the order they are built
OPS = ("predict", "predict_proba", "predict_log_proba", "decision_function", "transform")


@dataclass
class Context:
    """What a conversion records: every part by path (kind, notes) and the leaf estimators.

    ``data`` (the training X, read when columns are selected) is never saved: ``gn.save`` writes it as None
    (``_gn_unsaved``), and a loaded conversion rebuilds its context at its next fit.
    """

    _gn_unsaved = ("data",)

    parts: dict[str, dict[str, Any]] = field(default_factory=dict)
    leaves: dict[str, Any] = field(default_factory=dict)     # machine name -> the user's estimator
    data: Any = None                                          # the training X (for column selection)
    root_X: Any = None                                        # the source holding it
    cache: dict = field(default_factory=dict)                 # kept by the composite across fits
    forest_chunks: int = 1                                    # chunks of trees per forest (forests.py)
    fit_params: dict = field(default_factory=dict)            # path -> fit parameters it takes (fit_params.py)

    def note(self, path: str, kind: str, est: Any, note: str = "") -> None:
        entry = self.parts.setdefault(path or "(root)", {"kind": kind, "estimator": type(est).__name__,
                                                          "notes": []})
        if note:
            entry["notes"].append(note)


def join(path: str, name: str) -> str:
    """``path__name`` (the parameter prefix of a nested estimator)."""
    return f"{path}__{name}" if path else name


def is_passthrough(step: Any) -> bool:
    return step is None or (isinstance(step, str) and step == "passthrough")


def is_drop(step: Any) -> bool:
    return isinstance(step, str) and step == "drop"


def root_name(est: Any) -> str:
    """The report name of a top-level leaf: its class name in lower case (``make_pipeline``'s rule)."""
    return type(est).__name__.lower()


def leaf(est: Any, X: Any, y: Any, path: str, ctx: Context, kind: str = "leaf", note: str = "") -> dict[str, Any]:
    """One machine for ``est`` trained on ``(X, y)``; a node per operation it has."""
    name = path or root_name(est)
    m = machine(est, *((X,) if y is None else (X, y)), name=name, **ctx.fit_params.get(path, {}))
    ctx.leaves[name] = est
    ctx.note(name, kind, est, note)
    return {op: getattr(m, op)(X) for op in OPS if hasattr(est, op)}


def overridden(est: Any, base: type) -> list[str]:
    """The methods ``type(est)`` defines over ``base`` (empty when it is ``base`` or adds no behaviour)."""
    out: list[str] = []
    for cls in type(est).__mro__:
        if cls is base or not issubclass(cls, base):
            break
        out.extend(k for k, v in vars(cls).items()
                   if callable(v) or isinstance(v, (property, staticmethod, classmethod)))
    return sorted(set(out))


def converts_as(est: Any, *bases: type) -> bool:
    """Whether ``est`` is converted as one of ``bases``: of that exact type, or of a subclass that overrides none
    of its methods (a user's ``Pipeline`` subclass whose ``predict`` clips is not a ``Pipeline``: its network
    would lose the override, so it runs as one opaque machine instead; see :func:`build`)."""
    return any(isinstance(est, b) and not overridden(est, b) for b in bases)


def _known() -> list[tuple[Callable[[Any], bool], Callable[..., dict[str, Any]]]]:
    from sklearn.compose import ColumnTransformer, TransformedTargetRegressor
    from sklearn.ensemble import (
        StackingClassifier,
        StackingRegressor,
        VotingClassifier,
        VotingRegressor,
    )
    from sklearn.pipeline import FeatureUnion, Pipeline

    from gpunets.sklearn_import import (  # lazy: the builders import this module
        columns,
        ensembles,
        forests,
        pipeline,
        target,
    )

    return [
        (lambda e: converts_as(e, Pipeline), pipeline.build_pipeline),
        (lambda e: converts_as(e, ColumnTransformer), columns.build_column_transformer),
        (lambda e: converts_as(e, FeatureUnion), columns.build_feature_union),
        (lambda e: converts_as(e, VotingRegressor), ensembles.build_voting_regressor),
        (lambda e: converts_as(e, VotingClassifier), ensembles.build_voting_classifier),
        (lambda e: converts_as(e, StackingRegressor, StackingClassifier), ensembles.build_stacking),
        (lambda e: converts_as(e, TransformedTargetRegressor), target.build_transformed_target),
        (forests.is_forest, forests.build_forest),
    ]


def _known_base(est: Any) -> type | None:
    """The composition class gpunets converts that ``est`` subclasses with overrides (None: not one)."""
    from sklearn.compose import ColumnTransformer, TransformedTargetRegressor
    from sklearn.ensemble import (
        ExtraTreesClassifier,
        ExtraTreesRegressor,
        RandomForestClassifier,
        RandomForestRegressor,
        StackingClassifier,
        StackingRegressor,
        VotingClassifier,
        VotingRegressor,
    )
    from sklearn.pipeline import FeatureUnion, Pipeline

    for base in (Pipeline, ColumnTransformer, FeatureUnion, VotingRegressor, VotingClassifier, StackingRegressor,
                 StackingClassifier, TransformedTargetRegressor, RandomForestRegressor, RandomForestClassifier,
                 ExtraTreesRegressor, ExtraTreesClassifier):
        if isinstance(est, base):
            return base
    return None


def is_meta(est: Any) -> bool:
    """Whether ``est`` holds other estimators among its parameters (a meta-estimator)."""
    try:
        params = est.get_params(deep=False)
    except Exception:  # noqa: BLE001 - not a scikit-learn estimator: treated as a leaf
        return False

    def has_est(v: Any) -> bool:
        if not isinstance(v, type) and callable(getattr(v, "fit", None)):
            return True
        if isinstance(v, (list, tuple)):
            return any(has_est(x) for x in v)
        return False

    return any(has_est(v) for v in params.values())


def build(est: Any, X: Any, y: Any, path: str, ctx: Context) -> dict[str, Any]:
    """``{operation: node}`` for ``est`` (a composition, recursively, or one machine)."""
    for test, builder in _known():
        if test(est):
            return builder(est, X, y, path, ctx)
    base = _known_base(est)
    if base is not None:   # a subclass that overrides methods: converting it as its base would lose them
        methods = overridden(est, base)
        return leaf(est, X, y, path, ctx, kind="opaque",
                    note=f"{type(est).__name__} subclasses {base.__name__} and overrides {methods}: it runs as one "
                         f"opaque machine (its own methods, as written; a {base.__name__} is converted to a network "
                         f"only when its type is exactly {base.__name__} or a subclass adding no methods).")
    if is_meta(est):
        return leaf(est, X, y, path, ctx, kind="opaque",
                    note=f"{type(est).__name__} is a meta-estimator gpunets does not convert: it runs as one "
                         "opaque machine (its inner estimators train inside it, one after another).")
    return leaf(est, X, y, path, ctx)


def operations(est: Any) -> tuple[str, ...]:
    """The operations of :data:`OPS` that ``est`` offers (a stack without a final estimator: its default's)."""
    from sklearn.base import is_classifier
    from sklearn.ensemble import StackingClassifier, StackingRegressor
    from sklearn.pipeline import Pipeline

    if converts_as(est, Pipeline) and est.steps:
        last = est.steps[-1][1]
        return ("transform",) if is_passthrough(last) else operations(last)

    if converts_as(est, StackingRegressor, StackingClassifier) and est.final_estimator is None:
        from sklearn.linear_model import LogisticRegression, RidgeCV

        probe = LogisticRegression() if is_classifier(est) else RidgeCV()
        return ("transform",) + tuple(op for op in OPS if op != "transform" and hasattr(probe, op))
    return tuple(op for op in OPS if hasattr(est, op))


def first_part(est: Any) -> Any:
    """The estimator that receives the input first (through leading pipeline steps)."""
    from sklearn.pipeline import Pipeline

    while converts_as(est, Pipeline):
        steps = [s for _, s in est.steps if not is_passthrough(s)]
        if not steps:
            return None
        est = steps[0]
    return est
