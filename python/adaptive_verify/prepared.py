"""Prepared calls: the explicit fast path of the per-step ops (docs/design.md, "Host overhead").

A decode loop calls the same ops every step on the same buffers; only the values in them and a few scalars change.
``prepare(op, *args, **kwargs)`` validates a call once, exactly as ``op(*args, **kwargs)`` would (the same errors),
builds its kernel parameter struct, and returns a :class:`Prepared` handle that holds the struct and every tensor
it reads or writes. ``handle.run(...)`` then launches it: the pattern of FlashInfer's wrappers (``plan`` once,
``run`` every step). Nothing is launched by ``prepare``. The free functions stay the simple API: they validate
every call and remember nothing.

``run`` takes, by keyword, only what may change step to step (each op's ``run`` lists them):

- input tensors in place of the prepared ones (an engine's new logits, a new slice ``buf[:R]`` of a persistent
  buffer): same dtype, device, shape and strides as the prepared tensor, else :class:`PreparedMismatch`; only
  the pointer in the struct changes. Output buffers are fixed at prepare (the result is them).
- the op's per-step scalars (the planner's cost table, capacity, budget, prompt tokens, token offset, latency
  target, T_pad; a sampler's offset), validated again whenever they differ from the last run's, with the
  free function's errors.

An argument left out keeps its last value (an input given as None too; a per-step scalar given as None means what
None means to the op: no latency target, the default capacity or T_pad; a planner budget of None keeps it). Every
run also checks that each tensor the handle holds still has the data pointer, shape and strides it was validated
with, so a ``resize_``, ``set_`` or ``as_strided_`` of a prepared buffer raises :class:`PreparedMismatch` instead
of reaching a kernel (``own_outputs`` lifts that for an owner of the buffers, as AdaptiveVerifier). Tensor values
are never checked on the host (that would sync a device): the kernels' documented handling of bad values applies,
as for the free functions. Inputs the free function would convert (an int64 ``drafts``, a float64 weight) are
refused by ``prepare`` with a TypeError naming them: a converted copy would not see the values written into the
original later.

CUDA graphs: a run enqueues one kernel and reads nothing back, so it can be captured; replays then run no Python
at all (a prepared call and a captured graph freeze the same things: pointers, shapes and host scalars). A run
under torch.compile is not traced (call the op itself there: the ops are registered custom ops).
Handles are not thread-safe: give each thread its own.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable, Optional

import torch

from ._ext import check_status
from ._validate import stream_of

__all__ = ["Prepared", "PreparedLaunch", "PreparedMismatch", "prepare"]


class PreparedMismatch(ValueError):
    """A run's tensor does not match the prepared one (dtype, device, shape or strides), or a tensor the handle
    holds changed its data pointer, shape or strides since prepare: prepare the call again."""


_state = threading.local()
# op function -> its prepared form's name (filled by the op modules: register())
_PREPARABLE: dict = {}


def register(fn: Callable) -> Callable:
    """Marks an op function as one ``prepare`` accepts (the op captures its Prepared handle itself)."""
    _PREPARABLE[fn] = fn.__qualname__
    return fn


def preparing() -> bool:
    """Whether the op being called runs under ``prepare``: it then captures its handle instead of launching."""
    return getattr(_state, "box", None) is not None


def capture(handle: "Prepared") -> None:
    """Hands the op's validated, unlaunched call to ``prepare``."""
    _state.box.append(handle)


def refuse_copy(op: str, name: str) -> None:
    """prepare's error for an input the op converted into a per-call copy."""
    raise TypeError(f"prepare({op}): {name} would be converted into a copy on every call (another dtype or layout "
                    f"than the kernel reads), which a prepared call cannot repeat; pass it as the kernel reads it")


def prepare(op: Callable, *args, **kwargs) -> "Prepared":
    """A :class:`Prepared` handle of ``op(*args, **kwargs)``: validated now, launched by each ``handle.run()``.

    ``op``: :func:`~adaptive_verify.plan_verification`, :func:`~adaptive_verify.plan_tree_verification`,
    :func:`~adaptive_verify.choose_budget`, :func:`~adaptive_verify.prefix_survival`,
    :func:`~adaptive_verify.tree_survival`, :func:`~adaptive_verify.confidence`,
    :func:`~adaptive_verify.rejection_sample`, :func:`~adaptive_verify.tree_rejection_sample`,
    :func:`~adaptive_verify.sample` or an :class:`~adaptive_verify.AcceptanceStats` object's ``update``. The
    arguments are the op's own; outputs not given as ``out=`` are allocated once, here, and every run writes into
    the same buffers (the handle's result). Errors are the op's. See the module docstring for
    what ``run`` may change."""
    if torch.compiler.is_compiling():
        raise RuntimeError("prepare() cannot run under torch.compile: call the op itself in a compiled region")
    fn = getattr(op, "__func__", op)  # a bound method (AcceptanceStats.update)
    if fn not in _PREPARABLE:
        names = ", ".join(sorted(_PREPARABLE.values()))
        raise TypeError(f"prepare: op must be one of {names}; got {getattr(op, '__qualname__', op)!r}")
    if getattr(_state, "box", None) is not None:
        raise RuntimeError("prepare() calls do not nest")
    box: list = []
    _state.box = box
    try:
        op(*args, **kwargs)
    finally:
        _state.box = None
    if len(box) != 1:  # every registered op captures exactly once
        raise RuntimeError(f"prepare({fn.__qualname__}) captured {len(box)} calls")
    return box[0]


_SIG = Callable[[torch.Tensor], tuple]


class Prepared:
    """A validated, launch-ready call of one op (made by :func:`prepare`); ``run()`` launches it and returns the
    op's result. The tensors it reads are its *inputs* (rebindable in run, by name) and the rest it holds
    (outputs, settings tensors): both are checked for layout changes on every run."""

    __slots__ = ("op", "params", "_slots", "_held", "_held_sig", "_held_names", "_own_inputs", "_order", "_seq")

    def __init__(self, op: str, params, inputs: dict, held: Optional[dict] = None):
        """inputs: name -> (tensor or None, the struct field holding its pointer); held: name -> the other tensors the
        struct points into (outputs, workspace, tensors not rebindable), None entries skipped."""
        self.op, self.params = op, params
        # name -> [tensor, the struct field of its pointer, its kernel argument (pointer, dtype, device, shape, strides),
        # its layout (pointer, shape, strides): what an in-place change can alter]. (An input that was None stays None:
        # its presence decided the struct.)
        self._slots = {name: [t, field, (t.data_ptr(), t.dtype, t.device, t.shape, t.stride()),
                              (t.data_ptr(), t.shape, t.stride())]
                       for name, (t, field) in inputs.items() if t is not None}
        # every input name in the order given (None ones too) and its slot or None: what _bind_seq takes
        self._order = tuple(inputs)
        self._seq = tuple(self._slots.get(name) for name in self._order)
        held = {name: t for name, t in (held or {}).items() if t is not None}
        self._held, self._held_names = tuple(held.values()), tuple(held)
        self._own_inputs = False
        self._held_sig = [(t.data_ptr(), t.shape, t.stride()) for t in self._held]

    def _bind(self, new: Optional[dict]) -> None:
        """Rebinds the input tensors in ``new`` (name -> tensor or None: keep) and checks every other tensor's
        layout (_bind_seq). Raises TypeError for a name that is not an input, PreparedMismatch naming a tensor."""
        if not new:
            self._bind_seq(None)
            return
        unknown = sorted(name for name, t in new.items() if t is not None and name not in self._slots)
        if unknown:
            raise TypeError(f"{self.op}: run() cannot rebind {unknown}: its inputs are {list(self._slots)} (an input "
                            "that was None at prepare stays None; prepare another call to pass one)")
        self._bind_seq(tuple(map(new.get, self._order)))

    def _bind_seq(self, tensors) -> None:
        """Rebinds the inputs given positionally, ``tensors`` in the order they were given at construction (None:
        keep; None for ``tensors``: keep every one), the form an owner passing every input each run uses, and checks
        the layout of the bound ones (not with own_outputs(inputs=True)) and of the held ones."""
        own = self._own_inputs
        if tensors is None:
            if not own:
                for name, slot in self._slots.items():
                    t = slot[0]
                    if (t.data_ptr(), t.shape, t.stride()) != slot[3]:
                        raise PreparedMismatch(self._changed(name))
            if self._held:
                self._check_held()
            return
        params = self.params
        for name, slot, t in zip(self._order, self._seq, tensors):
            if slot is None:
                if t is not None:
                    raise TypeError(f"{self.op}: run() cannot rebind [{name!r}]: its inputs are {list(self._slots)} "
                                    "(an input that was None at prepare stays None; prepare another call to pass one)")
                continue
            cur = slot[0]
            if t is None or t is cur:  # the bound tensor: only an in-place change of its layout is possible
                if not own and (cur.data_ptr(), cur.shape, cur.stride()) != slot[3]:
                    raise PreparedMismatch(self._changed(name))
                continue
            arg = (t.data_ptr(), t.dtype, t.device, t.shape, t.stride()) if type(t) is torch.Tensor else None
            if arg != slot[2]:  # another pointer (or another layout, which is refused)
                if arg is None or arg[1:] != slot[2][1:]:
                    raise PreparedMismatch(self._mismatch(name, t, slot[2]))
                setattr(params, slot[1], arg[0])
                slot[2], slot[3] = arg, (arg[0], arg[3], arg[4])
            slot[0] = t
        if self._held:
            self._check_held()

    def _check_held(self) -> None:
        """Raises PreparedMismatch naming the first held tensor (output, settings tensor) whose layout changed."""
        for i, (t, sig) in enumerate(zip(self._held, self._held_sig)):
            if (t.data_ptr(), t.shape, t.stride()) != sig:
                raise PreparedMismatch(self._changed(self._held_names[i]))

    def _changed(self, name: str) -> str:
        return (f"{self.op}: {name} changed its data pointer, shape or strides since it was prepared (resize_, set_, "
                "as_strided_): prepare the call again")

    def _mismatch(self, name: str, t: Any, arg) -> str:
        want = f"{arg[1]} {list(arg[3])} with strides {arg[4]} on {arg[2]}"
        if not isinstance(t, torch.Tensor):
            return f"{self.op}: {name} must be a tensor like the prepared one ({want}), got {type(t).__name__}"
        return (f"{self.op}: {name} must match the prepared tensor ({want}), got {t.dtype} {list(t.shape)} with "
                f"strides {t.stride()} on {t.device}: prepare the call again for another layout")

    def own_outputs(self, inputs: bool = False) -> "Prepared":
        """Declares that the caller owns every tensor the handle holds besides its inputs (its outputs and settings
        tensors), and with ``inputs`` the prepared inputs too, and never changes their layout: runs stop checking
        them (a tensor rebound in a run is still checked). For an owner that made those buffers itself and hands out
        nothing that could resize them (AdaptiveVerifier's plan buffers; its lagged budget's inputs). Returns self."""
        self._held, self._held_sig, self._held_names = (), [], ()
        self._own_inputs = bool(inputs)
        return self

    @property
    def inputs(self) -> tuple:
        """The names run() can rebind."""
        return tuple(self._slots)

    def __repr__(self) -> str:
        return f"Prepared({self.op}, inputs={list(self._slots)})"


class PreparedLaunch(Prepared):
    """A prepared call of one extension entry point whose result is fixed at prepare (its out= buffers):
    ``run(**inputs)`` rebinds the inputs given, launches, and returns that result."""

    __slots__ = ("fn", "addr", "device", "on_cuda", "messages", "result")

    def __init__(self, op: str, fn, params, device: torch.device, inputs: dict, held: Optional[dict], result,
                 messages: Optional[dict] = None):
        super().__init__(op, params, inputs, held)
        self.fn, self.addr, self.device, self.on_cuda = fn, ctypes.addressof(params), device, device.type == "cuda"
        self.messages, self.result = messages, result  # messages: the op's wording of some statuses (check_status)

    def launch(self) -> None:
        status = self.fn(self.addr, self.on_cuda, stream_of(self.device) if self.on_cuda else 0)
        if status:
            check_status(status, self.op, self.device, self.messages)

    def run(self, **inputs):
        self._bind(inputs)
        self.launch()
        return self.result

    def run_owned(self, tensors: tuple):
        """run() for an owner that passes every input each run, positionally, in the order the op's prepare gave
        them (AcceptanceStats.update: conf, verify_lens, num_accepted, positions)."""
        self._bind_seq(tensors)
        self.launch()
        return self.result


def run_prepared(calls: dict, key, make: Callable[[], Prepared], limit: int = 64, **changes):
    """``calls[key].run(**changes)``, or, when there is no such call or its inputs do not match its prepared layout,
    ``make()`` (a new handle, built from this very call's arguments) stored under key and run: how an owner of
    prepared calls (AdaptiveVerifier) keeps one per shape of its caller's inputs, ``limit`` of them at most (the
    oldest goes first)."""
    call = calls.get(key)
    if call is not None:
        try:
            return call.run(**changes)
        except PreparedMismatch:  # a caller tensor of another layout (or one resized since): prepare again below
            pass
    call = make()
    if key not in calls and len(calls) >= limit:
        calls.pop(next(iter(calls)))
    calls[key] = call
    return call.run()
