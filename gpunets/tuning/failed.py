"""A fit or a score that raised, as a value the search network passes downstream (it pickles for Dask).

An exception travels between Dask processes as itself whenever it can (:class:`Portable`): by standard
pickling, else rebuilt without its ``__init__`` (a keyword-only or extra-argument ``__init__``).  One that
cannot (an unpicklable attribute, a class the receiver cannot rebuild) travels as a stand-in: an
:class:`~gpunets.base.exceptions.EvaluationError` that is also the original's nearest builtin class
(``OSError``, ``ValueError``, ...) and names the original class, message and where it was raised.  Pickling
or unpickling a :class:`Portable` never raises: a failure to send an error is never a lost value (Dask
would retry fetching it forever).
"""

from __future__ import annotations

import builtins
import pickle
import traceback
from typing import Any

from gpunets.base.exceptions import EvaluationError, wrap_exception


class Failed:
    """A fit or a score that raised: the exception and its traceback, passed downstream instead of a value.


    ``fit`` tells a failed fit (of a step, or its transform of the training rows: a *fit failure*)
    from a failed transform or prediction of rows to score (a *score failure*, as scikit-learn counts).
    """

    def __init__(self, error: BaseException, tb: str, seconds: float = 0.0, fit: bool = True) -> None:
        self.error, self.tb, self.seconds, self.fit = error, tb, seconds, fit

    def __getstate__(self) -> dict[str, Any]:   # any exception pickles, as itself or a stand-in (Dask)
        portable = self.__dict__.get("_portable")
        if portable is None or portable.error is not self.error:
            portable = self.__dict__["_portable"] = Portable(self.error, self.tb)
        state = {k: v for k, v in self.__dict__.items() if k != "_portable"}
        return {**state, "error": portable}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, error=unwrap_error(state["error"]))

    def as_fit(self) -> Failed:
        """This failure, counted as a fit failure (it reached a fit's inputs)."""
        return self if self.fit else Failed(self.error, self.tb, self.seconds, fit=True)


def _dumps(obj: Any) -> bytes:
    """``obj`` pickled as Dask pickles: by reference, else by value (cloudpickle, where installed)."""
    try:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        try:
            import cloudpickle
        except ImportError:
            raise
        return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _without_init(cls: type, args: tuple[Any, ...], state: dict[str, Any]) -> BaseException:
    """An exception of class ``cls`` rebuilt without calling its ``__init__``."""
    error: BaseException = cls.__new__(cls, *args)   # OSError, MemoryError ... have their own __new__
    error.args = args
    error.__dict__.update(state)
    return error


def _where(error: BaseException, tb: str | None) -> str:
    """Where ``error`` was raised: its innermost frame, from its traceback or the traceback text."""
    frames = traceback.extract_tb(error.__traceback__) if error.__traceback__ is not None else []
    if frames:
        f = frames[-1]
        return f"in {f.name} ({f.filename}:{f.lineno})"
    lines = [ln.strip() for ln in (tb or "").splitlines() if ln.strip().startswith("File ")]
    return lines[-1] if lines else "in a task"


def _builtin_base(cls: type) -> type[BaseException]:
    """The nearest builtin class of exception class ``cls`` that rebuilds from one message."""
    for base in cls.__mro__:
        if getattr(builtins, base.__name__, None) is base and issubclass(base, Exception):
            try:
                base("message")
            except Exception:  # noqa: BLE001, S112 - a builtin needing more arguments (UnicodeDecodeError)
                continue
            return base
    return Exception


def stand_in(cls_name: str, message: str, why: str, where: str, base: type[BaseException] = Exception) -> BaseException:
    """The error that travels in place of one that cannot: an ``EvaluationError`` that is also ``base``."""
    text = (f"A task raised {cls_name}({message!r}) {where}; it could not be sent between processes as itself "
            f"({why}), so this {EvaluationError.__name__} stands for it. Make the exception picklable (its "
            "arguments in .args, no locks, files or connections in its attributes) to get it back as raised.")
    return wrap_exception(EvaluationError, text, base.__new__(base))


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _loads(kind: str, payload: bytes, cls_name: str, message: str, where: str) -> Portable:
    """The receiving end of :meth:`Portable.__reduce__`: the error, or its stand-in if it cannot be rebuilt."""
    try:
        if kind == "pickle":
            error = pickle.loads(payload)   # noqa: S301 - a value of the same run
        else:
            error = _without_init(*pickle.loads(payload))   # noqa: S301
        if not isinstance(error, BaseException):
            raise TypeError(f"unpickled a {type(error).__name__}, not an exception")
        return Portable(error)
    except Exception as e:  # noqa: BLE001 - any failure: the stand-in, never a lost value
        return Portable(stand_in(cls_name, message, f"{type(e).__name__}: {e}", where))


def rebuild_error(cls: type, args: tuple[Any, ...], state: dict[str, Any]) -> Portable:
    """An exception rebuilt without calling its ``__init__``, still wrapped (see :class:`Portable`)."""
    try:
        return Portable(_without_init(cls, args, state))
    except Exception as e:  # noqa: BLE001 - the stand-in, never a lost value
        return Portable(stand_in(getattr(cls, "__qualname__", str(cls)), str(args[0] if args else ""),
                                 f"{type(e).__name__}: {e}", "in a task"))


class Portable:
    """An exception that pickles as itself when it can, any number of times, else as a stand-in; it never
    fails to pickle or unpickle.  :func:`unwrap_error` gives the exception.

    By standard pickling if the exception survives a round trip; else rebuilt without its ``__init__``
    (scikit-learn's ``UnsetMetadataPassedError`` takes keyword-only arguments; a class whose ``__init__``
    takes extra required arguments); else (an unpicklable attribute, ...) a :func:`stand_in` naming it.

    >>> class Odd(Exception):
    ...     def __init__(self, message, code):
    ...         super().__init__(message)
    ...         self.code = code
    >>> import pickle
    >>> back = unwrap_error(pickle.loads(pickle.dumps(Portable(OSError(2, "gone", "f.txt")))))
    >>> type(back).__name__, back.errno, back.filename
    ('FileNotFoundError', 2, 'f.txt')
    >>> import threading
    >>> bad = ValueError("has a lock")
    >>> bad.lock = threading.Lock()
    >>> back = unwrap_error(pickle.loads(pickle.dumps(Portable(bad))))
    >>> isinstance(back, ValueError), "ValueError('has a lock')" in str(back)
    (True, True)
    """

    def __init__(self, error: BaseException, tb: str | None = None) -> None:
        self.error = error
        self._tb = tb
        self._reduced: Any = None

    def __reduce__(self) -> Any:
        if self._reduced is None:
            self._reduced = self._reduce()
        return self._reduced

    def _reduce(self) -> Any:
        error = self.error
        cls = type(error)
        names = (_qualname(cls), str(error), _where(error, self._tb))
        why = ""
        for kind, value in (("pickle", error), ("fields", (cls, error.args, dict(error.__dict__)))):
            try:
                payload = _dumps(value)
                if kind == "pickle":
                    back = pickle.loads(payload)   # noqa: S301 - it rebuilds here, so it will there
                else:
                    back = _without_init(*pickle.loads(payload))   # noqa: S301
                if type(back) is not cls:
                    raise TypeError(f"it rebuilds as {type(back).__name__}")
                return (_loads, (kind, payload, *names))
            except Exception as e:  # noqa: BLE001 - try the next way, or the stand-in
                why = why or f"{type(e).__name__}: {e}"
        standin = stand_in(names[0], names[1], why, names[2], _builtin_base(cls))
        return (_loads, ("pickle", pickle.dumps(standin), *names))


def unwrap_error(value: Any) -> BaseException:
    return value.error if isinstance(value, Portable) else value
