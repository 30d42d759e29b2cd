"""Helpers of :mod:`gpunets.compose.composite`: telling whether a rebuilt network is the old one.

A composite rebuilds its network on every ``fit`` (``network(X, y)`` is cheap:
it only builds the graph).  Machines of the new graph whose training inputs
are *structurally the same* as those of a machine of the previous graph adopt
that machine's fitted state, so the core's retraining rules then see exactly
what changed: same model parameters -> ``skip``; other parameters or another
model class -> ``update``; an upstream machine retrained -> ``train``.

Two nodes are the same when they are the same source object, or apply the
same operation (same machine after matching, or an equal callable: same
function, equal ``functools.partial`` arguments, same code with equal
defaults and closure values) to the same arguments (nodes recursively,
constants by value).  The match is conservative: anything not provably equal
is different, and a different machine simply trains from scratch.
"""

from __future__ import annotations

import functools
import numbers
import types
from collections.abc import Iterable
from typing import Any

import numpy as np

from gpunets.core.nodes import Node, Source, is_node
from gpunets.devices.data import same_data

__all__ = ["same_value", "match_machines", "adopt_states", "carry_frozen", "frozen_names"]


def same_value(a: Any, b: Any) -> bool:
    """Whether two constants (or data) are equal: identity, then value (NaN equals NaN)."""
    if a is b:
        return True
    try:
        return bool(same_data(a, b))
    except Exception:
        return False


def _plain(x: Any) -> bool:
    """A value whose equality means equal behaviour (not a mutable object compared by identity)."""
    if x is None or isinstance(x, (numbers.Number, str, bytes, np.ndarray, np.generic, type)):
        return True
    if isinstance(x, (tuple, list, frozenset)):
        return all(_plain(v) for v in x)
    if isinstance(x, dict):
        return all(_plain(v) for v in x.values())
    return isinstance(x, (types.FunctionType, types.BuiltinFunctionType, functools.partial))


def same_operation(f: Any, g: Any, strict: bool) -> bool:
    """Whether two node operations compute the same thing (conservative)."""
    if f is g:
        return True
    if isinstance(f, str) or isinstance(g, str):
        return f == g
    if isinstance(f, functools.partial) and isinstance(g, functools.partial):
        return (same_operation(f.func, g.func, strict) and _same_args(f.args, g.args, strict)
                and _same_args(tuple(sorted(f.keywords.items())), tuple(sorted(g.keywords.items())), strict)
                and getattr(f, "__name__", None) == getattr(g, "__name__", None))
    if isinstance(f, types.MethodType) and isinstance(g, types.MethodType):
        return f.__func__ is g.__func__ and f.__self__ is g.__self__ and not strict
    if isinstance(f, types.FunctionType) and isinstance(g, types.FunctionType):
        if f.__code__ != g.__code__ or not _same_args(f.__defaults__ or (), g.__defaults__ or (), strict):
            return False
        if not _same_args(tuple(sorted((f.__kwdefaults__ or {}).items())),
                          tuple(sorted((g.__kwdefaults__ or {}).items())), strict):
            return False
        fc, gc = f.__closure__ or (), g.__closure__ or ()
        if len(fc) != len(gc):
            return False
        try:
            return _same_args(tuple(c.cell_contents for c in fc), tuple(c.cell_contents for c in gc), strict)
        except ValueError:  # an empty cell
            return False
    try:
        return bool(f == g) and type(f) is type(g)
    except Exception:
        return False


def _same_args(a: tuple, b: tuple, strict: bool) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if callable(x) and callable(y) and not is_node(x):
            if not same_operation(x, y, strict):
                return False
        elif strict and not (_plain(x) and _plain(y)) and x is y:
            return False  # an object compared by identity may have changed inside
        elif not same_value(x, y):
            return False
    return True


class _Matcher:
    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.mapping: dict[int, Any] = {}     # id(new machine) -> old machine
        self.memo: dict[tuple[int, int], bool] = {}

    def same_node(self, n: Any, o: Any) -> bool:
        if n is o:
            return True
        if not (is_node(n) and is_node(o)):
            return not is_node(n) and not is_node(o) and _same_args((n,), (o,), self.strict)
        if isinstance(n, Source) or isinstance(o, Source) or type(n) is not type(o):
            return False
        key = (id(n), id(o))
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        assert isinstance(n, Node) and isinstance(o, Node)
        if (n.machine is None) != (o.machine is None):
            r = False
        elif n.machine is not None and self.mapping.get(id(n.machine)) is not o.machine:
            r = False
        elif n.machine is not None:
            r = n.operation == o.operation and self._same_list(n.args, o.args)
        else:
            r = same_operation(n.operation, o.operation, self.strict) and self._same_list(n.args, o.args)
        self.memo[key] = r
        return r

    def _same_list(self, a: tuple, b: tuple) -> bool:
        return len(a) == len(b) and all(self.same_node(x, y) for x, y in zip(a, b))

    def same_inputs(self, m: Any, o: Any) -> bool:
        return m.name == o.name and self._same_list(m.args, o.args)


def match_machines(new: Iterable[Any], old: Iterable[Any], *, new_names: dict[int, str],
                   old_names: dict[int, str], strict: bool) -> dict[int, Any]:
    """``{id(new machine): old machine}`` for every new machine whose inputs equal an old one's.

    ``new`` must be in dependency order.  Among several old candidates the one
    with the same model object wins, then the same component name, then the
    same model class, then the first.
    """
    old = [o for o in old if o.is_fitted]
    matcher = _Matcher(strict)
    used: set[int] = set()
    for m in new:
        cands = [o for o in old if id(o) not in used and matcher.same_inputs(m, o)]
        if not cands:
            continue

        def rank(o: Any) -> tuple[int, int, int]:
            return (o.model is not m.model, old_names.get(id(o)) != new_names.get(id(m)),
                    type(o.model) is not type(m.model))

        best = min(cands, key=rank)
        matcher.mapping[id(m)] = best
        used.add(id(best))
    return matcher.mapping


def adopt_states(new: Iterable[Any], mapping: dict[int, Any]) -> None:
    """Give each matched new machine the identity and fitted state of its old twin.

    The old machines are left untouched (a fitted state is immutable), so the
    previous network stays usable if the new fit fails.  A state names its
    upstream machines by object: the adopted state names their new twins.
    """
    from dataclasses import replace

    twin = {id(o): n for n in new if (o := mapping.get(id(n))) is not None}
    for m in new:
        o = mapping.get(id(m))
        if o is None:
            continue
        m._uid = o._uid
        st = o._state
        if st is not None:
            st = replace(st, parents=tuple((twin.get(id(p), p), v) for p, v in st.parents))
        m._state = st
        m._version = o._version
        m.n_fits = o.n_fits


def frozen_names(freeze: Any, valid: Iterable[str], owner: str) -> tuple[str, ...]:
    """Check a composite's ``freeze`` hyperparameter: component names of its network (a tuple of str)."""
    if freeze is None:
        return ()
    if isinstance(freeze, str) or not isinstance(freeze, (tuple, list, set, frozenset)) or not all(
            isinstance(n, str) for n in freeze):
        msg = (f"{owner}: freeze={freeze!r} must be a tuple of component names, e.g. freeze=('encoder',) "
               "(a single name still goes in a tuple).")
        raise TypeError(msg)
    valid = sorted(set(valid))
    unknown = sorted(set(freeze) - set(valid))
    if unknown:
        msg = (f"{owner}: freeze names {unknown}, which are not components of its network. Valid names "
               f"are: {valid} (the keys of machines_).")
        raise ValueError(msg)
    return tuple(freeze)


def carry_frozen(new: Iterable[Any], names: dict[int, str], carried: dict[str, Any]) -> None:
    """Keep frozen components frozen in a rebuilt network (MLJ's ``Freezable``).

    ``carried`` maps component names to the frozen machines of the previous network (or of the
    composite a clone was made from).  The new machine of that name adopts the frozen machine's
    identity and fitted state, whatever the data (new rows included), and is frozen: it skips.
    """
    for m in new:
        o = carried.get(names.get(id(m), ""))
        if o is None or o._state is None:
            continue
        if m._uid != o._uid:      # not adopted already (the same data: adopt_states did)
            m._uid = o._uid
            m._state = o._state
            m._version = o._version
            m.n_fits = o.n_fits
        m.frozen = True
