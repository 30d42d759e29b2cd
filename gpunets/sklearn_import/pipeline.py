"""``Pipeline``: each step a machine trained on the previous step's output.

``"passthrough"`` and ``None`` steps are skipped; ``memory`` is ignored (the
network itself caches: an unchanged step is never refit), with a note in the
conversion report.
"""

from __future__ import annotations

from typing import Any

from gpunets.sklearn_import._base import Context, build, is_passthrough, join

__all__ = ["build_pipeline"]


def build_pipeline(est: Any, X: Any, y: Any, path: str, ctx: Context) -> dict[str, Any]:
    # scikit-learn's own checks, as Pipeline.fit runs them, before any machine is built: its parameters
    # (steps a list...), then its steps (not empty; unique names without "__" that are not parameters;
    # intermediate steps that transform, a last step that fits), with its exception classes and messages
    est._validate_params()
    est._validate_steps()
    ctx.note(path, "pipeline", est)
    if est.memory is not None:
        ctx.note(path, "pipeline", est, "memory is ignored: gpunets keeps fitted steps itself and refits only "
                                        "what changed.")
    steps = list(est.steps)
    Xt = X
    for name, step in steps[:-1]:
        if is_passthrough(step):
            continue
        Xt = build(step, Xt, y, join(path, name), ctx)["transform"]
    name, last = steps[-1]
    if is_passthrough(last):
        return {"transform": Xt}
    return build(last, Xt, y, join(path, name), ctx)
