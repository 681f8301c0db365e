// Pieces shared by the snapshot writer and reader (not part of snapshot.h).
#pragma once

#include <stdint.h>
#include <sys/stat.h>

#include <string>

#include "absl/status/status.h"
#include "snapshot/format.h"
#include "snapshot/group_manifest.h"
#include "snapshot/record.h"
#include "store/held_range.h"

struct ssa_session;

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

// A random non-zero 64-bit id (a full save's file id, a group save's set id).
uint64_t random_id();

// SSA_ERR_INVALID_ARGUMENT unless path is a non-empty string.
absl::Status check_path(const char* path);

}  // namespace ssa::snap

namespace ssa {

// One rank's file of a group's save (lib/snapshot/group_snapshot.cc): the
// session's pages in `held` and the shard section, written whole (temporary
// "<temp_base>.tmp...", fsync, rename over target, fsync of the directory).
// *out: what the manifest pins of it. Caller holds s.snapshot_mu and s.mu (shared).
absl::Status write_rank_file(ssa_session& s, const std::string& target, const std::string& temp_base,
                             const snap::ShardInfo& shard, const HeldRange& held, snap::RankFile* out);

}  // namespace ssa
