// The device passes of the sharded adaptive heavy rule (sharded_adaptive.h).
#include <cub/device/device_segmented_radix_sort.cuh>

#include "common/water_filling.h"
#include "device_util.cuh"
#include "sharded_adaptive.h"

namespace ssa::cuda {
namespace {

// One block per (rank item, selection head).
__global__ void listed_keys_kernel(const __grid_constant__ DecodeBatch b, Workspace ws, ShardBatchItems map, uint32_t* keys,
                                   uint32_t stride) {
  const uint32_t item = blockIdx.y, h = blockIdx.x, ns = b.sel_heads();
  const DecodeItem& it = b.item(item);
  const RowState& st = ws.rows[row_of(item, h, ns)];
  const size_t sel = it.select_base + size_t{h} * it.select_cap;
  const float* s = ws.scores + row_token_base(it, h);
  const uint32_t listed = it.n_select == 0 ? 0u : min(st.n_heavy, it.n_select);
  uint32_t* out = keys + (size_t{map.batch_item[item]} * ns + h) * stride;
  for (uint32_t i = threadIdx.x; i < it.n_select; i += blockDim.x)
    out[i] = i < listed ? float_key(s[ws.heavy[sel + i]]) : 0u;
}

__global__ void interleave_kernel(const uint32_t* in, uint32_t ranks, uint32_t rows, uint32_t stride,
                                  uint32_t* out) {
  const size_t total = size_t{ranks} * rows * stride;
  for (size_t x = blockIdx.x * size_t{blockDim.x} + threadIdx.x; x < total; x += size_t{gridDim.x} * blockDim.x) {
    const size_t r = x / (size_t{rows} * stride), rest = x % (size_t{rows} * stride);
    const size_t row = rest / stride, i = rest % stride;
    out[row * ranks * stride + r * stride + i] = in[x];
  }
}

__global__ void offsets_kernel(int* offsets, uint32_t rows, uint32_t seg) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i <= rows; i += gridDim.x * blockDim.x)
    offsets[i] = static_cast<int>(i * seg);
}

// One block per row: the probabilities in parallel, then one thread's water fill.
__global__ void water_fill_kernel(const uint32_t* sorted, uint32_t seg, const ShardWaterRow* rows, double* probs,
                                  uint32_t* heavy) {
  const uint32_t row = blockIdx.x;
  const ShardWaterRow r = rows[row];
  double* p = probs + size_t{row} * seg;
  const uint32_t* k = sorted + size_t{row} * seg;
  const float mx = key_float(r.max_key);
  for (uint32_t i = threadIdx.x; i < r.kprime; i += blockDim.x) {
    const float w = expf(key_float(k[i]) - mx);
    p[i] = static_cast<double>(w) / r.w_all;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  heavy[row] = r.kprime == 0 ? 0u
                             : static_cast<uint32_t>(water_fill(p, r.kprime, 1.0, static_cast<double>(r.kprime)).heavy);
}

}  // namespace

cudaError_t shard_listed_keys(const DecodeBatch& b, const Workspace& ws, const ShardBatchItems& map, uint32_t* keys,
                              uint32_t stride, cudaStream_t stream) {
  if (b.n_items == 0) return cudaSuccess;
  listed_keys_kernel<<<dim3(b.sel_heads(), b.n_items), 256, 0, stream>>>(b, ws, map, keys, stride);
  return cudaGetLastError();
}

cudaError_t shard_interleave_keys(const uint32_t* in, uint32_t ranks, uint32_t rows, uint32_t stride, uint32_t* out,
                                  cudaStream_t stream) {
  const size_t total = size_t{ranks} * rows * stride;
  if (total == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(std::min<size_t>((total + 255) / 256, 4096));
  interleave_kernel<<<blocks, 256, 0, stream>>>(in, ranks, rows, stride, out);
  return cudaGetLastError();
}

size_t shard_sort_temp_bytes(uint32_t rows, uint32_t seg) {
  size_t c = 0;
  cub::DeviceSegmentedRadixSort::SortKeysDescending(nullptr, c, static_cast<const uint32_t*>(nullptr),
                                                    static_cast<uint32_t*>(nullptr),
                                                    static_cast<int>(size_t{rows} * seg), static_cast<int>(rows),
                                                    static_cast<const int*>(nullptr),
                                                    static_cast<const int*>(nullptr));
  return c + (size_t{rows} + 1) * sizeof(int) + 256;  // and the segment offsets
}

cudaError_t shard_sort_keys(void* temp, size_t temp_bytes, const uint32_t* in, uint32_t* out, uint32_t rows,
                            uint32_t seg, cudaStream_t stream) {
  if (rows == 0 || seg == 0) return cudaSuccess;
  const size_t off_bytes = (size_t{rows} + 1) * sizeof(int);
  if (temp_bytes < off_bytes + 256) return cudaErrorInvalidValue;
  int* offsets = static_cast<int*>(temp);
  void* cub_temp = static_cast<uint8_t*>(temp) + (off_bytes + 255) / 256 * 256;
  size_t cub_bytes = temp_bytes - (off_bytes + 255) / 256 * 256;
  offsets_kernel<<<(rows + 256) / 256, 256, 0, stream>>>(offsets, rows, seg);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  return cub::DeviceSegmentedRadixSort::SortKeysDescending(cub_temp, cub_bytes, in, out,
                                                           static_cast<int>(size_t{rows} * seg),
                                                           static_cast<int>(rows), offsets, offsets + 1, 0, 32,
                                                           stream);
}

cudaError_t shard_water_fill(const uint32_t* sorted, uint32_t seg, const ShardWaterRow* rows, uint32_t n_rows,
                             double* probs, uint32_t* heavy, cudaStream_t stream) {
  if (n_rows == 0) return cudaSuccess;
  water_fill_kernel<<<n_rows, 256, 0, stream>>>(sorted, seg, rows, probs, heavy);
  return cudaGetLastError();
}

}  // namespace ssa::cuda
