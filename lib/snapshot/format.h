// The on-disk layout of a libssa snapshot file (docs/SNAPSHOT_FORMAT.md is the
// normative description; this header is its code form). All integers are
// little-endian; the library only builds on little-endian hosts, so page bytes are
// written verbatim and integers are copied with memcpy.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ssa.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the snapshot format stores little-endian data verbatim");

namespace ssa::snap {

// Current format version. Readers accept versions 1..kFormatVersion.
// Version 2 gives the config's word at offset 52 a meaning (the proxy) and puts
// the OPQ rotation after the centroids of a codebooks section. Version 3 adds
// the 4-bit proxies (values 2 and 3 of that word; code pages of two codes per
// byte), the query-aware proxies 4 and 5 (transforms and query moments in the
// codebooks section) and the config's float at offset 80 (pq_parallel_weight).
// Version 4 adds the recent queries after the query moments of a query-aware
// codebooks section. Version 5 adds the queries section: what a layer has been
// shown beyond what its codebooks were trained from (before 5, those queries
// were not saved).
inline constexpr uint32_t kFormatVersion = 5;

inline constexpr char kMagic[8] = {'\x89', 'S', 'S', 'A', 'S', 'N', 'P', '\n'};
inline constexpr char kTableMagic[8] = {'S', 'S', 'A', 'T', 'A', 'B', 'L', 'E'};

// The file starts with a 4096-byte header area holding two superblock slots.
inline constexpr uint64_t kHeaderAreaBytes = 4096;
inline constexpr uint64_t kSlotOffset[2] = {0, 2048};
inline constexpr uint32_t kSuperblockBytes = 128;  // v1 header length
inline constexpr uint32_t kMaxHeaderBytes = 2048;  // any version fits a slot

// Minimum alignment of every section; KV page runs use kKvAlign so each mapped
// run starts on its own OS page.
inline constexpr uint64_t kSectionAlign = 64;
inline constexpr uint64_t kKvAlign = 4096;

// Header flags: the low 16 bits are "incompatible" features a reader must know;
// the high 16 bits may be ignored. Version 1 defines none.
inline constexpr uint32_t kIncompatibleFlagsMask = 0xffffu;

enum class SectionKind : uint32_t {
  kConfig = 1,     // session config and model fingerprint (exactly one)
  kLayers = 2,     // per-layer token counts and index state (exactly one)
  kKvPages = 3,    // a run of whole KV pages of one layer
  kCodePages = 4,  // a run of whole PQ code pages of one layer
  kCodebooks = 5,  // the PQ codebooks of one layer (at most one per layer)
  kMetadata = 6,   // user metadata bytes (at most one)
  kShard = 7,      // the file is one rank's part of a group's snapshot (at most one)
  kKvRows = 8,     // rows [first, first + count) of one layer's KV pages (row_runs.h)
  kCodeRows = 9,   // rows [first, first + count) of one layer's code pages
  kQueries = 10,   // the queries one layer was shown, where its codebooks do not hold them (at most one per layer)
};
inline constexpr uint32_t kLastKnownKind = 10;
const char* section_kind_name(uint32_t kind);

// Section flag: a reader that does not know the section's kind may skip it.
inline constexpr uint32_t kSectionOptional = 1u;
inline constexpr uint32_t kNoLayer = 0xffffffffu;

// The slot generation g is committed to: a full save writes generation 1 to slot
// 0, and each checkpoint writes the slot not holding the current generation.
inline constexpr uint32_t slot_for_generation(uint64_t g) { return static_cast<uint32_t>((g + 1) % 2); }

// Superblock, 128 bytes in version 1 (header_length says how long).
struct Superblock {
  uint32_t format_version = kFormatVersion;
  uint32_t header_length = kSuperblockBytes;
  uint32_t flags = 0;
  uint32_t slot = 0;
  uint64_t generation = 0;    // 1 for a full save, +1 per checkpoint
  uint64_t table_offset = 0;
  uint64_t table_length = 0;
  uint64_t table_xxh3 = 0;
  uint64_t file_length = 0;   // bytes in use at commit (the file may be longer)
  uint64_t file_id = 0;       // random per full save; checkpoints keep it
};
// Byte offsets inside a slot.
inline constexpr size_t kSbVersionOff = 8, kSbHeaderLenOff = 12, kSbFlagsOff = 16,
                        kSbSlotOff = 20, kSbGenerationOff = 24, kSbTableOffsetOff = 32,
                        kSbTableLengthOff = 40, kSbTableHashOff = 48, kSbFileLengthOff = 56,
                        kSbFileIdOff = 64;

void encode_superblock(const Superblock& sb, uint8_t out[kSuperblockBytes]);

// One section table entry, 64 bytes.
struct SectionEntry {
  uint32_t kind = 0;
  uint32_t layer = kNoLayer;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint32_t alignment = kSectionAlign;
  uint32_t flags = 0;
  uint64_t xxh3 = 0;
  uint64_t first = 0;  // first page index (page runs)
  uint64_t count = 0;  // pages in the run (page runs)
};
inline constexpr uint32_t kEntryBytes = 64;
inline constexpr uint32_t kTableHeaderBytes = 64;

// The table: 64-byte header (magic, n_sections, entry size, generation, file id)
// followed by n_sections entries.
std::string encode_table(const std::vector<SectionEntry>& entries, uint64_t generation,
                         uint64_t file_id);
SectionEntry decode_entry(const uint8_t* p);

// Config section, 128 bytes in version 1.
inline constexpr uint32_t kConfigBytes = 128;
// Layers section: one 32-byte record per layer.
inline constexpr uint32_t kLayerRecordBytes = 32;
inline constexpr uint32_t kLayerHasCodebooks = 1u;
// Codebooks section: 16-byte header (n_kv_heads, subspaces, centroids, sub_dim),
// the centroids, then (SSA_PROXY_OPQ, _OPQ4) the rotations [n_kv_heads][d][d],
// or (SSA_PROXY_QPQ, _QPQ4) the key transforms and the query transforms (each
// [n_kv_heads][d][d] f32), the query counts [n_kv_heads] u64 and the query
// moment sums [n_kv_heads][d][d] f64 they were learned from, then (version >= 4)
// the recent query counts [n_kv_heads] u64 and the recent queries
// [n_kv_heads][kRecentQueries][d] f32 (store/query_moments.h).
inline constexpr uint32_t kCodebooksHeaderBytes = 16;
inline constexpr size_t kConfigProxyOff = 52;   // version >= 2; reserved (ignored) in 1
inline constexpr size_t kConfigWeightOff = 80;  // version >= 3; reserved (ignored) before

// Config section body (kConfigBytes) and its inverse for a file of
// format_version. decode_config checks that kv_dtype and proxy name known values
// (an enum is never loaded from an unchecked integer); the caller validates the
// other values (validate_session_config).
void encode_config(const ssa_session_config& cfg, uint64_t kv_page_bytes,
                   uint64_t code_page_bytes, uint8_t out[kConfigBytes]);
absl::Status decode_config(const uint8_t in[kConfigBytes], uint32_t format_version,
                           ssa_session_config* cfg, uint64_t* kv_page_bytes,
                           uint64_t* code_page_bytes);
// Bytes of a codebooks section for cfg (head_dim = pq_subspaces * sub_dim) in a
// file of format_version.
uint64_t codebooks_section_bytes(const ssa_session_config& cfg, uint32_t format_version);
// Bytes of the observed queries (counts, moment sums, recent counts, recent
// queries) for cfg's shape: the tail of a version 4+ query-aware codebooks
// section, and the whole of a queries section.
uint64_t query_moments_bytes(const ssa_session_config& cfg);

// Shard section (64 bytes): u64 set_id, u32 rank, u32 n_ranks, u64
// shard_tokens, 40 reserved zero bytes. The file holds the pages of the tokens
// rank `rank` of n_ranks keeps (lib/shard/shard_map.h, held_tokens) and no others;
// its layers section gives the whole session's lengths. set_id names the save
// the file belongs to, as its manifest does (lib/snapshot/group_manifest.h).
inline constexpr uint32_t kShardBytes = 64;
struct ShardInfo {
  uint64_t set_id = 0;
  uint32_t rank = 0, n_ranks = 0;
  uint64_t shard_tokens = 0;
};
void encode_shard(const ShardInfo& s, uint8_t out[kShardBytes]);
ShardInfo decode_shard(const uint8_t in[kShardBytes]);

inline void put_u32(uint8_t* p, uint32_t v) { memcpy(p, &v, 4); }
inline void put_u64(uint8_t* p, uint64_t v) { memcpy(p, &v, 8); }
inline uint32_t get_u32(const uint8_t* p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
inline uint64_t get_u64(const uint8_t* p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

inline uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace ssa::snap
