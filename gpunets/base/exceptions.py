"""Exceptions raised by gpunets.

Every exception inherits from the builtin a caller would already catch:

* :class:`NotFittedError` is a ``ValueError`` and an ``AttributeError`` (as in
  scikit-learn, and it *is* scikit-learn's ``NotFittedError``).
* :class:`CycleError` and :class:`NetworkError` are ``ValueError``.
* :class:`DeviceUnavailableError` is a ``RuntimeError``.
* :class:`FitError` and :class:`EvaluationError` wrap an exception raised by a
  model.  The raised object is an instance of *both* the gpunets class and the
  original exception's class, so ``except ValueError`` still catches a
  ``ValueError`` raised by ``Ridge.fit``; the original is chained as
  ``__cause__``.
"""

from __future__ import annotations

from sklearn.exceptions import NotFittedError as _SklearnNotFittedError

__all__ = [
    "GpunetsError",
    "NotFittedError",
    "CycleError",
    "NetworkError",
    "DeviceUnavailableError",
    "FitError",
    "EvaluationError",
    "StreamOrderError",
    "wrap_exception",
]


class GpunetsError(Exception):
    """Base class of every gpunets exception."""

    # what a run marks on the error of a failed task (annotations only: set on instances, never on the class)
    _gn_task_named: bool        # the message names the task (gpunets.executors.scheduler)
    _gn_original: BaseException  # the exception the task raised
    _gn_retrain_said: bool      # the message says which machines the next fit retrains (gpunets.api.network)


class NotFittedError(GpunetsError, _SklearnNotFittedError):
    """A machine was used before it was trained.

    >>> issubclass(NotFittedError, ValueError) and issubclass(NotFittedError, AttributeError)
    True
    """


class CycleError(GpunetsError, ValueError):
    """The network has a cycle."""


class NetworkError(GpunetsError, ValueError):
    """A network was built or called in a way that cannot work."""


class DeviceUnavailableError(GpunetsError, RuntimeError):
    """A node is placed on a device that does not exist here."""


class StreamOrderError(GpunetsError, RuntimeError):
    """The stream checker found a value read before its producer finished."""


class _WrappingError(GpunetsError):
    """Shared behaviour of errors that wrap a model's exception."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""

    def __reduce__(self):  # dynamic subclasses pickle by their two bases
        kind = FitError if isinstance(self, FitError) else EvaluationError
        original = next((b for b in type(self).__bases__ if b is not kind), None)
        return (_rebuild, (kind, original, str(self)))


class FitError(_WrappingError):
    """A machine's ``fit`` raised; the original exception is ``__cause__``."""


class EvaluationError(_WrappingError):
    """Evaluating a node raised; the original exception is ``__cause__``."""


def _rebuild(kind, original, message):
    if original is None:
        return kind(message)
    return wrap_exception(kind, message, original.__new__(original))


_WRAPPER_CACHE: dict[tuple[type, type], type[GpunetsError]] = {}


def wrap_exception(kind: type[GpunetsError], message: str, original: BaseException) -> GpunetsError:
    """Build an exception that is both ``kind`` and ``type(original)``.

    The message names the culprit; ``original`` should be chained with
    ``raise wrapped from original``.  Where the original class cannot be
    subclassed or constructed from one message, a plain ``kind`` is returned.

    >>> e = wrap_exception(FitError, "fitting Ridge failed", ValueError("bad"))
    >>> isinstance(e, ValueError), isinstance(e, FitError), str(e)
    (True, True, 'fitting Ridge failed')
    """
    base = type(original)
    if not isinstance(original, Exception) or issubclass(base, kind):
        return kind(message) if not issubclass(base, kind) else base(message)
    key = (kind, base)
    cls = _WRAPPER_CACHE.get(key)
    if cls is None:
        try:
            cls = type(f"{kind.__name__}[{base.__name__}]", (kind, base), {"__module__": __name__})
        except TypeError:
            cls = kind
        _WRAPPER_CACHE[key] = cls
    try:
        err = cls(message)
        str(err)
        return err
    except Exception:  # an exception class whose __init__ needs other arguments
        return kind(message)
