// Loading and inspecting snapshots. Every length and offset read from the file is
// checked against the file size before anything is allocated from it, and a
// session is handed out only once every part of it has been read and checked.
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <mutex>
#include <shared_mutex>
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "backend.h"
#include "index/proxy_kind.h"
#include "snapshot/content_check.h"
#include "snapshot/file_io.h"
#include "snapshot/format.h"
#include "snapshot/internal.h"
#include "snapshot/record.h"
#include "snapshot/row_runs.h"
#include "shard/shard_map.h"
#include "shard/shard_options.h"
#include "decode/fixed_splits.h"
#include "snapshot/group_manifest.h"
#include "snapshot/group_snapshot.h"
#include "snapshot/save_path.h"
#include "snapshot/snapshot.h"
#include "status.h"
#include "versioned_struct.h"

namespace ssa {

MappedSnapshot::~MappedSnapshot() {
  if (base != nullptr) snap::file_io().munmap(base, bytes);
}

namespace snap {
namespace {

template <typename... Args>
absl::Status corrupt(const std::string& path, const Args&... args) {
  return make_error(SSA_ERR_CORRUPT, absl::StrCat("snapshot '", path, "': ", args...));
}

}  // namespace

absl::Status read_superblock(int fd, const std::string& path, Superblock* out,
                             struct stat* st) {
  uint8_t area[kHeaderAreaBytes] = {};
  size_t n = 0;
  SSA_RETURN_IF_ERROR(pread_upto(fd, area, kHeaderAreaBytes, 0, path, &n));
  if (n == 0) return corrupt(path, "file is empty (0 bytes), not a snapshot");
  // Sized only now: a checkpoint writes its sections and table before the
  // superblock that points at them, and files only grow, so the file is at least
  // as long as any superblock already read says. (Sizing first made a commit
  // landing in between look like truncation.)
  if (file_io().fstat(fd, st) != 0) return io_error("cannot stat", path, errno);
  const uint64_t file_size = static_cast<uint64_t>(st->st_size);

  struct Candidate {
    bool valid = false;
    const uint8_t* p = nullptr;
    uint32_t header_length = 0;
  } cand[2];
  bool any_magic = false;
  std::string why[2];
  for (int i = 0; i < 2; ++i) {
    const uint64_t off = kSlotOffset[i];
    if (off + 16 > n) {
      why[i] = "lies beyond the end of the file";
      continue;
    }
    const uint8_t* p = area + off;
    if (memcmp(p, kMagic, sizeof kMagic) != 0) {
      why[i] = "has no magic";
      continue;
    }
    any_magic = true;
    const uint32_t hl = get_u32(p + kSbHeaderLenOff);
    if (hl < kSbFileIdOff + 16 || hl > kMaxHeaderBytes || off + hl > n) {
      why[i] = absl::StrCat("has an impossible header length ", hl);
      continue;
    }
    if (get_u64(p + hl - 8) != XXH3_64bits(p, hl - 8)) {
      why[i] = "fails its checksum";
      continue;
    }
    cand[i] = {true, p, hl};
  }
  if (!any_magic) {
    return corrupt(path, "not a libssa snapshot (bad magic; file is ", file_size, " bytes)");
  }
  int best = -1;
  for (int i = 0; i < 2; ++i) {
    if (!cand[i].valid) continue;
    if (best < 0 || get_u64(cand[i].p + kSbGenerationOff) > get_u64(cand[best].p + kSbGenerationOff))
      best = i;
  }
  if (best < 0) {
    return corrupt(path, "no valid superblock (slot 0 ", why[0], "; slot 1 ", why[1], ")");
  }
  const uint8_t* p = cand[best].p;
  Superblock sb;
  sb.format_version = get_u32(p + kSbVersionOff);
  sb.header_length = cand[best].header_length;
  sb.flags = get_u32(p + kSbFlagsOff);
  if (sb.format_version == 0 || sb.format_version > kFormatVersion) {
    return make_error(SSA_ERR_VERSION,
                      absl::StrCat("snapshot '", path, "' has format version ", sb.format_version,
                                   "; this library reads versions 1 to ", kFormatVersion));
  }
  if ((sb.flags & kIncompatibleFlagsMask) != 0) {
    return make_error(SSA_ERR_VERSION,
                      absl::StrCat("snapshot '", path, "' needs features (flags 0x",
                                   absl::Hex(sb.flags & kIncompatibleFlagsMask),
                                   ") this library does not know"));
  }
  if (sb.header_length != kSuperblockBytes) {
    return corrupt(path, "version 1 superblock has length ", sb.header_length);
  }
  sb.slot = get_u32(p + kSbSlotOff);
  sb.generation = get_u64(p + kSbGenerationOff);
  sb.table_offset = get_u64(p + kSbTableOffsetOff);
  sb.table_length = get_u64(p + kSbTableLengthOff);
  sb.table_xxh3 = get_u64(p + kSbTableHashOff);
  sb.file_length = get_u64(p + kSbFileLengthOff);
  sb.file_id = get_u64(p + kSbFileIdOff);
  if (sb.slot != static_cast<uint32_t>(best)) {
    return corrupt(path, "superblock in slot ", best, " says it belongs in slot ", sb.slot);
  }
  // Generation g lives in slot (g + 1) % 2, so the two slots never hold the same
  // generation and the newer one is never ambiguous.
  if (sb.generation == 0 || slot_for_generation(sb.generation) != sb.slot) {
    return corrupt(path, "superblock in slot ", best, " holds generation ", sb.generation,
                   ", which no writer puts in that slot");
  }
  if (sb.file_length > file_size) {
    return corrupt(path, "truncated: the snapshot spans ", sb.file_length,
                   " bytes but the file has ", file_size);
  }
  if (sb.table_offset < kHeaderAreaBytes || sb.table_offset % kSectionAlign != 0 ||
      sb.table_offset > sb.file_length || sb.table_length < kTableHeaderBytes ||
      sb.table_length > sb.file_length - sb.table_offset) {
    return corrupt(path, "section table at offset ", sb.table_offset, " length ",
                   sb.table_length, " does not fit the snapshot's ", sb.file_length, " bytes");
  }
  *out = sb;
  return absl::OkStatus();
}

absl::Status check_path(const char* path) {
  if (path == nullptr || path[0] == '\0') return invalid_argument("snapshot path is NULL or empty");
  return absl::OkStatus();
}

absl::Status verify_mapped_page(const SnapshotState& st, const uint8_t* data) {
  for (const auto& m : st.mappings) {
    if (data < m->base || data >= m->base + m->bytes) continue;
    const uint64_t off = static_cast<uint64_t>(data - m->base);
    auto it = std::upper_bound(m->sections.begin(), m->sections.end(), off,
                               [](uint64_t o, const MappedSnapshot::Section& s) { return o < s.offset; });
    if (it == m->sections.begin()) break;
    MappedSnapshot::Section& sec = *std::prev(it);
    if (off >= sec.offset + sec.length) break;
    if (sec.verified.load(std::memory_order_acquire)) return absl::OkStatus();
    if (XXH3_64bits(m->base + sec.offset, sec.length) != sec.xxh3) {
      return corrupt(m->path, "mapped KV section at offset ", sec.offset,
                     " fails its checksum (the file was damaged or changed after loading)");
    }
    sec.verified.store(true, std::memory_order_release);
    return absl::OkStatus();
  }
  return absl::OkStatus();
}

}  // namespace snap

namespace {

using snap::SectionEntry;
using snap::SectionKind;
using snap::corrupt;

constexpr uint32_t kNoSource = 0xffffffffu;

// Everything but the page contents, read and checked.
struct Parsed {
  std::string path;
  int fd = -1;
  uint64_t file_size = 0;
  dev_t dev = 0;
  ino_t ino = 0;
  snap::Superblock sb;
  std::vector<SectionEntry> entries;
  ssa_session_config cfg{};
  KvLayout layout;
  uint64_t kv_bytes = 0, code_bytes = 0;
  struct Layer {
    uint64_t n_tokens = 0, trained_at = 0;
    bool has_codebooks = false;
    int64_t codebooks_entry = -1;
    int64_t queries_entry = -1;  // the queries section (version 5), or -1
    std::vector<uint32_t> kv_src, code_src;  // winning entry per page
    std::vector<uint32_t> kv_row_runs, code_row_runs;  // row-run entries, in table order
    snap::RowPieces kv_rows, code_rows;  // pages that row runs give rows of (row_runs.h)
  };
  std::vector<Layer> layers;
  std::string metadata;
  int64_t config_entry = -1, layers_entry = -1, metadata_entry = -1, shard_entry = -1;
  uint64_t live_bytes = 0;
  // One rank's file of a group's snapshot (a shard section): which rank, and
  // the tokens whose pages it holds (all of them in any other file).
  bool has_shard = false;
  snap::ShardInfo shard;
  HeldRange held;
};

// The pages of a layer of n_tokens that `held` holds: [first, end).
std::pair<uint64_t, uint64_t> held_pages(const KvLayout& lay, const HeldRange& held, uint64_t n_tokens) {
  const uint64_t pages = lay.pages_for(n_tokens);
  const uint64_t first = std::min(pages, held.begin / lay.page_tokens);
  const uint64_t end = held.end == UINT64_MAX ? pages : std::min(pages, held.end / lay.page_tokens);
  return {first, std::max(first, end)};
}

std::string describe(const SectionEntry& e, size_t idx) {
  std::string s = absl::StrCat(snap::section_kind_name(e.kind), " section #", idx);
  if (e.layer != snap::kNoLayer) absl::StrAppend(&s, " (layer ", e.layer, ")");
  return s;
}

absl::Status run_checksum_error(const std::string& path, const SectionEntry& e, size_t idx) {
  return corrupt(path, describe(e, idx), " (pages ", e.first, "..", e.first + e.count - 1,
                 ") fails its checksum");
}

// Observed queries as the format stores them (snap::query_moments_bytes; before
// version 4 without the recent ones) at `at`, checked; null when no KV head
// was shown any (a layer shown none has no moments).
absl::StatusOr<QueryMomentsRef> read_query_moments(const uint8_t* at, uint32_t n_kv, uint32_t d, bool with_recent,
                                                   const std::string& path, uint32_t layer) {
  auto qm = std::make_shared<QueryMoments>();
  qm->n_kv_heads = n_kv;
  qm->head_dim = d;
  qm->count.resize(n_kv);
  memcpy(qm->count.data(), at, qm->count.size() * sizeof(uint64_t));
  at += qm->count.size() * sizeof(uint64_t);
  qm->sum.resize(size_t{n_kv} * d * d);
  memcpy(qm->sum.data(), at, qm->sum.size() * sizeof(double));
  at += qm->sum.size() * sizeof(double);
  if (with_recent) {
    qm->recent_count.resize(n_kv);
    memcpy(qm->recent_count.data(), at, qm->recent_count.size() * sizeof(uint64_t));
    at += qm->recent_count.size() * sizeof(uint64_t);
    qm->recent.resize(size_t{n_kv} * kRecentQueries * d);
    memcpy(qm->recent.data(), at, qm->recent.size() * sizeof(float));
  }
  SSA_RETURN_IF_ERROR(snap::check_query_moments(*qm, path, layer));
  bool any = false;
  for (const uint64_t c : qm->count) any |= c > 0;
  return any ? QueryMomentsRef(std::move(qm)) : QueryMomentsRef();
}

// Reads a whole section into memory and checks its hash.
absl::Status read_section(const Parsed& p, size_t idx, std::string* out) {
  const SectionEntry& e = p.entries[idx];
  out->resize(static_cast<size_t>(e.length));
  SSA_RETURN_IF_ERROR(snap::pread_exact(p.fd, out->data(), out->size(), e.offset, p.path));
  if (XXH3_64bits(out->data(), out->size()) != e.xxh3) {
    return corrupt(p.path, describe(e, idx), " fails its checksum");
  }
  return absl::OkStatus();
}

absl::Status check_expected(const Parsed& p, const ssa_session_config& x) {
  const ssa_session_config& c = p.cfg;
  auto mismatch = [&](const char* field, uint64_t want, uint64_t have) {
    return make_error(SSA_ERR_MISMATCH,
                      absl::StrCat("snapshot '", p.path, "' has ", field, " ", have,
                                   ", expected ", want));
  };
  if (c.model_fingerprint != x.model_fingerprint) {
    return make_error(SSA_ERR_MISMATCH,
                      absl::StrCat("snapshot '", p.path, "' has model fingerprint 0x",
                                   absl::Hex(c.model_fingerprint), ", expected 0x",
                                   absl::Hex(x.model_fingerprint)));
  }
  if (c.n_layers != x.n_layers) return mismatch("n_layers", x.n_layers, c.n_layers);
  if (c.n_q_heads != x.n_q_heads) return mismatch("n_q_heads", x.n_q_heads, c.n_q_heads);
  if (c.n_kv_heads != x.n_kv_heads) return mismatch("n_kv_heads", x.n_kv_heads, c.n_kv_heads);
  if (c.head_dim != x.head_dim) return mismatch("head_dim", x.head_dim, c.head_dim);
  // The caller's enum is read as the integer it holds: it may name no dtype.
  uint32_t want_dtype;
  static_assert(sizeof want_dtype == sizeof x.kv_dtype);
  memcpy(&want_dtype, &x.kv_dtype, sizeof want_dtype);
  if (static_cast<uint32_t>(c.kv_dtype) != want_dtype)
    return mismatch("kv_dtype", want_dtype, static_cast<uint32_t>(c.kv_dtype));
  if (c.pq_subspaces != x.pq_subspaces)
    return mismatch("pq_subspaces", x.pq_subspaces, c.pq_subspaces);
  if (c.pq_centroids != x.pq_centroids)
    return mismatch("pq_centroids", x.pq_centroids, c.pq_centroids);
  return absl::OkStatus();
}

// Maps the pages of a page-run section onto a layer's page sources.
absl::Status add_page_run(Parsed& p, size_t idx, size_t page_bytes,
                          std::vector<uint32_t> Parsed::Layer::*src) {
  const SectionEntry& e = p.entries[idx];
  if (e.count == 0 || e.length / page_bytes != e.count || e.length % page_bytes != 0) {
    return corrupt(p.path, describe(e, idx), " holds ", e.length, " bytes, not ", e.count,
                   " pages of ", page_bytes);
  }
  if (e.first > UINT64_MAX - e.count) {
    return corrupt(p.path, describe(e, idx), " has an impossible first page ", e.first);
  }
  std::vector<uint32_t>& dst = p.layers[e.layer].*src;
  const uint64_t end = std::min<uint64_t>(e.first + e.count, dst.size());
  for (uint64_t j = e.first; j < end; ++j) {
    if (!p.held.holds_page(j, p.layout.page_tokens)) {
      return corrupt(p.path, describe(e, idx), " holds page ", j, ", outside the shard of rank ", p.shard.rank,
                     " of ", p.shard.n_ranks, " this file is part of");
    }
    dst[j] = static_cast<uint32_t>(idx);
  }
  return absl::OkStatus();
}

// Reads the section table, checking its header against the superblock before
// anything sized by it is allocated, and each entry against the file as it is
// read, so a damaged table fails after one chunk rather than after reading
// everything it claims.
absl::Status read_table(Parsed* p) {
  const snap::Superblock& sb = p->sb;
  const std::string& path = p->path;
  uint8_t hdr[snap::kTableHeaderBytes];
  SSA_RETURN_IF_ERROR(snap::pread_exact(p->fd, hdr, sizeof hdr, sb.table_offset, path));
  const uint64_t n_sections = snap::get_u32(hdr + 8);
  if (memcmp(hdr, snap::kTableMagic, 8) != 0 || snap::get_u32(hdr + 12) != snap::kEntryBytes ||
      sb.table_length != snap::kTableHeaderBytes + n_sections * snap::kEntryBytes ||
      snap::get_u64(hdr + 16) != sb.generation || snap::get_u64(hdr + 24) != sb.file_id) {
    return corrupt(path, "section table header does not match its superblock");
  }
  // Sections are non-empty, 64-byte aligned and (the known kinds) disjoint, all
  // before the table: at most one per 64 bytes of that area.
  const uint64_t area = sb.table_offset - snap::kHeaderAreaBytes;
  if (n_sections > area / snap::kSectionAlign) {
    return corrupt(path, "section table lists ", n_sections, " sections; the ", area,
                   " bytes before it hold at most ", area / snap::kSectionAlign);
  }
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> hash(XXH3_createState(),
                                                                XXH3_freeState);
  if (!hash) return make_error(SSA_ERR_OUT_OF_MEMORY, "cannot allocate a hash state");
  XXH3_64bits_reset(hash.get());
  XXH3_64bits_update(hash.get(), hdr, sizeof hdr);
  constexpr uint64_t kChunkEntries = 1024;
  std::vector<uint8_t> chunk(static_cast<size_t>(std::min(n_sections, kChunkEntries)) *
                             snap::kEntryBytes);
  p->entries.reserve(static_cast<size_t>(std::min<uint64_t>(n_sections, kChunkEntries)));
  std::vector<std::pair<uint64_t, uint64_t>> extents;  // the known sections
  uint32_t unknown_kind = 0;
  for (uint64_t done = 0; done < n_sections;) {
    const uint64_t k = std::min(kChunkEntries, n_sections - done);
    const uint64_t off = sb.table_offset + snap::kTableHeaderBytes + done * snap::kEntryBytes;
    SSA_RETURN_IF_ERROR(snap::pread_exact(p->fd, chunk.data(), k * snap::kEntryBytes, off, path));
    XXH3_64bits_update(hash.get(), chunk.data(), k * snap::kEntryBytes);
    for (uint64_t j = 0; j < k; ++j) {
      const SectionEntry e = snap::decode_entry(chunk.data() + j * snap::kEntryBytes);
      const uint64_t idx = done + j;
      if (e.kind == 0) return corrupt(path, "section table entry #", idx, " has kind 0");
      if (e.alignment < snap::kSectionAlign || (e.alignment & (e.alignment - 1)) != 0 ||
          e.offset % e.alignment != 0 || e.offset < snap::kHeaderAreaBytes ||
          e.offset > sb.table_offset || e.length == 0 || e.length > sb.table_offset - e.offset) {
        return corrupt(path, "section table entry #", idx, " (", snap::section_kind_name(e.kind),
                       ") at offset ", e.offset, " length ", e.length, " alignment ", e.alignment,
                       " lies outside the section area or is empty");
      }
      if (e.kind > snap::kLastKnownKind) {
        // Unknown: optional ones are skipped; a required one is reported once the
        // table is known to be intact (a damaged kind is corruption, not a version).
        if (!(e.flags & snap::kSectionOptional) && unknown_kind == 0) unknown_kind = e.kind;
        continue;
      }
      const bool per_layer = e.kind == uint32_t(SectionKind::kKvPages) ||
                             e.kind == uint32_t(SectionKind::kCodePages) ||
                             e.kind == uint32_t(SectionKind::kKvRows) ||
                             e.kind == uint32_t(SectionKind::kCodeRows) ||
                             e.kind == uint32_t(SectionKind::kCodebooks) ||
                             e.kind == uint32_t(SectionKind::kQueries);
      if (!per_layer && e.layer != snap::kNoLayer) {
        return corrupt(path, describe(e, p->entries.size()), " names a layer");
      }
      extents.emplace_back(e.offset, e.length);
      p->live_bytes += e.length;
      p->entries.push_back(e);
    }
    done += k;
  }
  if (XXH3_64bits_digest(hash.get()) != sb.table_xxh3) {
    return corrupt(path, "section table fails its checksum");
  }
  if (unknown_kind != 0) {
    return make_error(SSA_ERR_VERSION,
                      absl::StrCat("snapshot '", path, "' holds a section of kind ", unknown_kind,
                                   " that this library does not know"));
  }
  std::sort(extents.begin(), extents.end());
  for (size_t i = 1; i < extents.size(); ++i) {
    if (extents[i].first < extents[i - 1].first + extents[i - 1].second) {
      return corrupt(path, "sections at offsets ", extents[i - 1].first, " and ",
                     extents[i].first, " overlap");
    }
  }
  return absl::OkStatus();
}

absl::Status parse(const std::string& path, int fd, Parsed* p) {
  p->path = path;
  p->fd = fd;
  struct stat st;
  SSA_RETURN_IF_ERROR(snap::read_superblock(fd, path, &p->sb, &st));
  p->file_size = static_cast<uint64_t>(st.st_size);
  p->dev = st.st_dev;
  p->ino = st.st_ino;
  const snap::Superblock& sb = p->sb;
  p->live_bytes = snap::kHeaderAreaBytes + sb.table_length;
  SSA_RETURN_IF_ERROR(read_table(p));

  // Config.
  for (size_t i = 0; i < p->entries.size(); ++i) {
    const uint32_t k = p->entries[i].kind;
    int64_t* slot = k == uint32_t(SectionKind::kConfig)     ? &p->config_entry
                    : k == uint32_t(SectionKind::kLayers)   ? &p->layers_entry
                    : k == uint32_t(SectionKind::kMetadata) ? &p->metadata_entry
                    : k == uint32_t(SectionKind::kShard)    ? &p->shard_entry
                                                            : nullptr;
    if (slot == nullptr) continue;
    if (*slot >= 0) return corrupt(path, "more than one ", snap::section_kind_name(k), " section");
    *slot = static_cast<int64_t>(i);
  }
  if (p->config_entry < 0 || p->layers_entry < 0) {
    return corrupt(path, "no ", p->config_entry < 0 ? "config" : "layers", " section");
  }
  std::string body;
  if (p->entries[p->config_entry].length != snap::kConfigBytes) {
    return corrupt(path, "config section has ", p->entries[p->config_entry].length,
                   " bytes, not ", snap::kConfigBytes);
  }
  SSA_RETURN_IF_ERROR(read_section(*p, static_cast<size_t>(p->config_entry), &body));
  absl::Status valid = snap::decode_config(reinterpret_cast<const uint8_t*>(body.data()),
                                           sb.format_version, &p->cfg, &p->kv_bytes, &p->code_bytes);
  if (valid.ok()) valid = validate_session_config(p->cfg, &p->layout);
  if (!valid.ok()) return corrupt(path, "invalid session config: ", valid.message());
  if (p->layout.kv_page_bytes() != p->kv_bytes || p->layout.code_page_bytes() != p->code_bytes) {
    return corrupt(path, "config says pages of ", p->kv_bytes, "/", p->code_bytes,
                   " bytes, its shape gives ", p->layout.kv_page_bytes(), "/",
                   p->layout.code_page_bytes());
  }

  // Layers.
  const SectionEntry& le = p->entries[p->layers_entry];
  if (le.length != uint64_t{p->cfg.n_layers} * snap::kLayerRecordBytes) {
    return corrupt(path, "layers section has ", le.length, " bytes for ", p->cfg.n_layers,
                   " layers");
  }
  if (p->shard_entry >= 0) {
    std::string sb_body;
    if (p->entries[p->shard_entry].length != snap::kShardBytes) {
      return corrupt(path, "shard section has ", p->entries[p->shard_entry].length, " bytes, not ", snap::kShardBytes);
    }
    SSA_RETURN_IF_ERROR(read_section(*p, static_cast<size_t>(p->shard_entry), &sb_body));
    const snap::ShardInfo sh = snap::decode_shard(reinterpret_cast<const uint8_t*>(sb_body.data()));
    if (sh.set_id == 0 || sh.n_ranks == 0 || sh.n_ranks > kMaxShards || sh.rank >= sh.n_ranks ||
        sh.shard_tokens == 0 || sh.shard_tokens % kSplitTokens != 0) {
      return corrupt(path, "shard section says rank ", sh.rank, " of ", sh.n_ranks, ", shard_tokens ",
                     sh.shard_tokens, ", set ", sh.set_id, ": no group writes that");
    }
    p->has_shard = true;
    p->shard = sh;
    p->held = held_tokens(sh.rank, sh.n_ranks, sh.shard_tokens);
  }
  SSA_RETURN_IF_ERROR(read_section(*p, static_cast<size_t>(p->layers_entry), &body));
  p->layers.resize(p->cfg.n_layers);
  // Every page of every layer lies in its own bytes of the section area, which
  // bounds what the page tables below allocate by the file's size in total.
  const uint64_t area = sb.table_offset - snap::kHeaderAreaBytes;
  uint64_t page_bytes_needed = 0;
  for (uint32_t l = 0; l < p->cfg.n_layers; ++l) {
    const uint8_t* r = reinterpret_cast<const uint8_t*>(body.data()) + l * snap::kLayerRecordBytes;
    Parsed::Layer& L = p->layers[l];
    L.n_tokens = snap::get_u64(r);
    L.trained_at = snap::get_u64(r + 8);
    const uint32_t flags = snap::get_u32(r + 16);
    if ((flags & ~snap::kLayerHasCodebooks) != 0) {
      return corrupt(path, "layer ", l, " has unknown flags 0x", absl::Hex(flags));
    }
    L.has_codebooks = flags & snap::kLayerHasCodebooks;
    if (L.n_tokens > kMaxTokensPerLayer || L.trained_at > kMaxTokensPerLayer) {
      return corrupt(path, "layer ", l, " claims ", L.n_tokens, " tokens (trained at ",
                     L.trained_at, "); a layer holds at most ", kMaxTokensPerLayer);
    }
    if (!L.has_codebooks && L.trained_at != 0) {
      return corrupt(path, "layer ", l, " has no index but says it was trained at ",
                     L.trained_at, " tokens");
    }
    const auto [first_held, end_held] = held_pages(p->layout, p->held, L.n_tokens);
    // Every row below the length is in some section (a page run or a row run):
    // the rows held bound the page tables allocated for them.
    const uint32_t P = p->layout.page_tokens;
    const uint64_t rows = end_held == first_held ? 0 : std::min(L.n_tokens, end_held * P) - first_held * P;
    const uint64_t per_row = (p->kv_bytes + (L.has_codebooks ? p->code_bytes : 0)) / P;
    if (rows > (area - page_bytes_needed) / per_row) {
      return corrupt(path, "layer ", l, " claims ", L.n_tokens,
                     " tokens, more than the file can hold");
    }
    page_bytes_needed += rows * per_row;
  }
  for (Parsed::Layer& L : p->layers) {
    L.kv_src.assign(p->layout.pages_for(L.n_tokens), kNoSource);
    if (L.has_codebooks) L.code_src.assign(L.kv_src.size(), kNoSource);
  }

  // Pages and codebooks: later runs win for a page several runs hold.
  for (size_t i = 0; i < p->entries.size(); ++i) {
    const SectionEntry& e = p->entries[i];
    const auto kind = static_cast<SectionKind>(e.kind);
    if (kind != SectionKind::kKvPages && kind != SectionKind::kCodePages && kind != SectionKind::kCodebooks &&
        kind != SectionKind::kKvRows && kind != SectionKind::kCodeRows && kind != SectionKind::kQueries) {
      continue;
    }
    if (e.layer >= p->cfg.n_layers) {
      return corrupt(path, describe(e, i), " names layer ", e.layer, " of ", p->cfg.n_layers);
    }
    Parsed::Layer& L = p->layers[e.layer];
    if (kind == SectionKind::kKvPages) {
      SSA_RETURN_IF_ERROR(add_page_run(*p, i, p->kv_bytes, &Parsed::Layer::kv_src));
    } else if (kind == SectionKind::kCodePages) {
      if (!L.has_codebooks) return corrupt(path, describe(e, i), " belongs to a layer without codebooks");
      SSA_RETURN_IF_ERROR(add_page_run(*p, i, p->code_bytes, &Parsed::Layer::code_src));
    } else if (kind == SectionKind::kKvRows || kind == SectionKind::kCodeRows) {
      const bool kv = kind == SectionKind::kKvRows;
      if (!kv && !L.has_codebooks) return corrupt(path, describe(e, i), " belongs to a layer without codebooks");
      SSA_RETURN_IF_ERROR(snap::check_row_run(path, e, i, snap::row_shape(p->layout, kv), p->held));
      (kv ? L.kv_row_runs : L.code_row_runs).push_back(static_cast<uint32_t>(i));
    } else if (kind == SectionKind::kQueries) {
      if (p->sb.format_version < 5) {
        return corrupt(path, describe(e, i), " is in a file of format version ", p->sb.format_version);
      }
      if (!proxy_is_query_aware(p->cfg.proxy)) {
        return corrupt(path, describe(e, i), " belongs to a session whose proxy learns no queries");
      }
      if (L.queries_entry >= 0) return corrupt(path, describe(e, i), " is a second one for its layer");
      const uint64_t bytes = snap::query_moments_bytes(p->cfg);
      if (e.length != bytes) {
        return corrupt(path, describe(e, i), " has ", e.length, " bytes, expected ", bytes);
      }
      L.queries_entry = static_cast<int64_t>(i);
    } else {
      if (!L.has_codebooks || L.codebooks_entry >= 0) {
        return corrupt(path, describe(e, i), L.has_codebooks ? " is a second one for its layer"
                                                             : " belongs to a layer without codebooks");
      }
      const uint64_t bytes = snap::codebooks_section_bytes(p->cfg, p->sb.format_version);
      if (e.length != bytes) {
        return corrupt(path, describe(e, i), " has ", e.length, " bytes, expected ", bytes);
      }
      L.codebooks_entry = static_cast<int64_t>(i);
    }
  }
  for (uint32_t l = 0; l < p->cfg.n_layers; ++l) {
    const Parsed::Layer& L = p->layers[l];
    if (L.has_codebooks && L.codebooks_entry < 0) {
      return corrupt(path, "layer ", l, " is marked indexed but has no codebooks section");
    }
    const auto [first_held, end_held] = held_pages(p->layout, p->held, L.n_tokens);
    Parsed::Layer& Lw = p->layers[l];
    SSA_RETURN_IF_ERROR(snap::compose_pieces(path, p->entries, L.kv_row_runs, L.kv_src, kNoSource,
                                             p->layout.page_tokens, L.n_tokens, first_held, end_held, l, true,
                                             &Lw.kv_rows));
    SSA_RETURN_IF_ERROR(snap::compose_pieces(path, p->entries, L.code_row_runs, L.code_src, kNoSource,
                                             p->layout.page_tokens, L.n_tokens, first_held, end_held, l, false,
                                             &Lw.code_rows));
    for (uint64_t j = first_held; j < end_held; ++j) {
      if (L.kv_src[j] == kNoSource && !L.kv_rows.count(j)) {
        return corrupt(path, "layer ", l, " KV page ", j, " is missing");
      }
      if (!L.code_src.empty() && L.code_src[j] == kNoSource && !L.code_rows.count(j)) {
        return corrupt(path, "layer ", l, " code page ", j, " is missing");
      }
    }
  }

  if (p->metadata_entry >= 0) {
    if (p->entries[p->metadata_entry].length > kMaxMetadataBytes) {
      return corrupt(path, "metadata section of ", p->entries[p->metadata_entry].length,
                     " bytes exceeds the limit");
    }
    SSA_RETURN_IF_ERROR(read_section(*p, static_cast<size_t>(p->metadata_entry), &p->metadata));
  }
  return absl::OkStatus();
}

// Opens without blocking (a FIFO or device at the path must not hang the open)
// and refuses anything but a regular file before a byte is read.
absl::StatusOr<int> open_snapshot(const std::string& path) {
  const snap::FileIo& io = snap::file_io();
  const int fd = io.open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK, 0);
  if (fd < 0) return snap::io_error("cannot open snapshot", path, errno);
  snap::FdGuard guard(fd);
  struct stat st;
  if (io.fstat(fd, &st) != 0) return snap::io_error("cannot stat", path, errno);
  if (!S_ISREG(st.st_mode)) {
    return make_error(SSA_ERR_IO, absl::StrCat("snapshot '", path, "' is not a regular file (",
                                               S_ISDIR(st.st_mode)    ? "a directory"
                                               : S_ISFIFO(st.st_mode) ? "a FIFO"
                                               : S_ISSOCK(st.st_mode) ? "a socket"
                                                                      : "a device",
                                               ")"));
  }
  const int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  return guard.release();
}


// The content rules for a page a session will use (superseded copies are only
// hashed): finite K/V, code bytes below pq_centroids.
absl::Status check_page(const Parsed& p, uint32_t layer, uint64_t j, bool kv, const uint8_t* page) {
  return kv ? snap::check_kv_page(p.layout, page, p.path, layer, j)
            : snap::check_code_page(p.layout, page, p.path, layer, j);
}

// Reads the pages of one run section: the ones that win and that the session
// keeps (`want`) are read into new pages of the session, the rest only hashed.
// Checks the section's hash. The session's backend takes each page through
// host memory (the page itself, or scratch then uploaded).
absl::Status read_page_run(const Parsed& p, size_t idx, size_t page_bytes, const ssa_session& s,
                           bool kv, const std::vector<uint32_t>& src, std::vector<PageRef>& dst,
                           const HeldRange& want, XXH3_state_t* hash, std::unique_ptr<uint8_t[]>& scratch) {
  const SectionEntry& e = p.entries[idx];
  XXH3_64bits_reset(hash);
  auto staging = [&] {
    if (!scratch) scratch.reset(new uint8_t[page_bytes]);
    return scratch.get();
  };
  for (uint64_t k = 0; k < e.count; ++k) {
    const uint64_t j = e.first + k;
    const uint64_t off = e.offset + k * page_bytes;
    auto read = [&](uint8_t* target) -> absl::Status {
      SSA_RETURN_IF_ERROR(snap::pread_exact(p.fd, target, page_bytes, off, p.path));
      XXH3_64bits_update(hash, target, page_bytes);
      return absl::OkStatus();
    };
    // A page the session will use is checked before the backend takes it.
    auto read_checked = [&](uint8_t* target) -> absl::Status {
      SSA_RETURN_IF_ERROR(read(target));
      return check_page(p, e.layer, j, kv, target);
    };
    if (j < src.size() && src[j] == idx && want.holds_page(j, p.layout.page_tokens)) {
      absl::StatusOr<PageRef> page = s.backend->page_from_host(s, kv, j, page_bytes, staging, read_checked);
      if (!page.ok()) return page.status();
      dst[j] = *std::move(page);
    } else {
      SSA_RETURN_IF_ERROR(read(staging()));
    }
  }
  if (XXH3_64bits_digest(hash) != e.xxh3) return run_checksum_error(p.path, e, idx);
  return absl::OkStatus();
}

// The pages that row runs give rows of, built in memory: the bytes of the page's
// winning page run (zeros without one), then its row runs in table order; every
// row run is hashed whole as it is read. Slots at and beyond the layer's length
// are zeroed; each page is checked by the content rules before the backend takes
// it (a mapped load copies these pages too: they are not one piece of the file).
absl::Status compose_row_pages(const Parsed& p, const ssa_session& s, const HeldRange& want,
                               std::vector<LayerStore>& layers) {
  const uint32_t P = p.layout.page_tokens;
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> hash(XXH3_createState(), XXH3_freeState);
  if (!hash) return make_error(SSA_ERR_OUT_OF_MEMORY, "cannot allocate a hash state");
  std::unique_ptr<uint8_t[]> scratch;
  for (const bool kv : {true, false}) {
    const size_t page_bytes = kv ? p.kv_bytes : p.code_bytes;
    const snap::RowShape sh = snap::row_shape(p.layout, kv);
    std::vector<uint8_t> slice(page_bytes);
    for (uint32_t l = 0; l < p.cfg.n_layers; ++l) {
      const Parsed::Layer& L = p.layers[l];
      const snap::RowPieces& pieces = kv ? L.kv_rows : L.code_rows;
      const std::vector<uint32_t>& src = kv ? L.kv_src : L.code_src;
      std::map<uint64_t, std::unique_ptr<uint8_t[]>> built;
      for (const auto& [j, runs] : pieces) {
        if (!want.holds_page(j, P)) continue;
        auto buf = std::make_unique<uint8_t[]>(page_bytes);  // zeros
        if (src[j] != kNoSource) {
          const SectionEntry& b = p.entries[src[j]];
          SSA_RETURN_IF_ERROR(snap::pread_exact(p.fd, buf.get(), page_bytes, b.offset + (j - b.first) * page_bytes,
                                                p.path));
        }
        built.emplace(j, std::move(buf));
      }
      for (const uint32_t r : kv ? L.kv_row_runs : L.code_row_runs) {
        const SectionEntry& e = p.entries[r];
        XXH3_64bits_reset(hash.get());
        uint64_t off = e.offset;
        for (uint64_t k = e.first / P; k * P < e.first + e.count; ++k) {
          const uint32_t a = static_cast<uint32_t>(std::max(e.first, k * P) - k * P);
          const uint32_t b = static_cast<uint32_t>(std::min(e.first + e.count, (k + 1) * P) - k * P);
          const size_t n = (b - a) * sh.row_bytes();
          SSA_RETURN_IF_ERROR(snap::pread_exact(p.fd, slice.data(), n, off, p.path));
          XXH3_64bits_update(hash.get(), slice.data(), n);
          off += n;
          const auto it = built.find(k);
          if (it == built.end()) continue;
          const std::vector<uint32_t>& runs = pieces.at(k);
          if (std::find(runs.begin(), runs.end(), r) != runs.end()) snap::scatter_rows(sh, slice.data(), a, b, it->second.get());
        }
        if (XXH3_64bits_digest(hash.get()) != e.xxh3) return corrupt(p.path, describe(e, r), " fails its checksum");
      }
      for (auto& [j, buf] : built) {
        if ((j + 1) * P > L.n_tokens) snap::zero_rows_from(sh, buf.get(), static_cast<uint32_t>(L.n_tokens - j * P));
        SSA_RETURN_IF_ERROR(check_page(p, l, j, kv, buf.get()));
        const uint8_t* bytes = buf.get();
        absl::StatusOr<PageRef> page = s.backend->page_from_host(
            s, kv, j, page_bytes,
            [&] {
              if (!scratch) scratch.reset(new uint8_t[std::max(p.kv_bytes, p.code_bytes)]);
              return scratch.get();
            },
            [&](uint8_t* target) {
              memcpy(target, bytes, page_bytes);
              return absl::OkStatus();
            });
        if (!page.ok()) return page.status();
        (kv ? layers[l].kv_pages : layers[l].code_pages)[j] = *std::move(page);
      }
    }
  }
  return absl::OkStatus();
}

// Whether any page of the run is one the session keeps.
bool run_wanted(const Parsed& p, const SectionEntry& e, const std::vector<uint32_t>& src, size_t idx,
                const HeldRange& want) {
  const uint64_t end = std::min<uint64_t>(e.first + e.count, src.size());
  for (uint64_t j = e.first; j < end; ++j) {
    if (src[j] == idx && want.holds_page(j, p.layout.page_tokens)) return true;
  }
  return false;
}

// One snapshot file, open and parsed.
struct OpenFile {
  snap::FdGuard guard;
  Parsed p;
};

absl::Status open_parsed(const std::string& path, OpenFile* f) {
  absl::StatusOr<int> fd = open_snapshot(path);
  if (!fd.ok()) return fd.status();
  f->guard.reset(*fd);
  return parse(path, *fd, &f->p);
}

// The rank files of a group's snapshot must be the files its manifest names,
// parts of the same session: the same config, lengths, index, codebooks and
// metadata in each, each holding its own rank's shard of the manifest's group.
absl::Status check_rank_file(const snap::Manifest& m, uint32_t r, const Parsed& p, const Parsed& first,
                             const std::string& manifest_path) {
  const snap::RankFile& want = m.ranks[r];
  auto bad = [&](const auto&... what) {
    return make_error(SSA_ERR_CORRUPT, absl::StrCat("group snapshot '", manifest_path, "': rank ", r, "'s file '",
                                                    p.path, "' ", what...));
  };
  if (p.sb.file_id != want.file_id || p.sb.generation != want.generation || p.sb.file_length != want.file_length ||
      p.sb.table_xxh3 != want.table_xxh3) {
    return bad("is not the file the manifest names (another save's, or changed since: file id ", p.sb.file_id,
               " generation ", p.sb.generation, ", the manifest says ", want.file_id, " generation ",
               want.generation, ")");
  }
  if (!p.has_shard || p.shard.set_id != m.set_id || p.shard.rank != r ||
      p.shard.n_ranks != m.ranks.size() || p.shard.shard_tokens != m.shard_tokens) {
    return bad("is not rank ", r, " of ", m.ranks.size(), " of this save (its shard section says rank ", p.shard.rank,
               " of ", p.shard.n_ranks, ")");
  }
  if (&p == &first) return absl::OkStatus();
  uint8_t a[snap::kConfigBytes], b[snap::kConfigBytes];
  snap::encode_config(p.cfg, p.kv_bytes, p.code_bytes, a);
  snap::encode_config(first.cfg, first.kv_bytes, first.code_bytes, b);
  if (memcmp(a, b, sizeof a) != 0) return bad("has another session config than rank 0's");
  if (p.metadata != first.metadata) return bad("has other metadata than rank 0's");
  for (size_t l = 0; l < p.layers.size(); ++l) {
    const Parsed::Layer &x = p.layers[l], &y = first.layers[l];
    if (x.n_tokens != y.n_tokens || x.trained_at != y.trained_at || x.has_codebooks != y.has_codebooks) {
      return bad("says layer ", l, " holds ", x.n_tokens, " tokens (index at ", x.trained_at, "), rank 0's ",
                 y.n_tokens, " (index at ", y.trained_at, ")");
    }
    if (x.has_codebooks && (p.entries[x.codebooks_entry].xxh3 != first.entries[y.codebooks_entry].xxh3 ||
                            p.entries[x.codebooks_entry].length != first.entries[y.codebooks_entry].length)) {
      return bad("holds other codebooks for layer ", l, " than rank 0's");
    }
    if ((x.queries_entry >= 0) != (y.queries_entry >= 0) ||
        (x.queries_entry >= 0 && p.entries[x.queries_entry].xxh3 != first.entries[y.queries_entry].xxh3)) {
      return bad("holds other observed queries for layer ", l, " than rank 0's");
    }
  }
  return absl::OkStatus();
}

// Opens `path`: one snapshot file, or a group's manifest and then every rank
// file it names (checked against it and each other). *is_set: a manifest.
absl::Status open_files(const std::string& path, std::vector<std::unique_ptr<OpenFile>>* files, bool* is_set) {
  absl::StatusOr<int> fd = open_snapshot(path);
  if (!fd.ok()) return fd.status();
  snap::FdGuard guard(*fd);
  uint8_t head[8] = {};
  size_t got = 0;
  SSA_RETURN_IF_ERROR(snap::pread_upto(*fd, head, sizeof head, 0, path, &got));
  *is_set = snap::is_manifest(head, got);
  if (!*is_set) {
    auto f = std::make_unique<OpenFile>();
    f->guard.reset(guard.release());
    SSA_RETURN_IF_ERROR(parse(path, f->guard.get(), &f->p));
    if (f->p.has_shard) {
      return invalid_argument("snapshot '", path, "' is rank ", f->p.shard.rank, "'s part of the snapshot of a group of ",
                              f->p.shard.n_ranks, " processes: load the group's manifest (the path the group saved to)");
    }
    files->push_back(std::move(f));
    return absl::OkStatus();
  }
  struct stat st;
  if (snap::file_io().fstat(*fd, &st) != 0) return snap::io_error("cannot stat", path, errno);
  if (static_cast<uint64_t>(st.st_size) > snap::kMaxManifestBytes) {
    return corrupt(path, "a group manifest of ", st.st_size, " bytes (at most ", snap::kMaxManifestBytes, ")");
  }
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  SSA_RETURN_IF_ERROR(snap::pread_exact(*fd, bytes.data(), bytes.size(), 0, path));
  absl::StatusOr<snap::Manifest> m = snap::decode_manifest(bytes, path);
  if (!m.ok()) return m.status();
  // The rank files lie beside the manifest itself (beside a link's target).
  absl::StatusOr<std::string> target = snap::resolve_save_target(path);
  if (!target.ok()) return target.status();
  const std::string dir = snap::parent_dir(*target);
  for (uint32_t r = 0; r < m->ranks.size(); ++r) {
    auto f = std::make_unique<OpenFile>();
    SSA_RETURN_IF_ERROR(open_parsed(dir + "/" + m->ranks[r].name, f.get()));
    files->push_back(std::move(f));
    SSA_RETURN_IF_ERROR(check_rank_file(*m, r, files->back()->p, (*files)[0]->p, path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ssa_session>> load(ssa_runtime* rt, const char* path_c,
                                                   uint32_t flags,
                                                   const ssa_session_config* expected) {
  if (rt == nullptr) return invalid_argument("runtime is NULL");
  SSA_RETURN_IF_ERROR(snap::check_path(path_c));
  if ((flags & ~(SSA_LOAD_VERIFY | SSA_LOAD_MMAP)) != 0) {
    return invalid_argument("unknown load flags 0x", absl::Hex(flags & ~(SSA_LOAD_VERIFY | SSA_LOAD_MMAP)));
  }
  if (expected != nullptr) {
    SSA_RETURN_IF_ERROR(check_struct_size(layout_of<ssa_session_config>(), struct_size_of(expected), expected));
  }
  const bool mmap_kv = flags & SSA_LOAD_MMAP;
  const bool verify_all = flags & SSA_LOAD_VERIFY;
  const std::string path(path_c);
  const snap::FileIo& io = snap::file_io();
  std::vector<std::unique_ptr<OpenFile>> files;
  bool is_set = false;
  SSA_RETURN_IF_ERROR(open_files(path, &files, &is_set));
  const Parsed& p0 = files[0]->p;
  if (expected != nullptr) SSA_RETURN_IF_ERROR(check_expected(p0, *expected));

  absl::StatusOr<std::unique_ptr<ssa_session>> made = create_session(rt, p0.cfg);
  if (!made.ok()) return made.status();
  ssa_session& s = **made;
  if (s.layout.kv_page_bytes() != p0.kv_bytes || s.layout.code_page_bytes() != p0.code_bytes) {
    return make_error(SSA_ERR_INTERNAL, "session created from a snapshot config has another layout");
  }
  // The pages this runtime's sessions keep: a rank of a group its shard's.
  const HeldRange want = rt->held;

  std::vector<LayerStore> layers(p0.cfg.n_layers);
  for (uint32_t l = 0; l < p0.cfg.n_layers; ++l) {
    layers[l].n_tokens = p0.layers[l].n_tokens;
    layers[l].trained_at_tokens = p0.layers[l].trained_at;
    layers[l].kv_pages.resize(p0.layers[l].kv_src.size());
    layers[l].code_pages.resize(p0.layers[l].code_src.size());
  }
  // Page runs that are read (not mapped) are read and hashed on the runtime's
  // threads, one run per task; the rest is done here. The codebooks come from
  // the first file (a group's files hold the same, checked by their hashes).
  std::vector<std::pair<size_t, size_t>> runs;  // (file, entry)
  std::vector<std::shared_ptr<MappedSnapshot>> mappings;
  std::string body;
  for (size_t fi = 0; fi < files.size(); ++fi) {
    const Parsed& p = files[fi]->p;
    const int fd = files[fi]->guard.get();
    std::shared_ptr<MappedSnapshot> mapping;
    if (mmap_kv && p.held.overlaps(want.begin, want.end)) {
      // The committed bytes only: the file may grow beyond them meanwhile.
      const size_t bytes = static_cast<size_t>(p.sb.file_length);
      void* base = io.mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
      if (base == MAP_FAILED) return snap::io_error("cannot map snapshot", p.path, errno);
      mapping = std::make_shared<MappedSnapshot>();
      mapping->path = p.path;
      mapping->base = static_cast<uint8_t*>(base);
      mapping->bytes = bytes;
      // Sparse decodes touch scattered rows: fault in only the OS pages they read,
      // no readahead around them, so the resident set follows the rows read.
      madvise(base, bytes, MADV_RANDOM);
      mappings.push_back(mapping);
    }
    for (size_t i = 0; i < p.entries.size(); ++i) {
      const SectionEntry& e = p.entries[i];
      const auto kind = static_cast<SectionKind>(e.kind);
      if ((kind == SectionKind::kKvPages || kind == SectionKind::kCodePages) && !want.all() &&
          !run_wanted(p, e, kind == SectionKind::kKvPages ? p.layers[e.layer].kv_src : p.layers[e.layer].code_src,
                      i, want)) {
        continue;  // a rank of a group keeps no page of it: not read
      }
      if (kind == SectionKind::kKvPages && mapping) {
        mapping->sections.emplace_back();
        MappedSnapshot::Section& ms = mapping->sections.back();
        ms.offset = e.offset;
        ms.length = e.length;
        ms.xxh3 = e.xxh3;
        if (verify_all) {
          const uint8_t* base = mapping->base + e.offset;
          if (XXH3_64bits(base, e.length) != e.xxh3) return run_checksum_error(p.path, e, i);
          ms.verified.store(true);
          // While the pages are resident: the content rule of a read load.
          const std::vector<uint32_t>& src = p.layers[e.layer].kv_src;
          for (uint64_t k = 0; k < e.count; ++k) {
            const uint64_t j = e.first + k;
            if (j >= src.size() || src[j] != i || !want.holds_page(j, p.layout.page_tokens)) continue;
            SSA_RETURN_IF_ERROR(snap::check_kv_page(p.layout, base + k * p.kv_bytes, p.path, e.layer, j));
          }
          // The hash read the pages in; give them back so verifying costs no RSS.
          const uint64_t os_page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
          madvise(mapping->base + e.offset / os_page * os_page,
                  static_cast<size_t>(e.offset % os_page + e.length), MADV_DONTNEED);
        }
        const std::vector<uint32_t>& src = p.layers[e.layer].kv_src;
        std::vector<PageRef>& dst = layers[e.layer].kv_pages;
        const std::shared_ptr<void> keeper = mapping;
        for (uint64_t k = 0; k < e.count; ++k) {
          const uint64_t j = e.first + k;
          if (j >= src.size() || src[j] != i || !want.holds_page(j, p.layout.page_tokens)) continue;
          dst[j] = std::make_shared<Page>(mapping->base + e.offset + k * p.kv_bytes, p.kv_bytes,
                                          false, keeper, PageTier::kFile);
        }
      } else if (kind == SectionKind::kKvPages || kind == SectionKind::kCodePages) {
        runs.emplace_back(fi, i);
      } else if (kind == SectionKind::kCodebooks && fi == 0) {
        SSA_RETURN_IF_ERROR(read_section(p, i, &body));
        const uint8_t* b = reinterpret_cast<const uint8_t*>(body.data());
        auto cb = std::make_shared<PqCodebooks>();
        cb->n_kv_heads = snap::get_u32(b);
        cb->subspaces = snap::get_u32(b + 4);
        cb->centroids = snap::get_u32(b + 8);
        cb->sub_dim = snap::get_u32(b + 12);
        if (cb->n_kv_heads != p.cfg.n_kv_heads || cb->subspaces != p.cfg.pq_subspaces ||
            cb->centroids != p.cfg.pq_centroids || cb->sub_dim != p.layout.sub_dim()) {
          return corrupt(p.path, describe(e, i), " has shape ", cb->n_kv_heads, "x", cb->subspaces,
                         "x", cb->centroids, "x", cb->sub_dim, " that does not fit the config");
        }
        // The length was checked against the config when the table was read.
        cb->data.resize(size_t{cb->n_kv_heads} * cb->subspaces * cb->centroids * cb->sub_dim);
        memcpy(cb->data.data(), b + snap::kCodebooksHeaderBytes, cb->data.size() * sizeof(float));
        const uint8_t* at = b + snap::kCodebooksHeaderBytes + cb->data.size() * sizeof(float);
        const size_t square = size_t{cb->n_kv_heads} * cb->head_dim() * cb->head_dim();
        if (proxy_has_transform(p.cfg.proxy)) {
          cb->rotation.resize(square);
          memcpy(cb->rotation.data(), at, square * sizeof(float));
          at += square * sizeof(float);
        }
        if (proxy_is_query_aware(p.cfg.proxy)) {
          cb->query_transform.resize(square);
          memcpy(cb->query_transform.data(), at, square * sizeof(float));
          at += square * sizeof(float);
          absl::StatusOr<QueryMomentsRef> qm =
              read_query_moments(at, cb->n_kv_heads, cb->head_dim(), p.sb.format_version >= 4, p.path, e.layer);
          if (!qm.ok()) return qm.status();
          cb->trained_moments = *std::move(qm);
          // Queries shown after the training, if any, replace these below.
          if (p.layers[e.layer].queries_entry < 0) layers[e.layer].query_moments = cb->trained_moments;
        }
        SSA_RETURN_IF_ERROR(snap::check_codebooks(*cb, p.path, e.layer));
        layers[e.layer].codebooks = std::move(cb);
      } else if (kind == SectionKind::kQueries && fi == 0) {
        SSA_RETURN_IF_ERROR(read_section(p, i, &body));
        absl::StatusOr<QueryMomentsRef> qm = read_query_moments(reinterpret_cast<const uint8_t*>(body.data()),
                                                                p.cfg.n_kv_heads, p.cfg.head_dim, true, p.path, e.layer);
        if (!qm.ok()) return qm.status();
        layers[e.layer].query_moments = *std::move(qm);
      }
    }
  }
  // A layer's queries are all it was shown, its codebooks' among them: never
  // fewer per KV head than the codebooks were trained from.
  for (uint32_t l = 0; l < p0.cfg.n_layers; ++l) {
    const QueryMoments* trained = layers[l].codebooks ? layers[l].codebooks->trained_moments.get() : nullptr;
    if (p0.layers[l].queries_entry < 0 || trained == nullptr) continue;
    const QueryMoments* shown = layers[l].query_moments.get();
    for (uint32_t h = 0; h < trained->n_kv_heads; ++h) {
      const uint64_t n = shown != nullptr ? shown->count[h] : 0;
      if (n < trained->count[h]) {
        return corrupt(p0.path, "layer ", l, " KV head ", h, " was shown ", n, " queries, fewer than the ",
                       trained->count[h], " its codebooks were trained from");
      }
    }
  }
  // Each task writes only the page slots its run wins, so tasks never share a
  // slot (a group's files hold disjoint pages).
  std::vector<absl::Status> run_status(runs.size());
  rt->pool->parallel_for(runs.size(), [&](size_t t) {
    const Parsed& p = files[runs[t].first]->p;
    const size_t i = runs[t].second;
    const SectionEntry& e = p.entries[i];
    const bool kv = e.kind == static_cast<uint32_t>(SectionKind::kKvPages);
    try {
      std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> hash(XXH3_createState(),
                                                                    XXH3_freeState);
      if (!hash) {
        run_status[t] = make_error(SSA_ERR_OUT_OF_MEMORY, "cannot allocate a hash state");
        return;
      }
      std::unique_ptr<uint8_t[]> scratch;
      run_status[t] = read_page_run(p, i, kv ? p.kv_bytes : p.code_bytes, s, kv,
                                    kv ? p.layers[e.layer].kv_src : p.layers[e.layer].code_src,
                                    kv ? layers[e.layer].kv_pages : layers[e.layer].code_pages, want,
                                    hash.get(), scratch);
    } catch (const std::bad_alloc&) {
      run_status[t] = make_error(SSA_ERR_OUT_OF_MEMORY, "out of host memory reading a page run");
    }
  });
  for (const absl::Status& st : run_status) SSA_RETURN_IF_ERROR(st);  // first in file order
  for (const auto& f : files) SSA_RETURN_IF_ERROR(compose_row_pages(f->p, s, want, layers));

  for (const std::shared_ptr<MappedSnapshot>& mapping : mappings) {
    std::sort(mapping->sections.begin(), mapping->sections.end(),
              [](const MappedSnapshot::Section& a, const MappedSnapshot::Section& b) {
                return a.offset < b.offset;
              });
  }

  // The record: the session's pages are exactly what the file holds, so a
  // checkpoint to the same path can append to it. Not for a group's set of
  // files, nor for a session that keeps part of the file (a group's rank):
  // their checkpoints are full saves.
  std::shared_ptr<SnapshotRecord> rec;
  if (!is_set && want.all()) {
    rec = std::make_shared<SnapshotRecord>();
    rec->path = path;
    rec->dev = p0.dev;
    rec->ino = p0.ino;
    rec->file_id = p0.sb.file_id;
    rec->generation = p0.sb.generation;
    rec->file_length = p0.sb.file_length;
    rec->sections = p0.entries;
    rec->config_entry = p0.config_entry;
    rec->layers_entry = p0.layers_entry;
    rec->metadata_entry = p0.metadata_entry;
    rec->metadata = p0.metadata;
    rec->layers.resize(p0.cfg.n_layers);
    for (uint32_t l = 0; l < p0.cfg.n_layers; ++l) {
      SnapshotRecord::Layer& rl = rec->layers[l];
      rl.n_tokens = layers[l].n_tokens;
      rl.trained_at_tokens = layers[l].trained_at_tokens;
      rl.kv = layers[l].kv_pages;
      rl.code = layers[l].code_pages;
      rl.kv_entry = p0.layers[l].kv_src;
      rl.code_entry = p0.layers[l].code_src;
      rl.kv_rows = p0.layers[l].kv_rows;
      rl.code_rows = p0.layers[l].code_rows;
      rl.codebooks = layers[l].codebooks;
      rl.codebooks_entry = p0.layers[l].codebooks_entry;
      if (p0.layers[l].queries_entry >= 0) rl.queries = layers[l].query_moments;
      rl.queries_entry = p0.layers[l].queries_entry;
    }
  }
  {
    std::lock_guard snap_lock(s.snapshot_mu);
    s.snapshot = std::make_shared<SnapshotState>();
    s.snapshot->record = std::move(rec);
    s.snapshot->mappings = std::move(mappings);
    std::unique_lock lock(s.mu);
    s.layers = std::move(layers);
    s.metadata = p0.metadata;
  }
  return made;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ssa_session>> snapshot_load(ssa_runtime* rt, const char* path,
                                                           uint32_t flags) {
  return snapshot_load_checked(rt, path, flags, nullptr);
}

absl::StatusOr<std::unique_ptr<ssa_session>> snapshot_load_checked(
    ssa_runtime* rt, const char* path, uint32_t flags, const ssa_session_config* expected) {
  // A group's rank: a collective call (lib/snapshot/group_snapshot.h).
  if (rt != nullptr && rt->group != nullptr) {
    absl::StatusOr<std::unique_ptr<ssa_session>> local = make_error(SSA_ERR_OUT_OF_MEMORY, "out of memory loading");
    try {
      local = load(rt, path, flags, expected);
    } catch (const std::bad_alloc&) {
      // Its peers still get this rank's failure at the load's exchange.
    }
    return finish_group_load(*rt, std::move(local));
  }
  return load(rt, path, flags, expected);
}

absl::Status snapshot_inspect(const char* path_c, ssa_snapshot_info* info) {
  SSA_RETURN_IF_ERROR(snap::check_path(path_c));
  if (info == nullptr) return invalid_argument("info is NULL");
  SSA_RETURN_IF_ERROR(check_output_struct(info));
  const std::string path(path_c);
  std::vector<std::unique_ptr<OpenFile>> files;
  bool is_set = false;
  SSA_RETURN_IF_ERROR(open_files(path, &files, &is_set));
  const Parsed& p = files[0]->p;

  // A group's snapshot: rank 0's file, with the sizes of all its files.
  ssa_snapshot_info full{};
  full.format_version = p.sb.format_version;
  full.generation = p.sb.generation;
  for (const auto& f : files) {
    full.file_bytes += f->p.sb.file_length;
    full.live_bytes += f->p.live_bytes;
    full.n_sections += static_cast<uint32_t>(f->p.entries.size());
  }
  full.n_layers = p.cfg.n_layers;
  full.n_q_heads = p.cfg.n_q_heads;
  full.n_kv_heads = p.cfg.n_kv_heads;
  full.head_dim = p.cfg.head_dim;
  full.kv_dtype = p.cfg.kv_dtype;
  full.pq_subspaces = p.cfg.pq_subspaces;
  full.pq_centroids = p.cfg.pq_centroids;
  full.page_tokens = p.cfg.page_tokens;
  full.model_fingerprint = p.cfg.model_fingerprint;
  full.length = p.layers.empty() ? 0 : UINT64_MAX;
  for (const Parsed::Layer& L : p.layers) {
    full.length = std::min(full.length, L.n_tokens);
    full.max_layer_length = std::max(full.max_layer_length, L.n_tokens);
    full.indexed_layers += L.has_codebooks ? 1 : 0;
  }
  full.metadata_bytes = p.metadata.size();
  full.proxy = p.cfg.proxy;
  full.pq_parallel_weight = p.cfg.pq_parallel_weight;
  write_struct(full, info);
  return absl::OkStatus();
}

}  // namespace ssa
