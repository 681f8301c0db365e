//! Safe Rust bindings of libssa: long-lived attention KV sessions with Stratified
//! Sparse Attention decode.
//!
//! ```no_run
//! use ssa::{DType, DecodeParams, Method, Runtime, RuntimeOptions, SessionConfig};
//! let rt = Runtime::new(&RuntimeOptions::cpu(0))?;
//! let mut s = rt.create_session(&SessionConfig::new(1, 8, 2, 64, DType::F32))?;
//! let k = vec![0.5f32; 100 * 2 * 64];
//! s.append(0, &k, &k)?;
//! let q = vec![0.1f32; 8 * 64];
//! let mut out = vec![0f32; 8 * 64];
//! let stats = s.decode(0, &q, &mut out, &DecodeParams::method(Method::Dense))?;
//! # Ok::<(), ssa::Error>(())
//! ```
//!
//! Ownership and threads follow ssa.h: a [`Runtime`] is `Send + Sync` and cheap to
//! clone (sessions keep it alive); a [`Session`] is `Send + Sync`, decodes take
//! `&self` (many threads may decode at once) and mutations take `&mut self`.
//! Half-precision data (F16, BF16) is passed as raw `u16` bits.

mod error;
mod types;

use std::ffi::CString;
use std::os::raw::c_void;
use std::path::Path;
use std::ptr::{self, NonNull};
use std::sync::Arc;

pub use error::{Error, Result, Status};
pub use ssa_sys as sys;
pub use types::{
    Backend, DType, DecodeParams, DecodeStats, Element, GroupSelection, LoadOptions, Method, Proxy, RuntimeOptions,
    SessionConfig, SnapshotInfo,
};

/// (major, minor, patch) of the libssa actually loaded.
pub fn version() -> (u32, u32, u32) {
    // SAFETY: no arguments, no state.
    let v = unsafe { sys::ssa_version() };
    (v / 10000, (v / 100) % 100, v % 100)
}

/// (major, minor, patch) of the ssa.h these bindings were generated from.
pub const HEADER_VERSION: (u32, u32, u32) = (sys::SSA_VERSION_MAJOR, sys::SSA_VERSION_MINOR, sys::SSA_VERSION_PATCH);

/// Describes the snapshot at `path` (a session's file or a group's manifest) without
/// loading it: the config, layer and metadata sections are read and their checksums
/// verified; K/V pages, codes and codebooks are not read.
pub fn inspect(path: impl AsRef<Path>) -> Result<SnapshotInfo> {
    let p = path_cstring(path.as_ref())?;
    // SAFETY: ssa_snapshot_info is plain data; init sets struct_size.
    let mut info: sys::ssa_snapshot_info = unsafe { std::mem::zeroed() };
    // SAFETY: info is valid for writes.
    unsafe { sys::ssa_snapshot_info_init(&mut info) };
    // SAFETY: NUL-terminated path, info initialised.
    error::check(unsafe { sys::ssa_snapshot_inspect(p.as_ptr(), &mut info) }, "ssa_snapshot_inspect")?;
    SnapshotInfo::from_raw(&info)
        .ok_or_else(|| Error::invalid(format!("snapshot has an unknown dtype {}", info.kv_dtype)))
}

struct RuntimeInner {
    raw: NonNull<sys::ssa_runtime>,
}

// SAFETY: ssa.h: "a runtime may be used from any number of threads at once".
unsafe impl Send for RuntimeInner {}
unsafe impl Sync for RuntimeInner {}

impl Drop for RuntimeInner {
    fn drop(&mut self) {
        // SAFETY: every session holds an Arc to this, so none is left.
        unsafe { sys::ssa_runtime_destroy(self.raw.as_ptr()) }
    }
}

/// A libssa runtime (backend, worker threads, default seed). Clones share one handle,
/// which is freed when the last clone and the last session of it are dropped.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<RuntimeInner>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("backend", &self.backend())
            .field("threads", &self.num_threads())
            .finish()
    }
}

fn path_cstring(path: &Path) -> Result<CString> {
    #[cfg(unix)]
    let bytes = {
        use std::os::unix::ffi::OsStrExt;
        path.as_os_str().as_bytes().to_vec()
    };
    #[cfg(not(unix))]
    let bytes = path
        .to_str()
        .ok_or_else(|| Error::invalid("path is not valid UTF-8"))?
        .as_bytes()
        .to_vec();
    CString::new(bytes).map_err(|_| Error::invalid("path contains a NUL byte"))
}

impl Runtime {
    /// Creates a runtime.
    pub fn new(opts: &RuntimeOptions) -> Result<Runtime> {
        let raw_opts = opts.to_raw();
        let mut out = ptr::null_mut();
        // SAFETY: opts and out are valid for the call.
        error::check(unsafe { sys::ssa_runtime_create(&raw_opts, &mut out) }, "ssa_runtime_create")?;
        let raw = NonNull::new(out).ok_or_else(|| Error::invalid("ssa_runtime_create returned NULL"))?;
        Ok(Runtime { inner: Arc::new(RuntimeInner { raw }) })
    }

    fn raw(&self) -> *mut sys::ssa_runtime {
        self.inner.raw.as_ptr()
    }

    /// The backend actually used (never `Auto`).
    pub fn backend(&self) -> Backend {
        // SAFETY: valid handle.
        Backend::from_raw(unsafe { sys::ssa_runtime_backend(self.raw()) })
    }

    /// CPU worker threads (>= 1).
    pub fn num_threads(&self) -> i32 {
        // SAFETY: valid handle.
        unsafe { sys::ssa_runtime_num_threads(self.raw()) }
    }

    /// Shards (devices) every session of the runtime is split over (>= 1).
    pub fn num_shards(&self) -> u32 {
        // SAFETY: valid handle.
        unsafe { sys::ssa_runtime_num_shards(self.raw()) }
    }

    /// Creates an empty session.
    pub fn create_session(&self, cfg: &SessionConfig) -> Result<Session> {
        let c = cfg.to_raw();
        let mut out = ptr::null_mut();
        // SAFETY: valid handle, cfg and out valid for the call.
        error::check(unsafe { sys::ssa_session_create(self.raw(), &c, &mut out) }, "ssa_session_create")?;
        Session::adopt(self.inner.clone(), out)
    }

    /// Restores a session saved with [`Session::save`] or [`Session::checkpoint`].
    pub fn load(&self, path: impl AsRef<Path>, opts: LoadOptions) -> Result<Session> {
        let p = path_cstring(path.as_ref())?;
        let mut out = ptr::null_mut();
        // SAFETY: valid handle, NUL-terminated path, out valid.
        error::check(
            unsafe { sys::ssa_session_load(self.raw(), p.as_ptr(), opts.raw(), &mut out) },
            "ssa_session_load",
        )?;
        Session::adopt(self.inner.clone(), out)
    }

    /// Decodes many sessions of this runtime at one layer in one call; each item's
    /// `out` is written. All items take the same element type.
    pub fn decode_batch<T: Element>(&self, items: &mut [BatchItem<'_, T>], layer: u32, params: &DecodeParams) -> Result<()> {
        let mut raw_items = Vec::with_capacity(items.len());
        for (i, it) in items.iter_mut().enumerate() {
            if !Arc::ptr_eq(&it.session.rt, &self.inner) {
                return Err(Error::invalid(format!("item {}: session belongs to another runtime", i)));
            }
            it.session
                .check_decode_args(&*it.q, &*it.out)
                .map_err(|e| Error::invalid(format!("item {}: {}", i, e.message())))?;
            raw_items.push(sys::ssa_decode_item {
                session: it.session.raw.as_ptr(),
                q: it.q.as_ptr() as *const c_void,
                out: it.out.as_mut_ptr() as *mut c_void,
            });
        }
        let p = params.to_raw();
        // SAFETY: every item's pointers are valid slices of the checked length; the
        // sessions are alive (borrowed) and belong to this runtime.
        error::check(
            unsafe { sys::ssa_decode_batch(raw_items.as_ptr(), raw_items.len(), layer, &p) },
            "ssa_decode_batch",
        )
    }
}

/// One entry of [`Runtime::decode_batch`].
pub struct BatchItem<'a, T: Element> {
    /// The session to decode.
    pub session: &'a Session,
    /// `[n_q_heads * head_dim]` query.
    pub q: &'a [T],
    /// `[n_q_heads * head_dim]` output, written.
    pub out: &'a mut [T],
}

/// One long-lived KV store: one sequence, all layers of a model.
pub struct Session {
    raw: NonNull<sys::ssa_session>,
    rt: Arc<RuntimeInner>,
    cfg: SessionConfig,
    device_pointers: bool,
}

// SAFETY: ssa.h: a session may be decoded from any number of threads at once (decode
// takes &self); append/update_index/truncate/checkpoint take &mut self, so Rust's
// borrow rules already keep them exclusive; destroy runs in Drop, which has the value
// exclusively.
unsafe impl Send for Session {}
unsafe impl Sync for Session {}

impl Drop for Session {
    fn drop(&mut self) {
        // SAFETY: we own the handle, nothing else borrows it now.
        unsafe { sys::ssa_session_destroy(self.raw.as_ptr()) }
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("len", &self.len()).field("config", &self.cfg).finish()
    }
}

impl Session {
    fn adopt(rt: Arc<RuntimeInner>, raw: *mut sys::ssa_session) -> Result<Session> {
        let raw = NonNull::new(raw).ok_or_else(|| Error::invalid("libssa returned a NULL session"))?;
        let mut c = std::mem::MaybeUninit::<sys::ssa_session_config>::uninit();
        // SAFETY: init writes every field; raw is a valid session.
        let mut c = unsafe {
            sys::ssa_session_config_init(c.as_mut_ptr());
            c.assume_init()
        };
        let st = unsafe { sys::ssa_session_get_config(raw.as_ptr(), &mut c) };
        if let Err(e) = error::check(st, "ssa_session_get_config") {
            unsafe { sys::ssa_session_destroy(raw.as_ptr()) };
            return Err(e);
        }
        let cfg = match SessionConfig::from_raw(&c) {
            Some(cfg) => cfg,
            None => {
                unsafe { sys::ssa_session_destroy(raw.as_ptr()) };
                return Err(Error::invalid(format!("session has an unknown dtype {}", c.kv_dtype)));
            }
        };
        // SAFETY: valid runtime handle.
        let cuda = unsafe { sys::ssa_runtime_backend(rt.raw.as_ptr()) } == sys::SSA_BACKEND_CUDA;
        Ok(Session { raw, rt, cfg, device_pointers: cuda && !cfg.host_pointers })
    }

    /// The configuration as the library resolved it.
    pub fn config(&self) -> &SessionConfig {
        &self.cfg
    }

    /// The runtime this session lives on.
    pub fn runtime(&self) -> Runtime {
        Runtime { inner: self.rt.clone() }
    }

    /// True when K, V, q and out must be device pointers (CUDA session without
    /// `host_pointers`): then only the `*_raw` methods can be used.
    pub fn takes_device_pointers(&self) -> bool {
        self.device_pointers
    }

    /// Tokens present in every layer.
    pub fn len(&self) -> u64 {
        // SAFETY: valid handle.
        unsafe { sys::ssa_session_length(self.raw.as_ptr()) }
    }

    /// True when some layer holds no token.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens present in one layer (0 for a layer out of range).
    pub fn layer_len(&self, layer: u32) -> u64 {
        // SAFETY: valid handle.
        unsafe { sys::ssa_session_layer_length(self.raw.as_ptr(), layer) }
    }

    fn check_host<T: Element>(&self) -> Result<()> {
        if self.device_pointers {
            return Err(Error::invalid(
                "this CUDA session takes device pointers: use the *_raw methods or create it with host_pointers",
            ));
        }
        if !T::fits(self.cfg.dtype) {
            return Err(Error::invalid(format!(
                "{} elements do not fit a {:?} session (use f32 for F32, u16 bits for F16/BF16)",
                T::NAME,
                self.cfg.dtype
            )));
        }
        Ok(())
    }

    fn check_decode_args<T: Element>(&self, q: &[T], out: &[T]) -> Result<()> {
        self.check_host::<T>()?;
        let n = self.cfg.q_len();
        if q.len() != n {
            return Err(Error::invalid(format!("q has {} elements, expected n_q_heads*head_dim = {}", q.len(), n)));
        }
        if out.len() != n {
            return Err(Error::invalid(format!(
                "out has {} elements, expected n_q_heads*head_dim = {}",
                out.len(),
                n
            )));
        }
        Ok(())
    }

    /// Appends tokens to one layer. `k` and `v` are `[n_tokens][n_kv_heads][head_dim]`
    /// flattened; their length must be a multiple of n_kv_heads*head_dim and equal.
    /// All-or-nothing.
    pub fn append<T: Element>(&mut self, layer: u32, k: &[T], v: &[T]) -> Result<()> {
        self.check_host::<T>()?;
        let row = self.cfg.kv_row_len();
        if k.len() % row != 0 {
            return Err(Error::invalid(format!(
                "k has {} elements, not a multiple of n_kv_heads*head_dim = {}",
                k.len(),
                row
            )));
        }
        if v.len() != k.len() {
            return Err(Error::invalid(format!("v has {} elements but k has {}", v.len(), k.len())));
        }
        let n = (k.len() / row) as u64;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: k and v hold n full tokens; host session.
        unsafe { self.append_raw(layer, k.as_ptr() as *const c_void, v.as_ptr() as *const c_void, n) }
    }

    /// Shows one layer queries for the query-aware proxies ([`Proxy::Qpq`],
    /// [`Proxy::Qpq4`]) to learn from: `q` is `[n][n_q_heads][head_dim]` flattened,
    /// n >= 0 whole queries (`ssa_session_observe_queries`). The layer's next index
    /// training uses them. Other proxies refuse them with `InvalidArgument`.
    pub fn observe_queries<T: Element>(&mut self, layer: u32, q: &[T]) -> Result<()> {
        self.check_host::<T>()?;
        let row = self.cfg.q_len();
        if q.len() % row != 0 {
            return Err(Error::invalid(format!(
                "q has {} elements, not a multiple of n_q_heads*head_dim = {}",
                q.len(),
                row
            )));
        }
        let n = (q.len() / row) as u64;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: q holds n full queries; host session.
        unsafe { self.observe_queries_raw(layer, q.as_ptr() as *const c_void, n) }
    }

    /// [`Session::observe_queries`] from a raw pointer in the session's memory space.
    ///
    /// # Safety
    /// `q` must point to `n * n_q_heads * head_dim` elements of the session's dtype,
    /// readable for the call, in the session's memory space.
    pub unsafe fn observe_queries_raw(&mut self, layer: u32, q: *const c_void, n: u64) -> Result<()> {
        error::check(sys::ssa_session_observe_queries(self.raw.as_ptr(), layer, q, n), "ssa_session_observe_queries")
    }

    /// Appends `n_tokens` tokens from raw pointers in the session's memory space.
    ///
    /// # Safety
    /// `k` and `v` must each point to `n_tokens * n_kv_heads * head_dim` elements of the
    /// session's dtype, readable for the call, in the session's memory space.
    pub unsafe fn append_raw(&mut self, layer: u32, k: *const c_void, v: *const c_void, n_tokens: u64) -> Result<()> {
        error::check(sys::ssa_session_append(self.raw.as_ptr(), layer, k, v, n_tokens), "ssa_session_append")
    }

    /// [`Session::append_raw`] queued on a CUDA stream instead of waiting. `stream` is a
    /// `cudaStream_t` as an address; 0 = the legacy default stream.
    ///
    /// For CUDA sessions it returns once the copy is queued on `stream`, and `k` and `v`
    /// are not scanned for NaN/Inf (a non-finite value is stored and makes the decodes
    /// that read it meaningless). Appends that (re)train the index and sessions with
    /// host pointers wait for the stream and append as `append_raw`. CPU sessions: the
    /// same as `append_raw` (`stream` is not used).
    ///
    /// # Safety
    /// As [`Session::append_raw`], except that `k` and `v` must stay valid and unchanged
    /// until `stream` reaches the queued copy (CPU sessions: for the call). `stream` must
    /// be 0 or a valid CUDA stream of the session's device.
    pub unsafe fn append_raw_async(
        &mut self,
        layer: u32,
        k: *const c_void,
        v: *const c_void,
        n_tokens: u64,
        stream: usize,
    ) -> Result<()> {
        error::check(
            sys::ssa_session_append_async(self.raw.as_ptr(), layer, k, v, n_tokens, stream as *mut c_void),
            "ssa_session_append_async",
        )
    }

    /// Attention output of one layer for one query. `q` and `out` are
    /// `[n_q_heads][head_dim]` flattened. Returns what the decode did.
    pub fn decode<T: Element>(&self, layer: u32, q: &[T], out: &mut [T], params: &DecodeParams) -> Result<DecodeStats> {
        self.check_decode_args(q, out)?;
        // SAFETY: lengths checked; q and out cannot overlap (& and &mut).
        unsafe { self.decode_raw(layer, q.as_ptr() as *const c_void, out.as_mut_ptr() as *mut c_void, params) }
    }

    /// Like [`Session::decode`], returning a new output vector.
    pub fn decode_vec<T: Element>(&self, layer: u32, q: &[T], params: &DecodeParams) -> Result<Vec<T>> {
        let mut out = vec![T::default(); self.cfg.q_len()];
        self.decode(layer, q, &mut out, params)?;
        Ok(out)
    }

    /// Decode through raw pointers in the session's memory space.
    ///
    /// # Safety
    /// `q` must point to `n_q_heads * head_dim` readable elements and `out` to as many
    /// writable ones, of the session's dtype, not overlapping, in the session's memory
    /// space.
    pub unsafe fn decode_raw(&self, layer: u32, q: *const c_void, out: *mut c_void, params: &DecodeParams) -> Result<DecodeStats> {
        let p = params.to_raw();
        let mut st = std::mem::MaybeUninit::<sys::ssa_decode_stats>::uninit();
        sys::ssa_decode_stats_init(st.as_mut_ptr());
        let mut st = st.assume_init();
        error::check(sys::ssa_decode(self.raw.as_ptr(), layer, q, out, &p, &mut st), "ssa_decode")?;
        Ok(DecodeStats::from_raw(&st))
    }

    /// (Re)trains the PQ codebooks of every non-empty layer and re-encodes all codes.
    pub fn update_index(&mut self) -> Result<()> {
        // SAFETY: valid handle, exclusive.
        error::check(unsafe { sys::ssa_session_update_index(self.raw.as_ptr()) }, "ssa_session_update_index")
    }

    /// Keeps the first `n_tokens` tokens of every layer (agent rollback).
    pub fn truncate(&mut self, n_tokens: u64) -> Result<()> {
        // SAFETY: valid handle, exclusive.
        error::check(unsafe { sys::ssa_session_truncate(self.raw.as_ptr(), n_tokens) }, "ssa_session_truncate")
    }

    /// An independent copy sharing pages copy-on-write. Runs beside decodes.
    pub fn fork(&self) -> Result<Session> {
        let mut out = ptr::null_mut();
        // SAFETY: fork only reads the session (ssa.h), so &self suffices.
        error::check(unsafe { sys::ssa_session_fork(self.raw.as_ptr(), &mut out) }, "ssa_session_fork")?;
        Session::adopt(self.rt.clone(), out)
    }

    /// Writes the whole session to `path` atomically. Runs beside decodes.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let p = path_cstring(path.as_ref())?;
        // SAFETY: save only reads the session (ssa.h).
        error::check(unsafe { sys::ssa_session_save(self.raw.as_ptr(), p.as_ptr()) }, "ssa_session_save")
    }

    /// Appends to `path` only what changed since the last save/checkpoint to it.
    /// Takes `&mut self` because it records what was written.
    pub fn checkpoint(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let p = path_cstring(path.as_ref())?;
        // SAFETY: valid handle, exclusive.
        error::check(unsafe { sys::ssa_session_checkpoint(self.raw.as_ptr(), p.as_ptr()) }, "ssa_session_checkpoint")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn thread_safety_markers() {
        assert_send_sync::<Runtime>();
        assert_send_sync::<Session>();
    }

    #[test]
    fn status_round_trip() {
        for raw in 1..=10u32 {
            let st = Status::from_raw(raw).unwrap();
            assert_eq!(st.raw(), raw);
            assert!(st.name().starts_with("SSA_ERR_"), "{}", st.name());
        }
        assert_eq!(Status::from_raw(sys::SSA_OK), None);
        assert_eq!(Status::from_raw(77), Some(Status::Unknown(77)));
    }
}
