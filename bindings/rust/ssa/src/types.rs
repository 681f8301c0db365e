//! Plain value types: enums, options, session config, decode params and stats.
use std::os::raw::c_void;

use ssa_sys as sys;

/// Where a runtime computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Backend {
    /// CUDA if built and a device exists, else CPU.
    #[default]
    Auto,
    /// The CPU backend (the reference).
    Cpu,
    /// The CUDA backend.
    Cuda,
}

impl Backend {
    pub(crate) fn raw(self) -> sys::ssa_backend {
        match self {
            Backend::Auto => sys::SSA_BACKEND_AUTO,
            Backend::Cpu => sys::SSA_BACKEND_CPU,
            Backend::Cuda => sys::SSA_BACKEND_CUDA,
        }
    }
    pub(crate) fn from_raw(raw: sys::ssa_backend) -> Backend {
        match raw {
            sys::SSA_BACKEND_CPU => Backend::Cpu,
            sys::SSA_BACKEND_CUDA => Backend::Cuda,
            _ => Backend::Auto,
        }
    }
}

/// Element type of K, V, q and out of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// `f32`.
    F32,
    /// IEEE binary16, passed as raw `u16` bits.
    F16,
    /// bfloat16, passed as raw `u16` bits.
    BF16,
}

impl DType {
    pub(crate) fn raw(self) -> sys::ssa_dtype {
        match self {
            DType::F32 => sys::SSA_DTYPE_F32,
            DType::F16 => sys::SSA_DTYPE_F16,
            DType::BF16 => sys::SSA_DTYPE_BF16,
        }
    }
    pub(crate) fn from_raw(raw: sys::ssa_dtype) -> Option<DType> {
        match raw {
            sys::SSA_DTYPE_F32 => Some(DType::F32),
            sys::SSA_DTYPE_F16 => Some(DType::F16),
            sys::SSA_DTYPE_BF16 => Some(DType::BF16),
            _ => None,
        }
    }
}

/// The score a session ranks and samples its candidates by (see `ssa_proxy` in ssa.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Proxy {
    /// Product quantisation of the keys as they are (the paper's proxy).
    Pq,
    /// A learned rotation before product quantisation.
    Opq,
    /// 4-bit codes scored from in-register tables.
    Pq4,
    /// OPQ's rotation with 4-bit codes.
    Opq4,
    /// Query-aware: keys transformed by what the observed queries read.
    Qpq,
    /// The query-aware transform with 4-bit codes.
    Qpq4,
}

impl Proxy {
    pub(crate) fn raw(self) -> sys::ssa_proxy {
        match self {
            Proxy::Pq => sys::SSA_PROXY_PQ,
            Proxy::Opq => sys::SSA_PROXY_OPQ,
            Proxy::Pq4 => sys::SSA_PROXY_PQ4,
            Proxy::Opq4 => sys::SSA_PROXY_OPQ4,
            Proxy::Qpq => sys::SSA_PROXY_QPQ,
            Proxy::Qpq4 => sys::SSA_PROXY_QPQ4,
        }
    }
    pub(crate) fn from_raw(raw: sys::ssa_proxy) -> Option<Proxy> {
        match raw {
            sys::SSA_PROXY_PQ => Some(Proxy::Pq),
            sys::SSA_PROXY_OPQ => Some(Proxy::Opq),
            sys::SSA_PROXY_PQ4 => Some(Proxy::Pq4),
            sys::SSA_PROXY_OPQ4 => Some(Proxy::Opq4),
            sys::SSA_PROXY_QPQ => Some(Proxy::Qpq),
            sys::SSA_PROXY_QPQ4 => Some(Proxy::Qpq4),
            _ => None,
        }
    }
}

/// How a decode spends its budget (see `ssa_method` in ssa.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// Exact attention over all tokens.
    Dense,
    /// Top-k' by exact scores (quality ceiling, no speedup).
    OracleTopK,
    /// PQCache: top-k' by PQ proxy scores.
    PqTopK,
    /// Proxy top h*k' plus uniform samples of the rest.
    HybridUniform,
    /// Proxy-proportional sampling only (h = 0).
    Sampling,
    /// Stratified: proxy top h*k' plus proxy sampling.
    Ssa,
    /// Stratified with the lambda water-filling heavy set.
    SsaAdaptive,
}

impl Method {
    /// Every method, in the header's order.
    pub const ALL: [Method; 7] = [
        Method::Dense,
        Method::OracleTopK,
        Method::PqTopK,
        Method::HybridUniform,
        Method::Sampling,
        Method::Ssa,
        Method::SsaAdaptive,
    ];

    pub(crate) fn raw(self) -> sys::ssa_method {
        match self {
            Method::Dense => sys::SSA_METHOD_DENSE,
            Method::OracleTopK => sys::SSA_METHOD_ORACLE_TOPK,
            Method::PqTopK => sys::SSA_METHOD_PQ_TOPK,
            Method::HybridUniform => sys::SSA_METHOD_HYBRID_UNIFORM,
            Method::Sampling => sys::SSA_METHOD_SAMPLING,
            Method::Ssa => sys::SSA_METHOD_SSA,
            Method::SsaAdaptive => sys::SSA_METHOD_SSA_ADAPTIVE,
        }
    }
}

/// Who selects the middle rows in a GQA model (docs/GROUP_SELECTION.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum GroupSelection {
    /// Every query head selects its own rows (the default).
    #[default]
    Off,
    /// One selection per KV head from the mixture of its query heads' proxy softmaxes.
    Mixture,
    /// One selection per KV head from the proxy softmax of the group's mean query.
    MeanQuery,
}

impl GroupSelection {
    pub(crate) fn raw(self) -> u32 {
        (match self {
            GroupSelection::Off => sys::SSA_GROUP_OFF,
            GroupSelection::Mixture => sys::SSA_GROUP_MIXTURE,
            GroupSelection::MeanQuery => sys::SSA_GROUP_MEAN_QUERY,
        }) as u32
    }
}

/// Options of [`crate::Runtime::new`]. `Default` gives the library's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeOptions {
    /// Backend; default `Auto`.
    pub backend: Backend,
    /// CUDA device ordinal; default 0.
    pub device: i32,
    /// CPU worker threads; 0 = hardware concurrency.
    pub threads: i32,
    /// Default sampling seed for decodes that pass none; `None` = the library's default.
    pub seed: Option<u64>,
    /// Bytes of device memory the K/V pages of the runtime's CUDA sessions may use
    /// (0 = no limit); pages beyond it live in pinned host memory.
    pub device_kv_budget: u64,
    /// The part of the budget for device copies of host pages read recently
    /// (0 = an eighth of the budget).
    pub host_cache_bytes: u64,
    /// Sharded sessions (docs/SHARDING.md): one shard per entry, in shard order
    /// (distinct ordinals; on the CPU backend they only name in-process shards).
    /// Empty (default) = one device, `device`.
    pub devices: Vec<i32>,
    /// Tokens a shard takes before the next one starts; 0 = the library's
    /// default (1048576); else a multiple of 8192.
    pub shard_tokens: u64,
    /// Pinned host memory page-locked when the runtime is created, for the host
    /// tier of its CUDA sessions (0 = none); a multiple of 64 MiB, only with a
    /// `device_kv_budget`. CPU runtimes check it and ignore it.
    pub host_pool_bytes: u64,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            backend: Backend::Auto,
            device: 0,
            threads: 0,
            seed: None,
            device_kv_budget: 0,
            host_cache_bytes: 0,
            devices: Vec::new(),
            shard_tokens: 0,
            host_pool_bytes: 0,
        }
    }
}

impl RuntimeOptions {
    /// CPU runtime with the given number of threads (0 = all cores).
    pub fn cpu(threads: i32) -> Self {
        RuntimeOptions { backend: Backend::Cpu, threads, ..Default::default() }
    }
    /// Sets the default sampling seed.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }
    /// Shards every session over `devices` with `shard_tokens` per shard.
    pub fn sharded(mut self, devices: &[i32], shard_tokens: u64) -> Self {
        self.devices = devices.to_vec();
        self.shard_tokens = shard_tokens;
        self
    }
    /// The raw options; they point into `self.devices`, so `self` must outlive their use.
    pub(crate) fn to_raw(&self) -> sys::ssa_runtime_options {
        let mut o = std::mem::MaybeUninit::<sys::ssa_runtime_options>::uninit();
        // SAFETY: init writes every field.
        let mut o = unsafe {
            sys::ssa_runtime_options_init(o.as_mut_ptr());
            o.assume_init()
        };
        o.backend = self.backend.raw();
        o.device = self.device;
        o.num_threads = self.threads;
        if let Some(seed) = self.seed {
            o.seed = seed;
        }
        o.device_kv_budget = self.device_kv_budget;
        o.host_cache_bytes = self.host_cache_bytes;
        if !self.devices.is_empty() {
            o.devices = self.devices.as_ptr();
            o.n_devices = self.devices.len() as u32;
        }
        o.shard_tokens = self.shard_tokens;
        o.host_pool_bytes = self.host_pool_bytes;
        o
    }
}

/// A session's configuration. [`SessionConfig::new`] fills the library's defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SessionConfig {
    /// Layers (>= 1).
    pub n_layers: u32,
    /// Query heads (a multiple of `n_kv_heads`).
    pub n_q_heads: u32,
    /// KV heads.
    pub n_kv_heads: u32,
    /// Head dimension: 32..512, a multiple of 8.
    pub head_dim: u32,
    /// Element type of K, V, q and out.
    pub dtype: DType,
    /// PQ subspaces M (must divide head_dim); default 16.
    pub pq_subspaces: u32,
    /// PQ centroids K, 2..256; default 256.
    pub pq_centroids: u32,
    /// Opaque value checked when a snapshot is loaded.
    pub model_fingerprint: u64,
    /// Tokens per KV page (power of two 16..4096); default 256.
    pub page_tokens: u32,
    /// CUDA sessions only: take host pointers (staged through the library).
    pub host_pointers: bool,
    /// Train the PQ index once a layer holds this many tokens; default 2048.
    pub index_min_tokens: u32,
    /// Retrain when the layer grew by this factor (0 = never); default 4.
    pub index_regrow_factor: f32,
    /// Keys sampled per KV head for training; default 16384.
    pub index_train_sample: u32,
    /// Lloyd iterations; default 8.
    pub index_iterations: u32,
    /// The proxy candidates are ranked and sampled by; default [`Proxy::Pq`].
    pub proxy: Proxy,
    /// The score-aware loss's weight (1: plain squared error); default 1.
    pub pq_parallel_weight: f32,
}

impl SessionConfig {
    /// A config with the given shape and dtype and every other field at the library's default.
    pub fn new(n_layers: u32, n_q_heads: u32, n_kv_heads: u32, head_dim: u32, dtype: DType) -> Self {
        let mut c = std::mem::MaybeUninit::<sys::ssa_session_config>::uninit();
        // SAFETY: init writes every field.
        let c = unsafe {
            sys::ssa_session_config_init(c.as_mut_ptr());
            c.assume_init()
        };
        let mut cfg = SessionConfig::from_raw(&c).expect("library default dtype is known");
        cfg.n_layers = n_layers;
        cfg.n_q_heads = n_q_heads;
        cfg.n_kv_heads = n_kv_heads;
        cfg.head_dim = head_dim;
        cfg.dtype = dtype;
        cfg
    }

    pub(crate) fn from_raw(c: &sys::ssa_session_config) -> Option<Self> {
        Some(SessionConfig {
            n_layers: c.n_layers,
            n_q_heads: c.n_q_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            dtype: DType::from_raw(c.kv_dtype)?,
            pq_subspaces: c.pq_subspaces,
            pq_centroids: c.pq_centroids,
            model_fingerprint: c.model_fingerprint,
            page_tokens: c.page_tokens,
            host_pointers: c.flags & sys::SSA_SESSION_HOST_POINTERS != 0,
            index_min_tokens: c.index_min_tokens,
            index_regrow_factor: c.index_regrow_factor,
            index_train_sample: c.index_train_sample,
            index_iterations: c.index_iterations,
            proxy: Proxy::from_raw(c.proxy)?,
            pq_parallel_weight: c.pq_parallel_weight,
        })
    }

    pub(crate) fn to_raw(&self) -> sys::ssa_session_config {
        let mut c = std::mem::MaybeUninit::<sys::ssa_session_config>::uninit();
        // SAFETY: init writes every field.
        let mut c = unsafe {
            sys::ssa_session_config_init(c.as_mut_ptr());
            c.assume_init()
        };
        c.n_layers = self.n_layers;
        c.n_q_heads = self.n_q_heads;
        c.n_kv_heads = self.n_kv_heads;
        c.head_dim = self.head_dim;
        c.kv_dtype = self.dtype.raw();
        c.pq_subspaces = self.pq_subspaces;
        c.pq_centroids = self.pq_centroids;
        c.model_fingerprint = self.model_fingerprint;
        c.page_tokens = self.page_tokens;
        c.flags = if self.host_pointers { sys::SSA_SESSION_HOST_POINTERS } else { 0 };
        c.index_min_tokens = self.index_min_tokens;
        c.index_regrow_factor = self.index_regrow_factor;
        c.index_train_sample = self.index_train_sample;
        c.index_iterations = self.index_iterations;
        c.proxy = self.proxy.raw();
        c.pq_parallel_weight = self.pq_parallel_weight;
        c
    }

    /// Elements in one token's K (or V): n_kv_heads * head_dim.
    pub fn kv_row_len(&self) -> usize {
        self.n_kv_heads as usize * self.head_dim as usize
    }
    /// Elements in q and out: n_q_heads * head_dim.
    pub fn q_len(&self) -> usize {
        self.n_q_heads as usize * self.head_dim as usize
    }
}

/// Parameters of a decode. `Default` gives the library's defaults (SSA, sparsity 50).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeParams {
    /// Method; default `Ssa`.
    pub method: Method,
    /// Tokens read per query head incl. sink+local; `None` = ceil(N / sparsity).
    pub budget: Option<u32>,
    /// N / budget when `budget` is `None`; >= 1; default 50.
    pub sparsity: f32,
    /// h for `Ssa` and `HybridUniform`, in [0, 1]; default 0.4.
    pub heavy_fraction: f32,
    /// Tokens always read at the start; default 128.
    pub n_sink: u32,
    /// Tokens always read at the end; default 128.
    pub n_local: u32,
    /// Lower clamp of inclusion probabilities, in (0, 1]; default 1e-4.
    pub pi_min: f32,
    /// Sampling seed; `None` = the runtime's seed.
    pub seed: Option<u64>,
    /// RNG counter: the same (seed, step, inputs) give the same output.
    pub step: u64,
    /// `cudaStream_t` (as an address) for CUDA sessions; 0 = default stream.
    pub stream: usize,
    /// Error-targeted decode (`Ssa` and `SsaAdaptive`; not batched on CUDA sessions; see ssa.h):
    /// wanted relative error of each head's output; 0 (default) = off. With a
    /// target, each head chooses its own budget and `budget` is a floor.
    pub target_error: f32,
    /// Allowed failure probability of the target, in (0, 1); default 0.1.
    pub target_delta: f32,
    /// Cap on the budget a head may choose; `None` = the library's default.
    pub max_budget: Option<u32>,
    /// One selection per KV group instead of per query head (docs/GROUP_SELECTION.md).
    pub group_selection: GroupSelection,
}

impl Default for DecodeParams {
    fn default() -> Self {
        let mut p = std::mem::MaybeUninit::<sys::ssa_decode_params>::uninit();
        // SAFETY: init writes every field.
        let p = unsafe {
            sys::ssa_decode_params_init(p.as_mut_ptr());
            p.assume_init()
        };
        DecodeParams {
            method: Method::Ssa,
            budget: if p.budget == 0 { None } else { Some(p.budget) },
            sparsity: p.sparsity,
            heavy_fraction: p.heavy_fraction,
            n_sink: p.n_sink,
            n_local: p.n_local,
            pi_min: p.pi_min,
            seed: if p.seed == 0 { None } else { Some(p.seed) },
            step: p.step,
            stream: p.stream as usize,
            target_error: p.target_error,
            target_delta: p.target_delta,
            max_budget: if p.max_budget == 0 { None } else { Some(p.max_budget) },
            group_selection: GroupSelection::Off,
        }
    }
}

impl DecodeParams {
    /// Defaults with another method.
    pub fn method(method: Method) -> Self {
        DecodeParams { method, ..Default::default() }
    }
    /// Sets an explicit budget.
    pub fn with_budget(mut self, budget: u32) -> Self {
        self.budget = Some(budget);
        self
    }
    /// Sets the sink and local counts.
    pub fn with_window(mut self, n_sink: u32, n_local: u32) -> Self {
        self.n_sink = n_sink;
        self.n_local = n_local;
        self
    }
    /// Sets seed and step.
    pub fn with_seed(mut self, seed: u64, step: u64) -> Self {
        self.seed = Some(seed);
        self.step = step;
        self
    }
    /// Asks for relative error <= `epsilon` per head with probability >= 1 - `delta`.
    pub fn with_target_error(mut self, epsilon: f32, delta: f32) -> Self {
        self.target_error = epsilon;
        self.target_delta = delta;
        self
    }
    /// Caps the budget an error-targeted head may choose.
    pub fn with_max_budget(mut self, max_budget: u32) -> Self {
        self.max_budget = Some(max_budget);
        self
    }

    /// Selects once per KV group with the given proposal.
    pub fn with_group_selection(mut self, g: GroupSelection) -> Self {
        self.group_selection = g;
        self
    }

    pub(crate) fn to_raw(&self) -> sys::ssa_decode_params {
        let mut p = std::mem::MaybeUninit::<sys::ssa_decode_params>::uninit();
        // SAFETY: init writes every field.
        let mut p = unsafe {
            sys::ssa_decode_params_init(p.as_mut_ptr());
            p.assume_init()
        };
        p.method = self.method.raw();
        p.budget = self.budget.unwrap_or(0);
        p.sparsity = self.sparsity;
        p.heavy_fraction = self.heavy_fraction;
        p.n_sink = self.n_sink;
        p.n_local = self.n_local;
        p.pi_min = self.pi_min;
        p.seed = self.seed.unwrap_or(0);
        p.step = self.step;
        p.stream = self.stream as *mut c_void;
        p.target_error = self.target_error;
        p.target_delta = self.target_delta;
        p.max_budget = self.max_budget.unwrap_or(0);
        p.group_selection = self.group_selection.raw();
        p
    }
}

/// What a decode did; sums are over query heads.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct DecodeStats {
    /// N of the layer decoded.
    pub context_tokens: u64,
    /// Rows of K/V read.
    pub tokens_read: u64,
    /// |H|.
    pub heavy_tokens: u64,
    /// Draws m.
    pub draws: u64,
    /// Unique sampled tokens |S|.
    pub unique_samples: u64,
    /// Proxy softmax mass of the sampled residual.
    pub residual_proxy_mass: f64,
    /// Proxy scores computed.
    pub scored_tokens: u64,
    /// Error-targeted decode: the budgets the heads chose (0 otherwise).
    pub target_budget: u64,
    /// Error-targeted decode: heads that stopped at the cap above the target.
    pub capped_heads: u32,
    /// Error-targeted decode: predicted error bound, summed over heads.
    pub predicted_error: f64,
    /// Heads whose budget did not exceed sink + local on a longer context: they
    /// read only those tokens (no sparse selection). Nonzero: raise the budget.
    pub window_only_heads: u32,
    /// Tiered CUDA sessions: rows read over the bus from host pages.
    pub rows_from_host: u64,
    /// Tiered CUDA sessions: rows of host pages read from their device copy.
    pub host_cache_hits: u64,
}

impl DecodeStats {
    pub(crate) fn from_raw(s: &sys::ssa_decode_stats) -> Self {
        DecodeStats {
            context_tokens: s.context_tokens,
            tokens_read: s.tokens_read,
            heavy_tokens: s.heavy_tokens,
            draws: s.draws,
            unique_samples: s.unique_samples,
            residual_proxy_mass: s.residual_proxy_mass,
            scored_tokens: s.scored_tokens,
            target_budget: s.target_budget,
            capped_heads: s.capped_heads,
            predicted_error: s.predicted_error,
            window_only_heads: s.window_only_heads,
            rows_from_host: s.rows_from_host,
            host_cache_hits: s.host_cache_hits,
        }
    }
}

/// What a snapshot file holds, read without loading it ([`crate::inspect`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SnapshotInfo {
    /// Format version of the committed superblock.
    pub format_version: u32,
    /// 1 after a full save, +1 per checkpoint.
    pub generation: u64,
    /// Bytes the committed snapshot spans in the file.
    pub file_bytes: u64,
    /// Bytes of sections the snapshot still uses (the rest were superseded by checkpoints).
    pub live_bytes: u64,
    /// Entries in the committed section table.
    pub n_sections: u32,
    /// Layers.
    pub n_layers: u32,
    /// Query heads.
    pub n_q_heads: u32,
    /// KV heads.
    pub n_kv_heads: u32,
    /// Head dimension.
    pub head_dim: u32,
    /// Element type of K and V.
    pub dtype: DType,
    /// PQ subspaces.
    pub pq_subspaces: u32,
    /// PQ centroids per subspace.
    pub pq_centroids: u32,
    /// Tokens per KV page.
    pub page_tokens: u32,
    /// Layers saved with trained PQ codebooks.
    pub indexed_layers: u32,
    /// The fingerprint the session was created with.
    pub model_fingerprint: u64,
    /// Tokens present in every layer.
    pub length: u64,
    /// Tokens of the longest layer.
    pub max_layer_length: u64,
    /// Size of the user metadata saved.
    pub metadata_bytes: u64,
    /// The sessions' proxy.
    pub proxy: Proxy,
    /// The score-aware weight.
    pub pq_parallel_weight: f32,
}

impl SnapshotInfo {
    pub(crate) fn from_raw(i: &sys::ssa_snapshot_info) -> Option<Self> {
        Some(SnapshotInfo {
            format_version: i.format_version,
            generation: i.generation,
            file_bytes: i.file_bytes,
            live_bytes: i.live_bytes,
            n_sections: i.n_sections,
            n_layers: i.n_layers,
            n_q_heads: i.n_q_heads,
            n_kv_heads: i.n_kv_heads,
            head_dim: i.head_dim,
            dtype: DType::from_raw(i.kv_dtype)?,
            pq_subspaces: i.pq_subspaces,
            pq_centroids: i.pq_centroids,
            page_tokens: i.page_tokens,
            indexed_layers: i.indexed_layers,
            model_fingerprint: i.model_fingerprint,
            length: i.length,
            max_layer_length: i.max_layer_length,
            metadata_bytes: i.metadata_bytes,
            proxy: Proxy::from_raw(i.proxy)?,
            pq_parallel_weight: i.pq_parallel_weight,
        })
    }
}

/// Flags of [`crate::Runtime::load`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoadOptions {
    /// Verify every checksum up front (default: on read).
    pub verify: bool,
    /// Map the file instead of reading it (CPU sessions).
    pub mmap: bool,
}

impl LoadOptions {
    pub(crate) fn raw(self) -> u32 {
        (if self.verify { sys::SSA_LOAD_VERIFY } else { 0 }) | (if self.mmap { sys::SSA_LOAD_MMAP } else { 0 })
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for u16 {}
}

/// Element types that can cross the API: `f32` for F32 sessions, `u16` (raw bits)
/// for F16 and BF16 sessions.
pub trait Element: sealed::Sealed + Copy + Default + 'static {
    /// Whether a session of `dtype` takes this element type.
    fn fits(dtype: DType) -> bool;
    /// A name for messages.
    const NAME: &'static str;
}

impl Element for f32 {
    fn fits(dtype: DType) -> bool {
        dtype == DType::F32
    }
    const NAME: &'static str = "f32";
}

impl Element for u16 {
    fn fits(dtype: DType) -> bool {
        dtype == DType::F16 || dtype == DType::BF16
    }
    const NAME: &'static str = "u16";
}
