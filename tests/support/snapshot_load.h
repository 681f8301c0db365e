// Loading a snapshot in a doctest test: the session, or a failed check naming
// the load's error (and null).
#pragma once

#include <stdint.h>

#include <memory>
#include <string>

#include <doctest/doctest.h>
#include "snapshot/snapshot.h"

namespace ssa::test {

inline std::unique_ptr<ssa_session> load_ok(ssa_runtime* rt, const std::string& path, uint32_t flags) {
  absl::StatusOr<std::unique_ptr<ssa_session>> s = snapshot_load(rt, path.c_str(), flags);
  if (!s.ok()) {
    FAIL_CHECK("load failed: " << s.status().message());
    return nullptr;
  }
  return *std::move(s);
}

}  // namespace ssa::test
