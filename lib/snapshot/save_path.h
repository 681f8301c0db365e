// Where a full save writes: the file a path names (symbolic links followed, so a
// save through a link replaces the link's target and keeps the link), the
// temporary file beside it, and the removal of temporary files that writers
// killed mid-save left behind.
#pragma once

#include <stdint.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ssa::snap {

// The path of the file `path` designates: its last component's symbolic links
// followed (at most 40), relative targets taken beside the link. The file need
// not exist; SSA_ERR_IO when it exists and is not a regular file, or on a loop.
absl::StatusOr<std::string> resolve_save_target(const std::string& path);

// The last component of a path.
std::string base_name(const std::string& path);

// "<target>.tmp.<host>.<pid>.<n>": the writer's host and process are in the name
// so that a later save can tell a dead writer's file from a live one's.
std::string temp_name(const std::string& target, uint64_t n);

// Removes the temporary files of `target` whose writer ran on this host and is
// no longer alive (best effort; errors are ignored). Returns how many it removed.
int remove_stale_temps(const std::string& target);

}  // namespace ssa::snap
