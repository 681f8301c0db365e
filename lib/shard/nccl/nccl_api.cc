#include "nccl_api.h"

#include <dlfcn.h>

#include <string>

#include "status.h"

namespace ssa {
namespace {

// The sonames tried, the versioned one first (what a caller's NCCL is loaded as).
constexpr const char* kNames[] = {"libnccl.so.2", "libnccl.so"};

absl::StatusOr<NcclApi> load() {
  void* h = nullptr;
  for (const char* name : kNames) {
    h = dlopen(name, RTLD_NOW | RTLD_NOLOAD);  // the caller's, already loaded
    if (h != nullptr) break;
  }
  for (size_t i = 0; h == nullptr && i < sizeof kNames / sizeof kNames[0]; ++i) h = dlopen(kNames[i], RTLD_NOW);
  if (h == nullptr) {
    return unsupported("an NCCL communicator was given but no NCCL library (libnccl.so.2) is loaded in the "
                       "process or can be opened");
  }
  NcclApi api{};
  std::string missing;
  auto sym = [&](auto* fn, const char* name) {
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(h, name));
    if (*fn == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name;
  };
  sym(&api.CommUserRank, "ncclCommUserRank");
  sym(&api.CommCount, "ncclCommCount");
  sym(&api.CommCuDevice, "ncclCommCuDevice");
  sym(&api.CommGetAsyncError, "ncclCommGetAsyncError");
  sym(&api.CommAbort, "ncclCommAbort");
  sym(&api.AllReduce, "ncclAllReduce");
  sym(&api.AllGather, "ncclAllGather");
  sym(&api.GetErrorString, "ncclGetErrorString");
  if (!missing.empty()) return unsupported("the process's NCCL library lacks ", missing);
  return api;  // the handle stays open: the functions are used for the process's life
}

}  // namespace

absl::StatusOr<const NcclApi*> nccl_api() {
  static const absl::StatusOr<NcclApi> api = load();
  if (!api.ok()) return api.status();
  return &*api;
}

}  // namespace ssa
