// The device half of the global top-k over the shards of a session
// (lib/cuda/device_sharded_topk.h drives it, between collectives): the same set
// as lib/shard/sharded_topk.h finds on the CPU, from this shard's scores in
// device memory. Three radix histogram rounds over the order keys (key bits
// 31-20, 19-8, 7-0), each all-reduced over the shards, give every row's k-th
// largest key T and how many keys equal to T the set still needs; the shards'
// counts of keys equal to T then say how many of them this shard takes (ties go
// to the lowest tokens, so to the lowest shards first), and a last pass marks
// the members in a bitmap.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "select/radix_topk.h"

namespace ssa::cuda {

// This shard's scores: rows x n floats, row r at x + r * stride. Rows of
// different lengths (the items of a batch): offsets[r] and counts[r], device
// arrays, give row r's start in x and its length, n the longest (the bitmap's
// row pitch is still (n + 31) / 32 words).
struct ShardTopkRows {
  const float* x = nullptr;
  uint32_t rows = 0, n = 0, stride = 0;
  const uint64_t* offsets = nullptr;
  const uint32_t* counts = nullptr;
};

// Per row, in device memory. Set by the host before the first round: all = the
// row takes every candidate (k >= the candidates over all shards), active = it
// needs the rounds (0 < k < those candidates), need = k.
struct ShardTopkState {
  uint32_t prefix;  // the key bits of T found so far
  uint32_t active, all, unused;
  unsigned long long need;  // of the keys matching prefix, how many the set still takes
};

// Histogram bins of round r (kShardedTopkRounds rounds, radix_topk.h: 12, 12, 8 bits).
inline constexpr uint32_t shard_topk_bins(int round) { return 1u << sharded_topk_bits(round); }
// Elements per chunk of the tie counts (one block each; 32 per thread).
inline constexpr uint32_t kShardTopkChunk = 8192;
inline uint32_t shard_topk_chunks(uint32_t n) { return (n + kShardTopkChunk - 1) / kShardTopkChunk; }

// hist[row][shard_topk_bins(round)] += the counts of this shard's keys that match
// the row's prefix (round > 0), by their next key bits. hist must be zeroed first.
cudaError_t shard_topk_histogram(const ShardTopkRows& r, const ShardTopkState* st, int round,
                                 unsigned long long* hist, cudaStream_t stream);
// From the all-reduced hist of round `round`: each active row's next bits of T
// and what it still needs of the keys that match them.
cudaError_t shard_topk_pick(uint32_t rows, int round, const unsigned long long* hist, ShardTopkState* st,
                            cudaStream_t stream);
// ties[row] = this shard's keys equal to T; chunk_ties[row][chunk] the same per
// chunk of kShardTopkChunk elements (for the marks' order). Zeroing not needed.
cudaError_t shard_topk_ties(const ShardTopkRows& r, const ShardTopkState* st, unsigned long long* ties,
                            uint32_t* chunk_ties, cudaStream_t stream);
// bits[row][(n + 31) / 32]: bit i of row r set iff this shard's element i is in
// the row's top-k: every key above T, and the first take[row] keys equal to T
// (index order). Rows that take all are all set; rows with k = 0 none.
cudaError_t shard_topk_mark(const ShardTopkRows& r, const ShardTopkState* st, const uint32_t* chunk_ties,
                            const unsigned long long* take, uint32_t* bits, cudaStream_t stream);

}  // namespace ssa::cuda
