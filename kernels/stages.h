// Stage launchers of one decode (internal to kernels/). Each enqueues its kernels
// on the stream and returns the launch error. Order: decode_pipeline.cu.
#pragma once

#include <cuda_runtime.h>

#include "decode_types.h"

namespace ssa::cuda {

cudaError_t launch_init_rows(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                             cudaStream_t st);
cudaError_t launch_pq_scores(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                             cudaStream_t st);
cudaError_t launch_exact_scores(const DecodeBatch& b, const WorkspacePlan& plan,
                                const Workspace& ws, cudaStream_t st);
// The mixture proposal's selection-row scores (group_mixture.cu): every q head
// scored into scratch rows, their normalisers, the mixture logits.
cudaError_t launch_group_mixture(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                 cudaStream_t st);
// Its stages, for a sharded decode to exchange the heads' maxima and chunk sums
// between them: the q heads' scores (scratch rows, with their maxima), their
// chunk sums (head_csum), and the mixture logits from given head terms
// (launch_mixture_terms: [row][3] from every shard's chunk sums; null: each
// head's own).
cudaError_t launch_mixture_head_scores(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                       cudaStream_t st);
cudaError_t launch_mixture_norms(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                 cudaStream_t st);
cudaError_t launch_mixture_logits(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                  const float* terms, const ShardBatchItems& map, cudaStream_t st);
cudaError_t launch_mixture_terms(const double* csum, uint32_t chunks_stride, const ShardMixtureRow* rows,
                                 uint32_t n_rows, float* terms, cudaStream_t st);
cudaError_t launch_topk(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                        cudaStream_t st);
// Heavy bitmap (and, with samples, the sample bitmap) -> token-ordered lists,
// n_heavy, n_unique and log pi of each sample. `pass` (< plan.compact_passes)
// picks the compaction counts, zeroed once per decode with the row states.
cudaError_t launch_compact(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                           bool samples, uint32_t pass, cudaStream_t st);
// The adaptive heavy set (adaptive_heavy.cu).
cudaError_t launch_adaptive_heavy(const DecodeBatch& b, const WorkspacePlan& plan,
                                  const Workspace& ws, cudaStream_t st);
// Residual weight sums per 32-token block and 1024-token chunk (stratified_sample.cu):
// mode 0 the residual hierarchy and masses after the heavy set is final, mode 1
// only the candidate total (adaptive heavy set).
cudaError_t launch_hierarchy(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws, int mode,
                             cudaStream_t st);
cudaError_t launch_sampling(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                            cudaStream_t st);
// launch_sampling's parts: the rows' chunk prefix sums in global memory (cprefix,
// and w_total), and the draws into the sample bitmap.
cudaError_t launch_chunk_prefix(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                cudaStream_t st);
cudaError_t launch_draws(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws, cudaStream_t st);
uint32_t sample_group_draws(uint32_t draws_max, uint32_t rows, int sm_count);
// Attention (attention.cu) = the splits' partial results (launch_split_attention,
// by the kernel that serves the launch set), then their merge into the output
// (launch_merge_splits, attention_merge.cu).
cudaError_t launch_attention(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                             bool all_dense, cudaStream_t st);
cudaError_t launch_split_attention(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                   bool all_dense, cudaStream_t st);
cudaError_t launch_merge_splits(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                cudaStream_t st);
// The split-K kernel on CUDA cores (split_attention.cuh): sparse rows
// (sparse_attention.cu), dense rows with GQA groups shared per block
// (dense_attention.cu).
cudaError_t launch_sparse_split(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                cudaStream_t st);
cudaError_t launch_dense_split(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                               cudaStream_t st);
uint32_t dense_heads_per_block(uint32_t group);
// Tensor-core dense attention (dense_attention_mma.cu): f16/bf16, head dims 64,
// 128, 256, GQA groups up to 16; one block per (split, KV head, item).
bool dense_mma_supported(const DecodeShape& s);
uint32_t dense_mma_splits(const DecodeShape& s, uint32_t n_items, uint32_t max_tokens, int sm_count);
cudaError_t launch_dense_mma(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                             cudaStream_t st);
// Sparse rows through a cp.async ring (sparse_gather_attention.cu): f16/bf16,
// head dims 64, 128, 256; one block per (split, q head, item).
bool sparse_gather_supported(const DecodeShape& s);
uint32_t sparse_gather_splits(const DecodeShape& s, uint32_t rows, uint32_t max_read, int sm_count);
cudaError_t launch_sparse_gather(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                 cudaStream_t st);
// Grouped sparse rows (group selection, G >= 2) on tensor cores
// (group_attention.cu): f16/bf16, head dims 64, 128, 256, groups of 2 to 16;
// one block per (split, KV head, item) reads each row of the group's read set
// once for all G q heads.
bool group_gather_supported(const DecodeShape& s);
uint32_t group_gather_splits(const DecodeShape& s, uint32_t blocks, uint32_t max_read, int sm_count);
cudaError_t launch_group_gather(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                                cudaStream_t st);
// ... and on CUDA cores (sparse_attention.cu) for what that leaves: f32, head
// dims 32 and 512, groups above 16; group_split_heads(shape) q heads per block.
uint32_t group_split_heads(const DecodeShape& s);
cudaError_t launch_group_split(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                               cudaStream_t st);
// Whether a sparse launch set's attention runs per KV group (one of the two
// kernels above): group selection with groups of two or more q heads. A group of
// one head keeps the per-head kernels, so it decodes bitwise as per-head selection.
inline bool group_attention(const DecodeBatch& b) { return b.grouped() && b.shape.group() > 1; }
const char* pq_shape_unsupported(const DecodeShape& s);
size_t segmented_sort_temp_bytes(uint32_t rows, uint64_t entries);
uint32_t compact_words_per_block(uint32_t n_pad_max, uint32_t rows, int sm_count);
uint32_t filter_blocks_per_row(uint32_t n_pad_max, uint32_t rows, uint32_t scan_blocks, int sm_count);

}  // namespace ssa::cuda
