#include "snapshot/group_snapshot.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <xxhash.h>

#include <mutex>
#include <new>
#include <shared_mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "decode/decode_step.h"
#include "index/query_transform.h"
#include "shard/callback_collective.h"
#include "shard/group_call_check.h"
#include "snapshot/file_io.h"
#include "snapshot/format.h"
#include "snapshot/group_manifest.h"
#include "snapshot/internal.h"
#include "snapshot/save_path.h"
#include "status.h"

namespace ssa {
namespace {

// What every rank's copy of a group's session shares (all but the pages):
// config, layer lengths, index state and codebooks, observed queries, metadata.
// Caller holds s.mu.
uint64_t content_hash(const ssa_session& s) {
  XXH3_state_t* h = XXH3_createState();
  if (h == nullptr) throw std::bad_alloc();
  XXH3_64bits_reset(h);
  uint8_t cfg[snap::kConfigBytes];
  snap::encode_config(s.config, s.layout.kv_page_bytes(), s.layout.code_page_bytes(), cfg);
  XXH3_64bits_update(h, cfg, sizeof cfg);
  for (const LayerStore& l : s.layers) {
    const uint64_t rec[3] = {l.n_tokens, l.codebooks != nullptr ? l.trained_at_tokens : 0, l.codebooks != nullptr};
    XXH3_64bits_update(h, rec, sizeof rec);
    if (l.codebooks != nullptr) {
      XXH3_64bits_update(h, l.codebooks->data.data(), l.codebooks->data.size() * sizeof(float));
      XXH3_64bits_update(h, l.codebooks->rotation.data(), l.codebooks->rotation.size() * sizeof(float));
      XXH3_64bits_update(h, l.codebooks->query_transform.data(),
                         l.codebooks->query_transform.size() * sizeof(float));
      const uint64_t moments = query_moments_hash(l.codebooks->trained_moments.get());
      XXH3_64bits_update(h, &moments, sizeof moments);
    }
    const uint64_t shown = query_moments_hash(l.query_moments.get());
    XXH3_64bits_update(h, &shown, sizeof shown);
  }
  XXH3_64bits_update(h, s.metadata.data(), s.metadata.size());
  const uint64_t v = XXH3_64bits_digest(h);
  XXH3_freeState(h);
  return v;
}

// Writes the manifest to target atomically (temporary, fsync, rename, fsync of
// the directory). *renamed: the new manifest is at target (a failure after it
// is the directory's fsync: the set is in place, its durability in question).
absl::Status write_manifest(const std::string& target, const std::string& bytes, bool* renamed) {
  static std::atomic<uint64_t> counter{0};
  const snap::FileIo& io = snap::file_io();
  const std::string tmp = snap::temp_name(target, counter.fetch_add(1));
  const int fd = io.open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return snap::io_error("cannot create temporary manifest file", tmp, errno);
  snap::FdGuard guard(fd);
  absl::Status st = snap::pwrite_all(fd, bytes.data(), bytes.size(), 0, tmp);
  if (st.ok()) st = snap::fsync_fd(fd, tmp);
  guard.reset();
  if (st.ok() && io.rename(tmp.c_str(), target.c_str()) != 0) {
    st = make_error(SSA_ERR_IO, absl::StrCat("cannot rename '", tmp, "' to '", target, "': ", strerror(errno)));
  }
  if (!st.ok()) {
    io.unlink(tmp.c_str());
    return st;
  }
  *renamed = true;
  (void)snap::remove_stale_temps(target);
  return snap::fsync_parent_dir(target);
}

// Removes the rank files of earlier saves to the manifest `base` in `dir`
// (best effort: a file another rank removed first is no error).
void remove_other_rank_files(const std::string& dir, const std::string& base, uint64_t keep) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  std::vector<std::string> old;
  while (const dirent* e = readdir(d)) {
    if (snap::is_other_rank_file(e->d_name, base, keep)) old.push_back(dir + "/" + e->d_name);
  }
  closedir(d);
  for (const std::string& p : old) snap::file_io().unlink(p.c_str());
}

absl::Status save_locked(ssa_session& s, ProcessGroup& g, const std::string& path) {
  static const char* const kNames[kSummaryFields] = {
      "snapshot path",
      "session (lengths, index or metadata: every rank must make the same calls on it)", nullptr, nullptr,
      nullptr, nullptr, nullptr, nullptr};
  // Where the files go; a path this rank cannot use fails the call on every rank.
  absl::Status local;
  std::string target, dir, base;
  absl::StatusOr<std::string> resolved = snap::resolve_save_target(path);
  if (!resolved.ok()) {
    local = resolved.status();
  } else {
    target = *resolved;
    dir = snap::parent_dir(target);
    base = snap::base_name(target);
    const size_t longest = snap::rank_file_name(base, UINT64_MAX, g.size() - 1).size();
    if (longest > snap::kMaxRankFileName) {
      local = invalid_argument("snapshot file name '", base, "' is too long for a group's save (its rank files' names, ",
                               longest, " bytes, exceed ", snap::kMaxRankFileName, ")");
    }
  }
  CallSummary mine;
  mine.kind = static_cast<uint64_t>(GroupCall::kSave);
  mine.field[0] = XXH3_64bits(path.data(), path.size());
  try {
    mine.field[1] = content_hash(s);
  } catch (const std::bad_alloc&) {
    if (local.ok()) local = make_error(SSA_ERR_OUT_OF_MEMORY, "out of memory hashing the session");
  }
  SSA_RETURN_IF_ERROR(begin_call(g, mine, local, kNames));

  // The set's id: rank 0's.
  const uint64_t proposal = g.rank() == 0 ? snap::random_id() : 0;
  std::vector<uint64_t> ids(g.size());
  SSA_RETURN_IF_ERROR(g.all_gather(&proposal, sizeof proposal, ids.data()));
  const uint64_t set_id = ids[0];

  const std::string name = snap::rank_file_name(base, set_id, g.rank());
  const std::string file = dir + "/" + name;
  snap::ShardInfo shard;
  shard.set_id = set_id;
  shard.rank = g.rank();
  shard.n_ranks = g.size();
  shard.shard_tokens = s.rt->shard_tokens;
  snap::RankFile mine_file;
  absl::Status wrote;
  try {
    wrote = write_rank_file(s, file, absl::StrCat(target, ".rank", g.rank()), shard, s.rt->own, &mine_file);
  } catch (const std::bad_alloc&) {
    wrote = make_error(SSA_ERR_OUT_OF_MEMORY, "out of memory writing a rank's snapshot file");
  }
  struct Result {
    uint64_t status, file_id, generation, file_length, table_xxh3;
  };
  const Result res{wrote.ok() ? 0 : static_cast<uint64_t>(status_code(wrote)), mine_file.file_id,
                   mine_file.generation, mine_file.file_length, mine_file.table_xxh3};
  std::vector<Result> all(g.size());
  absl::Status st = g.all_gather(&res, sizeof res, all.data());
  auto drop_mine = [&] {
    if (wrote.ok()) snap::file_io().unlink(file.c_str());
  };
  if (!st.ok()) {
    drop_mine();
    return st;
  }
  if (!wrote.ok()) return wrote;
  for (uint32_t r = 0; r < g.size(); ++r) {
    if (all[r].status == 0) continue;
    drop_mine();
    return make_error(static_cast<ssa_status>(all[r].status),
                      absl::StrCat("save of a group: rank ", r, " could not write its file (",
                                   ssa_status_string(static_cast<ssa_status>(all[r].status)),
                                   ", its message is on that rank); the previous snapshot at '", path,
                                   "' is unchanged"));
  }
  // Rank 0 commits the set.
  absl::Status committed;
  bool renamed = false;
  if (g.rank() == 0) {
    snap::Manifest m;
    m.set_id = set_id;
    m.shard_tokens = s.rt->shard_tokens;
    m.ranks.resize(g.size());
    for (uint32_t r = 0; r < g.size(); ++r) {
      snap::RankFile& f = m.ranks[r];
      f.name = snap::rank_file_name(base, set_id, r);
      f.file_id = all[r].file_id;
      f.generation = all[r].generation;
      f.file_length = all[r].file_length;
      f.table_xxh3 = all[r].table_xxh3;
    }
    try {
      committed = write_manifest(target, snap::encode_manifest(m), &renamed);
    } catch (const std::bad_alloc&) {
      committed = make_error(SSA_ERR_OUT_OF_MEMORY, "out of memory writing a group's manifest");
    }
  }
  struct Commit {
    uint64_t status, renamed;
  };
  const Commit c{committed.ok() ? 0 : static_cast<uint64_t>(status_code(committed)), renamed ? 1u : 0u};
  std::vector<Commit> commits(g.size());
  st = g.all_gather(&c, sizeof c, commits.data());
  if (!st.ok()) return st;  // the rank files stay: the manifest may name them
  if (commits[0].status != 0) {
    // Not renamed: the previous set is at path, these files are nobody's.
    // Renamed: the new set is at path, its directory maybe not durable.
    if (commits[0].renamed == 0) drop_mine();
    if (g.rank() == 0) return committed;
    return make_error(static_cast<ssa_status>(commits[0].status),
                      absl::StrCat("save of a group: rank 0 could not commit the manifest (",
                                   ssa_status_string(static_cast<ssa_status>(commits[0].status)),
                                   ", its message is on rank 0); ",
                                   commits[0].renamed != 0 ? "the new snapshot is in place, its durability unsure"
                                                           : "the previous snapshot is unchanged"));
  }
  remove_other_rank_files(dir, base, set_id);
  return absl::OkStatus();
}

}  // namespace

absl::Status group_save(ssa_session& s, const char* path) {
  SSA_RETURN_IF_ERROR(snap::check_path(path));
  SSA_RETURN_IF_ERROR(session_settle(s, true));
  std::lock_guard snap_lock(s.snapshot_mu);
  std::shared_lock lock(s.mu);
  ProcessGroup& g = *s.rt->group;
  std::lock_guard<std::mutex> call(g.call_mutex());
  return save_locked(s, g, path);
}

absl::StatusOr<std::unique_ptr<ssa_session>> finish_group_load(ssa_runtime& rt,
                                                               absl::StatusOr<std::unique_ptr<ssa_session>> local) {
  static const char* const kNames[kSummaryFields] = {
      "loaded session (every rank must load the same snapshot)", nullptr, nullptr, nullptr,
      nullptr, nullptr, nullptr, nullptr};
  ProcessGroup& g = *rt.group;
  CallSummary mine;
  mine.kind = static_cast<uint64_t>(GroupCall::kLoad);
  absl::Status st = local.status();
  if (st.ok()) {
    try {
      std::shared_lock lock((*local)->mu);
      mine.field[0] = content_hash(**local);
    } catch (const std::bad_alloc&) {
      st = make_error(SSA_ERR_OUT_OF_MEMORY, "out of memory hashing a loaded session");
    }
  }
  std::lock_guard<std::mutex> call(g.call_mutex());
  SSA_RETURN_IF_ERROR(begin_call(g, mine, st, kNames));
  return local;
}

}  // namespace ssa
