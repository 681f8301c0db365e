// The PQ index on the device: codebooks trained by k-means on the device (sample,
// k-means++ seeds as the CPU backend picks them, Lloyd iterations), and codes
// encoded with device codebooks. The query-aware proxies (QPQ, QPQ4) learn their
// transforms and key weights as the CPU backend does, to the bit: the d x d
// eigen-decompositions on the host with its code, the steps per key on the
// device; then their weighted k-means runs on the device over the transformed
// sample. The rotated proxies (OPQ, OPQ4), whose k-means rounds
// alternate with fits of the rotation, train on the host with the CPU backend's
// code; their codes are then encoded on the device.
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda_backend.h"
#include "device_error.h"
#include "device_state.h"
#include "file_staging.h"
#include "index/pq_index.h"
#include "index/proxy_kind.h"
#include "kernels/query_aware_train.h"
#include "runtime.h"

namespace ssa::cuda {

// Only the pages of the range go to the device.
// Transformed ranges of at least kTransformedEncodeMin tokens are encoded through
// a scratch of up to kTransformedEncodeChunk transformed keys per KV head (32 MiB
// for 8 heads of d 128).
constexpr uint64_t kTransformedEncodeMin = 1024, kTransformedEncodeChunk = 8192;

absl::Status encode_range(const ssa_session& s, const float* books, const std::vector<PageRef>& kv,
                          const std::vector<PageRef>& codes, uint64_t begin, uint64_t end) {
  if (end <= begin) return absl::OkStatus();
  const uint64_t P = s.layout.page_tokens, first = begin / P, count = (end - 1) / P - first + 1;
  DeviceMem kt, ct;
  SSA_RETURN_IF_ERROR(upload_table(kv, false, nullptr, &kt, first, count));
  SSA_RETURN_IF_ERROR(upload_table(codes, true, nullptr, &ct, first, count));
  const PqIndexShape shape = index_shape(s.layout, s.config.proxy);
  const auto* kv_table = static_cast<const uint8_t* const*>(kt.p);
  auto* code_table = static_cast<uint8_t* const*>(ct.p);
  const auto b = static_cast<uint32_t>(begin - first * P), e = static_cast<uint32_t>(end - first * P);
  if (shape.key_transform && end - begin >= kTransformedEncodeMin) {
    // The keys transformed in tiles first (several times faster per key), when
    // the scratch can be had; the one-pass kernel needs none.
    const auto chunk = static_cast<uint32_t>(std::min<uint64_t>(end - begin, kTransformedEncodeChunk));
    DeviceMem scratch;
    if (scratch.alloc(pq_encode_scratch_bytes(shape, chunk), nullptr) == cudaSuccess) {
      SSA_CUDA_RETURN(pq_encode_transformed(shape, kv_table, code_table, books, b, e, static_cast<float*>(scratch.p),
                                            chunk, nullptr),
                      "PQ encode kernels (transformed keys)");
      return absl::OkStatus();
    }
    (void)cudaGetLastError();
  }
  SSA_CUDA_RETURN(pq_encode(shape, kv_table, code_table, books, b, e, nullptr), "PQ encode kernel");
  return absl::OkStatus();
}

namespace {

// New code pages for every page of the layer.
absl::StatusOr<std::vector<PageRef>> new_code_pages(const ssa_session& s, uint64_t n_tokens) {
  std::vector<PageRef> codes;
  const uint64_t pages = s.layout.pages_for(n_tokens);
  for (uint64_t i = 0; i < pages; ++i) {
    absl::StatusOr<PageRef> page = shard_state(s, shard_of_page(s, i)).code_pool->allocate();
    if (!page.ok()) return page.status();
    codes.push_back(*std::move(page));
  }
  return codes;
}

// The query-aware proxies' transforms and key weights, as the CPU backend's
// learn_query_aware computes them, from the device's sample (the workspace's
// first floats): the d x d eigen-decompositions and products on the host, the
// steps per key on the device with the host's bits (query_aware_train.h). T and
// Q go into the device codebooks; the weights (when the layer kept recent
// queries) into the workspace, *weighted then true.
absl::Status learn_query_aware_on_device(ssa_session& s, const LayerStore& layer, const PqIndexShape& shape,
                                         uint32_t n, void* work, float* dev_books, PqCodebooks* books,
                                         bool* weighted) {
  const KvLayout& L = s.layout;
  const uint32_t H = L.n_kv_heads, d = L.head_dim;
  const size_t dd = size_t{d} * d;
  ThreadPool& pool = *s.rt->pool;
  absl::StatusOr<std::vector<QueryWhitening>> whitening = begin_query_aware(L, layer.query_moments, pool, books);
  if (!whitening.ok()) return whitening.status();
  std::vector<double> a_t(H * dd);
  for (uint32_t h = 0; h < H; ++h) {
    const std::vector<double>& at = (*whitening)[h].a_t;
    std::copy(at.begin(), at.end(), a_t.begin() + h * dd);
  }
  const float* x = static_cast<const float*>(work);  // the sample (pq_index.h)
  DeviceMem a_dev, y_dev, c_dev;
  SSA_CUDA_RETURN(a_dev.alloc(a_t.size() * sizeof(double), nullptr), "cudaMallocAsync of the whitening");
  SSA_CUDA_RETURN(y_dev.alloc(size_t{H} * n * d * sizeof(float), nullptr), "cudaMallocAsync of the whitened keys");
  SSA_CUDA_RETURN(c_dev.alloc(H * dd * sizeof(double), nullptr), "cudaMallocAsync of the second moments");
  SSA_CUDA_RETURN(cudaMemcpy(a_dev.p, a_t.data(), a_t.size() * sizeof(double), cudaMemcpyHostToDevice),
                  "whitening upload");
  SSA_CUDA_RETURN(qa_whiten_keys(shape, n, static_cast<const double*>(a_dev.p), x, static_cast<float*>(y_dev.p),
                                 nullptr),
                  "whitening kernel");
  SSA_CUDA_RETURN(qa_second_moments(shape, n, static_cast<const float*>(y_dev.p), static_cast<double*>(c_dev.p),
                                    nullptr),
                  "second moments kernel");
  std::vector<double> second(H * dd, 0.0);
  SSA_CUDA_RETURN(cudaMemcpy(second.data(), c_dev.p, second.size() * sizeof(double), cudaMemcpyDeviceToHost),
                  "second moments download");
  finish_query_aware(L, *whitening, second, pool, books);
  const DeviceBooksLayout layout = device_books_layout(shape);
  SSA_CUDA_RETURN(cudaMemcpy(dev_books + layout.key_transform_offset(), books->rotation.data(),
                             layout.transform * sizeof(float), cudaMemcpyHostToDevice),
                  "key transform upload");
  SSA_CUDA_RETURN(cudaMemcpy(dev_books + layout.query_transform_offset(), books->query_transform.data(),
                             layout.transform * sizeof(float), cudaMemcpyHostToDevice),
                  "query transform upload");
  // The keys' weights, from each head's recent queries (none kept: every key weighs 1).
  const QueryMoments* qm = layer.query_moments.get();
  const std::vector<uint32_t> counts = weighting_query_counts(L, qm);
  *weighted = !counts.empty();
  if (!*weighted) return absl::OkStatus();
  DeviceMem q_dev, counts_dev, scratch;
  SSA_CUDA_RETURN(q_dev.alloc(qm->recent.size() * sizeof(float), nullptr), "cudaMallocAsync of the recent queries");
  SSA_CUDA_RETURN(counts_dev.alloc(H * sizeof(uint32_t), nullptr), "cudaMallocAsync of the query counts");
  SSA_CUDA_RETURN(scratch.alloc(qa_key_weights_scratch_bytes(shape, n, kRecentQueries), nullptr),
                  "cudaMallocAsync of the key scores");
  SSA_CUDA_RETURN(cudaMemcpy(q_dev.p, qm->recent.data(), qm->recent.size() * sizeof(float), cudaMemcpyHostToDevice),
                  "recent queries upload");
  SSA_CUDA_RETURN(cudaMemcpy(counts_dev.p, counts.data(), H * sizeof(uint32_t), cudaMemcpyHostToDevice),
                  "query counts upload");
  SSA_CUDA_RETURN(qa_key_weights(shape, n, x, static_cast<const float*>(q_dev.p), kRecentQueries,
                                 static_cast<const uint32_t*>(counts_dev.p), scratch.p,
                                 kmeans_sample_weights(shape, n, work), nullptr),
                  "key weights kernels");
  return absl::OkStatus();
}

// Codebooks and rotations trained on the host by the CPU backend's
// train_codebooks_on from the keys the device samples; codes encoded on the device.
absl::Status train_on_host(ssa_session& s, LayerStore& layer, const std::vector<PageRef>& kv) {
  const KvLayout& L = s.layout;
  const PqIndexShape shape = index_shape(L, s.config.proxy);
  const uint64_t n = sample_count(layer.n_tokens, s.config.index_train_sample);
  DeviceMem kt, work;
  SSA_RETURN_IF_ERROR(upload_table(kv, false, nullptr, &kt));
  SSA_CUDA_RETURN(work.alloc(kmeans_workspace_bytes(shape, static_cast<uint32_t>(n)), nullptr),
                  "cudaMallocAsync of the key sample");
  PqIndexShape raw = shape;
  raw.key_transform = false;
  SSA_CUDA_RETURN(pq_gather_sample(raw, static_cast<const uint8_t* const*>(kt.p),
                                   static_cast<uint32_t>(layer.n_tokens), static_cast<uint32_t>(n), nullptr, work.p,
                                   nullptr),
                  "key sample kernel");
  // The sample is the workspace's first n_kv x n x head_dim floats (pq_index.h).
  std::vector<float> keys(size_t{L.n_kv_heads} * n * L.head_dim);
  SSA_CUDA_RETURN(cudaMemcpy(keys.data(), work.p, keys.size() * sizeof(float), cudaMemcpyDeviceToHost),
                  "key sample download");
  absl::StatusOr<CodebooksRef> books = train_codebooks_on(L, keys, n, s.config.index_iterations, s.config.proxy,
                                                          s.config.pq_parallel_weight, layer.query_moments,
                                                          *s.rt->pool);
  if (!books.ok()) return books.status();
  absl::StatusOr<const float*> dev = device_books(state(s), *books);
  if (!dev.ok()) return dev.status();
  absl::StatusOr<std::vector<PageRef>> codes = new_code_pages(s, layer.n_tokens);
  if (!codes.ok()) return codes.status();
  SSA_RETURN_IF_ERROR(encode_range(s, *dev, kv, *codes, 0, layer.n_tokens));
  SSA_CUDA_RETURN(cudaStreamSynchronize(nullptr), "PQ encode");  // the copies in kv may go after this
  layer.codebooks = *std::move(books);
  layer.code_pages = *std::move(codes);
  layer.trained_at_tokens = layer.n_tokens;
  return absl::OkStatus();
}

}  // namespace

absl::Status CudaBackend::train_index(ssa_session& s, LayerStore& layer) const {
  if (s.rt->group != nullptr) return train_group_index(s, layer);  // group_index_device.cc
  const KvLayout& L = s.layout;
  const ssa_proxy proxy = s.config.proxy;
  SSA_CUDA_RETURN(cudaSetDevice(state(s).device), "cudaSetDevice");
  // Pages mapped from a file this device cannot read are read from pinned copies.
  absl::StatusOr<std::vector<PageRef>> kv = readable_pages(s, layer);
  if (!kv.ok()) return kv.status();
  if (proxy_has_rotation(proxy)) return train_on_host(s, layer, *kv);
  // On the legacy default stream, as appends. Decodes still queued keep reading
  // the old code pages and codebooks (their tables hold them).
  const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(s.config.index_train_sample, layer.n_tokens));
  const PqIndexShape shape = index_shape(L, proxy);
  PqIndexShape raw = shape;  // the sample as keys, before any transform
  raw.key_transform = false;
  std::shared_ptr<PqCodebooks> books = empty_codebooks(L);
  DeviceMem kt, work, bd;
  SSA_RETURN_IF_ERROR(upload_table(*kv, false, nullptr, &kt));
  SSA_CUDA_RETURN(work.alloc(kmeans_workspace_bytes(shape, n), nullptr), "cudaMallocAsync of k-means workspace");
  // The codebooks as the decode kernels read them (device_books_layout): the
  // centroids, then a transformed proxy's two transforms.
  const DeviceBooksLayout layout = device_books_layout(shape);
  SSA_CUDA_RETURN(bd.alloc(layout.floats() * sizeof(float), nullptr), "cudaMallocAsync of codebooks");
  const auto* kv_table = static_cast<const uint8_t* const*>(kt.p);
  const auto n_tokens = static_cast<uint32_t>(layer.n_tokens);
  float* dev_books = static_cast<float*>(bd.p);
  SSA_CUDA_RETURN(pq_gather_sample(raw, kv_table, n_tokens, n, nullptr, work.p, nullptr), "k-means sample kernel");
  bool weighted = false;
  if (proxy_is_query_aware(proxy)) {
    // The transforms and the keys' weights from the sample and the layer's
    // observed queries; the k-means then runs over the transformed sample, T k
    // with the bits the CPU's rotate gives.
    SSA_RETURN_IF_ERROR(learn_query_aware_on_device(s, layer, shape, n, work.p, dev_books, books.get(), &weighted));
    SSA_CUDA_RETURN(pq_gather_sample(shape, kv_table, n_tokens, n, dev_books, work.p, nullptr),
                    "transformed sample kernel");
  }
  // All on the device, queued on one stream; the host waits once, for the
  // codebooks' copy after the encoding.
  SSA_CUDA_RETURN(pq_seed(shape, n, weighted, work.p, dev_books, nullptr), "k-means++ seeding kernel");
  SSA_CUDA_RETURN(pq_lloyd(shape, n, s.config.index_iterations, weighted, work.p, dev_books, nullptr),
                  "k-means kernels");
  absl::StatusOr<std::vector<PageRef>> fresh = new_code_pages(s, layer.n_tokens);
  if (!fresh.ok()) return fresh.status();
  std::vector<PageRef> codes = *std::move(fresh);
  SSA_RETURN_IF_ERROR(encode_range(s, dev_books, *kv, codes, 0, layer.n_tokens));
  // The copies in *kv may go once the helper has waited for the encoding.
  return install_trained_index(s, layer, std::move(books), std::move(bd), std::move(codes));
}

std::shared_ptr<PqCodebooks> empty_codebooks(const KvLayout& L) {
  auto books = std::make_shared<PqCodebooks>();
  books->n_kv_heads = L.n_kv_heads;
  books->subspaces = L.pq_subspaces;
  books->centroids = L.pq_centroids;
  books->sub_dim = L.sub_dim();
  books->data.resize(size_t{L.n_kv_heads} * L.pq_subspaces * L.pq_centroids * L.sub_dim());
  return books;
}

absl::Status install_trained_index(ssa_session& s, LayerStore& layer, std::shared_ptr<PqCodebooks> books,
                                   DeviceMem&& bd, std::vector<PageRef> codes) {
  SSA_CUDA_RETURN(cudaMemcpy(books->data.data(), bd.p, books->data.size() * sizeof(float), cudaMemcpyDeviceToHost),
                  "codebook download");
  SSA_CUDA_RETURN(cudaStreamSynchronize(nullptr), "PQ encode");
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
