"""A fit or a score that raised, as a value the search network passes downstream (it pickles for Dask)."""

from __future__ import annotations

from typing import Any


class Failed:
    """A fit or a score that raised: the exception and its traceback, passed downstream instead of a value.


    ``fit`` tells a failed fit (of a step, or its transform of the training rows: a *fit failure*)
    from a failed transform or prediction of rows to score (a *score failure*, as scikit-learn counts).
    """

    def __init__(self, error: BaseException, tb: str, seconds: float = 0.0, fit: bool = True) -> None:
        self.error, self.tb, self.seconds, self.fit = error, tb, seconds, fit

    def __getstate__(self) -> dict[str, Any]:   # exceptions with keyword-only __init__ pickle too (Dask)
        return {**self.__dict__, "error": Portable(self.error)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, error=unwrap_error(state["error"]))

    def as_fit(self) -> Failed:
        """This failure, counted as a fit failure (it reached a fit's inputs)."""
        return self if self.fit else Failed(self.error, self.tb, self.seconds, fit=True)


def rebuild_error(cls: type, args: tuple[Any, ...], state: dict[str, Any]) -> Portable:
    """An exception rebuilt without calling its ``__init__``, still wrapped (see :class:`Portable`)."""
    error: BaseException = BaseException.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return Portable(error)


class Portable:
    """An exception that pickles as itself even when its ``__init__`` takes keyword-only arguments
    (scikit-learn's ``UnsetMetadataPassedError``), any number of times; :func:`unwrap_error` gives it."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __reduce__(self) -> Any:
        return (rebuild_error, (type(self.error), self.error.args, dict(self.error.__dict__)))


def unwrap_error(value: Any) -> BaseException:
    return value.error if isinstance(value, Portable) else value
