import pytest

import ssa
from ssa._errors import error_for
from ssa._ssa_cffi import ffi, lib

CLASSES = {
    ssa.Status.INVALID_ARGUMENT: ssa.InvalidArgument,
    ssa.Status.OUT_OF_MEMORY: ssa.OutOfMemory,
    ssa.Status.IO: ssa.IOError,
    ssa.Status.CORRUPT: ssa.Corrupt,
    ssa.Status.VERSION: ssa.Version,
    ssa.Status.MISMATCH: ssa.Mismatch,
    ssa.Status.UNSUPPORTED: ssa.Unsupported,
    ssa.Status.DEVICE: ssa.Device,
    ssa.Status.BUSY: ssa.Busy,
    ssa.Status.INTERNAL: ssa.Internal,
}


def test_every_status_has_its_class():
    assert set(CLASSES) == set(ssa.Status) - {ssa.Status.OK}
    for status, cls in CLASSES.items():
        err = error_for(int(status), "ssa_fn")
        assert type(err) is cls
        assert isinstance(err, ssa.Error)
        assert err.status == status
        assert err.function == "ssa_fn"
        name = ffi.string(lib.ssa_status_string(int(status))).decode()
        assert name == "SSA_" + ("ERR_" if status else "") + status.name
        assert name in str(err)


def test_builtin_bases():
    assert issubclass(ssa.InvalidArgument, ValueError)
    assert issubclass(ssa.OutOfMemory, MemoryError)
    assert issubclass(ssa.IOError, OSError)


def test_unknown_status_still_raises_base_error():
    err = error_for(1234, "ssa_fn")
    assert type(err) is ssa.Error and err.status == 1234


def test_message_comes_from_library(rt):
    with rt.create_session(3, 8, 2, 64, "float32") as s:
        with pytest.raises(ssa.InvalidArgument) as ei:
            s.truncate(5)
        assert ei.value.message == ffi.string(lib.ssa_last_error_message()).decode()
        assert ei.value.message != ""
        assert ei.value.message in str(ei.value)


def test_status_enum_matches_header():
    assert [int(s) for s in ssa.Status] == list(range(11))
    assert int(ssa.Method.SSA_ADAPTIVE) == lib.SSA_METHOD_SSA_ADAPTIVE
    assert ssa.METHODS == ("dense", "oracle_topk", "pq_topk", "hybrid_uniform", "sampling", "ssa",
                           "ssa_adaptive")
