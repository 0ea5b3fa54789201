"""Launch-ready calls, remembered per op: how a decode loop pays microseconds of host time, not tens.

A decode loop calls each op with the same objects step after step (persistent buffers, the same cost table,
the same scalars); only the tensors' values change, and the kernel reads those at launch. So the first call
with a given set of argument objects validates everything and builds the kernel's parameter struct, and later
calls with the same objects check only what could have changed in place without changing the object:

- every tensor argument's data pointer, shape and layout (``resize_``, ``set_``, ``as_strided_``,
  ``transpose_`` all change one of them, so such a tensor is validated again): the strides of a tensor with more
  than one dimension, and whether a 1-D one is still contiguous (``as_strided_`` on a view of a larger buffer
  keeps its pointer and shape and changes only that; every 1-D tensor the ops accept is contiguous, so the flag
  says as much as the stride, for less host time);
- the per-step scalars an op lists as such (a fixed budget, a prompt chunk's size), which the op re-derives
  from the remembered validation with a few integer checks.

Scalars are compared by value AND type (the ops key them with ``scalar_key`` or their types): ``True == 1``
and ``2.0 == 2`` in Python, so a key of values alone would let ``min_verify=True`` or ``budget=2.0`` reuse a call
validated with ints and skip the check that rejects them.

Keys hold the ``id()`` of each argument object and each entry holds a strong reference to it, so no other
object can take that id while the entry lives. Where a loop is known to pass new slices of its buffers every step
(AcceptanceStats.update, AdaptiveVerifier's planner calls), tensors are keyed by what the kernel reads of them
instead (``tensor_key``: pointer, dtype, device, shape, strides); the entry holds the first such tensors, so their
memory cannot hold other data while it lives, and a hit needs no signature check (``CallCache.get_keyed``): the key
is the signature of the tensors passed. Entries are few (decode loops use one or two call shapes per
op) and the oldest is evicted first. Nothing is remembered while ``torch.compile`` traces (the traced graph
calls the registered custom op instead), and callers that build new tensor objects every step (slices of a
persistent buffer) simply take the validating path every time: they pay the old cost, never a wrong answer.
"""
from __future__ import annotations

import collections
import ctypes
from typing import Any, Optional

import torch

from ._ext import check_status
from ._validate import stream_of

#: Launch-ready calls remembered per op (a decode loop needs one or two; CUDA-graph capture one per size).
CALL_CACHE_SIZE = 16


def tensor_key(t) -> Optional[tuple]:
    """A tensor argument as part of a key by what a kernel's struct holds of it: data pointer, dtype, device, shape and
    strides (None for None). Two objects with one key are the same kernel argument, e.g. the slice ``buf[:R]`` an
    engine takes of a persistent buffer every step, which an ``id()`` key would send down the validating path each
    time. Validation depends on nothing else of a tensor. The entry must hold the tensors it was made with, so their
    memory (hence a pointer in its key) cannot hold other data while it lives. Only plain strided tensors are keyed
    so; anything else is keyed by identity."""
    if type(t) is torch.Tensor and t.layout is torch.strided:
        return (t.data_ptr(), t.dtype, t.device, t.shape, t.stride())
    # None, and anything else by identity (a subclass, a sparse tensor, a wrong type: the validating path judges it)
    return None if t is None else (type(t), id(t))


def tensor_signature(tensors, layout) -> list:
    """Data pointer, shape and layout of each tensor: the layout the remembered kernel struct was built for. Per
    tensor, ``layout`` says what holds it: 2 its strides (more than one dimension), 1 whether it is contiguous
    (1-D), 0 nothing more (0-d: a pointer and a shape say everything)."""
    return [(t.data_ptr(), t.shape, t.stride() if k == 2 else (k and t.is_contiguous()))
            for t, k in zip(tensors, layout)]


def layout_kind(t) -> int:
    """tensor_signature's layout entry of t (a rank change is a shape change: fixed for an entry's life)."""
    return 2 if t.dim() > 1 else t.dim()


class CallCache:
    """Entries of one op: key (argument ids and static scalars) -> (argument refs, tensors, their signature,
    value, what the signature holds of each tensor's layout). The tensors checked on a hit are the entry's own:
    the key's ids say the caller passed these very objects."""

    __slots__ = ("_entries", "size")

    def __init__(self, size: int = CALL_CACHE_SIZE):
        self._entries: dict = {}
        self.size = size

    def get(self, key) -> Optional[Any]:
        """The value stored under ``key`` if every tensor still has the signature it was validated with."""
        try:
            entry = self._entries.get(key)
        except TypeError:  # an unhashable scalar (a list for a float): the validating path names it
            return None
        if entry is None or entry[2] != tensor_signature(entry[1], entry[4]):
            return None
        return entry[3]

    def get_keyed(self, key) -> Optional[Any]:
        """The value stored under ``key`` with no signature check: for keys that hold every caller tensor as
        ``tensor_key`` (the key is then the signature of the tensors passed, which is what the kernel reads) and
        otherwise only the owner's own tensors, which never change layout."""
        entry = self._entries.get(key)
        return None if entry is None else entry[3]

    def put(self, key, refs, tensors, value) -> Any:
        """Remembers ``value`` for ``key``: ``refs`` are every object whose id() is in the key, ``tensors`` the
        tensors whose pointers the value holds (None entries are skipped)."""
        if key not in self._entries and len(self._entries) >= self.size:
            self._entries.pop(next(iter(self._entries)))
        tensors = [t for t in tensors if t is not None]
        layout = [layout_kind(t) for t in tensors]
        self._entries[key] = (refs, tensors, tensor_signature(tensors, layout), value, layout)
        return value

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


class Launch:
    """A launch-ready call of an extension entry point: its filled parameter struct (kept alive here), the
    device, and the op's name for errors. ``run()`` is the whole hot path of a remembered call."""

    __slots__ = ("fn", "params", "addr", "device", "on_cuda", "op", "keep", "messages")

    def __init__(self, fn, params, device, op: str, keep=(), messages=None):
        self.fn, self.params, self.device, self.op, self.keep = fn, params, device, op, keep
        self.addr, self.on_cuda = ctypes.addressof(params), device.type == "cuda"
        self.messages = messages  # the op's own wording of some CPU statuses (check_status)

    def run(self) -> None:
        status = self.fn(self.addr, self.on_cuda, stream_of(self.device) if self.on_cuda else 0)
        if status:
            check_status(status, self.op, self.device, self.messages)


def scalar_key(value) -> tuple:
    """A scalar argument as part of a key: its type with its value (so True never passes for 1, nor 2.0 for 2);
    a tensor by identity."""
    if isinstance(value, torch.Tensor):
        return (torch.Tensor, id(value))
    return (type(value), value)


class DrivenCalls:
    """Planner calls the verifier launches itself, step after step: the op's remembered call (planner/ops.py _Call) for
    the verifier's own persistent buffers and the caller's tensors. Entries are keyed by the caller's tensors as
    kernel arguments (_callcache.tensor_key), not by their objects: an engine that passes new slices of its
    persistent buffers each step (vLLM's ``positions[:num_tokens]``) still repeats the same kernel arguments, and
    the op's own remembered path, keyed by objects, would validate everything again for it. Each entry holds the
    tensors it was made with. The verifier's own buffers are the op call's and never change layout. Entries are
    few (one per plan-buffer set, R and caller layout): an LRU of ``size`` entries (AdaptiveVerifier:
    PLAN_CACHE_SIZE)."""

    __slots__ = ("_entries", "size")

    def __init__(self, size: int = 64):
        self._entries: collections.OrderedDict = collections.OrderedDict()
        self.size = size

    def run(self, key: tuple, table, step: tuple):
        """The call's result after launching it, or None when nothing is remembered for key (the caller then takes
        the op's own path). ``step``: ops.step_key of this step's per-step arguments (re-derived when they differ
        from the remembered call's)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        call = entry[1]
        if call.step != step and not call.restep(step, table):
            return None
        call.run()
        return call.result

    def call(self, key: tuple):
        """The remembered call for key, or None (not launched)."""
        entry = self._entries.get(key)
        return None if entry is None else entry[1]

    def remember(self, key: tuple, caller: tuple, call) -> None:
        if call is None:  # the op did not remember it (e.g. an argument was converted): nothing to drive
            self._entries.pop(key, None)
            return
        self._entries[key] = (caller, call)
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
