// Snapshots of a session of a group of processes (docs/DISTRIBUTED.md): a save
// is a collective call in which every rank writes its own file (its shard's
// pages, in the ordinary format plus a shard section) beside the path, and rank
// 0 then commits the set by renaming its manifest (lib/snapshot/group_manifest.h)
// to the path; a load by a group's rank is a collective call that reads the
// pages of its own shard (from a set's rank files, or from one ordinary file)
// and checks with its peers that they loaded the same session.
#pragma once

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "session.h"

namespace ssa {

// ssa_session_save (and ssa_session_checkpoint, which is a full save for a
// group) of a session whose runtime is a group's rank. Every rank calls it
// with the same path. Exchanges: the call's summary (the path, the session's
// lengths, index and metadata), the set id, every rank's result, rank 0's
// manifest commit. On failure no rank's file or manifest is left in place of
// the previous set; on success the rank files of earlier saves to path are removed.
absl::Status group_save(ssa_session& s, const char* path);

// The end of a load by a group's rank: `local` is this rank's own load; every
// rank gets an error unless all loaded, and loaded the same session.
absl::StatusOr<std::unique_ptr<ssa_session>> finish_group_load(ssa_runtime& rt,
                                                               absl::StatusOr<std::unique_ptr<ssa_session>> local);

}  // namespace ssa
