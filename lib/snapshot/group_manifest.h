// The manifest of a group's snapshot (docs/SNAPSHOT_FORMAT.md, "Group
// snapshots"): the small file at the path a group saved to, naming the one
// snapshot file each rank wrote beside it and pinning each file's exact content
// (file id, generation, length, section table hash). A group's save commits by
// renaming its manifest into place; every value read from one is checked
// before it is used.
#pragma once

#include <stdint.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ssa::snap {

inline constexpr char kManifestMagic[8] = {'\x89', 'S', 'S', 'A', 'G', 'R', 'P', '\n'};
inline constexpr uint32_t kManifestVersion = 1;
inline constexpr uint32_t kManifestHeaderBytes = 64;
inline constexpr uint32_t kManifestRecordBytes = 320;
inline constexpr uint32_t kMaxRankFileName = 255;  // NAME_MAX
inline constexpr uint32_t kMaxManifestRanks = 64;

struct RankFile {
  std::string name;  // a file name in the manifest's directory (no '/')
  uint64_t file_id = 0, generation = 0, file_length = 0, table_xxh3 = 0;
};

struct Manifest {
  uint64_t set_id = 0;        // also in every rank file's shard section; never 0
  uint64_t shard_tokens = 0;  // the group's; a positive multiple of 8192
  std::vector<RankFile> ranks;  // rank r's file at r; 1..64 of them
};

// The file's bytes: header, one record per rank, then the XXH3-64 of all before it.
std::string encode_manifest(const Manifest& m);

// Whether the bytes start like a manifest (then decode_manifest says if it is one).
bool is_manifest(const uint8_t* head, size_t n);

// Checks and decodes a manifest read from `path` (for messages):
// SSA_ERR_CORRUPT for anything malformed, SSA_ERR_VERSION for another version.
absl::StatusOr<Manifest> decode_manifest(const std::string& bytes, const std::string& path);

// The most bytes a manifest can have.
inline constexpr uint64_t kMaxManifestBytes =
    kManifestHeaderBytes + uint64_t{kMaxManifestRanks} * kManifestRecordBytes + 8;

// "<manifest file name>.<set_id, 16 hex digits>.rank<r>": the name of rank r's
// file of the set saved as `manifest_name`.
std::string rank_file_name(const std::string& manifest_name, uint64_t set_id, uint32_t rank);

// Whether `name` is a rank file of a set saved as `manifest_name` other than
// set `keep` (a leftover of an earlier save, which the next save removes).
bool is_other_rank_file(const std::string& name, const std::string& manifest_name, uint64_t keep);

}  // namespace ssa::snap
