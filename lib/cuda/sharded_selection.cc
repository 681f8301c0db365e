// The exchanges of a sharded CUDA decode's ranks between the pipeline's stages
// (sharded_work.h): the rows' maxima, the heavy sets, the adaptive rule's |H|,
// the mixture's q-head terms, the residual draws and the stats. A rank of a
// group of processes may hold none of the batch's items (no launch set: its
// kernels are skipped), and still makes every exchange, contributing nothing.
#include <cuda_runtime.h>
#include <stddef.h>

#include <algorithm>

#include "common/sampling_hierarchy.h"
#include "device_error.h"
#include "device_mem.h"
#include "device_sharded_topk.h"
#include "kernels/cuda_decode.h"
#include "kernels/sharded_adaptive.h"
#include "sharded_work.h"
#include "status.h"

namespace ssa::cuda::sharded {
namespace {

// Field [offset, offset + bytes) of each of n row states, to and from a host
// array of n such fields. Pageable host memory: the copy to the host is complete
// on return (it synchronises the stream), the copy from it once it returns.
cudaError_t row_fields_to_host(const RowState* rows, size_t offset, size_t bytes, uint32_t n, void* host,
                               cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const cudaError_t e = cudaMemcpy2DAsync(host, bytes, reinterpret_cast<const uint8_t*>(rows) + offset,
                                          sizeof(RowState), bytes, n, cudaMemcpyDeviceToHost, stream);
  return e != cudaSuccess ? e : cudaStreamSynchronize(stream);
}
cudaError_t row_fields_from_host(RowState* rows, size_t offset, size_t bytes, uint32_t n, const void* host,
                                 cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return cudaMemcpy2DAsync(reinterpret_cast<uint8_t*>(rows) + offset, sizeof(RowState), host, bytes, bytes, n,
                           cudaMemcpyHostToDevice, stream);
}

// Every rank's values of the batch rows: this rank's `mine` (one per local row)
// at their batch rows and 0 at the others, all-gathered: (*all)[r * batch_rows + row].
template <typename T>
absl::Status gather_batch_rows(Collective& comm, const RowMap& m, uint32_t batch_rows, const std::vector<T>& mine,
                               std::vector<T>* all) {
  std::vector<T> batch(batch_rows, T{});
  for (uint32_t i = 0; i < m.local_rows(); ++i) batch[m.batch_row(i)] = mine[i];
  all->assign(size_t{comm.size()} * batch_rows, T{});
  return comm.all_gather(batch.data(), batch_rows * sizeof(T), all->data());
}

// The batch indices of the rank's items, for its kernels.
ShardBatchItems batch_items(const RankWork& rw) {
  ShardBatchItems map{};
  for (size_t li = 0; li < rw.items.size(); ++li) map.batch_item[li] = rw.items[li];
  return map;
}

}  // namespace

// Every row's maximum proxy score over every rank's candidates, into each rank's
// row states (the residual weights exp(s~ - max) of all ranks share it).
absl::Status share_row_max(Collective& comm, const RowMap& m, uint32_t batch_rows, RowState* rows,
                           cudaStream_t stream, std::vector<uint32_t>* batch_max) {
  const uint32_t n = m.local_rows();
  std::vector<uint32_t> mine(n), all;
  SSA_CUDA_RETURN(row_fields_to_host(rows, offsetof(RowState, max_key), sizeof(uint32_t), n, mine.data(), stream),
                  "row state read-back");
  SSA_RETURN_IF_ERROR(gather_batch_rows(comm, m, batch_rows, mine, &all));
  batch_max->assign(batch_rows, 0);
  for (uint32_t r = 0; r < comm.size(); ++r)
    for (uint32_t row = 0; row < batch_rows; ++row)
      (*batch_max)[row] = std::max((*batch_max)[row], all[size_t{r} * batch_rows + row]);
  for (uint32_t i = 0; i < n; ++i) mine[i] = (*batch_max)[m.batch_row(i)];
  SSA_CUDA_RETURN(row_fields_from_host(rows, offsetof(RowState, max_key), sizeof(uint32_t), n, mine.data(), stream),
                  "row state update");
  return absl::OkStatus();
}

// The global top-k of every row, into the pipeline's heavy bitmap (a row's
// words from its block base; candidate j = token sink_end + j).
// k: per batch row, how many it takes (0 for items that select nothing).
absl::Status select_heavy(Collective& comm, const Shared& sh, const RowMap& m, const DecodeBatch& b,
                          const Workspace& ws, const std::vector<uint64_t>& k, cudaStream_t stream) {
  const uint32_t ns = m.ns, batch_rows = static_cast<uint32_t>(sh.items.size()) * ns;
  std::vector<uint64_t> n_global(batch_rows, 0), offsets(batch_rows, 0);
  std::vector<uint32_t> counts(batch_rows, 0);
  for (size_t j = 0; j < sh.items.size(); ++j) {
    const ItemWork& w = sh.items[j];
    if (!w.selects) continue;
    for (uint32_t h = 0; h < ns; ++h) n_global[j * ns + h] = w.global.local_begin - w.global.sink_end;
  }
  uint32_t longest = 0;
  for (uint32_t li = 0; li < m.rw.items.size(); ++li) {
    const DecodeItem& it = b.items[li];
    const uint32_t nc = item_candidates(it);
    longest = std::max(longest, nc);
    for (uint32_t h = 0; h < ns; ++h) {
      const size_t row = m.batch_row(li * ns + h);
      offsets[row] = it.score_base + size_t{h} * it.n_pad + it.sink_end;
      counts[row] = nc;
    }
  }
  const uint32_t words = std::max(1u, (longest + 31) / 32);
  DeviceMem table, bits;
  const size_t table_bytes = batch_rows * (sizeof(uint64_t) + sizeof(uint32_t));
  SSA_CUDA_RETURN(table.alloc(table_bytes, stream), "cudaMallocAsync of the top-k rows");
  SSA_CUDA_RETURN(bits.alloc(size_t{batch_rows} * words * sizeof(uint32_t), stream),
                  "cudaMallocAsync of the heavy bitmap");
  auto* dev_offsets = static_cast<uint64_t*>(table.p);
  auto* dev_counts = reinterpret_cast<uint32_t*>(dev_offsets + batch_rows);
  SSA_CUDA_RETURN(cudaMemcpyAsync(dev_offsets, offsets.data(), batch_rows * sizeof(uint64_t),
                                  cudaMemcpyHostToDevice, stream),
                  "top-k rows upload");
  SSA_CUDA_RETURN(cudaMemcpyAsync(dev_counts, counts.data(), batch_rows * sizeof(uint32_t), cudaMemcpyHostToDevice,
                                  stream),
                  "top-k rows upload");
  const ShardTopkRows rows{ws.scores, batch_rows, longest, 0, dev_offsets, dev_counts};
  SSA_RETURN_IF_ERROR(device_sharded_topk(comm, rows, k, n_global, stream, static_cast<uint32_t*>(bits.p)));
  // The rank's items' rows into their bitmap rows (n_pad / 32 words apart).
  for (uint32_t li = 0; li < m.rw.items.size(); ++li) {
    const DecodeItem& it = b.items[li];
    const size_t row_words = it.n_pad / 32;
    uint32_t* dst = ws.heavy_bits + it.score_base / 32;
    SSA_CUDA_RETURN(cudaMemsetAsync(dst, 0, size_t{ns} * row_words * sizeof(uint32_t), stream), "heavy bitmap setup");
    const uint32_t nc = item_candidates(it);
    if (nc == 0) continue;
    // Batch rows of one item are consecutive.
    const uint32_t* src = static_cast<const uint32_t*>(bits.p) + m.batch_row(li * ns) * words;
    SSA_CUDA_RETURN(cudaMemcpy2DAsync(dst, row_words * sizeof(uint32_t), src, words * sizeof(uint32_t),
                                      size_t{(nc + 31) / 32} * sizeof(uint32_t), ns, cudaMemcpyDeviceToDevice,
                                      stream),
                    "heavy bitmap copy");
  }
  return absl::OkStatus();
}

// The mixture proposal's selection rows (kernels/group_mixture.cu) over every
// shard: run_shard_scores left each q head's scores and maximum in the scratch
// rows; the maxima all-gathered; each rank's chunk sums of every head placed at
// their global chunk indices and summed over the ranks (each slot written by one
// rank, so its value is kept exactly); every head's terms from them, by the code
// one device runs over its own sums; the logits.
absl::Status mixture_logits(Collective& comm, const Shared& sh, const RowMap& m, const DecodeBatch& b,
                            const WorkspacePlan& plan, const Workspace& ws, cudaStream_t stream) {
  const uint32_t nq = sh.L.n_q_heads, G = sh.L.group_size();
  const auto n_items = static_cast<uint32_t>(sh.items.size()), held = static_cast<uint32_t>(m.rw.items.size());
  const uint32_t head_rows = n_items * nq;
  // The scratch rows: (item, q head) at item * nq + head.
  std::vector<uint32_t> gmax;
  SSA_RETURN_IF_ERROR(share_row_max(comm, RowMap{m.rw, nq}, head_rows, ws.head_rows, stream, &gmax));
  if (b.n_items > 0) SSA_CUDA_RETURN(run_shard_mixture_norms(b, plan, ws, stream), "mixture normaliser kernels");
  // Every head's chunk sums in global chunk order, [head row][stride].
  std::vector<ShardMixtureRow> rows(head_rows, ShardMixtureRow{0, 0});
  uint32_t stride = 1;
  for (uint32_t j = 0; j < n_items; ++j) {
    const ItemWork& w = sh.items[j];
    if (!w.selects) continue;
    const uint32_t chunks = (w.global.local_begin - w.global.sink_end + kChunkTokens - 1) / kChunkTokens;
    stride = std::max(stride, chunks);
    for (uint32_t q = 0; q < nq; ++q) rows[size_t{j} * nq + q] = ShardMixtureRow{gmax[size_t{j} * nq + q], chunks};
  }
  const size_t sums_bytes = size_t{head_rows} * stride * sizeof(double);
  const size_t rows_off = (sums_bytes + 255) / 256 * 256;
  const size_t terms_off = (rows_off + head_rows * sizeof(ShardMixtureRow) + 255) / 256 * 256;
  DeviceMem buf;
  SSA_CUDA_RETURN(buf.alloc(terms_off + size_t{head_rows} * 3 * sizeof(float), stream),
                  "cudaMallocAsync of the mixture's buffers");
  auto* sums = static_cast<double*>(buf.p);
  SSA_CUDA_RETURN(cudaMemsetAsync(sums, 0, sums_bytes, stream), "mixture sums setup");
  for (uint32_t li = 0; li < held; ++li) {
    const ItemWork& w = sh.items[m.rw.items[li]];
    const DecodeItem& it = b.items[li];
    const uint32_t nc = item_candidates(it);
    if (!w.selects || nc == 0 || it.n_select == 0) continue;
    // The rank's first candidate is a chunk boundary of the item's (chunk_aligned_ranges).
    const uint64_t first = m.rw.view_begin[li] + it.sink_end - w.global.sink_end;
    const size_t pitch = size_t{it.n_pad / kChunkTokens} * sizeof(double);
    SSA_CUDA_RETURN(cudaMemcpy2DAsync(sums + size_t{m.rw.items[li]} * nq * stride + first / kChunkTokens,
                                      stride * sizeof(double), ws.head_csum + it.score_base * G / kChunkTokens,
                                      pitch, size_t{(nc + kChunkTokens - 1) / kChunkTokens} * sizeof(double), nq,
                                      cudaMemcpyDeviceToDevice, stream),
                    "mixture sums copy");
  }
  static_assert(sizeof(double) == sizeof(uint64_t));
  SSA_RETURN_IF_ERROR(comm.all_reduce_sum(reinterpret_cast<uint64_t*>(sums), size_t{head_rows} * stride));
  auto* dev_rows = reinterpret_cast<ShardMixtureRow*>(static_cast<uint8_t*>(buf.p) + rows_off);
  auto* terms = reinterpret_cast<float*>(static_cast<uint8_t*>(buf.p) + terms_off);
  SSA_CUDA_RETURN(cudaMemcpyAsync(dev_rows, rows.data(), head_rows * sizeof(ShardMixtureRow), cudaMemcpyHostToDevice,
                                  stream),
                  "mixture rows upload");
  SSA_CUDA_RETURN(run_shard_mixture_terms(sums, stride, dev_rows, head_rows, terms, stream), "mixture term kernel");
  if (b.n_items > 0)
    SSA_CUDA_RETURN(run_shard_mixture_logits(b, plan, ws, terms, batch_items(m.rw), stream), "mixture kernel");
  // rows (pageable) was copied before cudaMemcpyAsync returned; buf is freed on the stream.
  return absl::OkStatus();
}

// Per batch row, the items' budget field `field` (n_heavy, or n_select: the
// adaptive rule's k'), 0 for items that select nothing.
std::vector<uint64_t> row_budgets(const Shared& sh, uint32_t DecodeItem::*field) {
  std::vector<uint64_t> k(sh.items.size() * sh.sel_heads, 0);
  for (size_t j = 0; j < sh.items.size(); ++j) {
    if (!sh.items[j].selects) continue;
    for (uint32_t h = 0; h < sh.sel_heads; ++h) k[j * sh.sel_heads + h] = sh.items[j].global.*field;
  }
  return k;
}

// The adaptive rule's |H| of every batch row, the same on every rank: the global
// top k' (the sharded top-k), listed by each rank; their score keys gathered and
// sorted per row, water-filled over the candidate total w_all (every rank's
// sum) with the global maximum, as adaptive_heavy.cu does on one device.
absl::Status adaptive_heavy_counts(Collective& comm, const Shared& sh, const RowMap& m, const DecodeBatch& b,
                                   const WorkspacePlan& plan, const Workspace& ws,
                                   const std::vector<uint32_t>& batch_max, cudaStream_t stream,
                                   std::vector<uint64_t>* heavy) {
  const uint32_t ns = m.ns, R = comm.size(), n = m.local_rows();
  const uint32_t batch_rows = static_cast<uint32_t>(sh.items.size()) * ns;
  // The candidate totals.
  if (b.n_items > 0) SSA_CUDA_RETURN(run_shard_candidate_mass(b, plan, ws, stream), "candidate mass kernels");
  std::vector<double> mine(n), all, w_all(batch_rows, 0.0);
  SSA_CUDA_RETURN(row_fields_to_host(ws.rows, offsetof(RowState, w_all), sizeof(double), n, mine.data(), stream),
                  "row state read-back");
  SSA_RETURN_IF_ERROR(gather_batch_rows(comm, m, batch_rows, mine, &all));
  for (uint32_t r = 0; r < R; ++r)
    for (uint32_t row = 0; row < batch_rows; ++row) w_all[row] += all[size_t{r} * batch_rows + row];
  // The global top k', listed.
  const std::vector<uint64_t> kprime = row_budgets(sh, &DecodeItem::n_select);
  SSA_RETURN_IF_ERROR(select_heavy(comm, sh, m, b, ws, kprime, stream));
  if (b.n_items > 0) SSA_CUDA_RETURN(run_shard_list_candidates(b, plan, ws, stream), "candidate list kernels");
  uint32_t stride = 1;
  for (const uint64_t k : kprime) stride = std::max<uint32_t>(stride, static_cast<uint32_t>(k));
  const size_t keys = size_t{batch_rows} * stride, seg = size_t{R} * stride;
  if (seg * batch_rows > 0x7fffffffull) return unsupported("the adaptive rule over so many rows and shards");
  const size_t sort_bytes = shard_sort_temp_bytes(batch_rows, static_cast<uint32_t>(seg));
  const size_t sort_off = (keys * (1 + 2 * R) * sizeof(uint32_t) + 255) / 256 * 256;
  const size_t probs_off = (sort_off + sort_bytes + 255) / 256 * 256;
  const size_t rows_off = probs_off + seg * batch_rows * sizeof(double);
  const size_t heavy_off = (rows_off + batch_rows * sizeof(ShardWaterRow) + 255) / 256 * 256;
  DeviceMem buf;
  SSA_CUDA_RETURN(buf.alloc(heavy_off + batch_rows * sizeof(uint32_t), stream),
                  "cudaMallocAsync of the adaptive rule's buffers");
  uint8_t* base = static_cast<uint8_t*>(buf.p);
  auto* local = reinterpret_cast<uint32_t*>(base);
  uint32_t* gathered = local + keys;       // [rank][row][stride]
  uint32_t* by_row = gathered + R * keys;  // [row][rank * stride], then sorted in place of gathered
  SSA_CUDA_RETURN(cudaMemsetAsync(local, 0, keys * sizeof(uint32_t), stream), "adaptive keys setup");
  if (b.n_items > 0)
    SSA_CUDA_RETURN(shard_listed_keys(b, ws, batch_items(m.rw), local, stride, stream), "adaptive key kernel");
  SSA_RETURN_IF_ERROR(comm.all_gather(local, keys * sizeof(uint32_t), gathered));
  SSA_CUDA_RETURN(shard_interleave_keys(gathered, R, batch_rows, stride, by_row, stream), "adaptive key kernel");
  SSA_CUDA_RETURN(shard_sort_keys(base + sort_off, sort_bytes, by_row, gathered, batch_rows,
                                  static_cast<uint32_t>(seg), stream),
                  "adaptive sort");
  std::vector<ShardWaterRow> water(batch_rows);
  for (uint32_t row = 0; row < batch_rows; ++row)
    water[row] = ShardWaterRow{batch_max[row], static_cast<uint32_t>(kprime[row]), w_all[row]};
  auto* dev_rows = reinterpret_cast<ShardWaterRow*>(base + rows_off);
  auto* dev_heavy = reinterpret_cast<uint32_t*>(base + heavy_off);
  SSA_CUDA_RETURN(cudaMemcpyAsync(dev_rows, water.data(), batch_rows * sizeof(ShardWaterRow),
                                  cudaMemcpyHostToDevice, stream),
                  "adaptive rows upload");
  SSA_CUDA_RETURN(shard_water_fill(gathered, static_cast<uint32_t>(seg), dev_rows, batch_rows,
                                   reinterpret_cast<double*>(base + probs_off), dev_heavy, stream),
                  "water-filling kernel");
  std::vector<uint32_t> t(batch_rows);
  SSA_CUDA_RETURN(cudaMemcpyAsync(t.data(), dev_heavy, batch_rows * sizeof(uint32_t), cudaMemcpyDeviceToHost,
                                  stream),
                  "adaptive read-back");
  SSA_CUDA_RETURN(cudaStreamSynchronize(stream), "adaptive read-back");
  heavy->assign(t.begin(), t.end());
  return absl::OkStatus();
}

// The rank's rows' |H| and m (n_heavy, n_draws: adjacent) once the adaptive
// rule has chosen |H|.
absl::Status set_row_budgets(const RowMap& m, const DecodeBatch& b, const std::vector<uint64_t>& heavy,
                             bool sampling, RowState* rows, cudaStream_t stream) {
  static_assert(offsetof(RowState, n_draws) == offsetof(RowState, n_heavy) + sizeof(uint32_t));
  const uint32_t n = m.local_rows();
  std::vector<uint32_t> v(2 * size_t{n});
  for (uint32_t i = 0; i < n; ++i) {
    const DecodeItem& it = b.items[i / m.ns];
    const auto h = static_cast<uint32_t>(std::min<uint64_t>(heavy[m.batch_row(i)], it.n_select));
    v[2 * i] = h;
    v[2 * i + 1] = sampling ? it.n_select - h : 0u;
  }
  SSA_CUDA_RETURN(row_fields_from_host(rows, offsetof(RowState, n_heavy), 2 * sizeof(uint32_t), n, v.data(), stream),
                  "row state update");
  return absl::OkStatus();
}

// The residual draws of every row: the ranks' residual totals (cprefix's last
// chunk) laid end to end in rank order, so token order, as one mass; each rank
// keeps the draws whose first-level target falls in its part; then w_total is the
// global total, as the samples' log pi needs.
absl::Status draw_samples(Collective& comm, const RowMap& m, uint32_t batch_rows, const DecodeBatch& b,
                          const WorkspacePlan& plan, const Workspace& ws, cudaStream_t stream) {
  const uint32_t ns = m.ns, n = m.local_rows(), R = comm.size(), rank = comm.rank();
  if (b.n_items > 0) SSA_CUDA_RETURN(run_shard_residual(b, plan, ws, stream), "residual kernels");
  std::vector<uint64_t> mine(n, 0), all;
  bool read = false;
  for (uint32_t li = 0; li < m.rw.items.size(); ++li) {
    const DecodeItem& it = b.items[li];
    const uint32_t nc = item_candidates(it);
    if (nc == 0 || it.n_select == 0) continue;  // no residual (the sampler's kernels leave such rows)
    const size_t pitch = size_t{it.n_pad / kChunkTokens} * sizeof(uint64_t);
    const uint64_t* last = ws.cprefix + it.score_base / kChunkTokens + (nc + kChunkTokens - 1) / kChunkTokens - 1;
    SSA_CUDA_RETURN(cudaMemcpy2DAsync(mine.data() + size_t{li} * ns, sizeof(uint64_t), last, pitch,
                                      sizeof(uint64_t), ns, cudaMemcpyDeviceToHost, stream),
                    "residual total read-back");
    read = true;
  }
  if (read) SSA_CUDA_RETURN(cudaStreamSynchronize(stream), "decode");
  SSA_RETURN_IF_ERROR(gather_batch_rows(comm, m, batch_rows, mine, &all));
  std::vector<uint64_t> mass(2 * size_t{n}, 0);  // per local row: mass_begin, mass_total
  std::vector<double> w_total(n);
  for (uint32_t i = 0; i < n; ++i) {
    const size_t row = m.batch_row(i);
    for (uint32_t r = 0; r < R; ++r) {
      if (r < rank) mass[2 * i] += all[size_t{r} * batch_rows + row];
      mass[2 * i + 1] += all[size_t{r} * batch_rows + row];
    }
    w_total[i] = static_cast<double>(mass[2 * i + 1]);
  }
  static_assert(offsetof(RowState, mass_total) == offsetof(RowState, mass_begin) + sizeof(uint64_t));
  SSA_CUDA_RETURN(row_fields_from_host(ws.rows, offsetof(RowState, mass_begin), 2 * sizeof(uint64_t), n,
                                       mass.data(), stream),
                  "row state update");
  if (b.n_items > 0) SSA_CUDA_RETURN(run_shard_draws(b, plan, ws, stream), "sampling kernels");
  SSA_CUDA_RETURN(row_fields_from_host(ws.rows, offsetof(RowState, w_total), sizeof(double), n, w_total.data(),
                                       stream),
                  "row state update");
  return absl::OkStatus();
}

// The rows' stats over every rank, into sh (rank 0).
absl::Status gather_stats(Collective& comm, Shared& sh, const RowMap& m, const std::vector<RowState>& rs) {
  const uint32_t batch_rows = static_cast<uint32_t>(sh.items.size()) * m.ns;
  std::vector<uint64_t> heavy(batch_rows, 0), unique(batch_rows, 0);
  std::vector<double> masses(2 * size_t{batch_rows}, 0.0), all(masses.size() * comm.size());
  for (uint32_t i = 0; i < rs.size(); ++i) {
    const size_t row = m.batch_row(i);
    heavy[row] = rs[i].n_heavy;
    unique[row] = rs[i].n_unique;
    masses[2 * row] = rs[i].w_resid_proxy;
    masses[2 * row + 1] = rs[i].w_heavy;
  }
  SSA_RETURN_IF_ERROR(comm.all_reduce_sum(heavy.data(), heavy.size()));
  SSA_RETURN_IF_ERROR(comm.all_reduce_sum(unique.data(), unique.size()));
  SSA_RETURN_IF_ERROR(comm.all_gather(masses.data(), masses.size() * sizeof(double), all.data()));
  if (comm.rank() != 0 && sh.group == nullptr) return absl::OkStatus();  // a group's every rank reports
  sh.heavy = std::move(heavy);
  sh.unique = std::move(unique);
  sh.resid_mass.assign(batch_rows, 0.0);
  sh.heavy_mass.assign(batch_rows, 0.0);
  for (uint32_t r = 0; r < comm.size(); ++r) {
    for (uint32_t row = 0; row < batch_rows; ++row) {
      sh.resid_mass[row] += all[r * masses.size() + 2 * row];
      sh.heavy_mass[row] += all[r * masses.size() + 2 * row + 1];
    }
  }
  return absl::OkStatus();
}
}  // namespace ssa::cuda::sharded
