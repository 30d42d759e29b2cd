"""``TransformedTargetRegressor``: a target-transformer machine, the regressor on the transformed target.

The target transformer is a small model (:class:`TargetTransformer`) that
fits ``y`` exactly as scikit-learn does (``transformer`` cloned, or a
``FunctionTransformer`` from ``func``/``inverse_func``, with the same inverse
check); the regressor is its own machine trained on ``transform(y)``, and
``predict`` is ``inverse_transform`` of the regressor's predictions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.base import BaseEstimator

from gpunets.core.machines import machine
from gpunets.sklearn_import._base import Context, build, join

__all__ = ["TargetTransformer", "build_transformed_target"]


class TargetTransformer(BaseEstimator):
    """The target half of a ``TransformedTargetRegressor`` (its ``transformer``/``func`` parameters)."""

    def __init__(self, transformer: Any = None, func: Any = None, inverse_func: Any = None,
                 check_inverse: bool = True) -> None:
        self.transformer = transformer
        self.func = func
        self.inverse_func = inverse_func
        self.check_inverse = check_inverse

    def fit(self, y: Any) -> TargetTransformer:
        from sklearn.compose import TransformedTargetRegressor
        from sklearn.utils.validation import check_array

        if y is None:
            msg = "This TransformedTargetRegressor estimator requires y to be passed, but the target y is None."
            raise ValueError(msg)
        y = check_array(y, input_name="y", accept_sparse=False, ensure_all_finite=True, ensure_2d=False,
                        dtype="numeric", allow_nd=True)
        self.training_dim_ = y.ndim
        ttr = TransformedTargetRegressor(transformer=self.transformer, func=self.func,
                                         inverse_func=self.inverse_func, check_inverse=self.check_inverse)
        ttr._fit_transformer(y.reshape(-1, 1) if y.ndim == 1 else y)
        self.transformer_ = ttr.transformer_
        return self

    def transform(self, y: Any) -> Any:
        from sklearn.utils.validation import check_array

        y = check_array(y, input_name="y", ensure_2d=False, dtype="numeric", allow_nd=True)
        y_trans = self.transformer_.transform(y.reshape(-1, 1) if y.ndim == 1 else y)
        if y_trans.ndim == 2 and y_trans.shape[1] == 1 and self.training_dim_ == 1:
            y_trans = y_trans.squeeze(axis=1)
        return y_trans

    def inverse_transform(self, pred: Any) -> Any:
        pred = np.asarray(pred)
        out = self.transformer_.inverse_transform(pred.reshape(-1, 1) if pred.ndim == 1 else pred)
        if self.training_dim_ == 1 and out.ndim == 2 and out.shape[1] == 1:
            out = out.squeeze(axis=1)
        return out


def build_transformed_target(est: Any, X: Any, y: Any, path: str, ctx: Context) -> dict[str, Any]:
    from sklearn.linear_model import LinearRegression

    ctx.note(path, "transformedtargetregressor", est)
    if est.transformer is not None and (est.func is not None or est.inverse_func is not None):
        msg = "'transformer' and functions 'func'/'inverse_func' cannot both be set."
        raise ValueError(msg)
    tname = join(path, "transformer")
    tt = machine(TargetTransformer(est.transformer, est.func, est.inverse_func, est.check_inverse), y,
                 name=tname)
    ctx.note(tname, "target transformer", est.transformer)
    y_trans = tt.transform(y)
    reg = est.regressor if est.regressor is not None else LinearRegression()
    out = build(reg, X, y_trans, join(path, "regressor"), ctx)
    return {"predict": tt.inverse_transform(out["predict"])}
