// Snapshots: full atomic saves, incremental checkpoints, loads (read or mapped)
// and inspection of a snapshot file. The file format is in format.h and
// docs/SNAPSHOT_FORMAT.md; the C API (lib/c_api.cc) calls these.
#pragma once

#include <stdint.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "session.h"
#include "ssa.h"

namespace ssa {

// Writes the whole session to path: temp file in the same directory, write,
// fsync, rename over path, fsync the directory. Takes s.mu as a reader.
absl::Status snapshot_save(ssa_session& s, const char* path);

// Appends what changed since this session was last saved/checkpointed to (or
// loaded from) path and commits by rewriting one superblock slot; falls back to
// snapshot_save when path does not hold that snapshot any more.
absl::Status snapshot_checkpoint(ssa_session& s, const char* path);

// Builds a new session on rt from the snapshot at path. flags: SSA_LOAD_VERIFY,
// SSA_LOAD_MMAP. Nothing is returned unless the whole session was restored.
absl::StatusOr<std::unique_ptr<ssa_session>> snapshot_load(ssa_runtime* rt, const char* path,
                                                           uint32_t flags);

// As snapshot_load, and SSA_ERR_MISMATCH unless the snapshot's model fingerprint
// and shape equal `expected` (checked before any page is read). expected may be null.
absl::StatusOr<std::unique_ptr<ssa_session>> snapshot_load_checked(
    ssa_runtime* rt, const char* path, uint32_t flags, const ssa_session_config* expected);

// Reads the superblocks, the section table and the small sections (config,
// layers, metadata), verifying their checksums, and fills *info up to
// info->struct_size bytes.
absl::Status snapshot_inspect(const char* path, ssa_snapshot_info* info);

// User metadata stored with the session and saved in its snapshots.
absl::Status session_set_metadata(ssa_session& s, const void* bytes, size_t n);
absl::Status session_get_metadata(const ssa_session& s, void* buf, size_t cap, size_t* n_out);

inline constexpr size_t kMaxMetadataBytes = size_t{64} << 20;

}  // namespace ssa
