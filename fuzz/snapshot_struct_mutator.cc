// Structure-aware mutations for the snapshot loader fuzzer: the input is parsed
// as a snapshot, one field (a config word, a layer record, a codebook value, a
// code byte, a K/V element, a table entry, a superblock field) or the entry list
// is changed, and every checksum is recomputed, so the loader's semantic checks
// - not its checksums - are what the fuzzer exercises. Inputs that do not parse
// (and one mutation in eight) get libFuzzer's byte-level mutations.
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <random>

#include "support/snapshot_image.h"

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

using ssa::snap::SectionKind;
using ssa::test::SnapshotImage;

uint64_t interesting(std::mt19937_64& rng, uint64_t cur) {
  static const uint64_t kValues[] = {0, 1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 63, 64, 255, 256, 257,
                                     4095, 4096, 65535, 65536, 0x7fffffffull, 0x80000000ull,
                                     0xffffffffull, uint64_t{1} << 32, uint64_t{1} << 62,
                                     uint64_t{1} << 63, ~uint64_t{0} - 1, ~uint64_t{0}};
  switch (rng() % 4) {
    case 0: return kValues[rng() % (sizeof kValues / sizeof kValues[0])];
    case 1: return cur + 1 + rng() % 4;
    case 2: return cur - 1 - rng() % 4;
    default: return cur ^ (uint64_t{1} << (rng() % 64));
  }
}

// A value of `bytes` bytes at p (2 or 4: a K/V element or a float) made NaN,
// infinite or huge.
void poison_float(uint8_t* p, size_t bytes, std::mt19937_64& rng) {
  static const uint32_t k32[] = {0x7fc00000u, 0x7f800000u, 0xff800000u, 0x7f7fffffu, 0x00000001u};
  static const uint16_t k16[] = {0x7e00u, 0x7c00u, 0xfc00u, 0x7fc0u, 0x7f80u, 0x7bffu};
  if (bytes == 4) {
    const uint32_t v = k32[rng() % 5];
    memcpy(p, &v, 4);
  } else {
    const uint16_t v = k16[rng() % 6];
    memcpy(p, &v, 2);
  }
}

void mutate_section(SnapshotImage& img, std::mt19937_64& rng) {
  if (img.entries.empty()) return;
  const size_t i = rng() % img.entries.size();
  if (!img.in_file(i)) return;
  const ssa::snap::SectionEntry& e = img.entries[i];
  uint8_t* b = img.body(i);
  const uint64_t len = e.length;
  if (len < 4) {  // a length already edited down: one byte
    if (len > 0) b[rng() % len] = static_cast<uint8_t>(rng());
    img.rehash(i);
    return;
  }
  switch (static_cast<SectionKind>(e.kind)) {
    case SectionKind::kCodePages:
    case SectionKind::kCodeRows: {  // a code byte, often one naming no centroid
      const uint64_t at = rng() % len;
      b[at] = rng() % 2 ? static_cast<uint8_t>(rng()) : static_cast<uint8_t>(16 + rng() % 240);
      break;
    }
    case SectionKind::kKvPages:
    case SectionKind::kKvRows: {  // an element (f16/bf16 or f32 by alignment)
      const size_t eb = rng() % 2 ? 2 : 4;
      poison_float(b + (rng() % (len / eb)) * eb, eb, rng);
      break;
    }
    case SectionKind::kCodebooks: {
      if (rng() % 2 && len >= 16) {  // the shape header
        const size_t w = rng() % 4;
        ssa::snap::put_u32(b + 4 * w, static_cast<uint32_t>(interesting(rng, ssa::snap::get_u32(b + 4 * w))));
      } else if (len >= 20) {
        poison_float(b + 16 + (rng() % ((len - 16) / 4)) * 4, 4, rng);
      }
      break;
    }
    default: {  // config, layers, metadata, unknown: a 4- or 8-byte word
      if (len < 8) {
        b[rng() % len] = static_cast<uint8_t>(rng());
        break;
      }
      const uint64_t at = (rng() % (len / 4)) * 4;
      if (rng() % 3 == 0 && at + 8 <= len) {
        ssa::snap::put_u64(b + at, interesting(rng, ssa::snap::get_u64(b + at)));
      } else {
        ssa::snap::put_u32(b + at, static_cast<uint32_t>(interesting(rng, ssa::snap::get_u32(b + at))));
      }
      break;
    }
  }
  img.rehash(i);
}

void mutate_entry(SnapshotImage& img, std::mt19937_64& rng) {
  if (img.entries.empty()) return;
  ssa::snap::SectionEntry& e = img.entries[rng() % img.entries.size()];
  switch (rng() % 8) {
    case 0: e.kind = static_cast<uint32_t>(rng() % 3 ? 1 + rng() % ssa::snap::kLastKnownKind : interesting(rng, e.kind)); break;
    case 1: e.layer = static_cast<uint32_t>(rng() % 2 ? rng() % 4 : interesting(rng, e.layer)); break;
    case 2: e.offset = interesting(rng, e.offset); break;
    case 3: e.length = interesting(rng, e.length); break;
    case 4: e.alignment = static_cast<uint32_t>(interesting(rng, e.alignment)); break;
    case 5: e.flags = static_cast<uint32_t>(interesting(rng, e.flags)); break;
    case 6: e.first = interesting(rng, e.first); break;
    default: e.count = interesting(rng, e.count); break;
  }
}

void mutate_list(SnapshotImage& img, std::mt19937_64& rng) {
  if (img.entries.empty()) return;
  const size_t i = rng() % img.entries.size(), j = rng() % img.entries.size();
  switch (rng() % 3) {
    case 0: img.entries.erase(img.entries.begin() + static_cast<long>(i)); break;
    case 1: img.entries.push_back(img.entries[i]); break;
    default: std::swap(img.entries[i], img.entries[j]); break;
  }
}

void mutate_superblock(SnapshotImage& img, std::mt19937_64& rng) {
  ssa::snap::Superblock& sb = img.sb;
  switch (rng() % 7) {
    case 0: sb.generation = interesting(rng, sb.generation); break;
    case 1: sb.table_offset = interesting(rng, sb.table_offset); break;
    case 2: sb.file_length = interesting(rng, sb.file_length); break;
    case 3: sb.slot = static_cast<uint32_t>(interesting(rng, sb.slot)); break;
    case 4: sb.flags = static_cast<uint32_t>(interesting(rng, sb.flags)); break;
    case 5: sb.format_version = static_cast<uint32_t>(interesting(rng, sb.format_version)); break;
    default: sb.file_id = interesting(rng, sb.file_id); break;
  }
}

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed) {
  std::mt19937_64 rng(seed);
  SnapshotImage img;
  img.bytes.assign(data, data + size);
  if (rng() % 8 == 0 || !img.parse()) return LLVMFuzzerMutate(data, size, max_size);
  const int n = 1 + static_cast<int>(rng() % 2);  // one or two edits
  for (int k = 0; k < n; ++k) {
    switch (rng() % 10) {
      case 0: case 1: case 2: case 3: mutate_section(img, rng); break;
      case 4: case 5: case 6: mutate_entry(img, rng); break;
      case 7: mutate_list(img, rng); break;
      case 8: mutate_superblock(img, rng); break;
      default: img.bytes.resize(img.bytes.size() - rng() % (img.bytes.size() / 4 + 1)); break;
    }
  }
  img.seal();
  if (img.bytes.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  memcpy(data, img.bytes.data(), img.bytes.size());
  return img.bytes.size();
}
