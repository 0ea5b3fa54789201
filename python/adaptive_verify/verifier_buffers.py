"""AdaptiveVerifier's persistent plan buffers (verifier.py keeps them per step shape in an LRU): one buffer set with
the prepared planner calls that write into it and the views its eager steps return, so that all three go together."""
from __future__ import annotations

#: Views of an eager step's first padded tokens kept per buffer set (first in, first out): an eager step's padded size
#: follows its budget and prompt chunk, so sizes recur but are many; one set of views (a VerifyPlan of four sliced
#: tensors) is about 1.5 KB, and slicing it anew costs about 10 us of host time (four tensor slices).
VIEW_CACHE_SIZE = 1024


class BufferSet:
    """One set of persistent plan buffers and what runs on it: ``out`` (a VerifyPlan or TreeVerifyPlan), the prepared
    planner calls writing into it (key: the shape of the caller's inputs), and views of its eager steps' first
    tokens (key: the step's size). Evicted together, so views never keep dropped memory alive."""

    __slots__ = ("out", "calls", "views")

    def __init__(self, out):
        self.out, self.calls, self.views = out, {}, {}

    def first_tokens(self, plan, padded: int):
        """plan.first_tokens(padded), kept per size (VIEW_CACHE_SIZE of them, first in, first out): a size seen before
        gets its views back without slicing. ``plan``: what a prepared call on these buffers returned (views of
        ``out``, the same object every run at one T_pad); views made from another plan are made anew."""
        hit = self.views.get(padded)
        if hit is None or hit[0] is not plan:
            if len(self.views) >= VIEW_CACHE_SIZE:
                self.views.pop(next(iter(self.views)))
            hit = self.views[padded] = (plan, plan.first_tokens(padded))
        return hit[1]
