// libFuzzer target: any bytes as a snapshot file, loaded plainly, verified, mapped
// and inspected. A load either fails with a status and message or yields a session
// that every method decodes in bounds, with finite outputs unless its K/V pages
// are mapped unchecked. Built twice: with libFuzzer's byte mutations, and with the
// structure-aware mutator (snapshot_struct_mutator.cc) that reseals checksums.
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>

#include "support/loaded_session_check.h"
#include "support/snapshot_helpers.h"

namespace {

struct Env {
  ssa_test::RuntimePtr rt = ssa::test::make_runtime(1);
  int fd = memfd_create("snapshot", 0);
  std::string path = "/proc/self/fd/" + std::to_string(fd);
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Env env;
  if (env.fd < 0) return 0;
  if (ftruncate(env.fd, 0) != 0) return 0;
  if (size > 0 && pwrite(env.fd, data, size, 0) != static_cast<ssize_t>(size)) return 0;

  ssa_snapshot_info info{};
  info.struct_size = sizeof info;
  const absl::Status inspected = ssa::snapshot_inspect(env.path.c_str(), &info);
  for (uint32_t flags : {0u, SSA_LOAD_VERIFY, SSA_LOAD_MMAP}) {
    absl::StatusOr<std::unique_ptr<ssa_session>> s = ssa::snapshot_load(env.rt.get(), env.path.c_str(), flags);
    if (!s.ok()) {
      const ssa_status st = ssa::status_code(s.status());
      if (s.status().message().empty() || (st != SSA_ERR_CORRUPT && st != SSA_ERR_VERSION)) __builtin_trap();
      continue;
    }
    if (!inspected.ok()) __builtin_trap();  // inspect must accept what load accepts
    const std::string bad = ssa::test::check_loaded_session(**s, flags != SSA_LOAD_MMAP);
    if (!bad.empty()) {
      fprintf(stderr, "loaded session fails: %s\n", bad.c_str());
      __builtin_trap();
    }
  }
  return 0;
}
