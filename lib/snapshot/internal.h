// Pieces shared by the snapshot writer and reader (not part of snapshot.h).
#pragma once

#include <stdint.h>
#include <sys/stat.h>

#include <string>

#include "absl/status/status.h"
#include "snapshot/format.h"
#include "snapshot/record.h"

namespace ssa::snap {

// Reads both superblock slots of an open snapshot file and returns the valid one
// with the highest generation; then fstats the file into *st and checks the
// superblock's fields against its size. SSA_ERR_CORRUPT / SSA_ERR_VERSION with a
// message.
absl::Status read_superblock(int fd, const std::string& path, Superblock* sb, struct stat* st);

// Hashes a mapped section that was not verified at load, once; SSA_ERR_CORRUPT if
// it does not match. Called before page bytes from a mapping are copied into
// another snapshot, so a damaged mapping never silently propagates.
absl::Status verify_mapped_page(const SnapshotState& st, const uint8_t* data);

// SSA_ERR_INVALID_ARGUMENT unless path is a non-empty string.
absl::Status check_path(const char* path);

}  // namespace ssa::snap
