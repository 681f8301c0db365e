// Marks the (token, KV head) rows every read set takes from file-tier pages
// (kernels/file_rows.h). The read sets are the attention's own (row_read_set),
// so the bits are exactly the rows the attention will read there.
#include "device_util.cuh"
#include "file_rows.h"
#include "tier_accounting.h"

namespace ssa::cuda {
namespace {

constexpr int kThreads = 256;
constexpr uint32_t kBlocksPerRow = 8;

__global__ void __launch_bounds__(kThreads) mark_file_rows_kernel(const __grid_constant__ DecodeBatch b, Workspace ws, FileRowBatch m) {
  const uint32_t item = blockIdx.z, h = blockIdx.y;
  const FileRowItem fi = m.items[item];
  if (fi.page_tier == nullptr) return;
  const uint32_t kvh = h / b.shape.group();
  const ReadSet rs = row_read_set(b, ws, item, h);
  for (uint32_t p = blockIdx.x * kThreads + threadIdx.x; p < rs.size(); p += kBlocksPerRow * kThreads) {
    float unused;
    const uint32_t t = rs.token(p, &unused);
    if (fi.page_tier[t >> b.shape.page_shift] != kTierFile) continue;
    const uint64_t bit = uint64_t{t} * b.shape.n_kv_heads + kvh;
    atomicOr(fi.bits + bit / 32, 1u << (bit % 32));
  }
}

}  // namespace

cudaError_t launch_mark_file_rows(const DecodeBatch& b, const Workspace& ws, const FileRowBatch& m,
                                  cudaStream_t stream) {
  const dim3 grid(kBlocksPerRow, b.shape.n_q_heads, b.n_items);
  mark_file_rows_kernel<<<grid, kThreads, 0, stream>>>(b, ws, m);
  return cudaGetLastError();
}

}  // namespace ssa::cuda
