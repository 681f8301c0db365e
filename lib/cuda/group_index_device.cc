// The PQ index of a rank of a group of processes on the device
// (docs/DISTRIBUTED.md, lib/shard/group_index.h): the training sample is
// gathered over the group (each rank copies the sample keys of its own tokens
// from its device pages), placed where pq_gather_sample would have put it, and
// trained by the same kernels as an unsharded session's (pq_seed, pq_lloyd):
// the same keys in the same order, so bitwise the same codebooks. Each rank
// then encodes the codes of the pages it keeps.
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "common/dtype.h"
#include "cuda_backend.h"
#include "device_error.h"
#include "device_state.h"
#include "device_tiers.h"
#include "index/pq_index.h"
#include "kernels/pq_index.h"
#include "session.h"
#include "shard/group_index.h"

namespace ssa::cuda {
namespace {

// Sample keys [i0, i1) of n over the layer's n_tokens, from this rank's device
// pages, into keys[h][i1 - i0][d] as floats (the conversion gather_kernel makes).
absl::Status read_device_sample_keys(const ssa_session& s, const LayerStore& layer, uint64_t n, uint64_t i0,
                                     uint64_t i1, float* keys) {
  const KvLayout& L = s.layout;
  const uint32_t H = L.n_kv_heads, d = L.head_dim, P = L.page_tokens;
  const size_t row = L.row_bytes();
  const uint64_t c = i1 - i0;
  std::vector<uint8_t> raw(c * H * row);  // [i][h][d] in the layer's dtype
  for (uint64_t i = i0; i < i1; ++i) {
    const uint64_t t = sample_token(i, layer.n_tokens, n);
    const uint64_t page = t / P;
    if (page >= layer.kv_pages.size() || layer.kv_pages[page] == nullptr) {
      return internal_error("group training: sample token ", t, " is not in this rank's pages");
    }
    const uint8_t* src = layer.kv_pages[page]->data() + L.k_offset(0, static_cast<uint32_t>(t % P));
    SSA_CUDA_RETURN(cudaMemcpy2DAsync(raw.data() + (i - i0) * H * row, row, src, size_t{P} * row, row, H,
                                      cudaMemcpyDefault, nullptr),
                    "sample key read-back");
  }
  SSA_CUDA_RETURN(cudaStreamSynchronize(nullptr), "sample key read-back");
  for (uint64_t i = 0; i < c; ++i)
    for (uint32_t h = 0; h < H; ++h)
      for (uint32_t j = 0; j < d; ++j)
        keys[(size_t{h} * c + i) * d + j] = load_as_f32(raw.data(), L.dtype, (i * H + h) * d + j);
  return absl::OkStatus();
}

}  // namespace

absl::Status train_group_index(ssa_session& s, LayerStore& layer) {
  const KvLayout& L = s.layout;
  if (layer.n_tokens == 0) return invalid_argument("cannot train a PQ index on an empty layer");
  if (layer_has_host_pages(layer)) {
    return unsupported("index training of a CUDA group's session with pages mapped from a file (SSA_LOAD_MMAP): "
                       "load the group's snapshot without mapping");
  }
  SSA_CUDA_RETURN(cudaSetDevice(state(s).device), "cudaSetDevice");
  const uint64_t n = sample_count(layer.n_tokens, s.config.index_train_sample);
  std::vector<float> keys;
  auto read = [&](uint64_t i0, uint64_t i1, float* out) {
    return read_device_sample_keys(s, layer, n, i0, i1, out);
  };
  SSA_RETURN_IF_ERROR(gather_sample_keys(*s.rt->group, L, layer.n_tokens, s.rt->shard_tokens, n, read, &keys));
  const PqIndexShape shape = index_shape(L, s.config.proxy);
  const auto n32 = static_cast<uint32_t>(n);
  std::shared_ptr<PqCodebooks> books = empty_codebooks(L);
  DeviceMem work, bd;
  SSA_CUDA_RETURN(work.alloc(kmeans_workspace_bytes(shape, n32), nullptr), "cudaMallocAsync of k-means workspace");
  SSA_CUDA_RETURN(bd.alloc(books->data.size() * sizeof(float), nullptr), "cudaMallocAsync of codebooks");
  // The sample where pq_gather_sample writes it: the workspace's first bytes, [n_kv][n][head_dim].
  SSA_CUDA_RETURN(cudaMemcpyAsync(work.p, keys.data(), keys.size() * sizeof(float), cudaMemcpyHostToDevice, nullptr),
                  "training sample upload");
  SSA_CUDA_RETURN(pq_seed(shape, n32, false, work.p, static_cast<float*>(bd.p), nullptr), "k-means++ seeding kernel");
  SSA_CUDA_RETURN(pq_lloyd(shape, n32, s.config.index_iterations, false, work.p, static_cast<float*>(bd.p), nullptr),
                  "k-means kernels");
  // Codes of the pages this rank keeps (null elsewhere, as its K/V pages).
  const HeldRange& held = s.rt->held;
  std::vector<PageRef> codes;
  const uint64_t pages = L.pages_for(layer.n_tokens);
  for (uint64_t i = 0; i < pages; ++i) {
    if (!held.holds_page(i, L.page_tokens)) {
      codes.emplace_back();
      continue;
    }
    absl::StatusOr<PageRef> page = state(s).code_pool->allocate();
    if (!page.ok()) return page.status();
    codes.push_back(*std::move(page));
  }
  SSA_RETURN_IF_ERROR(encode_range(s, static_cast<const float*>(bd.p), layer.kv_pages, codes,
                                   held.lo(0), held.hi(layer.n_tokens)));
  return install_trained_index(s, layer, std::move(books), std::move(bd), std::move(codes));
}

}  // namespace ssa::cuda
