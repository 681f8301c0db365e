// FlashInfer batch decode over the benchmark's pages: the same calls FlashInfer's
// own batch_decode.cu makes (DecodePlan, then BatchDecodeWithPagedKVCacheDispatched
// with the default attention variant, no positional encoding, no PDL).
#include "flashinfer_decode.h"

#include <flashinfer/attention/decode.cuh>
#include <flashinfer/attention/default_decode_params.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/attention/variants.cuh>

#include <cmath>
#include <exception>
#include <vector>

namespace ssa_bench {
namespace {

using flashinfer::BatchDecodeParams;
using flashinfer::DecodePlanInfo;
using flashinfer::PosEncodingMode;
using flashinfer::QKVLayout;
using Variant = flashinfer::DefaultAttention<false, false, false, false>;

struct DeviceBuffer {
  void* p = nullptr;
  ~DeviceBuffer() { if (p) cudaFree(p); }
  cudaError_t alloc(size_t n) { return cudaMalloc(&p, n ? n : 16); }
};

template <uint32_t D, uint32_t GROUP, typename T>
class Impl final : public FlashInferDecode {
  using Params = BatchDecodeParams<T, T, T, int32_t>;

 public:
  cudaError_t init(const FlashInferArgs& a) {
    const uint32_t pages = (a.n_tokens + a.page_tokens - 1) / a.page_tokens;
    std::vector<int32_t> indptr(a.batch + 1), indices(size_t{a.batch} * pages), last(a.batch);
    for (uint32_t i = 0; i <= a.batch; ++i) indptr[i] = static_cast<int32_t>(i * pages);
    for (size_t i = 0; i < indices.size(); ++i) indices[i] = static_cast<int32_t>(i);
    for (uint32_t i = 0; i < a.batch; ++i) last[i] = static_cast<int32_t>(a.n_tokens - (pages - 1) * a.page_tokens);
    cudaError_t e;
    if ((e = indptr_d_.alloc(indptr.size() * 4)) != cudaSuccess) return e;
    if ((e = indices_d_.alloc(indices.size() * 4)) != cudaSuccess) return e;
    if ((e = last_d_.alloc(last.size() * 4)) != cudaSuccess) return e;
    if ((e = cudaMemcpy(indptr_d_.p, indptr.data(), indptr.size() * 4, cudaMemcpyHostToDevice)) != cudaSuccess) return e;
    if ((e = cudaMemcpy(indices_d_.p, indices.data(), indices.size() * 4, cudaMemcpyHostToDevice)) != cudaSuccess) return e;
    if ((e = cudaMemcpy(last_d_.p, last.data(), last.size() * 4, cudaMemcpyHostToDevice)) != cudaSuccess) return e;

    // HND pages: page stride 2 * n_kv * P * D elements (K then V), head stride P * D.
    T* k = static_cast<T*>(const_cast<void*>(a.kv_pool));
    T* v = k + size_t{a.n_kv_heads} * a.page_tokens * D;
    const int64_t strides[3] = {int64_t{2} * a.n_kv_heads * a.page_tokens * D, int64_t{a.page_tokens} * D, D};
    flashinfer::paged_kv_t<T, int32_t> kv(a.n_kv_heads, a.page_tokens, D, a.batch, QKVLayout::kHND, k, v,
                                          strides, static_cast<int32_t*>(indices_d_.p),
                                          static_cast<int32_t*>(indptr_d_.p), static_cast<int32_t*>(last_d_.p));
    params_.q = static_cast<T*>(const_cast<void*>(a.q));
    params_.paged_kv = kv;
    params_.o = static_cast<T*>(a.out);
    params_.lse = nullptr;
    params_.num_qo_heads = a.n_q_heads;
    params_.q_stride_n = static_cast<int32_t>(a.n_q_heads * D);
    params_.q_stride_h = D;
    params_.window_left = -1;
    params_.logits_soft_cap = 0.f;
    params_.sm_scale = 1.f / std::sqrt(static_cast<float>(D));
    params_.rope_rcp_scale = 1.f;
    params_.rope_rcp_theta = 1.f / 1e4f;

    auto estimate = flashinfer::BatchDecodeWithPagedKVCacheWorkEstimationDispatched<
        GROUP, D, PosEncodingMode::kNone, Variant, Params>;
    size_t fbytes = 0, ibytes = 0;
    if ((e = flashinfer::DecodePlanWorkspaceSize<D, PosEncodingMode::kNone, Variant, Params>(
             fbytes, ibytes, indptr.data(), a.batch, a.n_q_heads, a.page_tokens, false, nullptr, estimate)) !=
        cudaSuccess)
      return e;
    ibytes += 256;  // FlashInfer's aligned allocator pads offsets
    fbytes += 256;
    if ((e = float_ws_.alloc(fbytes)) != cudaSuccess) return e;
    if ((e = int_ws_.alloc(ibytes)) != cudaSuccess) return e;
    pinned_.resize(ibytes);
    DecodePlanInfo plan;
    if ((e = flashinfer::DecodePlan<D, PosEncodingMode::kNone, Variant, Params>(
             float_ws_.p, fbytes, int_ws_.p, pinned_.data(), ibytes, plan, indptr.data(), a.batch, a.n_q_heads,
             a.page_tokens, false, nullptr, estimate)) != cudaSuccess)
      return e;
    if ((e = cudaDeviceSynchronize()) != cudaSuccess) return e;  // the plan's copy from pinned_
    auto at = [](void* base, int64_t off) { return reinterpret_cast<char*>(base) + off; };
    params_.request_indices = reinterpret_cast<int32_t*>(at(int_ws_.p, plan.request_indices_offset));
    params_.kv_tile_indices = reinterpret_cast<int32_t*>(at(int_ws_.p, plan.kv_tile_indices_offset));
    params_.o_indptr = reinterpret_cast<int32_t*>(at(int_ws_.p, plan.o_indptr_offset));
    params_.kv_chunk_size_ptr = reinterpret_cast<int32_t*>(at(int_ws_.p, plan.kv_chunk_size_ptr_offset));
    params_.block_valid_mask = nullptr;  // only with CUDA-graph plans
    params_.padded_batch_size = static_cast<uint32_t>(plan.padded_batch_size);
    if (plan.split_kv) {
      tmp_v_ = reinterpret_cast<T*>(at(float_ws_.p, plan.v_offset));
      tmp_s_ = reinterpret_cast<float*>(at(float_ws_.p, plan.s_offset));
    }
    return cudaSuccess;
  }

  cudaError_t run(cudaStream_t stream) override {
    return flashinfer::BatchDecodeWithPagedKVCacheDispatched<D, PosEncodingMode::kNone, Variant>(
        params_, tmp_v_, tmp_s_, /*enable_pdl=*/false, stream);
  }

 private:
  Params params_;
  T* tmp_v_ = nullptr;
  float* tmp_s_ = nullptr;
  DeviceBuffer indptr_d_, indices_d_, last_d_, float_ws_, int_ws_;
  std::vector<char> pinned_;  // the plan's host staging (pageable here: planning is untimed)
};

template <uint32_t D, uint32_t GROUP>
std::unique_ptr<FlashInferDecode> make(const FlashInferArgs& a, cudaError_t* e) {
  std::unique_ptr<FlashInferDecode> out;
  if (a.bf16) {
    auto p = std::make_unique<Impl<D, GROUP, __nv_bfloat16>>();
    if ((*e = p->init(a)) == cudaSuccess) out = std::move(p);
  } else {
    auto p = std::make_unique<Impl<D, GROUP, __half>>();
    if ((*e = p->init(a)) == cudaSuccess) out = std::move(p);
  }
  return out;
}

}  // namespace

std::unique_ptr<FlashInferDecode> FlashInferDecode::create(const FlashInferArgs& a, std::string* error) {
  cudaError_t e = cudaErrorInvalidValue;
  std::unique_ptr<FlashInferDecode> out;
  const uint32_t group = a.n_kv_heads ? a.n_q_heads / a.n_kv_heads : 0;
  try {  // FlashInfer's planner reports some failures by throwing
    // The benchmark's two shapes (and head dim 64): GQA group 4 or 8.
    if (a.head_dim == 256 && group == 4) out = make<256, 4>(a, &e);
    else if (a.head_dim == 128 && group == 4) out = make<128, 4>(a, &e);
    else if (a.head_dim == 128 && group == 8) out = make<128, 8>(a, &e);
    else if (a.head_dim == 64 && group == 4) out = make<64, 4>(a, &e);
    else {
      *error = "shape not instantiated in bench/flashinfer_decode.cu";
      return nullptr;
    }
  } catch (const std::exception& x) {
    *error = std::string("FlashInfer planning: ") + x.what();
    return nullptr;
  }
  if (!out) *error = std::string("FlashInfer planning: ") + cudaGetErrorString(e);
  return out;
}

}  // namespace ssa_bench
