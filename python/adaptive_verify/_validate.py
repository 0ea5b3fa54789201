"""Tensor checks shared by the ops (scalars: _checks.py): every message names the argument and the value."""
from __future__ import annotations

import torch

from ._ext import _C, build_info, cuda_available

# Element types the kernels read, with the codes of csrc/include/adaptive_verify/dtype.h.
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
#: K, drafts per request (32): the planner's candidate key holds 5 position bits (planner/math.h kMaxDrafts).
MAX_DRAFTS: int = _C.PLANNER_MAX_DRAFTS


def device_arg(name: str, device, *, kernels: bool = True) -> torch.device:
    """A device argument (a str such as "cpu" or "cuda:1", a torch.device, or a CUDA index) as a CPU or CUDA
    torch.device: TypeError / ValueError naming ``name`` for anything else, including a CUDA device where CUDA
    kernels cannot run (torch's own errors for these are RuntimeErrors that name nothing)."""
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise TypeError(f"{name} must be a str, int or torch.device, got {type(device).__name__} {device!r}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"{name} must name a CPU or CUDA device, got {device!r} ({e})") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} must be a CPU or CUDA device, got {dev}")
    if dev.type == "cuda":
        if kernels and not cuda_available():
            reason = build_info()["cuda_unusable_reason"]
            raise ValueError(f"{name} is {dev} but CUDA kernels cannot run here: {reason}")
        if not torch.cuda.is_available():
            raise ValueError(f"{name} is {dev} but torch {torch.__version__} has no usable CUDA device")
        if dev.index is not None and not 0 <= dev.index < torch.cuda.device_count():
            raise ValueError(f"{name} is {dev} but there are {torch.cuda.device_count()} CUDA devices")
    return dev


def check_device(name: str, t: torch.Tensor) -> torch.device:
    device = t.device
    if device.type == "cuda":
        if not cuda_available():
            raise RuntimeError(f"{name} is a CUDA tensor but CUDA kernels cannot run: {build_info()['cuda_unusable_reason']}")
    elif device.type != "cpu":
        raise ValueError(f"{name} must be a CPU or CUDA tensor, got device {device}")
    return device


def check_tensor(name, t, *, dtypes=None, device=None, ndim=None, shape=None, inner_contiguous=True):
    """Type, dtype, device, rank and shape; by default only the last dimension must be contiguous."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:  # sparse and other layouts have no strides or data pointer to hand a kernel
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")
    if dtypes is not None and t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({names}), got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} must be on {device}, got {t.device}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if inner_contiguous:
        # An empty tensor is never read: numpy-made ones can carry strides (0, 0), which is fine.
        if t.numel() and t.dim() >= 1 and t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dimension (stride 1), got strides {t.stride()}")
    elif not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    return t


def run_op(custom_op, launch, *args) -> None:
    """Eager calls go straight to the kernel launcher (no dispatcher cost on the hot path); while
    torch.compile traces, the same arguments go through the op's registered torch.library custom op."""
    if torch.compiler.is_compiling():
        custom_op(*args)
    else:
        launch(*args)


# The current stream's raw handle in one C call (what torch.compile's generated code uses); CPU builds lack it.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream_of(device: torch.device) -> int:
    """The current CUDA stream of ``device`` as an integer handle (0 on CPU)."""
    if device.type != "cuda":
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


def ptr(t) -> int:
    return 0 if t is None else t.data_ptr()


def check_temperature(name: str, temperature, K: int, device: torch.device):
    """[K] positive temperatures as a float32 tensor on `device` (None stays None).

    Accepts a sequence of numbers or a tensor. On the CPU (a sequence, or a CPU tensor) the values must be finite
    and > 0, checked on every call. A tensor already on a CUDA device is not read on the host (that would stall it
    on a sync every call): the kernels make the confidence of a position whose temperature is not finite and > 0
    NaN (confidence/math.h), which prefix_survival and the planner count as ``nan_survival`` and never verify.
    """
    if temperature is None:
        return None
    if not isinstance(temperature, torch.Tensor):
        if isinstance(temperature, (str, bytes)):
            raise TypeError(f"{name} must be a [K] tensor or a sequence of numbers, got {type(temperature).__name__}")
        try:
            temperature = torch.tensor([float(x) for x in temperature], dtype=torch.float32)
        except (TypeError, ValueError, OverflowError):
            raise TypeError(f"{name} must be a [K] tensor or a sequence of numbers, got {type(temperature).__name__}") \
                from None
    if not temperature.is_floating_point():
        raise TypeError(f"{name} must be floating point, got {temperature.dtype}")
    if temperature.shape != (K,):
        raise ValueError(f"{name} must have shape [K] = ({K},), got {tuple(temperature.shape)}")
    if temperature.device != device:
        if temperature.device.type != "cpu":
            raise ValueError(f"{name} must be on {device}, got {temperature.device}")
    if temperature.device.type == "cpu" and not torch.compiler.is_compiling():
        bad = ~(torch.isfinite(temperature) & (temperature > 0))
        if bool(bad.any()):
            raise ValueError(f"{name} must be finite and > 0 at every position, got {temperature.tolist()}")
    return temperature.to(device=device, dtype=torch.float32).contiguous()


def kernel_choice(cuda_kernel, setting: str, default, kernels: dict) -> int:
    """The id of a CUDA kernel chosen by a call's ``cuda_kernel`` argument, else by the module setting named
    ``setting`` (whose value is ``default``); an unknown name raises ValueError naming whichever was used."""
    name = default if cuda_kernel is None else cuda_kernel
    kernel = kernels.get(name) if isinstance(name, str) else None
    if kernel is None:
        what = setting if cuda_kernel is None else "cuda_kernel"
        raise ValueError(f"{what} must be one of {sorted(kernels)}, got {name!r}")
    return kernel


def logits_shape(name: str, logits) -> tuple:
    """(device, rows, V) of a [rows, V] bf16/fp16/fp32 logits tensor with a contiguous last dim and V >= 1."""
    check_tensor(name, logits, dtypes=tuple(DTYPE_CODES), ndim=2)
    device = check_device(name, logits)
    rows, V = logits.shape
    if V < 1:
        raise ValueError(f"{name} must have a vocabulary of at least 1, got shape {tuple(logits.shape)}")
    return device, rows, V
