"""Python bindings of libssa: long-lived attention KV sessions with Stratified Sparse Attention.

Example::

    import numpy as np, ssa
    with ssa.Runtime(backend="cpu") as rt, rt.create_session(1, 8, 2, 64, "float32") as s:
        k = np.random.randn(4096, 2, 64).astype(np.float32)
        s.append(0, k, np.random.randn(4096, 2, 64).astype(np.float32))
        out, st = s.decode(0, np.random.randn(8, 64).astype(np.float32), sparsity=20, stats=True)

Arrays are passed by pointer without copies; see Session.append and Session.decode.
Failing calls raise subclasses of ssa.Error carrying .status and the library's message.
"""
from ._core import (
    METHODS,
    Backend,
    DecodeStats,
    DecodeTrace,
    DType,
    GroupSelection,
    Method,
    Proxy,
    Runtime,
    Session,
    SessionConfig,
    SnapshotInfo,
    Status,
    header_version,
    inspect,
    version,
)
from ._errors import (
    Busy,
    Corrupt,
    Device,
    Error,
    Internal,
    InvalidArgument,
    IOError,
    Mismatch,
    OutOfMemory,
    Unsupported,
    Version,
)

__version__ = "0.1.0"

__all__ = [
    "Runtime", "Session", "SessionConfig", "SnapshotInfo", "DecodeStats", "DecodeTrace", "Status", "Backend", "DType", "GroupSelection", "Method", "Proxy",
    "METHODS", "version", "header_version", "inspect",
    "Error", "InvalidArgument", "OutOfMemory", "IOError", "Corrupt", "Version", "Mismatch",
    "Unsupported", "Device", "Busy", "Internal",
]
