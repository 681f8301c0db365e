"""Exceptions raised for failing libssa statuses."""
from typing import Dict, Optional, Type

from ._ssa_cffi import ffi, lib


class Error(Exception):
    """Base class of every libssa error.

    Attributes:
        status: the numeric ``ssa_status`` (``ssa.Status``) behind the error.
        message: the library's detail (``ssa_last_error_message()``) or, for errors
            the binding detects before calling the library, its own explanation.
        function: the C function that failed, or ``None`` for binding-side checks.
    """

    status: int = -1

    def __init__(self, message: str, status: Optional[int] = None, function: Optional[str] = None):
        if status is not None:
            self.status = int(status)
        self.message = message
        self.function = function
        name = ffi.string(lib.ssa_status_string(self.status)).decode() if self.status >= 0 else "?"
        where = function + ": " if function else ""
        super().__init__("%s%s: %s" % (where, name, message))

    def __str__(self) -> str:  # OSError and friends format their args differently
        return self.args[0] if self.args else ""


class InvalidArgument(Error, ValueError):
    """SSA_ERR_INVALID_ARGUMENT: a bad pointer, shape, layer or parameter.

    Also raised (as a ValueError) by the binding itself for wrong array shapes,
    dtypes or layouts before any C call is made."""

    status = lib.SSA_ERR_INVALID_ARGUMENT


class OutOfMemory(Error, MemoryError):
    """SSA_ERR_OUT_OF_MEMORY: a host or device allocation failed; nothing changed."""

    status = lib.SSA_ERR_OUT_OF_MEMORY


class IOError(Error, OSError):  # noqa: A001 - deliberately mirrors the status name
    """SSA_ERR_IO: a file system error while saving or loading a snapshot."""

    status = lib.SSA_ERR_IO


class Corrupt(Error):
    """SSA_ERR_CORRUPT: a snapshot fails a checksum or is truncated or malformed."""

    status = lib.SSA_ERR_CORRUPT


class Version(Error):
    """SSA_ERR_VERSION: the snapshot's format version is not supported."""

    status = lib.SSA_ERR_VERSION


class Mismatch(Error):
    """SSA_ERR_MISMATCH: a snapshot and the session or runtime do not fit."""

    status = lib.SSA_ERR_MISMATCH


class Unsupported(Error):
    """SSA_ERR_UNSUPPORTED: a valid request this build or backend cannot do."""

    status = lib.SSA_ERR_UNSUPPORTED


class Device(Error):
    """SSA_ERR_DEVICE: a CUDA error."""

    status = lib.SSA_ERR_DEVICE


class Busy(Error):
    """SSA_ERR_BUSY: the session is being mutated by another thread."""

    status = lib.SSA_ERR_BUSY


class Internal(Error):
    """SSA_ERR_INTERNAL: a bug in libssa; please report the message."""

    status = lib.SSA_ERR_INTERNAL


_BY_STATUS: Dict[int, Type[Error]] = {
    cls.status: cls
    for cls in (InvalidArgument, OutOfMemory, IOError, Corrupt, Version, Mismatch,
                Unsupported, Device, Busy, Internal)
}


def error_for(status: int, function: str) -> Error:
    """Builds the exception for a failing status, with this thread's error message."""
    message = ffi.string(lib.ssa_last_error_message()).decode("utf-8", "replace")
    cls = _BY_STATUS.get(int(status), Error)
    return cls(message, status=int(status), function=function)


def check(status: int, function: str) -> None:
    """Raises the matching ssa.Error subclass unless status is SSA_OK."""
    if status != lib.SSA_OK:
        raise error_for(status, function)


def invalid(message: str) -> InvalidArgument:
    """An InvalidArgument detected by the binding before any C call."""
    return InvalidArgument(message, status=lib.SSA_ERR_INVALID_ARGUMENT)
