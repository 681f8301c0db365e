#include "snapshot/group_manifest.h"

#include <string.h>
#include <xxhash.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "snapshot/format.h"
#include "status.h"

namespace ssa::snap {
namespace {

// Record layout: u64 file_id, generation, file_length, table_xxh3; u32
// name_length; u32 reserved; name bytes (zero-padded to 256); 24 reserved.
constexpr size_t kNameOff = 40, kNameRoom = 256;
static_assert(kNameOff + kNameRoom + 24 == kManifestRecordBytes);

template <typename... Args>
absl::Status corrupt(const std::string& path, const Args&... args) {
  return make_error(SSA_ERR_CORRUPT, absl::StrCat("group snapshot manifest '", path, "': ", args...));
}

bool valid_name(const std::string& n) {
  if (n.empty() || n.size() > kMaxRankFileName || n == "." || n == "..") return false;
  for (char c : n) {
    if (c == '/' || c == '\0') return false;
  }
  return true;
}

}  // namespace

std::string encode_manifest(const Manifest& m) {
  std::string out(kManifestHeaderBytes + m.ranks.size() * size_t{kManifestRecordBytes} + 8, '\0');
  uint8_t* p = reinterpret_cast<uint8_t*>(out.data());
  memcpy(p, kManifestMagic, 8);
  put_u32(p + 8, kManifestVersion);
  put_u32(p + 12, kManifestHeaderBytes);
  put_u32(p + 16, static_cast<uint32_t>(m.ranks.size()));
  put_u32(p + 20, kManifestRecordBytes);
  put_u64(p + 24, m.set_id);
  put_u64(p + 32, m.shard_tokens);
  uint8_t* r = p + kManifestHeaderBytes;
  for (const RankFile& f : m.ranks) {
    put_u64(r + 0, f.file_id);
    put_u64(r + 8, f.generation);
    put_u64(r + 16, f.file_length);
    put_u64(r + 24, f.table_xxh3);
    put_u32(r + 32, static_cast<uint32_t>(f.name.size()));
    memcpy(r + kNameOff, f.name.data(), std::min(f.name.size(), kNameRoom));
    r += kManifestRecordBytes;
  }
  put_u64(r, XXH3_64bits(p, static_cast<size_t>(r - p)));
  return out;
}

bool is_manifest(const uint8_t* head, size_t n) { return n >= 8 && memcmp(head, kManifestMagic, 8) == 0; }

absl::StatusOr<Manifest> decode_manifest(const std::string& bytes, const std::string& path) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(bytes.data());
  if (bytes.size() < kManifestHeaderBytes + 8 || !is_manifest(p, bytes.size())) {
    return corrupt(path, "too short (", bytes.size(), " bytes) or no magic");
  }
  const uint32_t version = get_u32(p + 8);
  if (version != kManifestVersion) {
    return make_error(SSA_ERR_VERSION, absl::StrCat("group snapshot manifest '", path, "' has version ", version,
                                                    "; this library reads version ", kManifestVersion));
  }
  const uint32_t header = get_u32(p + 12), n = get_u32(p + 16), record = get_u32(p + 20);
  if (header != kManifestHeaderBytes || record != kManifestRecordBytes) {
    return corrupt(path, "header of ", header, " bytes and records of ", record, " bytes (expected ",
                   kManifestHeaderBytes, " and ", kManifestRecordBytes, ")");
  }
  if (n == 0 || n > kMaxManifestRanks) return corrupt(path, "names ", n, " ranks (1..", kMaxManifestRanks, ")");
  const uint64_t want = kManifestHeaderBytes + uint64_t{n} * kManifestRecordBytes + 8;
  if (bytes.size() != want) return corrupt(path, "is ", bytes.size(), " bytes; ", n, " ranks take ", want);
  if (get_u64(p + want - 8) != XXH3_64bits(p, want - 8)) return corrupt(path, "fails its checksum");
  Manifest m;
  m.set_id = get_u64(p + 24);
  m.shard_tokens = get_u64(p + 32);
  if (m.set_id == 0) return corrupt(path, "has set id 0");
  if (m.shard_tokens == 0 || m.shard_tokens % 8192 != 0) {
    return corrupt(path, "has shard_tokens ", m.shard_tokens, " (a positive multiple of 8192)");
  }
  m.ranks.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    const uint8_t* r = p + kManifestHeaderBytes + size_t{i} * kManifestRecordBytes;
    RankFile& f = m.ranks[i];
    f.file_id = get_u64(r);
    f.generation = get_u64(r + 8);
    f.file_length = get_u64(r + 16);
    f.table_xxh3 = get_u64(r + 24);
    const uint32_t len = get_u32(r + 32);
    if (len == 0 || len > kMaxRankFileName) return corrupt(path, "rank ", i, " has a name of ", len, " bytes");
    f.name.assign(reinterpret_cast<const char*>(r + kNameOff), len);
    if (!valid_name(f.name)) return corrupt(path, "rank ", i, " has an invalid file name");
    for (size_t j = len; j < kNameRoom; ++j) {
      if (r[kNameOff + j] != 0) return corrupt(path, "rank ", i, "'s name is not zero-padded");
    }
    if (f.file_id == 0 || f.generation == 0 || f.file_length < kHeaderAreaBytes) {
      return corrupt(path, "rank ", i, " names a file of id ", f.file_id, ", generation ", f.generation,
                     " and ", f.file_length, " bytes, which no save writes");
    }
  }
  return m;
}

std::string rank_file_name(const std::string& manifest_name, uint64_t set_id, uint32_t rank) {
  return absl::StrFormat("%s.%016x.rank%u", manifest_name, set_id, rank);
}

bool is_other_rank_file(const std::string& name, const std::string& manifest_name, uint64_t keep) {
  // manifest_name + "." + 16 hex + ".rank" + digits
  const size_t b = manifest_name.size();
  if (name.size() < b + 1 + 16 + 5 + 1 || name.compare(0, b, manifest_name) != 0 || name[b] != '.') return false;
  const std::string hex = name.substr(b + 1, 16);
  for (char c : hex) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  if (name.compare(b + 17, 5, ".rank") != 0) return false;
  for (size_t i = b + 22; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
  }
  return hex != absl::StrFormat("%016x", keep);
}

}  // namespace ssa::snap
