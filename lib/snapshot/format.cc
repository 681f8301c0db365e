#include "snapshot/format.h"

#include <xxhash.h>

#include "absl/strings/str_cat.h"
#include "index/proxy_kind.h"
#include "store/query_moments.h"

namespace ssa::snap {

const char* section_kind_name(uint32_t kind) {
  switch (static_cast<SectionKind>(kind)) {
    case SectionKind::kConfig: return "config";
    case SectionKind::kLayers: return "layers";
    case SectionKind::kKvPages: return "kv-pages";
    case SectionKind::kCodePages: return "code-pages";
    case SectionKind::kCodebooks: return "codebooks";
    case SectionKind::kMetadata: return "metadata";
    case SectionKind::kShard: return "shard";
    case SectionKind::kKvRows: return "kv-rows";
    case SectionKind::kCodeRows: return "code-rows";
    case SectionKind::kQueries: return "queries";
  }
  return "unknown";
}

void encode_superblock(const Superblock& sb, uint8_t out[kSuperblockBytes]) {
  memset(out, 0, kSuperblockBytes);
  memcpy(out, kMagic, 8);
  put_u32(out + kSbVersionOff, sb.format_version);
  put_u32(out + kSbHeaderLenOff, kSuperblockBytes);
  put_u32(out + kSbFlagsOff, sb.flags);
  put_u32(out + kSbSlotOff, sb.slot);
  put_u64(out + kSbGenerationOff, sb.generation);
  put_u64(out + kSbTableOffsetOff, sb.table_offset);
  put_u64(out + kSbTableLengthOff, sb.table_length);
  put_u64(out + kSbTableHashOff, sb.table_xxh3);
  put_u64(out + kSbFileLengthOff, sb.file_length);
  put_u64(out + kSbFileIdOff, sb.file_id);
  put_u64(out + kSuperblockBytes - 8, XXH3_64bits(out, kSuperblockBytes - 8));
}

void encode_shard(const ShardInfo& s, uint8_t out[kShardBytes]) {
  memset(out, 0, kShardBytes);
  put_u64(out, s.set_id);
  put_u32(out + 8, s.rank);
  put_u32(out + 12, s.n_ranks);
  put_u64(out + 16, s.shard_tokens);
}

ShardInfo decode_shard(const uint8_t in[kShardBytes]) {
  ShardInfo s;
  s.set_id = get_u64(in);
  s.rank = get_u32(in + 8);
  s.n_ranks = get_u32(in + 12);
  s.shard_tokens = get_u64(in + 16);
  return s;
}

std::string encode_table(const std::vector<SectionEntry>& entries, uint64_t generation,
                         uint64_t file_id) {
  std::string out(kTableHeaderBytes + entries.size() * size_t{kEntryBytes}, '\0');
  uint8_t* p = reinterpret_cast<uint8_t*>(out.data());
  memcpy(p, kTableMagic, 8);
  put_u32(p + 8, static_cast<uint32_t>(entries.size()));
  put_u32(p + 12, kEntryBytes);
  put_u64(p + 16, generation);
  put_u64(p + 24, file_id);
  p += kTableHeaderBytes;
  for (const SectionEntry& e : entries) {
    put_u32(p + 0, e.kind);
    put_u32(p + 4, e.layer);
    put_u64(p + 8, e.offset);
    put_u64(p + 16, e.length);
    put_u32(p + 24, e.alignment);
    put_u32(p + 28, e.flags);
    put_u64(p + 32, e.xxh3);
    put_u64(p + 40, e.first);
    put_u64(p + 48, e.count);
    p += kEntryBytes;
  }
  return out;
}

void encode_config(const ssa_session_config& cfg, uint64_t kv_page_bytes,
                   uint64_t code_page_bytes, uint8_t out[kConfigBytes]) {
  memset(out, 0, kConfigBytes);
  put_u32(out + 0, cfg.n_layers);
  put_u32(out + 4, cfg.n_q_heads);
  put_u32(out + 8, cfg.n_kv_heads);
  put_u32(out + 12, cfg.head_dim);
  put_u32(out + 16, static_cast<uint32_t>(cfg.kv_dtype));
  put_u32(out + 20, cfg.pq_subspaces);
  put_u32(out + 24, cfg.pq_centroids);
  put_u32(out + 28, cfg.page_tokens);
  put_u32(out + 32, cfg.flags);
  put_u32(out + 36, cfg.index_min_tokens);
  memcpy(out + 40, &cfg.index_regrow_factor, 4);
  put_u32(out + 44, cfg.index_train_sample);
  put_u32(out + 48, cfg.index_iterations);
  put_u32(out + kConfigProxyOff, static_cast<uint32_t>(cfg.proxy));
  put_u64(out + 56, cfg.model_fingerprint);
  put_u64(out + 64, kv_page_bytes);
  put_u64(out + 72, code_page_bytes);
  memcpy(out + kConfigWeightOff, &cfg.pq_parallel_weight, 4);
}

absl::Status decode_config(const uint8_t in[kConfigBytes], uint32_t format_version,
                           ssa_session_config* cfg, uint64_t* kv_page_bytes,
                           uint64_t* code_page_bytes) {
  const uint32_t dtype = get_u32(in + 16);
  if (dtype != SSA_DTYPE_F32 && dtype != SSA_DTYPE_F16 && dtype != SSA_DTYPE_BF16) {
    return absl::InvalidArgumentError(absl::StrCat("unknown kv_dtype ", dtype));
  }
  // Version 1 wrote the word as reserved: its files are all plain PQ. Version 2
  // knew PQ and OPQ only, so a 4-bit proxy there is damage, not a feature.
  const uint32_t proxy = format_version >= 2 ? get_u32(in + kConfigProxyOff) : 0;
  if (!proxy_is_known(proxy) || (format_version < 3 && proxy > SSA_PROXY_OPQ)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown proxy ", proxy, " in a version ", format_version, " file"));
  }
  // Before version 3 the float at 80 was reserved: squared-error codebooks.
  float weight = 1.0f;
  if (format_version >= 3) memcpy(&weight, in + kConfigWeightOff, 4);
  *cfg = ssa_session_config{};
  cfg->struct_size = sizeof(ssa_session_config);
  cfg->n_layers = get_u32(in + 0);
  cfg->n_q_heads = get_u32(in + 4);
  cfg->n_kv_heads = get_u32(in + 8);
  cfg->head_dim = get_u32(in + 12);
  cfg->kv_dtype = static_cast<ssa_dtype>(dtype);
  cfg->pq_subspaces = get_u32(in + 20);
  cfg->pq_centroids = get_u32(in + 24);
  cfg->page_tokens = get_u32(in + 28);
  cfg->flags = get_u32(in + 32);
  cfg->index_min_tokens = get_u32(in + 36);
  memcpy(&cfg->index_regrow_factor, in + 40, 4);
  cfg->index_train_sample = get_u32(in + 44);
  cfg->index_iterations = get_u32(in + 48);
  cfg->proxy = static_cast<ssa_proxy>(proxy);
  cfg->pq_parallel_weight = weight;  // range-checked by validate_session_config
  cfg->model_fingerprint = get_u64(in + 56);
  *kv_page_bytes = get_u64(in + 64);
  *code_page_bytes = get_u64(in + 72);
  return absl::OkStatus();
}

uint64_t codebooks_section_bytes(const ssa_session_config& cfg, uint32_t format_version) {
  const uint64_t floats = uint64_t{cfg.n_kv_heads} * cfg.pq_centroids * cfg.head_dim;
  const uint64_t square = uint64_t{cfg.n_kv_heads} * cfg.head_dim * cfg.head_dim;
  const bool query_aware = proxy_is_query_aware(cfg.proxy);
  const uint64_t transforms = query_aware ? 2 * square : proxy_has_rotation(cfg.proxy) ? square : 0;
  const uint64_t moments = !query_aware        ? 0
                           : format_version >= 4 ? query_moments_bytes(cfg)
                                                 : uint64_t{cfg.n_kv_heads} * sizeof(uint64_t) + square * sizeof(double);
  return kCodebooksHeaderBytes + (floats + transforms) * sizeof(float) + moments;
}

uint64_t query_moments_bytes(const ssa_session_config& cfg) {
  const uint64_t square = uint64_t{cfg.n_kv_heads} * cfg.head_dim * cfg.head_dim;
  const uint64_t recent = uint64_t{cfg.n_kv_heads} * (sizeof(uint64_t) + sizeof(float) * uint64_t{kRecentQueries} * cfg.head_dim);
  return uint64_t{cfg.n_kv_heads} * sizeof(uint64_t) + square * sizeof(double) + recent;
}

SectionEntry decode_entry(const uint8_t* p) {
  SectionEntry e;
  e.kind = get_u32(p + 0);
  e.layer = get_u32(p + 4);
  e.offset = get_u64(p + 8);
  e.length = get_u64(p + 16);
  e.alignment = get_u32(p + 24);
  e.flags = get_u32(p + 28);
  e.xxh3 = get_u64(p + 32);
  e.first = get_u64(p + 40);
  e.count = get_u64(p + 48);
  return e;
}

}  // namespace ssa::snap
