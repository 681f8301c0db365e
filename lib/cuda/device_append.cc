// Appends on the device: rows copied into the tail's pages by a kernel that also
// scans them for NaN/Inf (device rows) or by 2D copies (host rows), their codes
// encoded with the layer's device codebooks; asynchronous appends queue all of
// it on the caller's stream and wait for nothing.
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "cuda_backend.h"
#include "device_error.h"
#include "device_state.h"
#include "kernels/append_rows.h"
#include "kernels/finite_scan.h"
#include "store/layer_tail.h"

namespace ssa::cuda {
namespace {

// The append's NaN/Inf verdict slots (first bad element of k and of v), reset on
// the legacy default stream, where the append's row copy lowers them. Host
// rows were scanned by the core, as on the CPU backend.
absl::StatusOr<unsigned long long*> reset_scan_slots(const ssa_session& s) {
  DeviceMem& slots = state(s).scan_result;
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
  SSA_CUDA_RETURN(cudaMemcpy(h, state(s).scan_result.p, sizeof h, cudaMemcpyDeviceToHost), "NaN/Inf scan result");
  if (h[0] != kNone) return invalid_argument("k[", h[0], "] is NaN or infinite");
  if (h[1] != kNone) return invalid_argument("v[", h[1], "] is NaN or infinite");
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
      SSA_CUDA_RETURN(pq_encode(index_shape(L, s.config.proxy), t, t + pages.count, books, static_cast<uint32_t>(begin - page0),
                                static_cast<uint32_t>(end - page0), st),
                      "PQ encode kernel");
    }
  }
  return absl::OkStatus();
}

// The page pools of a sharded session's shards as the one pool gather_tail
// takes: page j of the layer comes from the pool of the shard holding its tokens
// (shard boundaries are whole pages). gather_tail allocates pages in index
// order from the first new one, and copies at most the partly filled last page.
template <bool kKv>
class ShardPagePools {
 public:
  ShardPagePools(const ssa_session& s, uint64_t old_n)
      : s_(s), last_(old_n / s.layout.page_tokens), next_(s.layout.pages_for(old_n)) {}
  absl::StatusOr<PageRef> allocate() { return pool(next_++).allocate(); }
  absl::StatusOr<PageRef> copy_of(const Page& src) { return pool(last_).copy_of(src); }

 private:
  auto& pool(uint64_t page) {
    SessionState& st = shard_state(s_, shard_of_page(s_, page));
    if constexpr (kKv) {
      return *st.kv_pool;
    } else {
      return *st.code_pool;
    }
  }
  const ssa_session& s_;
  const uint64_t last_;
  uint64_t next_;
};

// K/V rows of tokens [lo, hi) (token-major [n][n_kv_heads][head_dim] from token
// old_n on, host or device memory) into the tail's head-major pages, one 2D
// copy per (page run, head) for K and for V, on the legacy default stream.
absl::Status copy_host_rows(const ssa_session& s, LayerTail& tail, const void* k, const void* v,
                            uint64_t old_n, uint64_t lo, uint64_t hi) {
  const KvLayout& L = s.layout;
  const uint32_t P = L.page_tokens;
  const size_t row = L.row_bytes();
  const uint8_t* kb = static_cast<const uint8_t*>(k);
  const uint8_t* vb = static_cast<const uint8_t*>(v);
  for (uint64_t t = lo; t < hi;) {
    const uint64_t page = t / P, end = std::min(hi, (page + 1) * P);
    uint8_t* dst = tail.kv_page(page).mutable_data();
    const uint32_t slot = static_cast<uint32_t>(t % P);
    for (uint32_t h = 0; h < L.n_kv_heads; ++h) {
      const size_t src = ((t - old_n) * L.n_kv_heads + h) * row;
      SSA_CUDA_RETURN(cudaMemcpy2DAsync(dst + L.k_offset(h, slot), row, kb + src, L.n_kv_heads * row, row, end - t,
                                        cudaMemcpyDefault, nullptr), "K row copy");
      SSA_CUDA_RETURN(cudaMemcpy2DAsync(dst + L.v_offset(h, slot), row, vb + src, L.n_kv_heads * row, row, end - t,
                                        cudaMemcpyDefault, nullptr), "V row copy");
    }
    t = end;
  }
  return absl::OkStatus();
}

// A rank of a group of processes (docs/DISTRIBUTED.md): every rank is given
// every row and checks all of them (so that rows they were all given refuse on
// every rank without an exchange), and keeps those of its pages. Device rows
// are scanned on the device (kernels/finite_scan.h) and copied on the legacy
// default stream after the caller's stream wrote them; host rows were scanned
// by the core.
absl::Status write_group_rows(ssa_session& s, const AppendRows& rows, const LayerStore& layer,
                              LayerTail& tail) {
  SessionState& st = state(s);
  const KvLayout& L = s.layout;
  const uint64_t old_n = rows.old_n, new_n = rows.new_n;
  const bool device_rows = !host_buffers(s);
  if (device_rows) {
    if (rows.async) SSA_CUDA_RETURN(cudaStreamSynchronize(static_cast<cudaStream_t>(rows.stream)), "append stream");
    absl::StatusOr<unsigned long long*> slots = reset_scan_slots(s);
    if (!slots.ok()) return slots.status();
    SSA_CUDA_RETURN(scan_finite(L.dtype, rows.k, rows.v, (new_n - old_n) * L.n_kv_heads * L.head_dim, *slots,
                                nullptr),
                    "NaN/Inf scan kernel");
  }
  const HeldRange& held = s.rt->held;
  const uint64_t lo = held.lo(old_n), hi = held.hi(new_n);
  if (lo < hi) {
    SSA_RETURN_IF_ERROR(copy_host_rows(s, tail, rows.k, rows.v, old_n, lo, hi));
    if (rows.encode) {
      absl::StatusOr<const float*> books = device_books(st, layer.codebooks);
      if (!books.ok()) return books.status();
      const uint64_t base = tail.first_page * L.page_tokens;
      SSA_RETURN_IF_ERROR(encode_range(s, *books, tail.kv, tail.code, lo - base, hi - base));
    }
  }
  // The one wait: the copies (host rows are read by them) and the scan's verdict.
  if (device_rows) return finite_scan_result(s);
  SSA_CUDA_RETURN(cudaStreamSynchronize(nullptr), "append copies");
  return absl::OkStatus();
}

}  // namespace

absl::Status CudaBackend::prepare_append(const ssa_session& s, bool async, void* stream) const {
  if (!async) return absl::OkStatus();
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  SSA_CUDA_RETURN(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &cap), "cudaStreamIsCapturing");
  if (cap != cudaStreamCaptureStatusNone) {
    return invalid_argument("the stream is being captured into a CUDA graph: an append changes the session when "
                            "it is called, so it cannot be replayed");
  }
  // Host K/V are scanned and copied during the call: the stream may still be writing them.
  if (host_buffers(s)) SSA_CUDA_RETURN(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "append stream");
  return absl::OkStatus();
}

// Rows go into the last page from slot old_n % P on: queued decodes read only
// tokens below old_n (truncate waited for any that read more). So rows can be
// written before the scan's verdict: an append it refuses drops them.
absl::Status CudaBackend::gather_tail(ssa_session& s, LayerStore& layer, uint64_t new_n, bool codes,
                                      LayerTail* tail) const {
  SessionState& st = state(s);
  SSA_CUDA_RETURN(cudaSetDevice(st.device), "cudaSetDevice");
  {
    absl::MutexLock cache_lock(&st.mu);
    st.prune_retired();
  }
  // Tiered sessions: the window the append writes comes to the device first
  // (older pages make room), as far as the budget allows.
  const uint32_t layer_index = static_cast<uint32_t>(&layer - s.layers.data());
  const uint64_t have = layer.kv_pages.size(), need = s.layout.pages_for(new_n);
  SSA_RETURN_IF_ERROR(
      rebalance_layer(s, layer_index, layer, layer.n_tokens / s.layout.page_tokens, need > have ? need - have : 0));
  if (shard_count(s) > 1) {
    ShardPagePools<true> kv(s, layer.n_tokens);
    ShardPagePools<false> code(s, layer.n_tokens);
    return ssa::gather_tail(layer, s.layout, new_n, kv, codes ? &code : nullptr, tail);
  }
  // A rank of a group keeps its shard's pages (and the margin after it) only.
  return ssa::gather_tail(layer, s.layout, new_n, *st.kv_pool, codes ? st.code_pool.get() : nullptr, tail,
                          s.rt->held);
}

absl::Status CudaBackend::write_rows(ssa_session& s, const AppendRows& rows, const LayerStore& layer,
                                     LayerTail& tail) const {
  if (s.rt->group != nullptr) return write_group_rows(s, rows, layer, tail);
  SessionState& st = state(s);
  const KvLayout& L = s.layout;
  const uint32_t P = L.page_tokens;
  const uint64_t old_n = rows.old_n, new_n = rows.new_n;
  const cudaStream_t stream = static_cast<cudaStream_t>(rows.stream);
  if (rows.async && rows.trains) {
    // Training reads every key on the legacy default stream and takes its time
    // anyway: the rows are made ready first, then the append runs as a plain one.
    SSA_CUDA_RETURN(cudaStreamSynchronize(stream), "append stream");
  }
  const float* books = nullptr;
  if (rows.encode) {
    absl::StatusOr<const float*> b = device_books(st, layer.codebooks);
    if (!b.ok()) return b.status();
    books = *b;
  }
  if (rows.async && !rows.trains) {
    // The stream's work on the session's pages comes after everything the
    // library queued on the legacy default stream before (page allocations and
    // copies, earlier appends), and the library's later work there (copies,
    // frees, other appends) after it.
    for (cudaEvent_t& e : st.append_order)
      if (e == nullptr) SSA_CUDA_RETURN(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    SSA_CUDA_RETURN(cudaEventRecord(st.append_order[0], nullptr), "append ordering");
    SSA_CUDA_RETURN(cudaStreamWaitEvent(stream, st.append_order[0], 0), "append ordering");
    const absl::Status queued = queue_device_rows(s, tail, rows.k, rows.v, old_n, new_n, books, nullptr, stream);
    // Also when a launch failed: the pages dropped then may have been written by
    // the launches before it, and are freed or reused on the legacy stream.
    if (cudaEventRecord(st.append_order[1], stream) != cudaSuccess ||
        cudaStreamWaitEvent(nullptr, st.append_order[1], 0) != cudaSuccess) {
      cudaGetLastError();
      SSA_CUDA_RETURN(cudaStreamSynchronize(stream), "append ordering");
    }
    return queued;
  }
  const bool device_rows = !host_buffers(s);
  if (device_rows) {
    absl::StatusOr<unsigned long long*> slots = reset_scan_slots(s);
    if (!slots.ok()) return slots.status();
    SSA_RETURN_IF_ERROR(queue_device_rows(s, tail, rows.k, rows.v, old_n, new_n, books, *slots, nullptr));
  } else {
    // Host K/V (scanned by the core).
    SSA_RETURN_IF_ERROR(copy_host_rows(s, tail, rows.k, rows.v, old_n, old_n, new_n));
    if (books != nullptr) {
      const uint64_t base = tail.first_page * P;  // the tail's pages start at this token
      SSA_RETURN_IF_ERROR(encode_range(s, books, tail.kv, tail.code, old_n - base, new_n - base));
    }
  }
  // The one wait of an append (before training: none on rejected rows): for its
  // queued device work, and for the scan's verdict.
  if (device_rows) return finite_scan_result(s);
  SSA_CUDA_RETURN(cudaStreamSynchronize(nullptr), "append copies");
  return absl::OkStatus();
}

}  // namespace ssa::cuda
