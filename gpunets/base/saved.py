"""The mark of gpunets' own functions that its saved networks call (the base layer: imports nothing of gpunets).

:func:`gpunets.load` trusts gpunets' classes by default, but of its functions only those marked here: a
function named in a file is called when the loaded network runs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["saved_operation"]


def saved_operation(fn: Any) -> Any:
    """Mark one of gpunets' own functions as an operation its networks use, so ``gn.load`` trusts it by default.

    A ``format="skops"`` file (or a pickle loaded with ``trusted=``) names the functions its nodes call; gpunets'
    classes are trusted, but of its functions only those marked here (and :data:`gpunets.persistence.persist.TRUSTED_TYPES`):
    a function is called when the loaded network runs.
    """
    fn.__gn_saved_operation__ = True
    return fn
