// FlashInfer's batch decode with a paged KV cache (its header-only CUDA templates,
// include/flashinfer), as a dense baseline of bench/gpu_decode_bench. Built only
// with -DSSA_FLASHINFER_DIR=<headers> (scripts/fetch_flashinfer_headers.sh), in
// its own translation unit: FlashInfer brings a newer CCCL than the toolkit's.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include <memory>
#include <string>

namespace ssa_bench {

// The benchmark's K/V: sessions' pages back to back in one pool; a page holds K
// as [n_kv heads][page tokens][head dim], then V laid out the same way.
struct FlashInferArgs {
  uint32_t n_q_heads, n_kv_heads, head_dim, page_tokens, batch, n_tokens;
  bool bf16;            // else f16
  const void* kv_pool;  // batch * ceil(n_tokens / page_tokens) pages
  const void* q;        // [batch][n_q_heads][head_dim]
  void* out;            // [batch][n_q_heads][head_dim]
};

class FlashInferDecode {
 public:
  // Plans the decode (FlashInfer's split-KV scheduler); nullptr and *error when
  // the shape is not one this build instantiates or planning fails.
  static std::unique_ptr<FlashInferDecode> create(const FlashInferArgs& args, std::string* error);
  virtual ~FlashInferDecode() = default;
  // Enqueues one decode on `stream`.
  virtual cudaError_t run(cudaStream_t stream) = 0;
};

}  // namespace ssa_bench
