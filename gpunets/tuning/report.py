"""What the search shared: step fits done against those of a candidate-by-candidate search."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SearchReport"]


@dataclass
class SearchReport:
    """Step fits done by the search against those a candidate-by-candidate search would do.

    Attributes
    ----------
    fits : dict
        ``{step label: fits done}`` over every fold (the refit excluded).
    naive : dict
        ``{step label: candidates × folds}``: what a search fitting each candidate on its own would do.
    transforms : int
        Test-row transforms done by shared steps (a candidate-by-candidate search does one per
        step, candidate and fold).
    seconds : float
        Wall time of the search network.
    errors : dict
        ``{candidate index: (its parameters, the last line of its first error)}`` for every candidate
        that failed on some fold (its scores are ``error_score``).
    """

    fits: dict[str, int] = field(default_factory=dict)
    naive: dict[str, int] = field(default_factory=dict)
    transforms: int = 0
    seconds: float = 0.0
    errors: dict = field(default_factory=dict)
    refit_route: tuple | None = field(default=None, repr=False)  # (route, device) of a search on a GPU

    @property
    def total(self) -> tuple[int, int]:
        """``(fits done, fits a candidate-by-candidate search would do)``."""
        return sum(self.fits.values()), sum(self.naive.values())

    def __repr__(self) -> str:
        done, naive = self.total
        lines = [f"SearchReport ({done} fits instead of {naive}, {self.seconds:.3f} s)",
                 f"  {'step':<24} {'fits':>6} {'naive':>6}"]
        lines += [f"  {k:<24} {self.fits[k]:>6} {self.naive[k]:>6}" for k in self.fits]
        lines += [f"  candidate {i} {params} failed: {err}" for i, (params, err) in self.errors.items()]
        return "\n".join(lines)
