// NCCL's functions, found at run time in the process rather than linked: a caller
// who passes an ncclComm_t has NCCL loaded already (its own copy: PyTorch ships
// one, a serving engine another), and the communicator must be driven by that
// same library. Linking libssa to the system's libnccl would load a second
// NCCL into such a process, which breaks the caller's (symbols resolve to the
// wrong copy). So the library is looked up by its soname among those already
// loaded (dlopen RTLD_NOLOAD), and only if none is loaded opened by that name.
#pragma once

#include <nccl.h>

#include "absl/status/statusor.h"

namespace ssa {

struct NcclApi {
  ncclResult_t (*CommUserRank)(const ncclComm_t, int*);
  ncclResult_t (*CommCount)(const ncclComm_t, int*);
  ncclResult_t (*CommCuDevice)(const ncclComm_t, int*);
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*);
  ncclResult_t (*CommAbort)(ncclComm_t);
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  const char* (*GetErrorString)(ncclResult_t);
};

// The process's NCCL (found once, then cached); SSA_ERR_UNSUPPORTED naming what
// is missing when no NCCL library can be found or lacks a function.
absl::StatusOr<const NcclApi*> nccl_api();

}  // namespace ssa
