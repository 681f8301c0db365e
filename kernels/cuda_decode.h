// Host entry points of the CUDA decode kernels (kernels/*.cu). Callable from plain
// C++ compiled without nvcc; every pointer inside the descriptors is device memory.
#pragma once

#include <cuda_runtime.h>

#include "decode_types.h"

namespace ssa::cuda {

// nullptr when the kernels support this shape, else why not (head dims 32, 64,
// 128, 256 and 512; PQ lookup tables of one query head must fit in shared memory).
const char* unsupported_shape(const DecodeShape& shape, bool needs_pq);

// Places every item's rows in the workspace (fills the placement fields of b) and
// sizes the one device allocation a decode of b needs. sm_count: multiprocessors
// of the device (sets the automatic split count). Host-only; no device work.
cudaError_t plan_workspace(DecodeBatch* b, int sm_count, WorkspacePlan* plan);

// Carves the buffers of `plan` out of one device allocation of plan.total_bytes.
Workspace bind_workspace(void* base, const WorkspacePlan& plan);

// Enqueues the whole decode of b on `stream` (no host synchronisation, no host to
// device copies: capturable into a CUDA graph). Returns the first launch error.
cudaError_t run_decode(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                       cudaStream_t stream);

// run_decode in two parts: every stage up to the attention (the read sets are
// then in the workspace), and the attention. A decode that must prepare the
// rows its read sets take (kernels/file_rows.h) runs them with that between.
cudaError_t run_selection(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                          cudaStream_t stream);
cudaError_t run_attention_stage(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                cudaStream_t stream);

// The stages of one shard's part of a sharded decode (lib/cuda/sharded_decode.cc),
// between which the shards exchange what the selection needs globally:
// the rows' initial states and proxy scores (PQ or exact; the mean query with
// group selection); with samples, once the global top-k has
// written the heavy bitmap and the global maximum is in the rows' max_key, the
// residual's block and chunk sums and chunk prefixes (the shard's total in
// cprefix's last chunk), then, with the rows' mass_begin and mass_total set,
// the draws; the read sets compacted (heavy list, and the samples' log pi with
// the global total in w_total); the attention's split partials, left in
// ws.partial unmerged; and the merge of partials laid out as ws.partial is,
// plan.n_splits per row (every shard's, gathered in split order).
cudaError_t run_shard_scores(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                             cudaStream_t stream);
// The mixture proposal's (run_shard_scores left the q heads' scores and maxima
// in the scratch rows): with the heads' global maxima in head_rows, their chunk
// sums (head_csum); the heads' terms from every shard's chunk sums, [row][3] for
// rows[] (q heads of the batch, [row][chunks_stride] sums in global chunk
// order); the selection rows' logits from those terms (map: the rank's items'
// batch indices).
cudaError_t run_shard_mixture_norms(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                    cudaStream_t stream);
cudaError_t run_shard_mixture_terms(const double* csum, uint32_t chunks_stride, const ShardMixtureRow* rows,
                                    uint32_t n_rows, float* terms, cudaStream_t stream);
cudaError_t run_shard_mixture_logits(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                     const float* terms, const ShardBatchItems& map, cudaStream_t stream);
// The adaptive heavy rule's: the candidate total (w_all) of the rank's rows, and
// the listing of the global top-k' members it holds (ws.heavy, n_heavy of them).
cudaError_t run_shard_candidate_mass(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                     cudaStream_t stream);
cudaError_t run_shard_list_candidates(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                      cudaStream_t stream);
cudaError_t run_shard_residual(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                               cudaStream_t stream);
cudaError_t run_shard_draws(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                            cudaStream_t stream);
cudaError_t run_shard_read_sets(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                cudaStream_t stream);
cudaError_t run_split_partials(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                               cudaStream_t stream);
cudaError_t run_merge_partials(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                               cudaStream_t stream);

}  // namespace ssa::cuda
