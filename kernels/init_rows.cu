// The rows' initial states, the first stage of a decode (decode_pipeline.cu)
// unless the PQ lookup-table kernel does it (pq_score.cu).
#include <algorithm>

#include "row_init.cuh"
#include "stage_launch.cuh"
#include "stages.h"

namespace ssa::cuda {
namespace {

// One block per item: the row states of its selection heads, and its rows' top-k
// histograms and compaction counts zeroed (saves memset launches per decode).
// With the PQ proxy the lookup-table kernel does this instead (one launch fewer).
__global__ void init_rows_kernel(const __grid_constant__ DecodeBatch b, Workspace ws, bool sparse) {
  stage_begin();
  const uint32_t item = blockIdx.x;
  const uint32_t h = threadIdx.x;
  const uint32_t ns = b.sel_heads();
  if (sparse)
    for (uint32_t hh = 0; hh < ns; ++hh) clear_row_sums(ws, row_of(item, hh, ns), b.n_items * ns);
  if (h >= ns) return;
  ws.rows[row_of(item, h, ns)] = initial_row(b, b.item(item));
}

}  // namespace

cudaError_t launch_init_rows(const DecodeBatch& b, const WorkspacePlan& plan, const Workspace& ws,
                             cudaStream_t st) {
  // build_lut_kernel does it, unless its rows are the mixture's scratch rows.
  if (b.proxy == Proxy::kPq && b.group != GroupProposal::kMixture) return cudaSuccess;
  const bool sparse = b.proxy != Proxy::kNone;
  const uint32_t threads = std::max(256u, (b.sel_heads() + 31) / 32 * 32);
  return launch_stage(b, init_rows_kernel, b.n_items, threads, 0, st, b, ws, sparse);
}

}  // namespace ssa::cuda
