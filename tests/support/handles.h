// Owning handles over the public C API for tests and the fuzzer: a failed call
// throws with its status and ssa_last_error_message(), so a test reports what
// the library said instead of a null handle later.
#pragma once

#include <stdint.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "config.h"
#include "ssa.h"

#define SSA_CHECK_OK(expr)                                                                   \
  do {                                                                                       \
    const ssa_status st_ = (expr);                                                           \
    if (st_ != SSA_OK)                                                                       \
      throw std::runtime_error(std::string(#expr) + ": " + ssa_status_string(st_) + ": " +   \
                               ssa_last_error_message());                                    \
  } while (0)

namespace ssa_test {

struct RuntimeDeleter {
  void operator()(ssa_runtime* r) const { ssa_runtime_destroy(r); }
};
struct SessionDeleter {
  void operator()(ssa_session* s) const { ssa_session_destroy(s); }
};
using RuntimePtr = std::unique_ptr<ssa_runtime, RuntimeDeleter>;
using SessionPtr = std::unique_ptr<ssa_session, SessionDeleter>;

inline RuntimePtr make_runtime(int threads = 2, uint64_t seed = 1234,
                               ssa_backend backend = SSA_BACKEND_CPU) {
  ssa_runtime_options o = runtime_options(backend, threads);
  o.seed = seed;
  ssa_runtime* rt = nullptr;
  SSA_CHECK_OK(ssa_runtime_create(&o, &rt));
  return RuntimePtr(rt);
}

inline SessionPtr make_session(ssa_runtime* rt, const ssa_session_config& c) {
  ssa_session* s = nullptr;
  SSA_CHECK_OK(ssa_session_create(rt, &c, &s));
  return SessionPtr(s);
}

}  // namespace ssa_test
