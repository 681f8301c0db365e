#include "cuda_backend.h"

#include "status.h"

#if !defined(SSA_HAVE_CUDA)

namespace ssa::cuda {
struct SessionState {};
absl::Status check_device(int) { return unsupported("this build has no CUDA backend"); }
bool device_available(int) { return false; }
absl::Status init_session(ssa_session&) { return unsupported("this build has no CUDA backend"); }
absl::StatusOr<std::shared_ptr<SessionState>> fork_state(const SessionState&) {
  return unsupported("this build has no CUDA backend");
}
absl::Status session_append(ssa_session&, uint32_t, const void*, const void*, uint64_t) {
  return unsupported("this build has no CUDA backend");
}
absl::Status session_append_async(ssa_session&, uint32_t, const void*, const void*, uint64_t, void*) {
  return unsupported("this build has no CUDA backend");
}
absl::Status wait_for_stream(void*) { return unsupported("this build has no CUDA backend"); }
absl::Status retrain_layer(ssa_session&, LayerStore&) {
  return unsupported("this build has no CUDA backend");
}
absl::Status wait_for_readers_beyond(ssa_session&, uint64_t) {
  return unsupported("this build has no CUDA backend");
}
absl::Status decode_layer(const ssa_session&, const LayerStore&, uint32_t, const void*, void*,
                          const ssa_decode_params&, uint64_t, ssa_decode_stats*) {
  return unsupported("this build has no CUDA backend");
}
absl::Status decode_batch(const ssa_decode_item*, size_t, uint32_t, const ssa_decode_params&) {
  return unsupported("this build has no CUDA backend");
}
absl::Status copy_page_to_host(const ssa_session&, const Page&, size_t, uint8_t*) {
  return unsupported("this build has no CUDA backend");
}
absl::StatusOr<PageRef> page_from_host(const ssa_session&, bool, const uint8_t*, size_t) {
  return unsupported("this build has no CUDA backend");
}
void release_unused_memory(int) {}
}  // namespace ssa::cuda

#else  // SSA_HAVE_CUDA

#include <cuda_runtime.h>
#include <string.h>

#include <algorithm>
#include <map>
#include <optional>

#include "decode/decode_plan.h"
#include "device_alloc.h"
#include "device_pages.h"
#include "index/pq_index.h"
#include "kernels/cuda_decode.h"
#include "kernels/append_rows.h"
#include "kernels/pq_index.h"
#include "method_plan.h"
#include "session.h"
#include "store/layer_tail.h"

namespace ssa::cuda {
namespace {

absl::Status device_error(cudaError_t e, const char* what) {
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return make_error(SSA_ERR_OUT_OF_MEMORY, absl::StrCat(what, ": ", cudaGetErrorString(e)));
  }
  return make_error(SSA_ERR_DEVICE, absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

#define SSA_CUDA_RETURN(expr, what)                       \
  do {                                                    \
    cudaError_t ssa_e_ = (expr);                          \
    if (ssa_e_ != cudaSuccess) return device_error(ssa_e_, what); \
  } while (0)

// A device allocation taken and returned in the order of one stream, freed on
// scope exit (cudaFree would wait for the whole device).
struct DeviceMem {
  void* p = nullptr;
  cudaStream_t stream = nullptr;
  DeviceMem() = default;
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  DeviceMem& operator=(DeviceMem&& o) noexcept {
    std::swap(p, o.p);
    std::swap(stream, o.stream);
    return *this;
  }
  ~DeviceMem() {
    if (p) cudaFreeAsync(p, stream);
  }
  cudaError_t alloc(size_t bytes, cudaStream_t st) {
    stream = st;
    return device_malloc_async(&p, bytes ? bytes : 1, st);
  }
};

// A device array of the pointers of pages [first, first + count) (all by
// default), uploaded on st.
absl::Status upload_table(const std::vector<PageRef>& pages, bool writable, cudaStream_t st, DeviceMem* out,
                          size_t first = 0, size_t count = SIZE_MAX) {
  count = std::min(count, pages.size() - first);
  std::vector<const uint8_t*> ptrs(count);
  for (size_t i = 0; i < count; ++i) {
    const PageRef& p = pages[first + i];
    ptrs[i] = writable ? p->mutable_data() : p->data();
  }
  SSA_CUDA_RETURN(out->alloc(ptrs.size() * sizeof(void*), st), "cudaMallocAsync of a page table");
  // From pageable memory: staged before the call returns, so ptrs may go.
  SSA_CUDA_RETURN(cudaMemcpyAsync(out->p, ptrs.data(), ptrs.size() * sizeof(void*), cudaMemcpyHostToDevice, st),
                  "page table upload");
  return absl::OkStatus();
}

// Where the decodes that read a layer's device tables stand: one event per
// stream they were queued on, recorded after the latest of them. What must have
// run before those tables, their pages or their codebooks may be freed or
// rewritten. Callers serialise access (SessionState::mu).
class LastUse {
 public:
  LastUse() = default;
  LastUse(const LastUse&) = delete;
  LastUse& operator=(const LastUse&) = delete;
  ~LastUse() {
    for (const Mark& m : marks_) cudaEventDestroy(m.event);
  }
  // After the work queued on st so far. Not while st is being captured into a
  // graph: replays are the caller's to order (ssa.h).
  cudaError_t record(cudaStream_t st) {
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(st, &cap);
    if (e != cudaSuccess || cap != cudaStreamCaptureStatusNone) return e;
    // Marks of other streams that have passed are dropped (streams come and go).
    for (size_t i = 0; i < marks_.size();) {
      if (marks_[i].stream != st && !running(marks_[i].event)) {
        cudaEventDestroy(marks_[i].event);
        marks_[i] = marks_.back();
        marks_.pop_back();
      } else {
        ++i;
      }
    }
    for (const Mark& m : marks_)
      if (m.stream == st) return cudaEventRecord(m.event, st);
    Mark m{st, nullptr};
    if ((e = cudaEventCreateWithFlags(&m.event, cudaEventDisableTiming)) != cudaSuccess) return e;
    marks_.push_back(m);
    return cudaEventRecord(m.event, st);
  }
  // True while a recorded decode may still run.
  bool pending() const {
    for (const Mark& m : marks_)
      if (running(m.event)) return true;
    return false;
  }
  void wait() const {
    for (const Mark& m : marks_) cudaEventSynchronize(m.event);
  }

 private:
  struct Mark {
    cudaStream_t stream;
    cudaEvent_t event;
  };
  // A failed query counts as done: the device is then unusable anyway.
  static bool running(cudaEvent_t e) {
    const cudaError_t r = cudaEventQuery(e);
    if (r != cudaSuccess && r != cudaErrorNotReady) cudaGetLastError();
    return r == cudaErrorNotReady;
  }
  std::vector<Mark> marks_;
};

// True for a pointer the device can read (device or managed memory).
bool is_device_pointer(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

bool host_pointers(const ssa_session& s) { return (s.config.flags & SSA_SESSION_HOST_POINTERS) != 0; }

absl::Status check_space(const ssa_session& s, const void* p, const char* name) {
  if (host_pointers(s)) return absl::OkStatus();
  if (!is_device_pointer(p)) {
    return invalid_argument(name, " is not a device pointer (a CUDA session takes device memory; "
                            "create it with SSA_SESSION_HOST_POINTERS to pass host memory)");
  }
  return absl::OkStatus();
}


PqIndexShape index_shape(const KvLayout& L) {
  PqIndexShape s;
  s.n_kv_heads = L.n_kv_heads;
  s.head_dim = L.head_dim;
  s.subspaces = L.pq_subspaces;
  s.centroids = L.pq_centroids;
  s.page_tokens = L.page_tokens;
  s.page_shift = 0;
  while ((1u << s.page_shift) < L.page_tokens) ++s.page_shift;
  s.dtype = L.dtype;
  return s;
}

DecodeShape decode_shape(const KvLayout& L) {
  DecodeShape s;
  s.n_q_heads = L.n_q_heads;
  s.n_kv_heads = L.n_kv_heads;
  s.head_dim = L.head_dim;
  s.page_tokens = L.page_tokens;
  s.page_shift = index_shape(L).page_shift;
  s.pq_subspaces = L.pq_subspaces;
  s.pq_centroids = L.pq_centroids;
  s.dtype = L.dtype;
  return s;
}

}  // namespace

// Device-side state of one session: page tables per layer (rebuilt when the
// layer's pages change), device copies of codebooks, and what keeps memory that
// queued decodes read alive. Decodes return once their kernels are queued, so
// nothing they read may be freed or recycled until their LastUse event has
// passed: a layer's tables hold its pages' memory and its codebooks, and tables
// replaced after a change wait in `retired` until then. Nothing here waits for
// the device as a whole.
struct SessionState {
  int device = 0;
  std::shared_ptr<DevicePagePool> kv_pool, code_pool;
  // Table and codebook uploads (and their frees): non-blocking, so they never
  // wait for work on other streams.
  cudaStream_t stream = nullptr;
  // The NaN/Inf scan's two result slots, kept between appends (which take the
  // session exclusively).
  DeviceMem scan_result;
  // Asynchronous appends: recorded on the legacy default stream before one (the
  // append's stream waits for it) and on its stream after it (the legacy stream
  // waits). Created on the first; appends take the session exclusively.
  cudaEvent_t append_order[2] = {nullptr, nullptr};
  absl::Mutex mu;
  struct Books {
    CodebooksRef host;  // keeps the key alive
    DeviceMem dev;
  };
  struct LayerCache {
    uint32_t layer = 0;
    std::vector<const uint8_t*> kv, code;  // page addresses, to notice a change
    const PqCodebooks* books_key = nullptr;
    std::vector<std::shared_ptr<void>> memory;  // the pages' memory (Page::keeper)
    std::shared_ptr<Books> books;
    DeviceMem kv_table, code_table;
    LastUse last_use;
    uint64_t tokens_read = 0;  // the longest context any decode through it read
  };
  std::vector<std::shared_ptr<LayerCache>> layers ABSL_GUARDED_BY(mu);
  std::vector<std::shared_ptr<LayerCache>> retired ABSL_GUARDED_BY(mu);
  std::map<const PqCodebooks*, std::shared_ptr<Books>> books ABSL_GUARDED_BY(mu);

  SessionState() = default;
  SessionState(const SessionState&) = delete;
  SessionState& operator=(const SessionState&) = delete;
  // Waits for this session's queued decodes, then frees (in stream order).
  ~SessionState() {
    absl::MutexLock lock(&mu);
    for (const auto& c : layers)
      if (c) c->last_use.wait();
    for (const auto& c : retired) c->last_use.wait();
    layers.clear();
    retired.clear();
    books.clear();  // (scan_result and codebooks are freed on the legacy default stream)
    if (stream != nullptr) {
      // Tables are freed on it: done before the pool is trimmed (destroy).
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    }
    for (cudaEvent_t e : append_order)
      if (e != nullptr) cudaEventDestroy(e);
  }

  // The device copy of `host`, uploaded on first use (complete on return).
  absl::StatusOr<std::shared_ptr<Books>> device_books(const CodebooksRef& host) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Records `dev` (complete) as the device copy of `host`.
  void seed_device_books(const CodebooksRef& host, DeviceMem&& dev) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    forget_unused_books();
    auto b = std::make_shared<Books>();
    b->host = host;
    b->dev = std::move(dev);
    books[host.get()] = std::move(b);
  }
  // Forgets device copies of codebooks no layer holds any more (tables that
  // queued decodes read keep theirs).
  void forget_unused_books() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (auto i = books.begin(); i != books.end();) {
      if (i->second->host.use_count() == 1) i = books.erase(i); else ++i;
    }
  }

  // Frees retired tables whose decodes have all run.
  void prune_retired() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    retired.erase(std::remove_if(retired.begin(), retired.end(),
                                 [](const std::shared_ptr<LayerCache>& c) { return !c->last_use.pending(); }),
                  retired.end());
  }
};

absl::StatusOr<std::shared_ptr<SessionState::Books>> SessionState::device_books(const CodebooksRef& host) {
  auto it = books.find(host.get());
  if (it != books.end()) return it->second;
  forget_unused_books();
  auto b = std::make_shared<Books>();
  b->host = host;
  const size_t bytes = host->data.size() * sizeof(float);
  SSA_CUDA_RETURN(b->dev.alloc(bytes, stream), "cudaMallocAsync of codebooks");
  SSA_CUDA_RETURN(cudaMemcpyAsync(b->dev.p, host->data.data(), bytes, cudaMemcpyHostToDevice, stream),
                  "codebook upload");
  SSA_CUDA_RETURN(cudaStreamSynchronize(stream), "codebook upload");
  // Freed on the legacy default stream: asynchronous appends that encode with
  // them are ordered before it, not before this session's own stream.
  b->dev.stream = nullptr;
  books.emplace(host.get(), b);
  return b;
}

namespace {

// The device codebooks an append encodes with.
absl::StatusOr<const float*> device_books(SessionState& st, const CodebooksRef& host) {
  absl::MutexLock lock(&st.mu);
  absl::StatusOr<std::shared_ptr<SessionState::Books>> b = st.device_books(host);
  if (!b.ok()) return b.status();
  return static_cast<const float*>((*b)->dev.p);
}

absl::StatusOr<std::shared_ptr<SessionState>> new_state(int device, std::shared_ptr<DevicePagePool> kv,
                                                        std::shared_ptr<DevicePagePool> code) {
  auto st = std::make_shared<SessionState>();
  st->device = device;
  st->kv_pool = std::move(kv);
  st->code_pool = std::move(code);
  SSA_CUDA_RETURN(cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  return st;
}

// The append's NaN/Inf verdict slots (first bad element of k and of v), reset on
// the legacy default stream, where the append's row copy lowers them. Host
// pointers were scanned by the caller, as on the CPU backend.
absl::StatusOr<unsigned long long*> reset_scan_slots(const ssa_session& s) {
  DeviceMem& slots = s.cuda->scan_result;
  if (slots.p == nullptr) {
    SSA_CUDA_RETURN(slots.alloc(2 * sizeof(unsigned long long), nullptr),
                    "cudaMallocAsync of the NaN/Inf scan result");
  }
  SSA_CUDA_RETURN(cudaMemsetAsync(slots.p, 0xff, 2 * sizeof(unsigned long long), nullptr), "NaN/Inf scan setup");
  return static_cast<unsigned long long*>(slots.p);
}

// Waits for the legacy default stream (the scan and whatever the append queued
// after it) and reports the scan's first bad element.
absl::Status finite_scan_result(const ssa_session& s) {
  constexpr unsigned long long kNone = ~0ull;  // all bits set: no bad element
  unsigned long long h[2];
  SSA_CUDA_RETURN(cudaMemcpy(h, s.cuda->scan_result.p, sizeof h, cudaMemcpyDeviceToHost), "NaN/Inf scan result");
  if (h[0] != kNone) return invalid_argument("k[", h[0], "] is NaN or infinite");
  if (h[1] != kNone) return invalid_argument("v[", h[1], "] is NaN or infinite");
  return absl::OkStatus();
}

}  // namespace

absl::Status check_device(int device) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    cudaGetLastError();
    return make_error(SSA_ERR_DEVICE, absl::StrCat("no usable CUDA device: ",
                                                   e != cudaSuccess ? cudaGetErrorString(e) : "none found"));
  }
  if (device < 0 || device >= n) {
    return make_error(SSA_ERR_DEVICE, absl::StrCat("CUDA device ", device, " does not exist (", n, " found)"));
  }
  return absl::OkStatus();
}

bool device_available(int device) { return check_device(device).ok(); }

absl::Status init_session(ssa_session& s) {
  const char* why = unsupported_shape(decode_shape(s.layout), true);
  if (why != nullptr) return unsupported("CUDA sessions: ", why);
  if (s.layout.head_dim / s.layout.pq_subspaces > 64) {
    return unsupported("CUDA sessions: PQ sub-vectors of more than 64 elements");
  }
  SSA_CUDA_RETURN(cudaSetDevice(s.rt->device), "cudaSetDevice");
  absl::StatusOr<std::shared_ptr<SessionState>> st =
      new_state(s.rt->device, DevicePagePool::create(s.layout.kv_page_bytes()),
                DevicePagePool::create(s.layout.code_page_bytes()));
  if (!st.ok()) return st.status();
  s.cuda = *std::move(st);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<SessionState>> fork_state(const SessionState& st) {
  SSA_CUDA_RETURN(cudaSetDevice(st.device), "cudaSetDevice");
  return new_state(st.device, st.kv_pool, st.code_pool);
}

absl::Status copy_page_to_host(const ssa_session& s, const Page& page, size_t bytes, uint8_t* dst) {
  if (page.bytes() < bytes) return make_error(SSA_ERR_INTERNAL, "device page is shorter than its layout");
  SSA_CUDA_RETURN(cudaSetDevice(s.cuda->device), "cudaSetDevice");
  SSA_CUDA_RETURN(cudaMemcpy(dst, page.data(), bytes, cudaMemcpyDeviceToHost), "page download");
  return absl::OkStatus();
}

void release_unused_memory(int device) {
  int current = 0;
  if (cudaGetDevice(&current) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  // The destroyed session's memory was freed on the legacy default stream (after
  // any asynchronous append it queued); a trim gives back only frees that have
  // completed.
  if (cudaStreamSynchronize(nullptr) != cudaSuccess) cudaGetLastError();
  device_pool_trim();
  if (cudaSetDevice(current) != cudaSuccess) cudaGetLastError();
}

absl::StatusOr<PageRef> page_from_host(const ssa_session& s, bool kv, const uint8_t* src, size_t bytes) {
  SSA_CUDA_RETURN(cudaSetDevice(s.cuda->device), "cudaSetDevice");
  absl::StatusOr<PageRef> page = (kv ? s.cuda->kv_pool : s.cuda->code_pool)->allocate();
  if (!page.ok()) return page.status();
  if ((*page)->bytes() < bytes) return make_error(SSA_ERR_INTERNAL, "device page is shorter than its layout");
  SSA_CUDA_RETURN(cudaMemcpy((*page)->mutable_data(), src, bytes, cudaMemcpyHostToDevice), "page upload");
  return page;
}

namespace {

// Queues the codes of tokens [begin, end) with device codebooks `books` on the
// legacy default stream; the caller waits. Only the pages of the range go to the
// device.
absl::Status encode_range(const ssa_session& s, const float* books, const std::vector<PageRef>& kv,
                          const std::vector<PageRef>& codes, uint64_t begin, uint64_t end) {
  if (end <= begin) return absl::OkStatus();
  const uint64_t P = s.layout.page_tokens, first = begin / P, count = (end - 1) / P - first + 1;
  DeviceMem kt, ct;
  SSA_RETURN_IF_ERROR(upload_table(kv, false, nullptr, &kt, first, count));
  SSA_RETURN_IF_ERROR(upload_table(codes, true, nullptr, &ct, first, count));
  SSA_CUDA_RETURN(pq_encode(index_shape(s.layout), static_cast<const uint8_t* const*>(kt.p),
                            static_cast<uint8_t* const*>(ct.p), books, static_cast<uint32_t>(begin - first * P),
                            static_cast<uint32_t>(end - first * P), nullptr),
                  "PQ encode kernel");
  return absl::OkStatus();
}

// Queues on st the device K/V rows of tokens [old_n, new_n) into the tail's
// pages, and their codes with device codebooks `books` (null: no codes). With
// slots, the rows are also scanned for NaN/Inf into them (reset_scan_slots).
absl::Status queue_device_rows(const ssa_session& s, const LayerTail& tail, const void* k, const void* v,
                               uint64_t old_n, uint64_t new_n, const float* books, unsigned long long* slots,
                               cudaStream_t st) {
  const KvLayout& L = s.layout;
  const uint64_t P = L.page_tokens;
  const AppendRowsShape shape{L.n_kv_heads, L.head_dim, L.page_tokens, L.dtype};
  DeviceMem table;  // written by the row kernel, read by pq_encode
  if (books != nullptr) {
    SSA_CUDA_RETURN(table.alloc(2 * kAppendPagesPerLaunch * sizeof(uint8_t*), st),
                    "cudaMallocAsync of the append's page table");
  }
  for (size_t c0 = 0; c0 < tail.kv.size(); c0 += kAppendPagesPerLaunch) {
    AppendPages pages{};
    pages.count = static_cast<uint32_t>(std::min<size_t>(kAppendPagesPerLaunch, tail.kv.size() - c0));
    pages.aligned = true;
    for (uint32_t i = 0; i < pages.count; ++i) {
      pages.kv[i] = tail.kv[c0 + i]->mutable_data();
      pages.aligned = pages.aligned && reinterpret_cast<uintptr_t>(pages.kv[i]) % 16 == 0;
      if (books != nullptr) pages.code[i] = tail.code[c0 + i]->mutable_data();
    }
    const uint64_t page0 = (tail.first_page + c0) * P;  // first token of the launch's pages
    const uint64_t begin = std::max(old_n, page0), end = std::min(new_n, page0 + pages.count * P);
    if (end <= begin) continue;
    const size_t skip = static_cast<size_t>((begin - old_n) * L.token_bytes());
    uint8_t** t = books != nullptr ? static_cast<uint8_t**>(table.p) : nullptr;
    SSA_CUDA_RETURN(append_rows(shape, static_cast<const uint8_t*>(k) + skip, static_cast<const uint8_t*>(v) + skip,
                                end - begin, pages, static_cast<uint32_t>(begin - page0),
                                (begin - old_n) * L.n_kv_heads * L.head_dim, slots, t, st),
                    "row copy kernel");
    if (books != nullptr) {
      SSA_CUDA_RETURN(pq_encode(index_shape(L), t, t + pages.count, books, static_cast<uint32_t>(begin - page0),
                                static_cast<uint32_t>(end - page0), st),
                      "PQ encode kernel");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status retrain_layer(ssa_session& s, LayerStore& layer) {
  const KvLayout& L = s.layout;
  SSA_CUDA_RETURN(cudaSetDevice(s.cuda->device), "cudaSetDevice");
  // On the legacy default stream, as appends. Decodes still queued keep reading
  // the old code pages and codebooks (their tables hold them).
  const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(s.config.index_train_sample, layer.n_tokens));
  const PqIndexShape shape = index_shape(L);
  auto books = std::make_shared<PqCodebooks>();
  books->n_kv_heads = L.n_kv_heads;
  books->subspaces = L.pq_subspaces;
  books->centroids = L.pq_centroids;
  books->sub_dim = L.sub_dim();
  books->data.resize(size_t{L.n_kv_heads} * L.pq_subspaces * L.pq_centroids * L.sub_dim());
  DeviceMem kt, work, bd;
  SSA_RETURN_IF_ERROR(upload_table(layer.kv_pages, false, nullptr, &kt));
  SSA_CUDA_RETURN(work.alloc(kmeans_workspace_bytes(shape, n), nullptr), "cudaMallocAsync of k-means workspace");
  SSA_CUDA_RETURN(bd.alloc(books->data.size() * sizeof(float), nullptr), "cudaMallocAsync of codebooks");
  // Sample on the device, k-means++ seeds on the host (as the CPU backend seeds),
  // Lloyd iterations on the device.
  SSA_CUDA_RETURN(pq_gather_sample(shape, static_cast<const uint8_t* const*>(kt.p),
                                   static_cast<uint32_t>(layer.n_tokens), n, work.p, nullptr),
                  "k-means sample kernel");
  std::vector<float> sample(size_t{L.n_kv_heads} * n * L.head_dim);
  SSA_CUDA_RETURN(cudaMemcpy(sample.data(), pq_sample(work.p), sample.size() * sizeof(float),
                             cudaMemcpyDeviceToHost), "k-means sample download");
  seed_codebooks(L, sample.data(), n, *s.rt->pool, books.get());
  SSA_CUDA_RETURN(cudaMemcpy(bd.p, books->data.data(), books->data.size() * sizeof(float),
                             cudaMemcpyHostToDevice), "k-means seed upload");
  SSA_CUDA_RETURN(pq_lloyd(shape, n, s.config.index_iterations, work.p, static_cast<float*>(bd.p), nullptr),
                  "k-means kernels");
  SSA_CUDA_RETURN(cudaMemcpy(books->data.data(), bd.p, books->data.size() * sizeof(float),
                             cudaMemcpyDeviceToHost), "codebook download");
  std::vector<PageRef> codes;
  const uint64_t pages = L.pages_for(layer.n_tokens);
  for (uint64_t i = 0; i < pages; ++i) {
    absl::StatusOr<PageRef> page = s.cuda->code_pool->allocate();
    if (!page.ok()) return page.status();
    codes.push_back(*std::move(page));
  }
  SSA_RETURN_IF_ERROR(encode_range(s, static_cast<const float*>(bd.p), layer.kv_pages, codes, 0, layer.n_tokens));
  SSA_CUDA_RETURN(cudaStreamSynchronize(nullptr), "PQ encode");
  {
    // The session's device copy of these codebooks is the one just trained: the
    // next append or decode need not upload them again.
    absl::MutexLock lock(&s.cuda->mu);
    s.cuda->seed_device_books(books, std::move(bd));
  }
  layer.codebooks = std::move(books);
  layer.code_pages = std::move(codes);
  layer.trained_at_tokens = layer.n_tokens;
  return absl::OkStatus();
}

absl::Status wait_for_readers_beyond(ssa_session& s, uint64_t n_tokens) {
  SessionState& st = *s.cuda;
  absl::MutexLock lock(&st.mu);
  st.prune_retired();
  auto wait = [&](SessionState::LayerCache& c) {
    if (c.tokens_read <= n_tokens) return;
    c.last_use.wait();
    c.tokens_read = n_tokens;  // decodes still queued read no more than this
  };
  for (const auto& c : st.layers)
    if (c != nullptr) wait(*c);
  for (const auto& c : st.retired) wait(*c);
  return absl::OkStatus();
}

namespace {

// An append to layer `layer_index` with the session held exclusively; validates
// the count. With `async`: device K/V read on that stream, not scanned, nothing
// waited for (session_append_async).
absl::Status append_locked(ssa_session& s, uint32_t layer_index, const void* k, const void* v, uint64_t n_tokens,
                           std::optional<cudaStream_t> async) {
  const KvLayout& L = s.layout;
  if (layer_index >= L.n_layers) return invalid_argument("layer ", layer_index, " >= n_layers ", L.n_layers);
  if (n_tokens == 0) return absl::OkStatus();
  SSA_RETURN_IF_ERROR(check_space(s, k, "k"));
  SSA_RETURN_IF_ERROR(check_space(s, v, "v"));
  SSA_CUDA_RETURN(cudaSetDevice(s.cuda->device), "cudaSetDevice");
  {
    absl::MutexLock cache_lock(&s.cuda->mu);
    s.cuda->prune_retired();
  }
  LayerStore& cur = s.layers[layer_index];
  if (n_tokens > 0xFFFFFFFFull - cur.n_tokens) {
    return invalid_argument("appending ", n_tokens, " tokens to layer ", layer_index, " of ", cur.n_tokens,
                            " exceeds the limit of 4294967295 tokens per layer");
  }
  const uint64_t old_n = cur.n_tokens, new_n = old_n + n_tokens;
  const uint32_t P = L.page_tokens;
  const bool has_codes = cur.codebooks != nullptr;
  const bool trains = index_wants_training(s.config, cur, new_n);
  if (async && trains) {
    // Training reads every key on the legacy default stream and takes its time
    // anyway: the rows are made ready first, then the append runs as a plain one.
    SSA_CUDA_RETURN(cudaStreamSynchronize(*async), "append stream");
    async.reset();
  }
  const bool device_rows = !host_pointers(s);
  const bool scanned_here = device_rows && !async;
  // The one wait of an append: for its queued device work, and for the scan's verdict.
  auto finish = [&]() -> absl::Status {
    if (scanned_here) return finite_scan_result(s);
    SSA_CUDA_RETURN(cudaStreamSynchronize(nullptr), "append copies");
    return absl::OkStatus();
  };
  // The pages written are gathered aside; the layer changes at the commit only.
  // Rows go into the last page from slot old_n % P on: queued decodes read only
  // tokens below old_n (truncate waited for any that read more). So rows can be
  // written before the scan's verdict: an append it refuses drops them.
  LayerTail tail;
  SSA_RETURN_IF_ERROR(gather_tail(cur, L, new_n, *s.cuda->kv_pool, has_codes ? s.cuda->code_pool.get() : nullptr,
                                  &tail));
  const float* books = nullptr;
  if (has_codes && !trains) {
    absl::StatusOr<const float*> b = device_books(*s.cuda, cur.codebooks);
    if (!b.ok()) return b.status();
    books = *b;
  }
  if (async) {
    // The stream's work on the session's pages comes after everything the
    // library queued on the legacy default stream before (page allocations and
    // copies, earlier appends), and the library's later work there (copies,
    // frees, other appends) after it.
    SessionState& st = *s.cuda;
    for (cudaEvent_t& e : st.append_order)
      if (e == nullptr) SSA_CUDA_RETURN(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    SSA_CUDA_RETURN(cudaEventRecord(st.append_order[0], nullptr), "append ordering");
    SSA_CUDA_RETURN(cudaStreamWaitEvent(*async, st.append_order[0], 0), "append ordering");
    const absl::Status queued = queue_device_rows(s, tail, k, v, old_n, new_n, books, nullptr, *async);
    // Also when a launch failed: the pages dropped then may have been written by
    // the launches before it, and are freed or reused on the legacy stream.
    if (cudaEventRecord(st.append_order[1], *async) != cudaSuccess ||
        cudaStreamWaitEvent(nullptr, st.append_order[1], 0) != cudaSuccess) {
      cudaGetLastError();
      SSA_CUDA_RETURN(cudaStreamSynchronize(*async), "append ordering");
    }
    SSA_RETURN_IF_ERROR(queued);
    commit_tail(std::move(tail), &cur);
    return absl::OkStatus();
  }
  if (device_rows) {
    absl::StatusOr<unsigned long long*> slots = reset_scan_slots(s);
    if (!slots.ok()) return slots.status();
    SSA_RETURN_IF_ERROR(queue_device_rows(s, tail, k, v, old_n, new_n, books, *slots, nullptr));
  } else {
    // Host K/V (scanned by the caller): token-major [n][n_kv][d] into head-major
    // pages, one 2D copy per (page run, head) for K and for V.
    const size_t row = L.row_bytes();
    const uint8_t* kb = static_cast<const uint8_t*>(k);
    const uint8_t* vb = static_cast<const uint8_t*>(v);
    for (uint64_t t = old_n; t < new_n;) {
      const uint64_t page = t / P, end = std::min(new_n, (page + 1) * P);
      uint8_t* dst = tail.kv_page(page).mutable_data();
      const uint32_t slot = static_cast<uint32_t>(t % P);
      for (uint32_t h = 0; h < L.n_kv_heads; ++h) {
        const size_t src = ((t - old_n) * L.n_kv_heads + h) * row;
        SSA_CUDA_RETURN(cudaMemcpy2DAsync(dst + L.k_offset(h, slot), row, kb + src, L.n_kv_heads * row, row,
                                          end - t, cudaMemcpyDefault, nullptr), "K row copy");
        SSA_CUDA_RETURN(cudaMemcpy2DAsync(dst + L.v_offset(h, slot), row, vb + src, L.n_kv_heads * row, row,
                                          end - t, cudaMemcpyDefault, nullptr), "V row copy");
      }
      t = end;
    }
    if (books != nullptr) {
      const uint64_t base = tail.first_page * P;  // the tail's pages start at this token
      SSA_RETURN_IF_ERROR(encode_range(s, books, tail.kv, tail.code, old_n - base, new_n - base));
    }
  }
  SSA_RETURN_IF_ERROR(finish());  // before training: none on rejected rows
  if (trains) {
    LayerStore next = cur;  // every code is rebuilt: O(layer) anyway
    commit_tail(std::move(tail), &next);
    SSA_RETURN_IF_ERROR(retrain_layer(s, next));
    cur = std::move(next);
    return absl::OkStatus();
  }
  commit_tail(std::move(tail), &cur);
  return absl::OkStatus();
}

}  // namespace

absl::Status session_append(ssa_session& s, uint32_t layer_index, const void* k, const void* v,
                            uint64_t n_tokens) {
  std::unique_lock lock(s.mu);
  return append_locked(s, layer_index, k, v, n_tokens, std::nullopt);
}

absl::Status check_append_stream(void* stream) {
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  SSA_CUDA_RETURN(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &cap), "cudaStreamIsCapturing");
  if (cap != cudaStreamCaptureStatusNone) {
    return invalid_argument("the stream is being captured into a CUDA graph: an append changes the session when "
                            "it is called, so it cannot be replayed");
  }
  return absl::OkStatus();
}

absl::Status wait_for_stream(void* stream) {
  SSA_RETURN_IF_ERROR(check_append_stream(stream));
  SSA_CUDA_RETURN(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "append stream");
  return absl::OkStatus();
}

absl::Status session_append_async(ssa_session& s, uint32_t layer_index, const void* k, const void* v,
                                  uint64_t n_tokens, void* stream) {
  SSA_RETURN_IF_ERROR(check_append_stream(stream));
  std::unique_lock lock(s.mu);
  return append_locked(s, layer_index, k, v, n_tokens, static_cast<cudaStream_t>(stream));
}

namespace {

// Device page tables and codebooks of a layer, uploaded once per change. The
// tables they replace are retired, not freed: decodes queued earlier may still
// read them.
absl::StatusOr<std::shared_ptr<SessionState::LayerCache>> layer_tables(const ssa_session& s,
                                                                      uint32_t layer_index,
                                                                      const LayerStore& layer,
                                                                      DecodeItem* item) {
  SessionState& st = *s.cuda;
  absl::MutexLock lock(&st.mu);
  if (st.layers.size() < s.layout.n_layers) st.layers.resize(s.layout.n_layers);
  std::shared_ptr<SessionState::LayerCache>& c = st.layers[layer_index];
  auto same = [](const std::vector<const uint8_t*>& a, const std::vector<PageRef>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i] != b[i]->data()) return false;
    return true;
  };
  if (c == nullptr || !same(c->kv, layer.kv_pages) || !same(c->code, layer.code_pages) ||
      c->books_key != layer.codebooks.get()) {
    st.prune_retired();
    auto fresh = std::make_shared<SessionState::LayerCache>();
    fresh->layer = layer_index;
    SSA_RETURN_IF_ERROR(upload_table(layer.kv_pages, false, st.stream, &fresh->kv_table));
    SSA_RETURN_IF_ERROR(upload_table(layer.code_pages, false, st.stream, &fresh->code_table));
    for (const auto& p : layer.kv_pages) {
      fresh->kv.push_back(p->data());
      fresh->memory.push_back(p->keeper());
    }
    for (const auto& p : layer.code_pages) {
      fresh->code.push_back(p->data());
      fresh->memory.push_back(p->keeper());
    }
    fresh->books_key = layer.codebooks.get();
    if (layer.codebooks != nullptr) {
      absl::StatusOr<std::shared_ptr<SessionState::Books>> b = st.device_books(layer.codebooks);
      if (!b.ok()) return b.status();
      fresh->books = *std::move(b);
    }
    // Decodes run on the caller's stream: the uploads must be complete.
    SSA_CUDA_RETURN(cudaStreamSynchronize(st.stream), "table upload");
    if (c != nullptr) st.retired.push_back(std::move(c));
    c = std::move(fresh);
  }
  item->kv_pages = static_cast<const uint8_t* const*>(c->kv_table.p);
  item->code_pages = static_cast<const uint8_t* const*>(c->code_table.p);
  item->codebooks = c->books != nullptr ? static_cast<const float*>(c->books->dev.p) : nullptr;
  c->tokens_read = std::max<uint64_t>(c->tokens_read, layer.n_tokens);
  return c;
}

struct Job {
  const ssa_session* s;
  const LayerStore* layer;
  const void* q;
  void* out;
  DecodePlan plan;
};

// One launch set over jobs of one shape; stats (optional) summed over the jobs.
absl::Status run_launch_set(const std::vector<Job>& jobs, uint32_t layer_index, const ssa_decode_params& p,
                            uint64_t seed, ssa_decode_stats* stats) {
  const ssa_session& s0 = *jobs[0].s;
  cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  DecodeBatch b{};
  b.shape = decode_shape(s0.layout);
  b.n_items = static_cast<uint32_t>(jobs.size());
  bool all_dense = true;
  for (const Job& j : jobs) all_dense = all_dense && j.plan.dense;
  set_method(all_dense ? SSA_METHOD_DENSE : p.method, &b);
  if (b.sampling != Sampling::kNone) {
    for (const Job& j : jobs) {
      if (!j.plan.dense && j.plan.candidates() > kMaxSampledCandidates)
        return absl::UnimplementedError(
            "CUDA backend: sampling over 2^26 or more candidate tokens in one session");
    }
  }
  b.pi_min = p.pi_min;
  b.layer = layer_index;
  b.seed = seed;
  b.step = p.step;
  const size_t qbytes = size_t{s0.layout.n_q_heads} * s0.layout.row_bytes();
  const bool staged = host_pointers(s0);
  DeviceMem stage;
  if (staged) SSA_CUDA_RETURN(stage.alloc(2 * qbytes * jobs.size(), stream), "cudaMallocAsync of q/out staging");
  std::vector<std::shared_ptr<SessionState::LayerCache>> tables(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& j = jobs[i];
    DecodeItem& it = b.items[i];
    absl::StatusOr<std::shared_ptr<SessionState::LayerCache>> t = layer_tables(*j.s, layer_index, *j.layer, &it);
    if (!t.ok()) return t.status();
    tables[i] = *std::move(t);
    if (staged) {
      uint8_t* base = static_cast<uint8_t*>(stage.p) + 2 * qbytes * i;
      SSA_CUDA_RETURN(cudaMemcpyAsync(base, j.q, qbytes, cudaMemcpyHostToDevice, stream), "q upload");
      it.q = base;
      it.out = base + qbytes;
    } else {
      it.q = j.q;
      it.out = j.out;
    }
    plan_item(j.plan, p, &it);
  }
  int sms = 0;
  SSA_CUDA_RETURN(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, s0.cuda->device),
                  "cudaDeviceGetAttribute");
  WorkspacePlan plan;
  SSA_CUDA_RETURN(plan_workspace(&b, sms, &plan), "decode planning");
  void* blob = nullptr;
  SSA_CUDA_RETURN(device_malloc_async(&blob, plan.total_bytes, stream), "cudaMallocAsync of the decode workspace");
  const Workspace ws = bind_workspace(blob, plan);
  cudaError_t e = run_decode(b, plan, ws, stream);
  std::vector<RowState> rows;
  if (e == cudaSuccess && stats != nullptr && !all_dense) {
    rows.resize(plan.rows);
    e = cudaMemcpyAsync(rows.data(), ws.rows, rows.size() * sizeof(RowState), cudaMemcpyDeviceToHost, stream);
  }
  if (e == cudaSuccess && staged) {
    for (size_t i = 0; i < jobs.size(); ++i) {
      e = cudaMemcpyAsync(jobs[i].out, b.items[i].out, qbytes, cudaMemcpyDeviceToHost, stream);
      if (e != cudaSuccess) break;
    }
  }
  cudaFreeAsync(blob, stream);
  if (e != cudaSuccess) return device_error(e, "decode kernels");
  // What the queued kernels read stays alive until they have run. Should an
  // event not be recorded, the decode is waited for instead.
  for (size_t i = 0; i < jobs.size(); ++i) {
    SessionState& st = *jobs[i].s->cuda;
    absl::MutexLock lock(&st.mu);
    if (tables[i]->last_use.record(stream) != cudaSuccess) {
      cudaGetLastError();
      SSA_CUDA_RETURN(cudaStreamSynchronize(stream), "decode");
    }
  }
  if (staged || stats != nullptr) SSA_CUDA_RETURN(cudaStreamSynchronize(stream), "decode");
  if (stats != nullptr) {
    const uint32_t nq = s0.layout.n_q_heads;
    for (size_t i = 0; i < jobs.size(); ++i) {
      const DecodePlan& pl = jobs[i].plan;
      stats->context_tokens += pl.n;
      if (pl.window_only()) stats->window_only_heads += nq;
      const uint64_t always = pl.dense ? pl.n : pl.sink_end + (pl.n - pl.local_begin);
      for (uint32_t h = 0; h < nq; ++h) {
        if (pl.dense || b.proxy == Proxy::kNone) {
          stats->tokens_read += pl.n;
          continue;
        }
        const RowState& r = rows[i * nq + h];
        stats->tokens_read += always + r.n_heavy + r.n_unique;
        stats->heavy_tokens += r.n_heavy;
        stats->scored_tokens += pl.kprime > 0 ? pl.candidates() : 0;
        if (b.sampling != Sampling::kNone) {
          stats->draws += r.n_draws;
          stats->unique_samples += r.n_unique;
          const double total = r.w_resid_proxy + r.w_heavy;
          stats->residual_proxy_mass += total > 0 ? r.w_resid_proxy / total : 0.0;
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status decode_layer(const ssa_session& s, const LayerStore& layer, uint32_t layer_index,
                          const void* q, void* out, const ssa_decode_params& p, uint64_t seed,
                          ssa_decode_stats* stats) {
  if (p.target_error > 0.0f) return unsupported(kCudaNoErrorTarget);
  SSA_RETURN_IF_ERROR(check_space(s, q, "q"));
  SSA_RETURN_IF_ERROR(check_space(s, out, "out"));
  SSA_CUDA_RETURN(cudaSetDevice(s.cuda->device), "cudaSetDevice");
  std::vector<Job> jobs{Job{&s, &layer, q, out, plan_decode(layer.n_tokens, p)}};
  return run_launch_set(jobs, layer_index, p, seed, stats);
}

absl::Status decode_batch(const ssa_decode_item* items, size_t n_items, uint32_t layer,
                          const ssa_decode_params& p) {
  if (p.target_error > 0.0f) return unsupported(kCudaNoErrorTarget);
  // Proxy methods need an index on every layer decoded (trained on demand).
  std::vector<ssa_session*> sessions;
  for (size_t i = 0; i < n_items; ++i) {
    ssa_session* s = items[i].session;
    if (s->cuda == nullptr) return invalid_argument("item ", i, ": not a CUDA session");
    SSA_RETURN_IF_ERROR(check_space(*s, items[i].q, "q"));
    SSA_RETURN_IF_ERROR(check_space(*s, items[i].out, "out"));
    sessions.push_back(s);
  }
  std::sort(sessions.begin(), sessions.end());
  sessions.erase(std::unique(sessions.begin(), sessions.end()), sessions.end());
  for (ssa_session* s : sessions) {
    bool needs = false;
    {
      std::shared_lock lock(s->mu);
      const LayerStore& l = s->layers[layer];
      if (l.n_tokens == 0) return invalid_argument("layer ", layer, " holds no tokens");
      const DecodePlan plan = plan_decode(l.n_tokens, p);
      needs = plan_needs_index(plan, p.method) && l.codebooks == nullptr;
    }
    if (needs) SSA_RETURN_IF_ERROR(session_ensure_index(*s, layer));
  }
  // Shared locks on every distinct session (sorted by address: one global
  // order), released on every path out, early returns included.
  std::vector<std::shared_lock<RwLock>> locks;
  locks.reserve(sessions.size());
  for (ssa_session* s : sessions) locks.emplace_back(s->mu);
  absl::Status st = absl::OkStatus();
  {
    const uint64_t seed = p.seed != 0 ? p.seed : sessions[0]->rt->seed;
    SSA_CUDA_RETURN(cudaSetDevice(sessions[0]->cuda->device), "cudaSetDevice");
    // Launch sets: items of one shape (and pointer space), up to kMaxBatchItems each.
    std::vector<bool> done(n_items, false);
    for (size_t i = 0; i < n_items && st.ok(); ++i) {
      if (done[i]) continue;
      std::vector<Job> jobs;
      const ssa_session& a = *items[i].session;
      for (size_t j = i; j < n_items && jobs.size() < kMaxBatchItems; ++j) {
        const ssa_session& b = *items[j].session;
        if (done[j] || memcmp(&a.layout, &b.layout, sizeof(KvLayout)) != 0 ||
            host_pointers(a) != host_pointers(b))
          continue;
        done[j] = true;
        const LayerStore& l = b.layers[layer];
        jobs.push_back(Job{&b, &l, items[j].q, items[j].out, plan_decode(l.n_tokens, p)});
      }
      st = run_launch_set(jobs, layer, p, seed, nullptr);
    }
  }
  return st;
}

}  // namespace ssa::cuda

#endif  // SSA_HAVE_CUDA
