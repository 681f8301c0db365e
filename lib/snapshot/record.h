// What a session last wrote to (or loaded from) a snapshot file, kept in the
// session so that a checkpoint writes only what changed since. Pages are compared
// by identity: the record holds a reference to every page it wrote, so a page the
// session changes afterwards is a different page (a shared page is copied before
// it is written), and a page still referenced by both is unchanged.
#pragma once

#include <stdint.h>
#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "snapshot/format.h"
#include "store/layer_store.h"

namespace ssa {

// A snapshot file mapped by SSA_LOAD_MMAP. Sections whose bytes were not hashed at
// load are hashed before anything copies them into another snapshot.
struct MappedSnapshot {
  struct Section {
    uint64_t offset = 0, length = 0, xxh3 = 0;
    std::atomic<bool> verified{false};
    Section() = default;
    Section(const Section& o) : offset(o.offset), length(o.length), xxh3(o.xxh3),
                                verified(o.verified.load()) {}
    Section& operator=(const Section& o) {
      offset = o.offset;
      length = o.length;
      xxh3 = o.xxh3;
      verified.store(o.verified.load());
      return *this;
    }
  };
  std::string path;
  uint8_t* base = nullptr;
  size_t bytes = 0;
  std::vector<Section> sections;  // KV sections mapped, sorted by offset
  ~MappedSnapshot();
};

struct SnapshotRecord {
  std::string path;
  dev_t dev = 0;
  ino_t ino = 0;
  uint64_t file_id = 0;
  uint64_t generation = 0;
  uint64_t file_length = 0;
  std::vector<snap::SectionEntry> sections;  // the committed table

  struct Layer {
    uint64_t n_tokens = 0, trained_at_tokens = 0;
    std::vector<PageRef> kv, code;            // pages as written, by index
    std::vector<uint32_t> kv_entry, code_entry;  // page run holding page i (UINT32_MAX: none)
    // Row runs (in table order) that give rows of page i on top of its page run.
    std::map<uint64_t, std::vector<uint32_t>> kv_rows, code_rows;
    CodebooksRef codebooks;
    int64_t codebooks_entry = -1;
    QueryMomentsRef queries;  // as the queries section holds them (null: none)
    int64_t queries_entry = -1;
  };
  std::vector<Layer> layers;
  int64_t config_entry = -1, layers_entry = -1, metadata_entry = -1;
  std::string metadata;
};

// Per-session snapshot state (ssa_session::snapshot).
struct SnapshotState {
  std::shared_ptr<SnapshotRecord> record;
  std::vector<std::shared_ptr<MappedSnapshot>> mappings;
};

}  // namespace ssa
