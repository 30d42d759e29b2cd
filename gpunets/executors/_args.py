"""Checks of executor constructor arguments: each names the argument, says what it expects and how to fix it.

They run in ``__init__`` before anything is stored, so a bad argument fails
where the executor is made, not in the middle of a run.

>>> check_flag("check", True, "StreamsExecutor")
True
>>> check_flag("check", "yes", "StreamsExecutor")
Traceback (most recent call last):
...
TypeError: StreamsExecutor(check='yes'): expected True or False, got a str. ...
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["check_flag", "check_optional_flag", "check_seconds", "check_delays", "check_seed", "check_callable",
           "check_mapping"]


def _got(value: Any) -> str:
    return f"a {type(value).__name__}"


def check_flag(name: str, value: Any, owner: str) -> bool:
    """``value`` if it is a bool, else a TypeError."""
    if not isinstance(value, bool):
        msg = (f"{owner}({name}={value!r}): expected True or False, got {_got(value)}. "
               f"Pass {name}=True or {name}=False.")
        raise TypeError(msg)
    return value


def check_optional_flag(name: str, value: Any, owner: str, none_means: str) -> bool | None:
    """``value`` if it is a bool or None, else a TypeError."""
    if value is not None and not isinstance(value, bool):
        msg = (f"{owner}({name}={value!r}): expected True, False or None ({none_means}), got {_got(value)}.")
        raise TypeError(msg)
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_seconds(name: str, value: Any, owner: str, none_means: str) -> float | None:
    """``value`` if it is None or a finite number of seconds > 0."""
    if value is None:
        return None
    if not _is_number(value):
        msg = (f"{owner}({name}={value!r}): expected a number of seconds or None ({none_means}), "
               f"got {_got(value)}. For example {name}=60.")
        raise TypeError(msg)
    if not (value > 0 and math.isfinite(value)):
        msg = (f"{owner}({name}={value!r}): expected a positive, finite number of seconds or None "
               f"({none_means}).")
        raise ValueError(msg)
    return value


def check_delays(value: Any, owner: str) -> tuple[float, float] | None:
    """``(lo, hi)`` with ``0 <= lo <= hi`` finite seconds, or None."""
    if value is None:
        return None
    hint = "Pass two numbers of seconds (lo, hi) with 0 <= lo <= hi, e.g. delays=(0.0, 0.002), or None."
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 2:
        msg = f"{owner}(delays={value!r}): expected a pair (lo, hi), got {_got(value)}. {hint}"
        raise TypeError(msg)
    lo, hi = value
    if not (_is_number(lo) and _is_number(hi)):
        msg = f"{owner}(delays={value!r}): both bounds must be numbers of seconds. {hint}"
        raise TypeError(msg)
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 <= lo <= hi):
        msg = f"{owner}(delays={value!r}): expected 0 <= lo <= hi, finite. {hint}"
        raise ValueError(msg)
    return (float(lo), float(hi))


def check_seed(value: Any, owner: str) -> int | None:
    """An int (not a bool) or None."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        msg = f"{owner}(seed={value!r}): expected an integer or None, got {_got(value)}. For example seed=0."
        raise TypeError(msg)
    return value


def check_callable(name: str, value: Any, owner: str, signature: str) -> Any:
    """A callable or None."""
    if value is not None and not callable(value):
        msg = f"{owner}({name}={value!r}): expected a function {signature} or None, got {_got(value)}."
        raise TypeError(msg)
    return value


def check_mapping(name: str, value: Any, owner: str, what: str) -> dict[str, Any]:
    """A dict with string keys (a copy), or {} for None."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        msg = (f"{owner}({name}={value!r}): expected a dict of {what} (string keys) or None, got {_got(value)}. "
               f"For example {name}={{'memory_limit': '2GB'}}.")
        raise TypeError(msg)
    return dict(value)
