// The PQ index on the device: codebooks trained by k-means on the device (sample,
// k-means++ seeds as the CPU backend picks them, Lloyd iterations), and codes
// encoded with device codebooks.
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda_backend.h"
#include "device_error.h"
#include "device_state.h"
#include "file_staging.h"
#include "index/pq_index.h"

namespace ssa::cuda {

// Only the pages of the range go to the device.
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

absl::Status CudaBackend::train_index(ssa_session& s, LayerStore& layer) const {
  if (s.rt->group != nullptr) return train_group_index(s, layer);  // group_index_device.cc
  const KvLayout& L = s.layout;
  SSA_CUDA_RETURN(cudaSetDevice(state(s).device), "cudaSetDevice");
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
  // Pages mapped from a file this device cannot read are read from pinned copies.
  absl::StatusOr<std::vector<PageRef>> kv = readable_pages(s, layer);
  if (!kv.ok()) return kv.status();
  SSA_RETURN_IF_ERROR(upload_table(*kv, false, nullptr, &kt));
  SSA_CUDA_RETURN(work.alloc(kmeans_workspace_bytes(shape, n), nullptr), "cudaMallocAsync of k-means workspace");
  SSA_CUDA_RETURN(bd.alloc(books->data.size() * sizeof(float), nullptr), "cudaMallocAsync of codebooks");
  // All on the device, queued on one stream; the host waits once, for the
  // codebooks' copy after the encoding.
  SSA_CUDA_RETURN(pq_gather_sample(shape, static_cast<const uint8_t* const*>(kt.p),
                                   static_cast<uint32_t>(layer.n_tokens), n, work.p, nullptr),
                  "k-means sample kernel");
  SSA_CUDA_RETURN(pq_seed(shape, n, work.p, static_cast<float*>(bd.p), nullptr), "k-means++ seeding kernel");
  SSA_CUDA_RETURN(pq_lloyd(shape, n, s.config.index_iterations, work.p, static_cast<float*>(bd.p), nullptr),
                  "k-means kernels");
  std::vector<PageRef> codes;
  const uint64_t pages = L.pages_for(layer.n_tokens);
  for (uint64_t i = 0; i < pages; ++i) {
    absl::StatusOr<PageRef> page = shard_state(s, shard_of_page(s, i)).code_pool->allocate();
    if (!page.ok()) return page.status();
    codes.push_back(*std::move(page));
  }
  SSA_RETURN_IF_ERROR(encode_range(s, static_cast<const float*>(bd.p), *kv, codes, 0, layer.n_tokens));
  SSA_CUDA_RETURN(cudaMemcpy(books->data.data(), bd.p, books->data.size() * sizeof(float),
                             cudaMemcpyDeviceToHost), "codebook download");
  SSA_CUDA_RETURN(cudaStreamSynchronize(nullptr), "PQ encode");  // the copies in *kv may go after this
  {
    // The session's device copy of these codebooks is the one just trained: the
    // next append or decode need not upload them again.
    absl::MutexLock lock(&state(s).mu);
    state(s).seed_device_books(books, std::move(bd));
  }
  layer.codebooks = std::move(books);
  layer.code_pages = std::move(codes);
  layer.trained_at_tokens = layer.n_tokens;
  return absl::OkStatus();
}

}  // namespace ssa::cuda
