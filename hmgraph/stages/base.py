"""The lifecycle every stage of `hmgraph.DataLoader` shares.

As torchdata's ``BaseNode``: a stage is reset before each epoch, reports
a small state for inspection and is closed once, when its loader is. A
stage reads only what it was given; none calls back into the loader.
"""

from __future__ import annotations

__all__ = ["Stage"]


class Stage:
    """A stage of the loader's pipeline; the defaults do nothing."""

    def reset(self) -> None:
        """Prepare for the next epoch."""

    def state_dict(self) -> dict:
        """The stage's state, JSON-ready (empty: nothing to keep)."""
        return {}

    def close(self) -> None:
        """Release what the stage holds (files, threads); idempotent."""
