"""Zero-copy access to the arrays handed to libssa.

Host memory: numpy arrays (and torch CPU tensors) are passed by pointer through
ffi.from_buffer / data_ptr() without copies. Device memory (CUDA sessions): torch
CUDA tensors and any object exposing ``__cuda_array_interface__`` are passed by
pointer. Shapes, dtypes and C-contiguity are checked here, before any C call.
"""
import sys
from typing import Any, Optional, Sequence, Tuple

import numpy as np

from ._errors import invalid
from ._ssa_cffi import ffi, lib

try:  # optional: a real bfloat16 numpy dtype
    import ml_dtypes as _ml_dtypes  # type: ignore

    BFLOAT16: Optional[np.dtype] = np.dtype(_ml_dtypes.bfloat16)
except Exception:  # pragma: no cover - depends on the environment
    BFLOAT16 = None

DTYPE_NAMES = {lib.SSA_DTYPE_F32: "float32", lib.SSA_DTYPE_F16: "float16", lib.SSA_DTYPE_BF16: "bfloat16"}

# numpy dtypes accepted for each session dtype (bfloat16 as raw uint16 bits or ml_dtypes).
_HOST_OK = {
    lib.SSA_DTYPE_F32: (np.dtype(np.float32),),
    lib.SSA_DTYPE_F16: (np.dtype(np.float16),),
    lib.SSA_DTYPE_BF16: (np.dtype(np.uint16),) + ((BFLOAT16,) if BFLOAT16 is not None else ()),
}
# __cuda_array_interface__ typestrs accepted for each session dtype.
_CAI_OK = {
    lib.SSA_DTYPE_F32: ("<f4",),
    lib.SSA_DTYPE_F16: ("<f2",),
    lib.SSA_DTYPE_BF16: ("<u2", "<V2"),
}
_TORCH_OK = {lib.SSA_DTYPE_F32: "float32", lib.SSA_DTYPE_F16: "float16", lib.SSA_DTYPE_BF16: "bfloat16"}


def default_host_dtype(ssa_dtype: int) -> np.dtype:
    """The numpy dtype used for outputs the binding allocates itself."""
    if ssa_dtype == lib.SSA_DTYPE_BF16:
        return BFLOAT16 if BFLOAT16 is not None else np.dtype(np.uint16)
    return _HOST_OK[ssa_dtype][0]


def _torch_tensor_type():
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None) if torch is not None else None


def is_torch(x: Any) -> bool:
    t = _torch_tensor_type()
    return t is not None and isinstance(x, t)


class Ref:
    """A checked pointer to an array, kept alive with the object that owns the memory."""

    __slots__ = ("ptr", "obj", "keep")

    def __init__(self, ptr, obj, keep=None):
        self.ptr = ptr
        self.obj = obj
        self.keep = keep


def _shape_str(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(int(s)) for s in shape) + ")"


def _check_shape(name: str, got: Tuple[int, ...], want: Sequence[Optional[int]]) -> None:
    ok = len(got) == len(want) and all(w is None or g == w for g, w in zip(got, want))
    if not ok:
        pretty = "(" + ", ".join("n" if w is None else str(w) for w in want) + ")"
        raise invalid("%s has shape %s, expected %s" % (name, _shape_str(got), pretty))


def host_array(name: str, x: Any, ssa_dtype: int, shape: Sequence[Optional[int]], writable: bool) -> Ref:
    """Checks a host array and returns a pointer to its data (no copy)."""
    if is_torch(x):
        if x.device.type != "cpu":
            raise invalid("%s is a %s tensor but this session takes host memory" % (name, x.device.type))
        dt = str(x.dtype).replace("torch.", "")
        if dt != _TORCH_OK[ssa_dtype]:
            raise invalid("%s has dtype %s, this session needs %s" % (name, dt, DTYPE_NAMES[ssa_dtype]))
        _check_shape(name, tuple(x.shape), shape)
        if not x.is_contiguous():
            raise invalid("%s is not C-contiguous" % name)
        if writable and x.requires_grad:
            raise invalid("%s requires grad and cannot be written" % name)
        return Ref(ffi.cast("void *", x.data_ptr()), x)
    if hasattr(x, "__cuda_array_interface__") and not isinstance(x, np.ndarray):
        raise invalid("%s is device memory but this session takes host memory "
                      "(numpy arrays; create a CUDA session without host_pointers for device arrays)" % name)
    if not isinstance(x, np.ndarray):
        raise invalid("%s must be a numpy.ndarray, got %s" % (name, type(x).__name__))
    if x.dtype not in _HOST_OK[ssa_dtype]:
        accepted = ", ".join(str(d) for d in _HOST_OK[ssa_dtype])
        raise invalid("%s has dtype %s, this %s session needs %s" % (name, x.dtype, DTYPE_NAMES[ssa_dtype], accepted))
    _check_shape(name, x.shape, shape)
    if not x.flags.c_contiguous:
        raise invalid("%s is not C-contiguous (use numpy.ascontiguousarray)" % name)
    if writable and not x.flags.writeable:
        raise invalid("%s is read-only" % name)
    if x.size == 0:
        return Ref(ffi.NULL, x)
    buf = ffi.from_buffer("char[]", x, require_writable=writable)
    return Ref(ffi.cast("void *", buf), x, buf)


def device_array(name: str, x: Any, ssa_dtype: int, shape: Sequence[Optional[int]], writable: bool,
                 device: int) -> Ref:
    """Checks a CUDA array (torch tensor or __cuda_array_interface__) and returns its pointer."""
    if is_torch(x):
        if x.device.type != "cuda":
            raise invalid("%s is a %s tensor but this CUDA session takes device memory "
                          "(create it with host_pointers=True to pass host arrays)" % (name, x.device.type))
        if x.device.index is not None and x.device.index != device:
            raise invalid("%s lives on cuda:%d but the runtime uses device %d" % (name, x.device.index, device))
        dt = str(x.dtype).replace("torch.", "")
        if dt != _TORCH_OK[ssa_dtype]:
            raise invalid("%s has dtype %s, this session needs %s" % (name, dt, DTYPE_NAMES[ssa_dtype]))
        _check_shape(name, tuple(x.shape), shape)
        if not x.is_contiguous():
            raise invalid("%s is not C-contiguous" % name)
        return Ref(ffi.cast("void *", x.data_ptr()), x)
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is None:
        raise invalid("%s must be device memory (a torch CUDA tensor or an object with "
                      "__cuda_array_interface__), got %s; create the session with host_pointers=True "
                      "to pass host arrays" % (name, type(x).__name__))
    typestr = cai.get("typestr")
    if typestr not in _CAI_OK[ssa_dtype]:
        raise invalid("%s has typestr %r, this %s session needs one of %s"
                      % (name, typestr, DTYPE_NAMES[ssa_dtype], _CAI_OK[ssa_dtype]))
    got = tuple(int(s) for s in cai["shape"])
    _check_shape(name, got, shape)
    strides = cai.get("strides")
    if strides is not None:
        itemsize = int(typestr[2:])
        expect, acc = [], itemsize
        for s in reversed(got):
            expect.append(acc)
            acc *= s
        if tuple(strides) != tuple(reversed(expect)) and 0 not in got:
            raise invalid("%s is not C-contiguous (strides %s)" % (name, tuple(strides)))
    if cai.get("mask") is not None:
        raise invalid("%s has a mask, which libssa cannot take" % name)
    ptr, readonly = cai["data"]
    if writable and readonly:
        raise invalid("%s is read-only" % name)
    return Ref(ffi.cast("void *", int(ptr)), x)


def overlaps(a: Any, b: Any) -> bool:
    """True when two host arrays may share memory."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return bool(np.shares_memory(a, b))
    return False


def new_host(ssa_dtype: int, shape: Tuple[int, ...], like: Any = None) -> Any:
    """Allocates an output array in host memory, matching `like`'s dtype when given."""
    if is_torch(like):
        return like.new_empty(shape)
    if isinstance(like, np.ndarray):
        return np.empty(shape, dtype=like.dtype)
    return np.empty(shape, dtype=default_host_dtype(ssa_dtype))


def new_device(name: str, like: Any, shape: Tuple[int, ...]) -> Any:
    """Allocates an output array in device memory; only possible when the input is a torch tensor."""
    if is_torch(like):
        return like.new_empty(shape)
    raise invalid("%s=None needs a torch tensor input to allocate device memory; pass %s explicitly" % (name, name))
