//! Errors: every failing libssa status becomes an [`Error`] with the library's message.
use std::ffi::CStr;
use std::fmt;

use ssa_sys as sys;

/// A failing `ssa_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// SSA_ERR_INVALID_ARGUMENT: null pointer, bad size, unknown layer, bad params.
    InvalidArgument,
    /// SSA_ERR_OUT_OF_MEMORY: a host or device allocation failed; nothing changed.
    OutOfMemory,
    /// SSA_ERR_IO: a file system error (open, write, fsync, rename).
    Io,
    /// SSA_ERR_CORRUPT: a snapshot fails a checksum or is truncated/malformed.
    Corrupt,
    /// SSA_ERR_VERSION: the snapshot format version is not supported.
    Version,
    /// SSA_ERR_MISMATCH: a snapshot and the session do not fit.
    Mismatch,
    /// SSA_ERR_UNSUPPORTED: a valid request this build or backend cannot do.
    Unsupported,
    /// SSA_ERR_DEVICE: a CUDA error.
    Device,
    /// SSA_ERR_BUSY: the session is being mutated by another thread.
    Busy,
    /// SSA_ERR_INTERNAL: a bug in libssa.
    Internal,
    /// A status this binding does not know (a newer library).
    Unknown(u32),
}

impl Status {
    /// Maps a raw `ssa_status`; `None` for SSA_OK.
    pub fn from_raw(raw: sys::ssa_status) -> Option<Status> {
        Some(match raw {
            sys::SSA_OK => return None,
            sys::SSA_ERR_INVALID_ARGUMENT => Status::InvalidArgument,
            sys::SSA_ERR_OUT_OF_MEMORY => Status::OutOfMemory,
            sys::SSA_ERR_IO => Status::Io,
            sys::SSA_ERR_CORRUPT => Status::Corrupt,
            sys::SSA_ERR_VERSION => Status::Version,
            sys::SSA_ERR_MISMATCH => Status::Mismatch,
            sys::SSA_ERR_UNSUPPORTED => Status::Unsupported,
            sys::SSA_ERR_DEVICE => Status::Device,
            sys::SSA_ERR_BUSY => Status::Busy,
            sys::SSA_ERR_INTERNAL => Status::Internal,
            other => Status::Unknown(other),
        })
    }

    /// The raw `ssa_status` value.
    pub fn raw(self) -> sys::ssa_status {
        match self {
            Status::InvalidArgument => sys::SSA_ERR_INVALID_ARGUMENT,
            Status::OutOfMemory => sys::SSA_ERR_OUT_OF_MEMORY,
            Status::Io => sys::SSA_ERR_IO,
            Status::Corrupt => sys::SSA_ERR_CORRUPT,
            Status::Version => sys::SSA_ERR_VERSION,
            Status::Mismatch => sys::SSA_ERR_MISMATCH,
            Status::Unsupported => sys::SSA_ERR_UNSUPPORTED,
            Status::Device => sys::SSA_ERR_DEVICE,
            Status::Busy => sys::SSA_ERR_BUSY,
            Status::Internal => sys::SSA_ERR_INTERNAL,
            Status::Unknown(v) => v,
        }
    }

    /// The library's static name of the status ("SSA_ERR_CORRUPT").
    pub fn name(self) -> &'static str {
        // SAFETY: ssa_status_string returns a static, NUL-terminated string, never NULL.
        unsafe { CStr::from_ptr(sys::ssa_status_string(self.raw())) }
            .to_str()
            .unwrap_or("SSA_ERR_?")
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failed libssa call, or an argument the binding refused before calling it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    status: Status,
    message: String,
    function: Option<&'static str>,
}

impl Error {
    /// The status.
    pub fn status(&self) -> Status {
        self.status
    }
    /// The library's detail (`ssa_last_error_message`) or the binding's own explanation.
    pub fn message(&self) -> &str {
        &self.message
    }
    /// The C function that failed, or `None` when the binding refused the call itself.
    pub fn function(&self) -> Option<&'static str> {
        self.function
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error { status: Status::InvalidArgument, message: message.into(), function: None }
    }

    /// Reads this thread's last error message; call right after the failing call.
    pub(crate) fn from_last(status: Status, function: &'static str) -> Error {
        // SAFETY: never NULL; valid until the next libssa call on this thread, and we copy it now.
        let msg = unsafe { CStr::from_ptr(sys::ssa_last_error_message()) }
            .to_string_lossy()
            .into_owned();
        Error { status, message: msg, function: Some(function) }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(func) = self.function {
            write!(f, "{}: ", func)?;
        }
        write!(f, "{}: {}", self.status, self.message)
    }
}

impl std::error::Error for Error {}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn check(raw: sys::ssa_status, function: &'static str) -> Result<()> {
    match Status::from_raw(raw) {
        None => Ok(()),
        Some(st) => Err(Error::from_last(st, function)),
    }
}
