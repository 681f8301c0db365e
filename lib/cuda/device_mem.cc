#include "device_mem.h"

#include <algorithm>

#include "device_error.h"

namespace ssa::cuda {

absl::Status upload_array(const void* host, size_t bytes, cudaStream_t st, DeviceMem* out) {
  SSA_CUDA_RETURN(out->alloc(bytes, st), "cudaMallocAsync of a table");
  // From pageable memory: staged before the call returns, so the source may go.
  if (bytes > 0) SSA_CUDA_RETURN(cudaMemcpyAsync(out->p, host, bytes, cudaMemcpyHostToDevice, st), "table upload");
  return absl::OkStatus();
}

bool is_device_memory(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

absl::Status upload_table(const std::vector<PageRef>& pages, bool writable, cudaStream_t st, DeviceMem* out,
                          size_t first, size_t count) {
  count = std::min(count, pages.size() - first);
  std::vector<const uint8_t*> ptrs(count);
  for (size_t i = 0; i < count; ++i) {
    const PageRef& p = pages[first + i];
    ptrs[i] = writable ? p->mutable_data() : p->data();
  }
  return upload_array(ptrs.data(), ptrs.size() * sizeof(void*), st, out);
}

}  // namespace ssa::cuda
