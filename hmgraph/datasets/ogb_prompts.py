"""Answer ogb's interactive questions instead of blocking on stdin.

Used by the node datasets (`hmgraph.datasets`) and the graph-property
datasets (`hmgraph.datasets.graphprop`) around every ogb dataset class.
"""

from __future__ import annotations

import builtins
import contextlib
import logging

log = logging.getLogger(__name__)

__all__ = ["answer_ogb_prompts"]


@contextlib.contextmanager
def answer_ogb_prompts(answer: str):
    """Answer every ``input()`` ogb asks with ``answer`` while inside.

    ogb asks before re-downloading a copy without its release marker (we
    answer "n": a local copy is used as is) and before downloads over 1 GB
    (we answer "y" when asked to fetch a dataset the user named). Each
    question and its answer are logged at INFO.

    Parameters
    ----------
    answer : str
        ``"y"`` or ``"n"``.

    Yields
    ------
    None
        ``builtins.input`` is restored on exit, also on an exception.

    Examples
    --------
    >>> with answer_ogb_prompts(answer="n"):
    ...     input("Will you update the dataset now? (y/N)")
    'n'
    """
    original = builtins.input

    def reply(prompt: str = "") -> str:
        log.info("ogb asked %r; answering %r", prompt.strip(), answer)
        return answer

    builtins.input = reply
    try:
        yield
    finally:
        builtins.input = original
