// Counts the tiers of every row a decode read (kernels/tier_accounting.h). The
// read sets are the attention's own (row_read_set), so the counts are exactly
// what the attention read, whatever the method.
#include "device_util.cuh"
#include "tier_accounting.h"

namespace ssa::cuda {
namespace {

constexpr int kThreads = 256;
constexpr uint32_t kBlocksPerRow = 8;

__global__ void __launch_bounds__(kThreads) tier_accounting_kernel(const __grid_constant__ DecodeBatch b, Workspace ws, TierBatch t) {
  const uint32_t item = blockIdx.z, h = blockIdx.y;
  const TierItem ti = t.items[item];
  if (ti.page_tier == nullptr) return;
  const DecodeItem& it = b.item(item);
  const bool dense = it.sink_end >= it.local_begin;
  const ReadSet rs = row_read_set(b, ws, item, h);
  uint64_t host = 0, cached = 0;
  for (uint32_t p = blockIdx.x * kThreads + threadIdx.x; p < rs.size(); p += kBlocksPerRow * kThreads) {
    float unused;
    const uint32_t page = rs.token(p, &unused) >> b.shape.page_shift;
    if (!dense) atomicAdd(ti.page_rows + page, 1u);
    const uint8_t tier = ti.page_tier[page];
    if (tier == kTierHost || tier == kTierFile) ++host;
    if (tier == kTierCached) ++cached;
  }
  __shared__ uint64_t sum[2][kThreads / 32];
  host = warp_sum(host);
  cached = warp_sum(cached);
  if (threadIdx.x % 32 == 0) {
    sum[0][threadIdx.x / 32] = host;
    sum[1][threadIdx.x / 32] = cached;
  }
  __syncthreads();
  if (threadIdx.x < 2) {
    uint64_t s = 0;
    for (int w = 0; w < kThreads / 32; ++w) s += sum[threadIdx.x][w];
    if (s != 0 && ti.counts != nullptr) atomicAdd(ti.counts + threadIdx.x, static_cast<unsigned long long>(s));
  }
}

}  // namespace

cudaError_t launch_tier_accounting(const DecodeBatch& b, const Workspace& ws, const TierBatch& t,
                                   cudaStream_t stream) {
  const dim3 grid(kBlocksPerRow, b.shape.n_q_heads, b.n_items);
  tier_accounting_kernel<<<grid, kThreads, 0, stream>>>(b, ws, t);
  return cudaGetLastError();
}

}  // namespace ssa::cuda
