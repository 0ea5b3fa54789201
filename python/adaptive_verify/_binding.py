"""Named parameter structs of adaptive_verify._C, built once from the layouts the extension exports.

Every op of the extension takes the address of a C struct (csrc/include/adaptive_verify/<area>/params.h), a
flag saying whether to run the CUDA launcher, and a stream. The extension exports each struct's fields as
(name, offset, size, kind) (csrc/bindings/, AV_FIELD: the name and the member come from one token); here each
becomes a ctypes.Structure whose offsets and size are checked against the C ones at import, so a field
missing from the export, or a struct that changed without its export, fails loudly at import rather than
writing the wrong field. Wrappers fill the struct by field name; the host emulator (tests/emu) receives the
very same struct.
"""
from __future__ import annotations

import ctypes

from ._ext import _C

_CTYPES = {
    ("p", 8): ctypes.c_void_p, ("i", 4): ctypes.c_int32, ("i", 8): ctypes.c_int64, ("u", 4): ctypes.c_uint32,
    ("u", 8): ctypes.c_uint64, ("f", 4): ctypes.c_float, ("f", 8): ctypes.c_double, ("b", 1): ctypes.c_bool,
}


#: Array fields (fixed size, by value): their element type per kind.
_ARRAY_ELEMENTS = {"F": ctypes.c_float, "I": ctypes.c_int64, "B": ctypes.c_uint8}


def _ctype(kind: str, size: int):
    element = _ARRAY_ELEMENTS.get(kind)
    if element is None:
        return _CTYPES[(kind, size)]
    if size % ctypes.sizeof(element):
        raise KeyError((kind, size))
    return element * (size // ctypes.sizeof(element))


def struct_type(name: str, layout) -> type:
    """A ctypes.Structure subclass with the fields of an exported layout ([(name, offset, size, kind)], sizeof)."""
    fields, size = layout
    fields = sorted(fields, key=lambda f: f[1])
    try:
        ctype_fields = [(f_name, _ctype(kind, f_size)) for f_name, _, f_size, kind in fields]
    except KeyError as e:
        raise ImportError(f"adaptive_verify._C.{name}: unsupported field kind {e}") from None
    cls = type(name, (ctypes.Structure,), {"_fields_": ctype_fields, "__slots__": ()})
    for f_name, offset, _, _ in fields:
        if getattr(cls, f_name).offset != offset:
            raise ImportError(f"adaptive_verify._C.{name}: field {f_name} is at offset {getattr(cls, f_name).offset} "
                              f"here but {offset} in C: the extension and this package disagree (rebuild)")
    if ctypes.sizeof(cls) != size:
        raise ImportError(f"adaptive_verify._C.{name}: {ctypes.sizeof(cls)} bytes here but {size} in C: a field is "
                          "missing from the bindings' export (csrc/bindings/)")
    return cls


def fields_of(cls: type) -> tuple[str, ...]:
    """The field names of a params struct type, in C order."""
    return tuple(name for name, _ in cls._fields_)


SurvivalParams = struct_type("SURVIVAL_PARAMS", _C.SURVIVAL_PARAMS)
PlannerParams = struct_type("PLANNER_PARAMS", _C.PLANNER_PARAMS)
ConfidenceParams = struct_type("CONFIDENCE_PARAMS", _C.CONFIDENCE_PARAMS)
LogitParams = struct_type("LOGIT_PARAMS", _C.LOGIT_PARAMS)
MarginParams = struct_type("MARGIN_PARAMS", _C.MARGIN_PARAMS)
StatsParams = struct_type("STATS_PARAMS", _C.STATS_PARAMS)
RejectionParams = struct_type("REJECTION_PARAMS", _C.REJECTION_PARAMS)
SampleParams = struct_type("SAMPLE_PARAMS", _C.SAMPLE_PARAMS)
TreeSampleParams = struct_type("TREE_SAMPLE_PARAMS", _C.TREE_SAMPLE_PARAMS)
AttentionParams = struct_type("ATTENTION_PARAMS", _C.ATTENTION_PARAMS)
WriteKvParams = struct_type("WRITE_KV_PARAMS", _C.WRITE_KV_PARAMS)
CommitTreeKvParams = struct_type("COMMIT_TREE_KV_PARAMS", _C.COMMIT_TREE_KV_PARAMS)
SlotParams = struct_type("SLOT_PARAMS", _C.SLOT_PARAMS)


def call(op, params, on_cuda: bool, stream: int) -> int:
    """Runs _C.<op> on a filled params struct; returns its status."""
    return op(ctypes.addressof(params), on_cuda, stream)
