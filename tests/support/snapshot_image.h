// A snapshot file as bytes that a test or the structure-aware fuzzer edits field
// by field and then reseals: section hashes, the table and the live superblock
// are recomputed, so what the loader sees is a file whose checksums all match
// and only its semantic checks stand between the edit and a session.
#pragma once

#include <stdint.h>
#include <string.h>
#include <xxhash.h>

#include <vector>

#include "snapshot/format.h"

namespace ssa::test {

struct SnapshotImage {
  std::vector<uint8_t> bytes;
  int slot = -1;  // slot of the live superblock
  snap::Superblock sb;
  std::vector<snap::SectionEntry> entries;

  // Reads the live superblock and the table; false unless both are intact
  // (bounds-checked: any bytes may be given).
  bool parse() {
    entries.clear();
    slot = -1;
    uint64_t best_gen = 0;
    for (int i = 0; i < 2; ++i) {
      const uint64_t off = snap::kSlotOffset[i];
      if (bytes.size() < off + snap::kSuperblockBytes) continue;
      const uint8_t* p = bytes.data() + off;
      if (memcmp(p, snap::kMagic, 8) != 0) continue;
      if (snap::get_u32(p + snap::kSbHeaderLenOff) != snap::kSuperblockBytes) continue;
      if (snap::get_u64(p + 120) != XXH3_64bits(p, 120)) continue;
      const uint64_t g = snap::get_u64(p + snap::kSbGenerationOff);
      if (slot < 0 || g > best_gen) {
        slot = i;
        best_gen = g;
      }
    }
    if (slot < 0) return false;
    const uint8_t* p = bytes.data() + snap::kSlotOffset[slot];
    sb.format_version = snap::get_u32(p + snap::kSbVersionOff);
    sb.flags = snap::get_u32(p + snap::kSbFlagsOff);
    sb.slot = snap::get_u32(p + snap::kSbSlotOff);
    sb.generation = snap::get_u64(p + snap::kSbGenerationOff);
    sb.table_offset = snap::get_u64(p + snap::kSbTableOffsetOff);
    sb.table_length = snap::get_u64(p + snap::kSbTableLengthOff);
    sb.table_xxh3 = snap::get_u64(p + snap::kSbTableHashOff);
    sb.file_length = snap::get_u64(p + snap::kSbFileLengthOff);
    sb.file_id = snap::get_u64(p + snap::kSbFileIdOff);
    if (sb.table_offset > bytes.size() || bytes.size() - sb.table_offset < snap::kTableHeaderBytes)
      return false;
    const uint8_t* t = bytes.data() + sb.table_offset;
    const uint64_t n = snap::get_u32(t + 8);
    if (n * snap::kEntryBytes > bytes.size() - sb.table_offset - snap::kTableHeaderBytes) return false;
    for (uint64_t i = 0; i < n; ++i)
      entries.push_back(snap::decode_entry(t + snap::kTableHeaderBytes + i * snap::kEntryBytes));
    return true;
  }

  // Entry index of the first section of `kind` (of `layer` unless kAnyLayer), or -1.
  static constexpr uint32_t kAnyLayer = 0xfffffffeu;
  int find(snap::SectionKind kind, uint32_t layer = kAnyLayer) const {
    for (size_t i = 0; i < entries.size(); ++i) {
      if (entries[i].kind == static_cast<uint32_t>(kind) && (layer == kAnyLayer || entries[i].layer == layer))
        return static_cast<int>(i);
    }
    return -1;
  }
  // Whether section i lies inside the bytes (edits touch only such sections).
  bool in_file(size_t i) const {
    const snap::SectionEntry& e = entries[i];
    return e.offset <= bytes.size() && e.length <= bytes.size() - e.offset;
  }
  uint8_t* body(size_t i) { return bytes.data() + entries[i].offset; }
  void rehash(size_t i) {
    if (in_file(i)) entries[i].xxh3 = XXH3_64bits(body(i), entries[i].length);
  }

  // Re-encodes the table at sb.table_offset and the live superblock (the other
  // slot is kept), growing the file if the table grew.
  void seal() {
    if (sb.table_offset > bytes.size() + (uint64_t{1} << 20)) {  // an edit moved it far away
      reseal_superblock();
      return;
    }
    const std::string t = snap::encode_table(entries, sb.generation, sb.file_id);
    if (sb.table_offset + t.size() > bytes.size()) bytes.resize(sb.table_offset + t.size());
    memcpy(bytes.data() + sb.table_offset, t.data(), t.size());
    sb.table_length = t.size();
    sb.table_xxh3 = XXH3_64bits(t.data(), t.size());
    if (sb.file_length < sb.table_offset + t.size()) sb.file_length = sb.table_offset + t.size();
    reseal_superblock();
  }
  // Recomputes only the live superblock's checksum from sb (for superblock edits).
  void reseal_superblock() {
    if (slot < 0) return;
    uint8_t* p = bytes.data() + snap::kSlotOffset[slot];
    snap::encode_superblock(sb, p);
  }
};

}  // namespace ssa::test
