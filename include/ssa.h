/*
 * ssa.h - libssa: long-lived session KV stores with Stratified Sparse Attention.
 *
 * The only public header of libssa. C99, opaque handles, a stable ABI.
 *
 * Conventions (they hold for every function below unless its comment says otherwise):
 *  - Every fallible call returns ssa_status. On failure the thread-local
 *    ssa_last_error_message() holds a human-readable detail, and every handle is
 *    left exactly as it was before the call (operations are all-or-nothing),
 *    lazy work included: a refused call keeps nothing done for it (every check
 *    that can refuse a decode runs before it trains an index on demand, so a
 *    refused decode leaves a layer without an index still without one).
 *  - Versioned structs (those that start with `struct_size`): call the matching
 *    *_init() first, which sets struct_size to this header's sizeof and every
 *    default. Fields are only ever appended. One rule holds for all of them:
 *    struct_size may be any size from the end of the struct's core fields (marked
 *    "core" in each struct) up, that does not end inside a field. Fields beyond
 *    the caller's size are not read (inputs: they take their defaults) and not
 *    written (outputs), so code compiled against an older header keeps working.
 *    A size larger than this header's struct (code compiled against a newer
 *    header) is accepted for inputs when every byte beyond this header's struct
 *    is zero, else SSA_ERR_UNSUPPORTED (a field this version does not know is
 *    set); outputs get zeros there. A size below the core, or inside a field, is
 *    SSA_ERR_INVALID_ARGUMENT, and so is a size above SSA_MAX_STRUCT_SIZE (4096
 *    bytes, more than any version's struct will take), refused before any byte
 *    beyond this header's struct is read or written. Every field of this header
 *    is in 0.1.0, the first version; a field added later will say which version
 *    added it.
 *  - Enums are 32 bits. A value outside an enum's listed values, in a struct or
 *    an argument, gives SSA_ERR_INVALID_ARGUMENT naming it.
 *  - Caller buffers of one call (q, out and stats of a decode, the trace buffers
 *    of ssa_decode_traced, the q and out of every item of ssa_decode_batch, buf
 *    and n_out of ssa_session_get_metadata): a buffer the call writes may not
 *    overlap any other buffer of the call; buffers it only reads may share
 *    memory. An overlap is SSA_ERR_INVALID_ARGUMENT, found before anything is
 *    read or written through them.
 *  - Out-parameters (`**out`) are written only on success. Objects returned through
 *    them are owned by the caller and freed with the matching *_destroy().
 *    Every other pointer argument is borrowed for the duration of the call only.
 *  - Memory space: K, V, q and out point to host memory for CPU sessions and to
 *    device memory for CUDA sessions (unless the session was created with
 *    SSA_SESSION_HOST_POINTERS). Snapshot paths are host strings (UTF-8/bytes).
 *  - Thread safety: a runtime may be used from any number of threads at once.
 *    A session may be decoded from any number of threads at once; calls that
 *    mutate a session (append, update_index, truncate) take it exclusively and
 *    wait for running decodes (and make new decodes wait) - they never tear a
 *    read. fork and save only read the session and run beside decodes.
 *  - CUDA streams: with device pointers, ssa_decode queues its kernels on
 *    p->stream and returns; out is ready when that stream gets there. The session
 *    may be changed or destroyed meanwhile: what queued decodes read (pages,
 *    codes, codebooks) stays alive and unwritten until they have run, without
 *    a wait for the whole device. truncate waits for the session's queued
 *    decodes that read tokens it removes; destroy waits for all of them. append
 *    reads device K/V on the legacy default stream (in order after work on
 *    blocking streams, as cudaMemcpy does; K/V written on a non-blocking stream
 *    must be complete); append and update_index return when their work is done.
 *    ssa_session_append_async queues its work on a stream of the caller's
 *    instead (see there).
 *    A decode captured into a CUDA graph reads the layer as it was at capture:
 *    replay it only while that layer is unchanged and the session alive. A
 *    decode step (ssa_decode_step, after ssa_session_reserve) is the capturable
 *    form of a loop's append + decode: every replay grows the layer on the device.
 *  - CUDA device memory comes from a stream-ordered pool of the library's own
 *    per device (not the device's default pool, whose settings stay the
 *    caller's). It keeps memory that decodes and appends free for their next
 *    calls; ssa_session_destroy waits for the legacy default stream (the
 *    session's frees are queued there) and gives what the pool holds unused
 *    back to the driver.
 *  - Non-finite values: K and V given to append are always scanned (on the host,
 *    or on the device for device pointers of CUDA sessions), and so is q where the
 *    library can read it on the host (CPU sessions, and CUDA sessions with
 *    SSA_SESSION_HOST_POINTERS); a NaN or infinity anywhere gives
 *    SSA_ERR_INVALID_ARGUMENT naming the first bad element, with nothing changed
 *    (one NaN key would poison every later decode). A device q of a CUDA session is
 *    not scanned (that would cost a wait for the device on every decode): NaN/Inf
 *    there is the caller's to avoid; it is not reported and makes that decode's
 *    output meaningless (typically NaN), and nothing else.
 *  - No C++ exception, abort or assertion crosses this boundary.
 */
#ifndef SSA_H
#define SSA_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#  if defined(SSA_BUILDING_LIBRARY)
#    define SSA_API __declspec(dllexport)
#  else
#    define SSA_API
#  endif
#elif defined(__GNUC__)
#  define SSA_API __attribute__((visibility("default")))
#else
#  define SSA_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- version */

#define SSA_VERSION_MAJOR 0
#define SSA_VERSION_MINOR 1
#define SSA_VERSION_PATCH 0

/* The largest struct_size of any versioned struct, in this and every later
   version (Conventions, "Versioned structs"). */
#define SSA_MAX_STRUCT_SIZE 4096u

/* MAJOR*10000 + MINOR*100 + PATCH of the library actually loaded. */
SSA_API uint32_t ssa_version(void);

/* The same as a static string, "MAJOR.MINOR.PATCH" ("0.1.0"). Never NULL. */
SSA_API const char *ssa_version_string(void);

/* ----------------------------------------------------------------- errors */

/* Values are stable and never renumbered. Pinned to 32 bits. */
typedef enum ssa_status {
  SSA_OK = 0,
  SSA_ERR_INVALID_ARGUMENT = 1, /* null pointer, bad size, unknown layer, bad params   */
  SSA_ERR_OUT_OF_MEMORY = 2,    /* host or device allocation failed; nothing changed  */
  SSA_ERR_IO = 3,               /* file system error (open, write, fsync, rename)     */
  SSA_ERR_CORRUPT = 4,          /* snapshot fails a checksum, is truncated/malformed  */
  SSA_ERR_VERSION = 5,          /* snapshot format version not supported              */
  SSA_ERR_MISMATCH = 6,         /* snapshot/session does not fit (fingerprint, shape) */
  SSA_ERR_UNSUPPORTED = 7,      /* valid request this build/backend cannot do         */
  SSA_ERR_DEVICE = 8,           /* CUDA error                                         */
  SSA_ERR_BUSY = 9,             /* session is being mutated by another thread         */
  SSA_ERR_INTERNAL = 10,        /* a bug in libssa; please report the message         */
  SSA_STATUS_FORCE_32BIT = 0x7fffffff
} ssa_status;

/* Static English name of a status ("SSA_ERR_CORRUPT"); never NULL, also for
   unknown values. Thread-safe. */
SSA_API const char *ssa_status_string(ssa_status st);

/* Detail of the last failing call made on this thread ("layer 40 >= n_layers 32"),
   or "" if the last call succeeded or none failed yet. The string is owned by the
   library and valid until the next libssa call on this thread. Never NULL. */
SSA_API const char *ssa_last_error_message(void);

/* ------------------------------------------------------------------ enums */

typedef enum ssa_backend {
  SSA_BACKEND_AUTO = 0, /* CUDA if built and a device exists, else CPU */
  SSA_BACKEND_CPU = 1,
  SSA_BACKEND_CUDA = 2,
  SSA_BACKEND_FORCE_32BIT = 0x7fffffff
} ssa_backend;

typedef enum ssa_dtype {
  SSA_DTYPE_F32 = 0,
  SSA_DTYPE_F16 = 1,  /* IEEE binary16 */
  SSA_DTYPE_BF16 = 2, /* bfloat16 */
  SSA_DTYPE_FORCE_32BIT = 0x7fffffff
} ssa_dtype;

/* The proxy score a session ranks and samples its candidate tokens by
   (docs/ALGORITHM.md, section 4).
   PQ:   product quantisation of the keys as they are (the paper's proxy): one
         byte per subspace, pq_subspaces bytes per token per KV head.
   OPQ:  a learned orthogonal rotation of each KV head's keys before product
         quantisation (trained with the codebooks, alternating k-means and a
         Procrustes fit); keys are rotated when encoded, the query once per decode
         step. A scoring pass costs what PQ's costs.
   PQ4:  4-bit codes ("fast scan"): pq_centroids <= 16 and an even pq_subspaces
         (at most 256), two codes per byte, pq_subspaces / 2 bytes per token per
         KV head (32 subspaces x 16 centroids: PQ's 16 bytes). A decode scores
         from a lookup table quantised to 8 bits per entry, held in SIMD
         registers (AVX2 shuffles, a portable loop elsewhere): the proxy the
         decode ranks and samples by is that table's score, within
         pq_subspaces / 2 table steps of the float one (docs/ALGORITHM.md).
   OPQ4: OPQ's rotation with PQ4's codes and scoring.
   QPQ:  query-aware: keys are transformed before product quantisation by a
         matrix T learned from the queries the layer was shown
         (ssa_session_observe_queries), so that the squared error of the
         quantised keys is the expected squared error of the scores q . k over
         those queries: T whitens the queries' second moment, then a
         variance-balanced rotation spreads the transformed keys over the
         subspaces. The query scores as T^-T q (once per decode step), so
         (T^-T q) . (T k) = q . k. A layer trained before any query was observed
         uses the identity in place of the whitening. k-means weighs each
         training key by how many of the layer's last 256 observed queries rank
         it in their top 5% (1 + 256 x that share), so the keys queries read get
         the codebooks' resolution. One-byte codes.
   QPQ4: QPQ's transform with PQ4's codes and scoring.
   Every proxy runs on both backends, with the same codebooks, transforms and
   (up to near-ties of two centroids) codes from the same keys and queries; a
   CUDA runtime of several devices or processes takes SSA_PROXY_PQ only (other
   proxies: SSA_ERR_UNSUPPORTED at ssa_session_create and at load). */
typedef enum ssa_proxy {
  SSA_PROXY_PQ = 0,
  SSA_PROXY_OPQ = 1,
  SSA_PROXY_PQ4 = 2,
  SSA_PROXY_OPQ4 = 3,
  SSA_PROXY_QPQ = 4,
  SSA_PROXY_QPQ4 = 5,
  SSA_PROXY_FORCE_32BIT = 0x7fffffff
} ssa_proxy;

/* How a decode spends its budget of k tokens per query head. In every method the
   first n_sink and last n_local tokens are always read (inclusion probability 1)
   and count towards k; the remaining k' = k - n_sink - n_local tokens are chosen
   from the middle of the context as below. With k >= N every method is DENSE. */
typedef enum ssa_method {
  SSA_METHOD_DENSE = 0,          /* exact attention over all tokens                    */
  SSA_METHOD_ORACLE_TOPK = 1,    /* top-k' by exact scores (quality ceiling, no speedup)*/
  SSA_METHOD_PQ_TOPK = 2,        /* PQCache: top-k' by PQ proxy scores                 */
  SSA_METHOD_HYBRID_UNIFORM = 3, /* vAttention-style: proxy top h*k' + uniform samples */
  SSA_METHOD_SAMPLING = 4,       /* proxy-proportional sampling only (h = 0)           */
  SSA_METHOD_SSA = 5,            /* stratified: proxy top h*k' + proxy sampling        */
  SSA_METHOD_SSA_ADAPTIVE = 6,   /* stratified with the lambda water-filling heavy set */
  SSA_METHOD_FORCE_32BIT = 0x7fffffff
} ssa_method;

/* Who selects the middle rows in a GQA model (docs/GROUP_SELECTION.md).
   OFF: every query head scores, selects and samples on its own (the paper's SSA).
   MIXTURE and MEAN_QUERY: one selection per KV head, made once for its G query
   heads: the heavy set and the draws come from one group proposal (the mixture
   of the G heads' proxy softmaxes, or the proxy softmax of the group's mean
   query), and every query head of the group reweights all of the shared rows by
   the shared inclusion probabilities, so each head's Horvitz-Thompson numerator
   and denominator stay unbiased. The group's budget is the sum of its heads'
   budgets: G * k' middle rows per KV head, the same rows as G per-head
   selections before their overlap is removed. */
typedef enum ssa_group_selection {
  SSA_GROUP_OFF = 0,
  SSA_GROUP_MIXTURE = 1,
  SSA_GROUP_MEAN_QUERY = 2,
  SSA_GROUP_FORCE_32BIT = 0x7fffffff
} ssa_group_selection;

/* ---------------------------------------------------------------- runtime */

typedef struct ssa_runtime ssa_runtime;

/* The collectives of a group of processes, as one rank sees them: libssa calls
   them, on the thread that called it, in the same order on every rank (SPMD),
   and never keeps the buffers past a call. Each returns 0 on success, anything
   else on failure; a callback must return (non-zero) within timeout_ms when a
   peer fails, leaves or does not arrive, so that a dead rank gives an error
   (SSA_ERR_IO), never a hang. After a failed collective the group is out of
   step: every later collective call of the runtime returns SSA_ERR_IO at once
   (destroy it and build a new group). Results must be bitwise the same on
   every rank (integer sums and float maxima are exact in any order).
   The collective calls of a group's runtime: ssa_runtime_create, decodes
   (ssa_decode, ssa_decode_batch, ssa_decode_step), index training (an append
   that reaches the index policy's threshold, ssa_session_update_index, a
   decode that trains on demand), ssa_session_save / _checkpoint and
   ssa_session_load(_checked). Every rank makes them in the same order with the
   same arguments. Each opens with one exchange of a summary of the call, so
   that ranks making another call, or the same call with other arguments,
   return SSA_ERR_INVALID_ARGUMENT there, and a rank that failed before it
   (rows only it was given, its memory, a path it cannot use) gives its peers
   its status at once; training and save end with an exchange of every rank's
   result, so that they change every rank or none (docs/DISTRIBUTED.md). */
typedef struct ssa_collective {
  uint32_t struct_size;
  uint32_t rank;       /* this process, 0..size-1 */
  uint32_t size;       /* processes in the group, 1..64 */
  uint32_t timeout_ms; /* passed to every callback; default 60000; must be > 0 */
  void *user;          /* passed to every callback; owned by the caller */
  /* data[0..n) = the element-wise sum over the ranks (mod 2^64). */
  int (*all_reduce_sum_u64)(void *user, uint64_t *data, size_t n, uint32_t timeout_ms);
  /* data[0..n) = the element-wise maximum over the ranks (no NaN is passed). */
  int (*all_reduce_max_f32)(void *user, float *data, size_t n, uint32_t timeout_ms);
  /* recv[r*bytes .. (r+1)*bytes) = rank r's send[0..bytes), for every rank r;
     bytes is the same on every rank (possibly 0). */
  int (*all_gather)(void *user, const void *send, size_t bytes, void *recv, uint32_t timeout_ms);
} ssa_collective;

/* Fills *c with defaults (no callbacks, rank 0 of 1, timeout 60000 ms) and sets
   struct_size. c must not be NULL. */
SSA_API void ssa_collective_init(ssa_collective *c);

typedef struct ssa_runtime_options {
  uint32_t struct_size;
  ssa_backend backend; /* default AUTO: CUDA if built and a device exists, else CPU */
  int32_t device;      /* CUDA device ordinal; default 0 */
  int32_t num_threads; /* CPU worker threads; 0 (default) = hardware concurrency */
  uint64_t seed;       /* default seed for sampling when a decode passes seed 0;
                          default 0x5EED */
  /* ---- core: every field above; struct_size may end here or at a later field ---- */
  /* Tiered K/V for CUDA runtimes (docs/TIERED_MEMORY.md). CPU runtimes check
     both as CUDA runtimes do (host_cache_bytes above device_kv_budget is
     SSA_ERR_INVALID_ARGUMENT on every backend: whether options are valid does
     not depend on the machine, SSA_BACKEND_AUTO included) and then ignore them.
     device_kv_budget: the device memory, in bytes, that the K/V
     pages of this runtime's sessions may use, resident pages and caches together;
     0 (default) = no limit, every page on the device. Pages beyond it live in
     pinned host memory (allocated in chunks as needed) and decodes read them over
     the bus; the first 128 tokens and the newest 1024 tokens of each layer are kept
     on the device while the budget allows, older pages move to the host first.
     host_cache_bytes: the part of device_kv_budget kept for device copies of host
     pages that decodes read recently (shared by the runtime's sessions); default
     0 = an eighth of device_kv_budget; at most device_kv_budget. */
  uint64_t device_kv_budget;
  uint64_t host_cache_bytes;
  /* Sharded sessions (docs/SHARDING.md): every session of the runtime holds each
     layer's tokens in contiguous shards, one per device, in the order of
     `devices`; appends go to the last shard in use, which grows to shard_tokens,
     then the next shard starts (the last device's shard takes every token beyond
     the others). A decode makes exactly the selection an unsharded session would
     (the same estimator: global top-k threshold, global proposal normaliser,
     draws split by residual mass with the same RNG, partial outputs merged by
     log-sum-exp), bitwise the same output on the CPU backend.
     CUDA runtimes: one shard per GPU of the list, which must all read each
     other's memory (peer access, enabled by ssa_runtime_create); K, V, q and out
     are memory of the first device (or host memory, SSA_SESSION_HOST_POINTERS).
     DENSE and every method decode there with the heavy set and the samples of
     one GPU (the output equal up to the rounding of the attention's splits);
     ssa_decode_batch runs one pass per shard over the items it holds.
     target_error and pages mapped with SSA_LOAD_MMAP give SSA_ERR_UNSUPPORTED,
     and a decode returns once its output is queued,
     with the shards' selection exchanged between their threads (not on a
     stream being captured into a graph). */
  const int32_t *devices; /* n_devices device ordinals, borrowed for the call, no
                             duplicates; NULL (default) = one device, `device`.
                             CPU runtimes: the ordinals only name the in-process
                             shards (any distinct values >= 0), n_devices of them.
                             CUDA runtimes: existing GPUs; with n_devices > 1 and
                             device_kv_budget set, SSA_ERR_UNSUPPORTED in this
                             version */
  uint32_t n_devices;     /* entries of devices; default 0 (no list); must be
                             1..64 when devices is set, 0 when it is NULL */
  uint64_t shard_tokens;  /* tokens per shard before the next shard starts; 0
                             (default) = 1048576; else a multiple of 8192 (the
                             decode's fixed split, see docs/SHARDING.md) */
  void *communicator;     /* an ncclComm_t of the caller's (one process per GPU,
                             on one host or several): the runtime is then the
                             CUDA rank ncclCommUserRank of a group of
                             ncclCommCount ranks, as with `collective` below,
                             its collectives NCCL calls on a stream of the
                             runtime's (device buffers in place). `device` must
                             be the communicator's device; backend AUTO or
                             CUDA (CPU: SSA_ERR_INVALID_ARGUMENT). Every
                             collective has a timeout of 60 s: one that does
                             not complete in time, or whose communicator
                             reports an asynchronous error, aborts the
                             communicator (ncclCommAbort; the caller must then
                             neither use nor destroy it) and returns
                             SSA_ERR_IO. Borrowed: it must outlive the runtime.
                             Default NULL. Builds without NCCL (a CUDA build
                             that finds NCCL has it) give SSA_ERR_UNSUPPORTED */
  /* Sessions across processes (docs/DISTRIBUTED.md): the runtime is rank
     `collective->rank` of a group of `collective->size` processes whose
     transport is the caller's (an MPI communicator, a torch.distributed process
     group, ...), reached through the callbacks of ssa_collective. Every session
     of the runtime is sharded by position over the group as over `devices`
     (shard_tokens per shard, rank i holds shard i): each rank keeps only its
     shard's K/V pages and PQ codes (every rank keeps the layer lengths and
     the codebooks, trained identically everywhere), and every decode is a
     collective call. Borrowed for the call: the runtime copies the table (the
     table's `user` must outlive the runtime). Default NULL. Not with a devices
     list, nor with `communicator`. Backend AUTO makes a CPU rank; a CUDA rank
     (backend CUDA, on `device`) passes host buffers to the callbacks too (the
     library stages its device buffers through host memory) and keeps, besides
     its shard, the first 1024 tokens of the next shard (the GPU sampler's
     chunks straddle shard boundaries); every rank must use the same backend
     (else SSA_ERR_INVALID_ARGUMENT at ssa_runtime_create). A CUDA rank's decode
     output equals the unsharded CUDA session's up to the rounding of where the
     attention's splits fall (the same tokens read, the same samples), bitwise
     the same on every rank. Not with a CUDA rank (SSA_ERR_UNSUPPORTED):
     device_kv_budget (tiers), target_error, ssa_session_reserve, and decodes
     or index training of pages mapped with SSA_LOAD_MMAP. */
  const ssa_collective *collective;
  /* Pinned host memory for the host tier (docs/TIERED_MEMORY.md), page-locked
     by ssa_runtime_create in 64 MiB chunks: the runtime's sessions take their
     host pages from it before they pin any new memory (page-locking runs at
     about 2 GB/s, far below the bus, so pinning during an append bounds the
     append). Chunks a session frees come back to the runtime's pool, not to the
     OS, until the runtime is destroyed. 0 (default) = none: host pages are
     pinned as sessions need them. Else a multiple of 67108864 (64 MiB) and only
     with device_kv_budget set (the host tier exists only then), else
     SSA_ERR_INVALID_ARGUMENT on every backend; CPU runtimes check it so and
     ignore it. CUDA runtimes: SSA_ERR_OUT_OF_MEMORY when it cannot all be
     page-locked (nothing is kept). Sessions whose K/V pages exceed 64 MiB pin
     their own host memory. */
  uint64_t host_pool_bytes;
} ssa_runtime_options;

/* Fills *opts with defaults and sets struct_size. opts must not be NULL. */
SSA_API void ssa_runtime_options_init(ssa_runtime_options *opts);

/* Creates a runtime (backend choice, worker threads, default seed).
   opts: borrowed; NULL means defaults. out: receives the runtime, owned by the
   caller, freed with ssa_runtime_destroy() after every session made from it.
   Returns SSA_OK, SSA_ERR_INVALID_ARGUMENT (out NULL, bad struct_size, unknown
   backend, negative threads, a bad device list or shard_tokens),
   SSA_ERR_UNSUPPORTED (CUDA asked for but not built; a communicator in a
   build without NCCL; several CUDA devices with a device_kv_budget, or without
   peer access between them; a collective or communicator with a devices list,
   or with the CUDA backend and a device_kv_budget),
   SSA_ERR_DEVICE (CUDA asked for, no usable device, a listed device missing),
   SSA_ERR_OUT_OF_MEMORY (host_pool_bytes included). A CUDA runtime with a
   host_pool_bytes takes the time to page-lock it here. With a collective or a
   communicator it is a collective call (every rank makes it): the ranks check
   that they number themselves 0..size-1 and agree on shard_tokens and the
   backend (else SSA_ERR_INVALID_ARGUMENT on every rank); SSA_ERR_IO when a
   collective fails. */
SSA_API ssa_status ssa_runtime_create(const ssa_runtime_options *opts, ssa_runtime **out);

/* Frees a runtime. NULL is a no-op. Every session of it must be destroyed first. */
SSA_API void ssa_runtime_destroy(ssa_runtime *rt);

/* The backend the runtime actually uses (never AUTO). rt NULL gives AUTO. */
SSA_API ssa_backend ssa_runtime_backend(const ssa_runtime *rt);

/* Number of CPU worker threads the runtime uses (>= 1); 0 if rt is NULL. */
SSA_API int32_t ssa_runtime_num_threads(const ssa_runtime *rt);

/* Number of shards (devices) the runtime's sessions are split over (>= 1);
   0 if rt is NULL. */
SSA_API uint32_t ssa_runtime_num_shards(const ssa_runtime *rt);

/* This process's rank in the runtime's group (ssa_runtime_options.collective
   or .communicator); 0 for a runtime without one, or if rt is NULL. */
SSA_API uint32_t ssa_runtime_rank(const ssa_runtime *rt);

/* --------------------------------------------------------------- sessions */

/* One long-lived KV store: one sequence, all layers of a model. */
typedef struct ssa_session ssa_session;

/* Session flag: K, V, q and out of a CUDA session are host pointers (staged
   through the library). Without it a CUDA session takes device pointers only.
   Ignored by CPU sessions, which always take host pointers. */
#define SSA_SESSION_HOST_POINTERS 1u

typedef struct ssa_session_config {
  uint32_t struct_size;
  uint32_t n_layers;     /* >= 1                                               */
  uint32_t n_q_heads;    /* >= 1, a multiple of n_kv_heads                     */
  uint32_t n_kv_heads;   /* >= 1                                               */
  uint32_t head_dim;     /* 32..512 and a multiple of 8 (64, 128, 256 typical) */
  ssa_dtype kv_dtype;    /* dtype of K, V, q and out; default F16              */
  uint32_t pq_subspaces; /* M, default 16; must divide head_dim                */
  uint32_t pq_centroids; /* K, default 256; 2..256 (one-byte codes), 2..16 for
                            the 4-bit proxies (SSA_PROXY_PQ4, _OPQ4, _QPQ4)    */
  uint64_t model_fingerprint; /* opaque to the library; checked on load; default 0 */
  /* ---- core: the fields above; struct_size may end here or at a later field ---- */
  uint32_t page_tokens;  /* tokens per KV page, default 256; power of two 16..4096;
                            a page (K and V) must fit in 1 GiB                */
  uint32_t flags;        /* SSA_SESSION_* flags, default 0                      */
  /* PQ index policy, per layer. The codebooks of a layer are trained (k-means++
     then Lloyd) on up to index_train_sample keys per KV head as soon as the layer
     holds index_min_tokens tokens, and retrained (all codes re-encoded) whenever
     the layer has grown by index_regrow_factor since the last training.
     Keys appended in between are encoded with the current codebooks.
     index_regrow_factor 0 disables automatic retraining (training once still
     happens); ssa_session_update_index() trains on demand. */
  uint32_t index_min_tokens;   /* default 2048, >= 1                   */
  float index_regrow_factor;   /* default 4.0; 0 or >= 1.0 (1.0 = every append) */
  uint32_t index_train_sample; /* keys sampled per KV head, default 16384, >= 1 */
  uint32_t index_iterations;   /* Lloyd iterations after k-means++, default 8 */
  ssa_proxy proxy;             /* default SSA_PROXY_PQ; stored in snapshots   */
  /* Score-aware quantisation (ScaNN's anisotropic loss): the weight eta of the
     part of a key's quantisation error along the key itself, relative to the
     part across it, in codebook training and in encoding. The along part moves
     every large score q . k of that key; the across part mostly cancels. 1
     (default) = plain squared error (k-means); > 1 = score-aware, trained by
     alternating code and centroid updates that never raise the loss
     (docs/ALGORITHM.md). ScaNN's threshold T (a fraction of the key's norm)
     corresponds to eta = (head_dim - 1) T^2 / (1 - T^2). 0 (a zeroed field)
     reads as 1; else in [1, 1000]. Stored in snapshots. Above 1: CPU sessions
     only (SSA_ERR_UNSUPPORTED on CUDA). */
  float pq_parallel_weight;
} ssa_session_config;

/* Fills *cfg with defaults (shape fields 0: the caller must set n_layers,
   n_q_heads, n_kv_heads and head_dim) and sets struct_size. cfg must not be NULL. */
SSA_API void ssa_session_config_init(ssa_session_config *cfg);

/* Creates an empty session on rt's backend. cfg: borrowed, must not be NULL.
   out: receives the session, owned by the caller (ssa_session_destroy).
   The runtime must outlive the session.
   Returns SSA_OK, SSA_ERR_INVALID_ARGUMENT (NULLs, bad struct_size, a shape or
   PQ setting out of range, an unknown proxy, 4-bit proxies with more than 16
   centroids or an odd number of subspaces), SSA_ERR_UNSUPPORTED (pq_parallel_weight
   above 1 on a CUDA runtime, a proxy other than SSA_PROXY_PQ on a CUDA runtime
   of several devices or processes),
   SSA_ERR_OUT_OF_MEMORY, SSA_ERR_DEVICE. */
SSA_API ssa_status ssa_session_create(ssa_runtime *rt, const ssa_session_config *cfg,
                                      ssa_session **out);

/* Frees a session and every page it alone holds. NULL is a no-op. Must not race
   with any other call on the same session. */
SSA_API void ssa_session_destroy(ssa_session *s);

/* Tokens present in every layer (the minimum over layers). 0 if s is NULL. */
SSA_API uint64_t ssa_session_length(const ssa_session *s);

/* Tokens present in one layer; 0 if s is NULL or layer is out of range. */
SSA_API uint64_t ssa_session_layer_length(const ssa_session *s, uint32_t layer);

/* Copies the session's configuration into *cfg (cfg->struct_size must be set,
   e.g. by ssa_session_config_init). Returns SSA_OK or SSA_ERR_INVALID_ARGUMENT. */
SSA_API ssa_status ssa_session_get_config(const ssa_session *s, ssa_session_config *cfg);

/* Appends n_tokens tokens to one layer. k and v: [n_tokens][n_kv_heads][head_dim]
   in kv_dtype, borrowed, in the session's memory space. New keys are encoded with
   the layer's current PQ codebooks; the index policy may (re)train them here.
   All-or-nothing: on failure the layer is unchanged. n_tokens 0 is a no-op.
   Takes the session exclusively (waits for running decodes).
   A layer holds at most 2^32 - 1 tokens.
   Sharded sessions (ssa_runtime_options.devices): the tokens go to the last
   shard in use until it holds shard_tokens, then to the next shard.
   A group's runtime (ssa_runtime_options.collective): every rank appends the
   same rows (all n_tokens of them); each checks them all and keeps those that
   fall in its shard. An append that (re)trains the index is a collective call
   (see ssa_session_update_index); others exchange nothing.
   Returns SSA_OK, SSA_ERR_INVALID_ARGUMENT (NULL s/k/v, layer >= n_layers, size
   overflow, the layer limit exceeded, NaN or infinity in k/v),
   SSA_ERR_OUT_OF_MEMORY, SSA_ERR_DEVICE; on a group's runtime, when it trains,
   SSA_ERR_IO (a collective failed) and a peer's failure. */
SSA_API ssa_status ssa_session_append(ssa_session *s, uint32_t layer, const void *k,
                                      const void *v, uint64_t n_tokens);

/* ssa_session_append without waiting, for CUDA sessions fed from device memory
   (a decode loop: the model writes this step's K/V on `stream`, the append and
   the next decode are queued behind it, nothing waits on the host).
   Queues on `stream` (a cudaStream_t; NULL = the legacy default stream) the
   copy of k and v into the session and their PQ codes, and returns. The layer
   holds the tokens on return: decodes queued on the same stream afterwards (or
   ordered after it by the caller) read them; a decode on another stream not so
   ordered may read them before they are written. k and v are read when the
   stream gets there: keep them unchanged until then. Unlike ssa_session_append,
   k and v are NOT scanned for NaN/Inf (that would need a wait): a non-finite
   value is stored and makes the decodes that read it meaningless.
   The queued copy comes after the work queued before the call on the legacy
   default stream (and so on blocking streams). The library orders its own
   later work on the session (appends, copies, frees, truncate, fork, save)
   after the queued copy by making the legacy default stream wait for it; so
   later work of the caller's on the legacy stream, or on blocking streams, also
   waits for `stream` up to that point.
   Exceptions, where it waits for the stream and then appends as
   ssa_session_append (scan included): an append that reaches the layer's index
   (re)training threshold, and sessions created with SSA_SESSION_HOST_POINTERS.
   CPU sessions: the same as ssa_session_append (stream is not used).
   Returns as ssa_session_append, and SSA_ERR_INVALID_ARGUMENT if the stream is
   being captured into a CUDA graph (the session changes at the call, so a
   replay could not append). */
SSA_API ssa_status ssa_session_append_async(ssa_session *s, uint32_t layer, const void *k,
                                            const void *v, uint64_t n_tokens, void *stream);

/* (Re)trains the PQ codebooks of every layer that holds at least one token from
   its current keys and re-encodes all codes. Also runs automatically (see
   ssa_session_config). Takes the session exclusively.
   A group's runtime: a collective call per layer; the training sample (the
   keys an unsharded session samples) is gathered over the group, every rank
   trains the same codebooks (bitwise an unsharded session's) and encodes its
   own keys.
   Returns SSA_OK, SSA_ERR_INVALID_ARGUMENT (s NULL), SSA_ERR_OUT_OF_MEMORY,
   SSA_ERR_DEVICE; on a group's runtime SSA_ERR_IO (a collective failed). */
SSA_API ssa_status ssa_session_update_index(ssa_session *s);

/* Shows a layer queries for the query-aware proxies (SSA_PROXY_QPQ, _QPQ4) to
   learn their transform from: the queries the model attends the layer with, in
   the shape of a decode's q, n of them: q [n][n_q_heads][head_dim] in the
   session's dtype and memory space (CUDA sessions: device memory, read on the
   legacy default stream before the call returns; host memory with
   SSA_SESSION_HOST_POINTERS), borrowed. Per KV head the
   second moment of its query heads' queries is accumulated (head_dim^2
   multiply-adds per query head: a few hundred queries per layer are plenty, a
   prefill's last ones or the first decode steps'), and its last 256 queries
   are kept to weight the training keys by. Nothing is retrained here:
   the layer's next training uses every query observed so far (the automatic
   policy, or ssa_session_update_index). The moments and recent queries a
   layer's index was trained from are saved with it in snapshots, and a loaded
   session keeps observing from them; queries observed after a layer's last
   training are not saved.
   n 0 does nothing. Takes the session exclusively. A rank of a group of
   processes observes locally: every rank must pass the same queries (the
   layer's next training compares them and refuses on every rank otherwise).
   Returns SSA_OK, SSA_ERR_INVALID_ARGUMENT (s NULL, q NULL with n > 0,
   layer >= n_layers, a proxy that is not query-aware, NaN or infinity in q,
   more than 2^28 values in q, more than 2^48 queries per KV head in all, q not
   in the session's memory space), SSA_ERR_OUT_OF_MEMORY, SSA_ERR_DEVICE. */
SSA_API ssa_status ssa_session_observe_queries(ssa_session *s, uint32_t layer, const void *q, uint64_t n);

/* Keeps the first n_tokens tokens of every layer (agent rollback). n_tokens may
   not exceed ssa_session_length (the shortest layer), so every layer ends up
   exactly n_tokens long. Codebooks are kept. Sharded sessions: the shards past
   n_tokens are emptied (whole shards drop), the next append refills them.
   A group's runtime: every rank truncates (no exchange), each its own pages.
   Takes the session exclusively.
   Returns SSA_OK, SSA_ERR_INVALID_ARGUMENT (s NULL, n_tokens > ssa_session_length). */
SSA_API ssa_status ssa_session_truncate(ssa_session *s, uint64_t n_tokens);

/* Makes an independent copy of the session. Pages, codes and codebooks are shared
   copy-on-write, so forking costs O(pages), not O(bytes). out: receives the
   new session, owned by the caller. The source may be decoded meanwhile.
   A fork of a sharded session is sharded the same way (the same runtime); on a
   group's runtime every rank forks (no exchange), each sharing its own pages.
   Returns SSA_OK, SSA_ERR_INVALID_ARGUMENT, SSA_ERR_OUT_OF_MEMORY. */
SSA_API ssa_status ssa_session_fork(ssa_session *s, ssa_session **out);

/* ----------------------------------------------------------------- decode */

typedef struct ssa_decode_params {
  uint32_t struct_size;
  ssa_method method;    /* default SSA_METHOD_SSA */
  uint32_t budget;      /* tokens read per query head incl. sink+local; 0 (default)
                           = ceil(N / sparsity). With target_error > 0: the floor
                           of the chosen budget (0 = none) */
  float sparsity;       /* N / budget when budget == 0; default 50; must be >= 1
                           (finite); not read with target_error > 0, where any
                           value (NaN included) is accepted */
  float heavy_fraction; /* h for SSA and HYBRID_UNIFORM, in [0, 1]; default 0.4 */
  uint32_t n_sink;      /* default 128 */
  uint32_t n_local;     /* default 128 */
  float pi_min;         /* lower clamp of inclusion probabilities, in (0, 1]; 1e-4 */
  uint64_t seed;        /* 0 (default) = the runtime's seed */
  uint64_t step;        /* RNG counter: same (seed, step, inputs) = same result */
  void *stream;         /* cudaStream_t for CUDA sessions; NULL = default stream */
  /* ---- core: the fields above; struct_size may end here or at a later field ---- */
  /* error-targeted decode (see below) */
  float target_error;   /* epsilon: wanted relative L2 error of each head's output;
                           0 (default) = off; else finite and > 0 */
  float target_delta;   /* delta: allowed failure probability, in (0, 1);
                           default 0.1; read only when target_error > 0 */
  uint32_t max_budget;  /* cap on the budget chosen per head (tokens incl. sink
                           and local); 0 (default) = max(ceil(N / 5), budget) */
  /* selection per KV group (docs/GROUP_SELECTION.md) */
  uint32_t group_selection; /* an ssa_group_selection (read as an integer);
                               default SSA_GROUP_OFF. Not with target_error > 0
                               (SSA_ERR_UNSUPPORTED) */
} ssa_decode_params;

/* Error-targeted decode (target_error > 0; methods SSA and SSA_ADAPTIVE only;
   CPU and CUDA sessions, not sharded ones). Instead of a fixed budget, each query head chooses its
   own budget k so that its output o_hat meets
       ||o_hat - o||_2 <= target_error * ||o||_2   with probability >= 1 - target_delta
   by the library's prediction, where o is exact dense attention. Per head:
     1. The sink and local tokens and the method's heavy set for the floor
        budget (`budget`; 0 = no floor, then no heavy tokens yet) are read exactly.
     2. A pilot of 64 draws from the residual (proxy-proportional, as in SSA) is
        read. It estimates V, the variance per draw of the self-normalised
        estimator's output, by the delta method (linearised ratio), summed over
        the head dimension, relative to ||o_hat||^2. m draws give an expected
        squared relative error V / m.
     3. While the draws needed, c * V / target_error^2, exceed what the method's
        split of the current budget leaves, the budget grows: the smallest k whose
        heavy set (fixed fraction h, or the water-filling lambda) shrinks the
        residual's proxy mass enough, with V predicted to scale with that mass
        squared; the new heavy rows are read and V is estimated again.
     4. Then draws continue on the same RNG stream, V re-estimated on all of
        them as they grow, until m >= c * V / target_error^2. The output is the
        usual self-normalised Horvitz-Thompson estimate over everything read.
   c is z^2 with z the normal (1 - delta/2) quantile, at least 1.6: for a
   Gaussian error vector of any covariance, P(||e||^2 > c E||e||^2) <= delta
   (the single-direction case is the worst for these c), so only V is needed.
   The budget (sink + local + heavy + draws) never exceeds max_budget; a head
   that would need more stops there and is counted in
   ssa_decode_stats.capped_heads. A head whose chosen budget covers all of its
   candidates reads them all (exact). `sparsity` is not read; `budget`, if
   nonzero, is the floor and must not exceed a nonzero max_budget.
   The guarantee is a prediction (normal limit of the mean of the draws, V
   estimated from the draws themselves, the with-replacement variance as a
   conservative stand-in for the deduplicated estimator's); tests check the
   achieved coverage statistically, and it is typically well above 1 - delta.
   Deterministic like every sampling decode: a function of (seed, step, layer,
   head, inputs), independent of the thread count. Other methods give
   SSA_ERR_INVALID_ARGUMENT, and so does SSA with heavy_fraction 1 (no draws to
   measure the error with).
   CUDA sessions give the same guarantee with budgets grown in rounds, as the
   kernels take one budget per decode (docs/ALGORITHM.md, "On CUDA sessions"):
   round 0 decodes every head at the floor (at least a pilot of 64 draws; the
   method's split into heavy rows and draws), V of every head is estimated on
   the device from the rows that round read (the formula of step 2, every draw
   with its multiplicity), and a head whose c * V / target_error^2 draws are no
   more than the round drew keeps that round's output. The other heads decode
   again, all at the largest budget any of them needs (with a margin); the
   fourth round, or one at the cap, is the last, and heads still short keep its
   output and count in capped_heads. So each head's prediction comes from the
   draws of the output returned for it. The stats describe the round each head
   kept (rows_from_host and host_cache_hits: all rounds); the call waits for
   its rounds on the host (a stream being captured into a CUDA graph gives
   SSA_ERR_INVALID_ARGUMENT), and ssa_decode_batch gives SSA_ERR_UNSUPPORTED. */

/* Fills *p with defaults and sets struct_size. p must not be NULL. */
SSA_API void ssa_decode_params_init(ssa_decode_params *p);

typedef struct ssa_decode_stats {
  uint32_t struct_size;
  uint64_t context_tokens; /* N of the layer decoded (summed over batch items)   */
  uint64_t tokens_read;    /* rows of K/V read, summed over query heads          */
  uint64_t heavy_tokens;   /* |H| summed over query heads                        */
  uint64_t draws;          /* m summed over query heads                          */
  uint64_t unique_samples; /* |S| summed over query heads                        */
  /* ---- core: the fields above; struct_size may end here or at a later field ---- */
  double residual_proxy_mass; /* proxy softmax mass of the sampled residual R,
                                 summed over query heads (0 for top-k methods:
                                 that mass is simply dropped there)             */
  uint64_t scored_tokens;  /* proxy scores computed, summed over query heads     */
  /* error-targeted decode (0 unless target_error > 0) */
  uint64_t target_budget;  /* budget each head chose (sink + local + |H| + draws),
                              summed over query heads; tokens_read <= this, as
                              duplicate draws are read once                      */
  uint32_t capped_heads;   /* query heads that stopped at max_budget with their
                              predicted error still above target_error           */
  double predicted_error;  /* predicted relative error bound at confidence
                              1 - target_delta, summed over query heads; 0 for
                              exact heads; infinite if a head could not estimate
                              it (the cap left no room for draws, o_hat = 0)     */
  uint32_t window_only_heads; /* query heads whose budget did not exceed n_sink +
                              n_local while the context is longer (for error-
                              targeted decodes: whose cap did not): they read
                              only the sink and local tokens, no heavy set, no
                              draws, nothing scored. Nonzero means the budget is
                              too small for sparse decode here: raise budget or
                              lower sparsity (ceil(N / sparsity) > n_sink +
                              n_local is needed)                                 */
  uint64_t rows_from_host; /* rows of tokens_read that a CUDA decode read over the
                              bus from pinned host pages (device_kv_budget), summed
                              over query heads; 0 on the CPU backend             */
  uint64_t host_cache_hits; /* rows of host pages that were read from their device
                              copy in the session's cache instead, summed over
                              query heads; rows_from_host + host_cache_hits = the
                              rows of host-tier pages read                       */
} ssa_decode_stats;

/* Zeroes *st and sets struct_size. st must not be NULL. Sizes as in
   "Versioned structs" (Conventions): only the fields of the caller's size are
   written. */
SSA_API void ssa_decode_stats_init(ssa_decode_stats *st);

/* Attention output of one layer for one new query.
   q: [n_q_heads][head_dim]; out: [n_q_heads][head_dim]; both in kv_dtype and in
   the session's memory space; q borrowed, out written by the call (q, out and
   stats may not overlap: Conventions). The query attends over every token of
   the layer (ssa_session_layer_length). p: borrowed, NULL = defaults. stats: NULL = not
   wanted; else its struct_size must be set and it is overwritten.
   Sampling methods draw from a counter-based RNG keyed by (seed, step, layer,
   query head): the result does not depend on threads or timing, and the same
   inputs, seed and step give bitwise the same output on the same backend,
   also after a fork or a snapshot round trip.
   Proxy methods on a layer without a PQ index train one on demand, but only
   when they select candidates. Short contexts decode the same way on every
   backend and with every method: a layer of at most n_sink + n_local tokens, or
   a budget >= N, is exact dense attention; a budget of at most n_sink + n_local
   below N (k' = 0; e.g. a short prompt at a high sparsity) reads the sink and
   local tokens alone (stats' window_only_heads), scores nothing and needs no
   index, so none is trained (docs/ALGORITHM.md#fixed-tokens).
   Decoding an empty layer gives SSA_ERR_INVALID_ARGUMENT, as does a NaN or
   infinity in a host q (see Conventions). Arguments are checked before anything
   is computed: a call they reject writes nothing to out.
   A sharded session decodes with exactly the selection an unsharded one makes
   (on the CPU backend, bitwise the same output and stats; docs/SHARDING.md).
   A CUDA session loaded with SSA_LOAD_MMAP on a device that cannot read pageable
   host memory waits mid-decode for its selection (the host copies the rows read
   from the file), and gives SSA_ERR_INVALID_ARGUMENT on a stream being captured.
   Returns SSA_OK, SSA_ERR_INVALID_ARGUMENT, SSA_ERR_OUT_OF_MEMORY, SSA_ERR_DEVICE,
   SSA_ERR_UNSUPPORTED (target_error > 0 on a sharded session). */
SSA_API ssa_status ssa_decode(ssa_session *s, uint32_t layer, const void *q, void *out,
                              const ssa_decode_params *p, ssa_decode_stats *stats);

/* ssa_decode that also reports which rows each query head read: a selection
   trace, for studies of how the selected rows change from step to step or how a
   cache of recently read rows would serve them.
   Decodes as ssa_decode with the same arguments (bitwise the same out and stats)
   and writes, for every query head h, the distinct token indices of the layer
   that h's output used, in ascending order, to
   tokens[head_offsets[h] .. head_offsets[h + 1]), with head_offsets[0] = 0.
   Sink and local tokens are included; with group selection every query head of a
   KV group lists the group's shared rows; a dense decode lists every token; the
   number of rows of head h summed over heads is stats' tokens_read.
   tokens: capacity entries. log_pi: NULL = not wanted, else capacity entries that
   receive, at the same positions, the natural log of each row's inclusion
   probability (0 for sink, local and heavy rows and in dense decodes).
   head_offsets: n_q_heads + 1 entries. All three: host memory, caller-owned,
   borrowed, overlapping neither each other nor q, out and stats (Conventions);
   tokens may be NULL only with capacity 0.
   A capacity of n_q_heads * ssa_session_layer_length(s, layer) always suffices;
   a budgeted decode needs at most n_q_heads * budget, and with group selection
   n_q_heads * (n_sink + n_local + G * (budget - n_sink - n_local)) for G query
   heads per KV head. If this decode read more rows than capacity, nothing is
   written to out, stats, tokens or log_pi and the session is unchanged (an
   index the layer lacked and this decode trained is not kept); head_offsets
   receives the offsets the trace would have had (head_offsets[n_q_heads] is
   the capacity needed: the same call with that capacity, seed and step reads
   the same rows) and the call returns SSA_ERR_INVALID_ARGUMENT naming both
   numbers.
   CPU sessions, sharded ones included (every shard's rows, in layer indices:
   the trace of the unsharded decode). CUDA sessions return SSA_ERR_UNSUPPORTED
   (their selection stays on the device) and nothing is written.
   Returns as ssa_decode, and SSA_ERR_INVALID_ARGUMENT for head_offsets NULL,
   tokens NULL with capacity > 0, or a capacity too small. */
SSA_API ssa_status ssa_decode_traced(ssa_session *s, uint32_t layer, const void *q, void *out,
                                     const ssa_decode_params *p, ssa_decode_stats *stats,
                                     uint32_t *tokens, float *log_pi, uint64_t capacity,
                                     uint64_t *head_offsets);

typedef struct ssa_decode_item {
  ssa_session *session; /* borrowed; all items must share one runtime */
  const void *q;        /* [n_q_heads][head_dim] of that session, borrowed */
  void *out;            /* [n_q_heads][head_dim] of that session, written */
} ssa_decode_item;

/* Decodes many sessions (of any lengths and shapes) at one layer, in parallel.
   Items: borrowed array of n_items. A session may appear in several items.
   Validates every item before computing any; on failure no out is written
   by a failing validation, and the message names the first bad item.
   Returns as ssa_decode, and SSA_ERR_UNSUPPORTED for target_error > 0 on CUDA
   sessions (decode them one at a time with ssa_decode). */
SSA_API ssa_status ssa_decode_batch(const ssa_decode_item *items, size_t n_items,
                                    uint32_t layer, const ssa_decode_params *p);

/* ----------------------------------------------------------- decode steps */

/* One step of a generation loop: the new token's K and V appended to `layer` and
   the layer decoded with q over the grown context, in one call. CPU sessions (and
   CUDA sessions without a reservation) run it eagerly: exactly
   ssa_session_append_async(s, layer, k, v, 1, p->stream) followed by ssa_decode
   with the RNG step p->step + position, where position is the layer's length
   before the append (the new token's index).

   CUDA graphs. After ssa_session_reserve(s, n), a CUDA session's step runs on
   the device without the host: a kernel reads the layer's length from device
   memory, writes the token's K/V rows into the reserved page and its PQ code
   (with the layer's codebooks at the reservation), advances the length, and
   plans the decode of the grown context there (sink and local ranges, the
   budget of `sparsity`, the heavy count: the numbers the host planner gives),
   with the RNG step p->step + position. So a caller captures one step of its
   loop (every layer's step, or a batch) into a CUDA graph once and replays it
   for every later token. A replayed step makes the selection the same step run
   eagerly makes (heavy set, draws, weights) and bitwise the same output; against
   ssa_decode of the same context and step it makes the same selection and the
   same output up to the attention's rounding (the step's launches are sized
   for the reservation's capacity, so its attention may split differently).
   The host learns the grown lengths lazily: every other call that reads or
   changes the session's layers (append, decode, fork, truncate, save...) first
   waits for the session's queued steps and commits the tokens they appended (as
   ssa_session_sync does); ssa_session_length and ssa_session_layer_length
   report the lengths committed so far. ssa_session_append(_async),
   update_index, truncate, fork, save and checkpoint END the reservation (a
   replay of a step queued under it then does nothing, see ssa_session_sync):
   reserve and capture again to continue.
   What a step cannot do on the device is refused when it is queued (eagerly or
   during capture), with nothing queued: target_error > 0 and SSA_GROUP_MIXTURE
   with several query heads per KV head (SSA_ERR_UNSUPPORTED; SSA_GROUP_MEAN_QUERY
   works), stats while the stream is being captured, a layer at its reserved
   capacity by the host's count, and a step of a session without a reservation
   on a stream being captured (SSA_ERR_INVALID_ARGUMENT; its append would change
   the session at the call). Sessions that cannot be reserved (sharded, mapped,
   host pointers) therefore cannot be captured.
   Tiered sessions (device_kv_budget) reserve and capture as others: the
   reservation moves pages between tiers as an append would, and its steps read
   the tables of that moment (host pages in place over the bus, cached copies
   from the device); what they read is counted per page and taken in at the
   next settle, and the device cache of host pages changes only at the next
   reservation. A short reservation (say 128 tokens) lets pages move and the
   cache learn more often.
   No index (re)training happens inside a reservation: its steps encode with the
   codebooks the layer had when it was reserved, and the index policy's
   retraining (index_regrow_factor) runs at the next append or update_index after
   it. A loop that wants it retrains between replays: ssa_session_update_index,
   then ssa_session_reserve and capture again. A step replayed on a layer already
   at its capacity does nothing (out is not written) and is counted by
   ssa_session_sync.
   Ordering: a step's kernels run on p->stream. Replays of a session's steps must
   run in the order they are to append (one stream, or ordered by the caller),
   not beside other calls on the session. k, v and q are read and out written
   when the stream gets there; k and v are NOT scanned for NaN/Inf (as in
   ssa_session_append_async). A replay after ssa_session_destroy does nothing
   while the runtime lives (each step first checks a guard that outlives the
   session, before it reads any of the session's memory); a replay after the
   runtime is destroyed is undefined.

   k, v: [n_kv_heads][head_dim]; q, out: [n_q_heads][head_dim]; all in kv_dtype
   and the session's memory space, borrowed (q and out may not overlap). p:
   borrowed, NULL = defaults. stats: as in ssa_decode (NULL = not wanted).
   Returns as ssa_session_append_async and ssa_decode, and the refusals above. */
SSA_API ssa_status ssa_decode_step(ssa_session *s, uint32_t layer, const void *k, const void *v,
                                   const void *q, void *out, const ssa_decode_params *p,
                                   ssa_decode_stats *stats);

typedef struct ssa_decode_step_item {
  ssa_session *session; /* borrowed; all items share one runtime, each session once */
  const void *k;        /* [n_kv_heads][head_dim] of the new token, borrowed */
  const void *v;        /* [n_kv_heads][head_dim] of the new token, borrowed */
  const void *q;        /* [n_q_heads][head_dim], borrowed */
  void *out;            /* [n_q_heads][head_dim], written */
} ssa_decode_step_item;

/* ssa_decode_step over many sessions at one layer: with reservations, one launch
   set per 32 sessions (each item planned from its own length, with the RNG step
   p->step + its own position; the sessions must share one config and device,
   else SSA_ERR_INVALID_ARGUMENT); without, each item eagerly in turn. All
   sessions have a reservation or none (else SSA_ERR_INVALID_ARGUMENT). No item's
   out may overlap another's out or any q.
   items: borrowed array of n_items. stats: summed over the items. Every item is
   validated before any is queued. Returns as ssa_decode_step. */
SSA_API ssa_status ssa_decode_step_batch(const ssa_decode_step_item *items, size_t n_items,
                                         uint32_t layer, const ssa_decode_params *p,
                                         ssa_decode_stats *stats);

/* Reserves room for n_tokens more tokens on every layer of a CUDA session for
   decode steps (ssa_decode_step): their K/V and code pages are allocated now,
   with the device lengths and page tables the steps use. Ends a reservation the
   session held (committing its tokens first). Every layer must hold at least one
   token; a layer without a PQ index is trained now (as a decode would). Returns
   once its uploads are done. Takes the session exclusively.
   CPU sessions: checks the arguments and reserves nothing (their steps run
   eagerly). Returns SSA_OK, SSA_ERR_INVALID_ARGUMENT (s NULL, n_tokens 0, an
   empty layer, the layer limit exceeded), SSA_ERR_UNSUPPORTED (sharded sessions,
   pages mapped from a file (SSA_LOAD_MMAP), SSA_SESSION_HOST_POINTERS),
   SSA_ERR_OUT_OF_MEMORY, SSA_ERR_DEVICE. A tiered session (device_kv_budget)
   first takes its turn: idle sessions of the runtime (no reservation, not in a
   call) move device pages to the host, least recently active first, and it
   brings its host pages in, leaving room for the reserved pages
   (docs/TIERED_MEMORY.md, "Sessions taking turns"). */
SSA_API ssa_status ssa_session_reserve(ssa_session *s, uint64_t n_tokens);

/* Starts a tiered session's turn ahead of its ssa_session_reserve, so that its
   host pages cross the bus while another session decodes: idle sessions give up
   device pages as at a reservation (room is kept for n_tokens new tokens per
   layer; 0 keeps none) and the session's host pages are queued for copying to
   the device on a stream of the library's (copy engines, beside the runtime's
   kernels), not waited for. The session keeps reading its host pages until its
   next ssa_session_reserve waits for the copies and takes them in; a page
   written or shared meanwhile stays on the host (its copy is dropped). If the
   session is given up before it reserves, its copies are dropped. Call it for
   the next session once the current one holds its reservation: an idle session
   (the current one too, before it reserves) may give up pages to it.
   Sessions of a runtime without device_kv_budget, CPU sessions and a session
   holding a reservation: SSA_OK, nothing to do. Returns SSA_OK,
   SSA_ERR_INVALID_ARGUMENT (s NULL, n_tokens beyond the layer limit),
   SSA_ERR_UNSUPPORTED (as ssa_session_reserve), SSA_ERR_OUT_OF_MEMORY,
   SSA_ERR_DEVICE. Takes the session exclusively. */
SSA_API ssa_status ssa_session_prefetch(ssa_session *s, uint64_t n_tokens);

/* Waits for the session's queued decode steps (up to the last step queued or
   replayed, on whatever stream) and commits the tokens they appended, so that
   ssa_session_length and ssa_session_layer_length count them. Keeps the
   reservation. dropped_steps: NULL = not wanted; else receives the number of
   steps that did nothing since the last report (replays after the reservation
   ended, or on a layer at its capacity). Takes the session exclusively. Sessions
   without a reservation: a no-op (0 dropped).
   Returns SSA_OK, SSA_ERR_INVALID_ARGUMENT (s NULL), SSA_ERR_DEVICE. */
SSA_API ssa_status ssa_session_sync(ssa_session *s, uint64_t *dropped_steps);

/* -------------------------------------------------------------- snapshots */

/* Writes the whole session to path atomically (temp file, fsync, rename, fsync
   of the directory): after a crash at any moment path holds the old or the new
   snapshot. On failure path is unchanged, except that a failing fsync of the
   directory after the rename reports SSA_ERR_IO with the new file in place.
   path: borrowed. Reads the session (runs beside decodes; waits for mutations);
   saves of one session are serialised. A CUDA session's pages are copied to host
   memory one page at a time as they are written; the file is the same as the CPU
   backend's, so a snapshot saved on either backend loads on the other.
   A sharded session saves to one snapshot of the same format, with the same
   sections as an unsharded session of the same content: it loads on a runtime
   of any shard count, one included.
   A group's runtime (ssa_runtime_options.collective): a collective call, the
   same path on every rank. Each rank writes its shard's pages to its own file
   beside path ("<path's name>.<set id>.rank<i>"), then rank 0 commits the set
   by writing a manifest at path atomically; the rank files of earlier saves to
   path are then removed. On failure every rank returns an error and path keeps
   the previous set (docs/SNAPSHOT_FORMAT.md, "Group snapshots"). The set loads
   into a group of any size or into one process (ssa_session_load of path).
   Returns SSA_OK, SSA_ERR_INVALID_ARGUMENT, SSA_ERR_IO, SSA_ERR_OUT_OF_MEMORY,
   SSA_ERR_DEVICE (a CUDA copy failed). */
SSA_API ssa_status ssa_session_save(ssa_session *s, const char *path);

/* Appends to path only what changed since this session was last saved or
   checkpointed to (or loaded from) path - new and changed pages, new codes,
   retrained codebooks, changed metadata - plus a new section table, then commits
   by rewriting one of two superblock slots: after a crash or failure at any
   moment path holds the previous or the new state. Falls back to a full save
   when path holds no snapshot of this session (another session saved there, the
   file was replaced) or when superseded bytes outweigh live ones. Locking as
   ssa_session_save. Statuses as ssa_session_save. A group's runtime: a full
   save of the set, as ssa_session_save. */
SSA_API ssa_status ssa_session_checkpoint(ssa_session *s, const char *path);

#define SSA_LOAD_VERIFY 1u /* verify every checksum up front (default: on read) */
/* SSA_LOAD_MMAP on CUDA runtimes: the K/V pages stay in the file; a device that
   cannot read pageable host memory decodes them through pinned copies of the rows
   each decode reads, and such decodes cannot be captured into a CUDA graph
   (docs/TIERED_MEMORY.md). */
#define SSA_LOAD_MMAP 2u   /* map the file's K/V pages instead of reading them */

/* Restores a session saved by ssa_session_save/checkpoint onto rt's backend
   (either backend, whichever saved it; on a CUDA runtime the pages are read into
   host memory, verified and uploaded to device memory, or with a device budget
   placed in its tiers; the session's flags,
   SSA_SESSION_HOST_POINTERS included, are those it was saved with). On a
   sharded runtime the session is sharded by that runtime's devices and
   shard_tokens, whatever runtime saved it.
   path may be the manifest a group saved (ssa_session_save on a group's
   runtime): the set is checked whole (every rank file is the one the manifest
   pins, all parts of one session) and loads into one process, or into a group
   of any size. One rank's file alone is SSA_ERR_INVALID_ARGUMENT. On a group's
   runtime a load is a collective call, the same path on every rank: each rank
   reads only its shard's pages (from a set, or from one process's snapshot),
   and every rank fails unless all of them loaded the same session.
   What is verified (docs/SNAPSHOT_FORMAT.md has the details): the superblocks,
   section table, config, layer and metadata sections always; every section that
   is read is checked against its XXH3-64 as it is read, so a plain load (flags 0)
   and SSA_LOAD_VERIFY verify everything. With SSA_LOAD_MMAP the KV pages are
   mapped read-only from the file instead of read (codes and codebooks are still
   read and verified): the load takes constant time and memory, and the mapped KV
   pages are hashed only with SSA_LOAD_VERIFY, or else the first time a save or
   checkpoint of the session copies them into another file. The file must not be
   truncated by anyone while a session maps it. A restore never retrains the index.
   The loaded session remembers path, so ssa_session_checkpoint(s, path) appends.
   flags: SSA_LOAD_* bits. path: borrowed. out: receives the session, owned by the
   caller; written only on success (no partly restored session is ever returned).
   Thread-safe; several loads may run at once.
   Returns SSA_OK, SSA_ERR_INVALID_ARGUMENT, SSA_ERR_IO, SSA_ERR_CORRUPT,
   SSA_ERR_VERSION, SSA_ERR_MISMATCH, SSA_ERR_OUT_OF_MEMORY (host or device memory),
   SSA_ERR_DEVICE, SSA_ERR_UNSUPPORTED (a shape or proxy the CUDA backend does not take);
   on a group's runtime SSA_ERR_IO (a collective failed) and a peer's failure. */
SSA_API ssa_status ssa_session_load(ssa_runtime *rt, const char *path, uint32_t flags,
                                    ssa_session **out);

/* As ssa_session_load, but first checks the snapshot against the shape the
   caller expects: n_layers, n_q_heads, n_kv_heads, head_dim, kv_dtype,
   pq_subspaces, pq_centroids and model_fingerprint must all equal those of
   *expected (page_tokens, flags and the index policy are storage settings and are
   taken from the snapshot). The check happens after the small sections are read
   and verified and before any page is read. expected: borrowed; NULL = no check
   (then this is ssa_session_load). out: receives the session, owned by the caller.
   Thread-safe; never touches other sessions.
   Returns as ssa_session_load; SSA_ERR_MISMATCH names the first field that
   differs; SSA_ERR_INVALID_ARGUMENT for a bad expected->struct_size. */
SSA_API ssa_status ssa_session_load_checked(ssa_runtime *rt, const char *path, uint32_t flags,
                                            const ssa_session_config *expected,
                                            ssa_session **out);

/* What a snapshot file holds, read without loading it (ssa_snapshot_inspect). */
typedef struct ssa_snapshot_info {
  uint32_t struct_size;
  uint32_t format_version;    /* format version of the committed superblock      */
  /* ---- core: the fields above; struct_size may end here or at a later field ---- */
  uint64_t generation;        /* 1 after a full save, +1 per checkpoint          */
  uint64_t file_bytes;        /* bytes the committed snapshot spans in the file   */
  uint64_t live_bytes;        /* bytes of sections the snapshot still uses; the
                                 rest are superseded by later checkpoints        */
  uint32_t n_sections;        /* entries in the committed section table          */
  uint32_t n_layers;
  uint32_t n_q_heads;
  uint32_t n_kv_heads;
  uint32_t head_dim;
  ssa_dtype kv_dtype;
  uint32_t pq_subspaces;
  uint32_t pq_centroids;
  uint32_t page_tokens;
  uint32_t indexed_layers;    /* layers saved with trained PQ codebooks          */
  uint64_t model_fingerprint;
  uint64_t length;            /* tokens present in every layer (min over layers)  */
  uint64_t max_layer_length;  /* tokens of the longest layer                      */
  uint64_t metadata_bytes;    /* size of the user metadata saved                  */
  ssa_proxy proxy;            /* the sessions' proxy (SSA_PROXY_PQ for files that
                                 predate the proxies)                            */
  float pq_parallel_weight;   /* the score-aware weight (1: squared error)        */
} ssa_snapshot_info;

/* Zeroes *info and sets struct_size. info must not be NULL. */
SSA_API void ssa_snapshot_info_init(ssa_snapshot_info *info);

/* Describes the snapshot at path without loading it: reads the superblocks, the
   section table and the config, layer and metadata sections, verifying their
   checksums (KV pages, codes and codebooks are not read). For a group's
   manifest: every rank file is checked as a load checks it; the fields are rank
   0's file's, file_bytes, live_bytes and n_sections summed over the files; one
   rank's file alone is SSA_ERR_INVALID_ARGUMENT. info: its struct_size
   must be set (ssa_snapshot_info_init); fields beyond it are not written; the
   rest is written only on success. Thread-safe.
   Returns SSA_OK, SSA_ERR_INVALID_ARGUMENT (NULL path/info, struct_size too
   small), SSA_ERR_IO (cannot open or read), SSA_ERR_CORRUPT, SSA_ERR_VERSION. */
SSA_API ssa_status ssa_snapshot_inspect(const char *path, ssa_snapshot_info *info);

/* Replaces the session's user metadata (opaque bytes, at most 64 MiB) with a copy
   of bytes[0..n); n 0 clears it (bytes may then be NULL). The metadata is saved
   in every snapshot of the session and restored by load. bytes: borrowed.
   Takes the session exclusively (waits for running decodes and saves).
   Returns SSA_OK, SSA_ERR_INVALID_ARGUMENT (s NULL, bytes NULL with n > 0,
   n too large), SSA_ERR_OUT_OF_MEMORY. */
SSA_API ssa_status ssa_session_set_metadata(ssa_session *s, const void *bytes, size_t n);

/* Copies the session's user metadata into buf[0..cap) and its full size into
   *n_out. A buf too small (including NULL with cap 0) gets nothing written and
   is not an error: check *n_out > cap and call again with a larger buffer.
   buf: caller-owned, host memory. n_out must not be NULL. Reads the session
   (runs beside decodes and saves).
   Returns SSA_OK, SSA_ERR_INVALID_ARGUMENT (s or n_out NULL, buf NULL with cap > 0). */
SSA_API ssa_status ssa_session_get_metadata(const ssa_session *s, void *buf, size_t cap,
                                            size_t *n_out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SSA_H */
