// Full saves (temp file + rename) and incremental checkpoints (append + table +
// superblock slot) of a session.
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <mutex>
#include <shared_mutex>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <random>

#include "decode/decode_step.h"
#include "absl/strings/str_cat.h"
#include "backend.h"
#include "caller_buffers.h"
#include "index/proxy_kind.h"
#include "snapshot/file_io.h"
#include "snapshot/format.h"
#include "snapshot/group_snapshot.h"
#include "snapshot/internal.h"
#include "snapshot/record.h"
#include "snapshot/row_runs.h"
#include "snapshot/save_path.h"
#include "snapshot/snapshot.h"
#include "status.h"

namespace ssa {
namespace {

using snap::SectionEntry;
using snap::SectionKind;

constexpr size_t kBufferBytes = size_t{8} << 20;
constexpr size_t kDirectBytes = size_t{1} << 20;  // pieces this large skip the buffer
constexpr uint64_t kHolePadBytes = 512;  // padding this long is skipped, not written
// A checkpoint rewrites the file in full once superseded bytes exceed the live
// ones (and this floor), so a file never grows beyond about twice its content.
constexpr uint64_t kCompactFloorBytes = uint64_t{16} << 20;

}  // namespace

uint64_t snap::random_id() {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  uint64_t x = (uint64_t{rd()} << 32) ^ rd();
  x ^= static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  x ^= counter.fetch_add(0x9E3779B97F4A7C15ull) + static_cast<uint64_t>(getpid());
  return x == 0 ? 1 : x;
}

namespace {

// Writes sections one after another from a start offset, hashing each section
// and batching small pieces into few large writes.
class SectionWriter {
 public:
  SectionWriter(int fd, std::string path, uint64_t start)
      : fd_(fd), path_(std::move(path)), pos_(start), state_(XXH3_createState()),
        buf_(new uint8_t[kBufferBytes]) {}
  ~SectionWriter() { XXH3_freeState(state_); }

  bool ok() const { return state_ != nullptr; }
  uint64_t pos() const { return pos_; }

  absl::Status begin(SectionKind kind, uint32_t layer, uint32_t alignment, uint64_t first = 0,
                     uint64_t count = 0) {
    SSA_RETURN_IF_ERROR(pad_to(alignment));
    cur_ = SectionEntry{};
    cur_.kind = static_cast<uint32_t>(kind);
    cur_.layer = layer;
    cur_.alignment = alignment;
    cur_.offset = pos_;
    cur_.first = first;
    cur_.count = count;
    XXH3_64bits_reset(state_);
    return absl::OkStatus();
  }
  absl::Status write(const void* p, size_t n) {
    XXH3_64bits_update(state_, p, n);
    return emit(p, n);
  }
  void end() {
    cur_.length = pos_ - cur_.offset;
    cur_.xxh3 = XXH3_64bits_digest(state_);
    entries.push_back(cur_);
  }
  // Bytes outside any section (the table).
  absl::Status write_raw(const void* p, size_t n) { return emit(p, n); }
  // Padding belongs to no section and is never read: a long one is left as a
  // hole (it reads as zeros) rather than written, so that a checkpoint writes
  // about its sections' bytes and not up to 4 KiB more per KV page run.
  absl::Status pad_to(uint64_t alignment) {
    static const uint8_t kZeros[snap::kKvAlign] = {};
    const uint64_t target = snap::align_up(pos_, alignment);
    if (target - pos_ < kHolePadBytes) return emit(kZeros, static_cast<size_t>(target - pos_));
    SSA_RETURN_IF_ERROR(flush());
    pos_ = target;
    return absl::OkStatus();
  }
  absl::Status flush() {
    if (len_ == 0) return absl::OkStatus();
    absl::Status st = snap::pwrite_all(fd_, buf_.get(), len_, pos_ - len_, path_);
    len_ = 0;
    return st;
  }

  std::vector<SectionEntry> entries;

 private:
  absl::Status emit(const void* p, size_t n) {
    if (n == 0) return absl::OkStatus();
    if (n >= kDirectBytes) {
      SSA_RETURN_IF_ERROR(flush());
      SSA_RETURN_IF_ERROR(snap::pwrite_all(fd_, p, n, pos_, path_));
      pos_ += n;
      return absl::OkStatus();
    }
    if (len_ + n > kBufferBytes) SSA_RETURN_IF_ERROR(flush());
    memcpy(buf_.get() + len_, p, n);
    len_ += n;
    pos_ += n;
    return absl::OkStatus();
  }

  int fd_;
  std::string path_;
  uint64_t pos_;  // file offset of the next byte (buffered bytes included)
  XXH3_state_t* state_;
  std::unique_ptr<uint8_t[]> buf_;
  size_t len_ = 0;
  SectionEntry cur_;
};

// A copy of a partial last page with the slots beyond the layer's length zeroed:
// those slots hold whatever the page held before (fresh pool memory, truncated
// rows), which must not reach the file.
void copy_visible(const KvLayout& lay, SectionKind kind, const uint8_t* src, uint32_t valid,
                  uint8_t* dst) {
  if (kind == SectionKind::kKvPages) {
    memset(dst, 0, lay.kv_page_bytes());
    for (uint32_t h = 0; h < lay.n_kv_heads; ++h) {
      memcpy(dst + lay.k_offset(h, 0), src + lay.k_offset(h, 0), valid * lay.row_bytes());
      memcpy(dst + lay.v_offset(h, 0), src + lay.v_offset(h, 0), valid * lay.row_bytes());
    }
  } else {
    memset(dst, 0, lay.code_page_bytes());
    for (uint32_t h = 0; h < lay.n_kv_heads; ++h) {
      for (uint32_t r = 0; r < lay.code_rows(); ++r) {
        memcpy(dst + lay.code_offset(h, r), src + lay.code_offset(h, r), valid);
      }
    }
  }
}

// Whether observed queries (null: none) have the shape of n_kv KV heads of d
// dimensions (recent queries may be absent: moments read from a version 3 file).
bool moments_fit(const QueryMoments* qm, uint32_t n_kv, uint32_t d) {
  return qm == nullptr ||
         (qm->count.size() == n_kv && qm->sum.size() == size_t{n_kv} * d * d &&
          (qm->recent_count.empty() ||
           (qm->recent_count.size() == n_kv && qm->recent.size() == size_t{n_kv} * kRecentQueries * d)));
}

// The observed queries as the format stores them (snap::query_moments_bytes):
// counts, moment sums, recent counts, recent queries; none observed is zeros, and
// moments read from a version 3 file have zero recent counts and rows.
absl::Status write_query_moments(SectionWriter& w, const QueryMoments* qm, uint32_t n_kv, uint32_t d) {
  const size_t square = size_t{n_kv} * d * d, recent_floats = size_t{n_kv} * kRecentQueries * d;
  const bool any = qm != nullptr, recent = any && !qm->recent_count.empty();
  const std::vector<uint64_t> zero_counts(recent ? 0 : n_kv, 0);
  const std::vector<double> zero_sum(any ? 0 : square, 0.0);
  const std::vector<float> zero_recent(recent ? 0 : recent_floats, 0.0f);
  const std::vector<uint64_t>& count = any ? qm->count : zero_counts;
  const std::vector<double>& sum = any ? qm->sum : zero_sum;
  const std::vector<uint64_t>& recent_count = recent ? qm->recent_count : zero_counts;
  const std::vector<float>& recent_rows = recent ? qm->recent : zero_recent;
  SSA_RETURN_IF_ERROR(w.write(count.data(), count.size() * sizeof(uint64_t)));
  SSA_RETURN_IF_ERROR(w.write(sum.data(), sum.size() * sizeof(double)));
  SSA_RETURN_IF_ERROR(w.write(recent_count.data(), recent_count.size() * sizeof(uint64_t)));
  return w.write(recent_rows.data(), recent_rows.size() * sizeof(float));
}

SnapshotState& state_of(ssa_session& s) {
  if (!s.snapshot) s.snapshot = std::make_shared<SnapshotState>();
  return *s.snapshot;
}

// Sections of the session that `prev` (the file's committed state; null for a
// full save) does not hold yet are written through w; the rest are kept. Builds
// the new table and record. Entry references are encoded while writing as
// >= 0: index into prev->sections, < 0: -(1 + index into w.entries).
struct BodyResult {
  std::vector<SectionEntry> table;
  std::shared_ptr<SnapshotRecord> record;
};

// held: the pages written (a rank of a group writes its shard's; the layers
// section still gives the whole lengths); shard: the file's shard section.
absl::Status write_body(const ssa_session& s, const SnapshotState& st, const SnapshotRecord* prev,
                        SectionWriter& w, BodyResult* out, const HeldRange& held = HeldRange{},
                        const snap::ShardInfo* shard = nullptr) {
  const KvLayout& lay = s.layout;
  const size_t kv_bytes = lay.kv_page_bytes(), code_bytes = lay.code_page_bytes();
  auto rec = std::make_shared<SnapshotRecord>();
  auto new_ref = [&w]() { return -1 - static_cast<int64_t>(w.entries.size()); };
  constexpr int64_t kNone = INT64_MIN;
  int64_t config_ref = kNone, layers_ref = kNone, meta_ref = kNone;

  // Config: fixed for the life of the session.
  if (prev != nullptr && prev->config_entry >= 0) {
    config_ref = prev->config_entry;
  } else {
    uint8_t cfg[snap::kConfigBytes];
    snap::encode_config(s.config, kv_bytes, code_bytes, cfg);
    config_ref = new_ref();
    SSA_RETURN_IF_ERROR(w.begin(SectionKind::kConfig, snap::kNoLayer, snap::kSectionAlign));
    SSA_RETURN_IF_ERROR(w.write(cfg, sizeof cfg));
    w.end();
  }

  // Layers: token counts and index state, rewritten every time (32 B per layer).
  {
    std::string body(s.layers.size() * size_t{snap::kLayerRecordBytes}, '\0');
    uint8_t* p = reinterpret_cast<uint8_t*>(body.data());
    for (const LayerStore& L : s.layers) {
      snap::put_u64(p + 0, L.n_tokens);
      snap::put_u64(p + 8, L.trained_at_tokens);
      snap::put_u32(p + 16, L.codebooks ? snap::kLayerHasCodebooks : 0u);
      p += snap::kLayerRecordBytes;
    }
    layers_ref = new_ref();
    SSA_RETURN_IF_ERROR(w.begin(SectionKind::kLayers, snap::kNoLayer, snap::kSectionAlign));
    SSA_RETURN_IF_ERROR(w.write(body.data(), body.size()));
    w.end();
  }
  if (shard != nullptr) {
    uint8_t b[snap::kShardBytes];
    snap::encode_shard(*shard, b);
    SSA_RETURN_IF_ERROR(w.begin(SectionKind::kShard, snap::kNoLayer, snap::kSectionAlign));
    SSA_RETURN_IF_ERROR(w.write(b, sizeof b));
    w.end();
  }

  rec->metadata = s.metadata;
  if (!s.metadata.empty()) {
    if (prev != nullptr && prev->metadata_entry >= 0 && prev->metadata == s.metadata) {
      meta_ref = prev->metadata_entry;
    } else {
      meta_ref = new_ref();
      SSA_RETURN_IF_ERROR(w.begin(SectionKind::kMetadata, snap::kNoLayer, snap::kSectionAlign));
      SSA_RETURN_IF_ERROR(w.write(s.metadata.data(), s.metadata.size()));
      w.end();
    }
  }

  // Refs are int64 while writing; remapped to final table indices below.
  // rows_refs: per page, the row runs that give rows of it on top of its page run.
  using RowRefs = std::map<uint64_t, std::vector<int64_t>>;
  std::vector<std::vector<int64_t>> kv_refs(s.layers.size()), code_refs(s.layers.size());
  std::vector<RowRefs> kv_row_refs(s.layers.size()), code_row_refs(s.layers.size());
  std::vector<int64_t> cb_refs(s.layers.size(), kNone), query_refs(s.layers.size(), kNone);
  rec->layers.resize(s.layers.size());

  std::unique_ptr<uint8_t[]> partial;   // the masked copy of a partial last page, or a run's rows
  std::unique_ptr<uint8_t[]> staging;   // host copy of a page the backend keeps elsewhere
  std::unique_ptr<uint8_t[]> staging2;  // the same, for a second page at once
  auto host_bytes = [&](uint32_t layer, SectionKind kind, const Page* page, uint64_t k, size_t page_bytes,
                        std::unique_ptr<uint8_t[]>& buf) -> absl::StatusOr<const uint8_t*> {
    if (page == nullptr || page->bytes() < page_bytes) {
      return make_error(SSA_ERR_INTERNAL,
                        absl::StrCat("layer ", layer, " ", snap::section_kind_name(static_cast<uint32_t>(kind)),
                                     " page ", k, " is missing or short"));
    }
    return s.backend->page_to_host(s, *page, page_bytes, [&] {
      if (!buf) buf.reset(new uint8_t[std::max(kv_bytes, code_bytes)]);
      return buf.get();
    });
  };

  // Writes the pages of `pages` in [0, needed) that are held and that prev (pl)
  // does not hold. A full save writes whole pages only (readable by every reader
  // of this format version). A checkpoint writes, of each run of changed pages,
  // the rows the file lacks as row runs: the rows appended to the page that was
  // partial at the last commit (when its earlier rows are unchanged) and the rows
  // of a new partial last page; the whole pages between them (KV) as a page run,
  // which a mapped load maps.
  auto write_pages = [&](uint32_t layer, bool kv, const std::vector<PageRef>& pages, uint64_t n_tokens,
                         const SnapshotRecord::Layer* pl, std::vector<int64_t>& refs,
                         RowRefs& row_refs) -> absl::Status {
    const SectionKind kind = kv ? SectionKind::kKvPages : SectionKind::kCodePages;
    const size_t page_bytes = kv ? kv_bytes : code_bytes;
    const uint32_t P = lay.page_tokens;
    const std::vector<PageRef>* old = pl ? (kv ? &pl->kv : &pl->code) : nullptr;
    const std::vector<uint32_t>* old_entry = pl ? (kv ? &pl->kv_entry : &pl->code_entry) : nullptr;
    const std::map<uint64_t, std::vector<uint32_t>>* old_rows = pl ? (kv ? &pl->kv_rows : &pl->code_rows) : nullptr;
    const snap::RowShape sh = snap::row_shape(lay, kv);
    const uint64_t needed = lay.pages_for(n_tokens);
    const uint32_t tail = static_cast<uint32_t>(n_tokens % P);
    refs.assign(needed, kNone);
    row_refs.clear();
    auto unchanged = [&](uint64_t j) {
      return old != nullptr && j < old->size() && (*old)[j].get() == pages[j].get();
    };
    // Page j as the file holds it now: its page run and row runs.
    auto keep_old = [&](uint64_t j) {
      const uint32_t e = (*old_entry)[j];
      refs[j] = e == UINT32_MAX ? kNone : int64_t{e};
      const auto it = old_rows->find(j);
      if (it != old_rows->end()) row_refs[j].assign(it->second.begin(), it->second.end());
    };
    auto page_run = [&](uint64_t a, uint64_t b) -> absl::Status {
      const uint32_t align = kv ? snap::kKvAlign : snap::kSectionAlign;
      const int64_t ref = new_ref();
      SSA_RETURN_IF_ERROR(w.begin(kind, layer, align, a, b - a));
      for (uint64_t k = a; k < b; ++k) {
        absl::StatusOr<const uint8_t*> host = host_bytes(layer, kind, pages[k].get(), k, page_bytes, staging);
        if (!host.ok()) return host.status();
        const uint8_t* bytes = *host;
        SSA_RETURN_IF_ERROR(snap::verify_mapped_page(st, bytes));
        if (k + 1 == needed && tail != 0) {
          if (!partial) partial.reset(new uint8_t[std::max(kv_bytes, code_bytes)]);
          copy_visible(lay, kind, bytes, tail, partial.get());
          SSA_RETURN_IF_ERROR(w.write(partial.get(), page_bytes));
        } else {
          SSA_RETURN_IF_ERROR(w.write(bytes, page_bytes));
        }
        refs[k] = ref;
      }
      w.end();
      return absl::OkStatus();
    };
    // Rows [a, b) as one row run; `delta_page`: the page whose earlier rows the
    // file keeps (UINT64_MAX: none).
    auto row_run = [&](uint64_t a, uint64_t b, uint64_t delta_page) -> absl::Status {
      const int64_t ref = new_ref();
      SSA_RETURN_IF_ERROR(w.begin(kv ? SectionKind::kKvRows : SectionKind::kCodeRows, layer, snap::kSectionAlign,
                                  a, b - a));
      if (!partial) partial.reset(new uint8_t[std::max(kv_bytes, code_bytes)]);
      for (uint64_t k = a / P; k * P < b; ++k) {
        absl::StatusOr<const uint8_t*> host = host_bytes(layer, kind, pages[k].get(), k, page_bytes, staging);
        if (!host.ok()) return host.status();
        SSA_RETURN_IF_ERROR(snap::verify_mapped_page(st, *host));
        const uint32_t sa = static_cast<uint32_t>(std::max(a, k * P) - k * P);
        const uint32_t sb = static_cast<uint32_t>(std::min(b, (k + 1) * P) - k * P);
        snap::gather_rows(sh, *host, sa, sb, partial.get());
        SSA_RETURN_IF_ERROR(w.write(partial.get(), (sb - sa) * sh.row_bytes()));
        if (k == delta_page) {
          keep_old(k);
        } else {
          refs[k] = kNone;
          row_refs.erase(k);
        }
        row_refs[k].push_back(ref);
      }
      w.end();
      return absl::OkStatus();
    };
    // Whether the page partial at the last commit keeps its committed rows.
    auto extends_old_partial = [&](uint64_t i) -> absl::StatusOr<bool> {
      if (pl == nullptr || pl->n_tokens % P == 0 || i != pl->n_tokens / P || n_tokens <= pl->n_tokens ||
          i >= old->size()) {
        return false;
      }
      absl::StatusOr<const uint8_t*> was = host_bytes(layer, kind, (*old)[i].get(), i, page_bytes, staging2);
      if (!was.ok()) return was.status();
      absl::StatusOr<const uint8_t*> now = host_bytes(layer, kind, pages[i].get(), i, page_bytes, staging);
      if (!now.ok()) return now.status();
      return snap::rows_equal(sh, *was, *now, 0, static_cast<uint32_t>(pl->n_tokens % P));
    };

    uint64_t i = 0;
    while (i < needed) {
      if (!held.holds_page(i, P)) {
        ++i;
        continue;
      }
      if (unchanged(i)) {
        keep_old(i);
        ++i;
        continue;
      }
      uint64_t j = i;
      while (j < needed && !unchanged(j) && held.holds_page(j, P)) ++j;
      absl::StatusOr<bool> delta = extends_old_partial(i);
      if (!delta.ok()) return delta.status();
      const bool partial_end = j == needed && tail != 0;
      if (prev == nullptr || (!*delta && !partial_end)) {
        SSA_RETURN_IF_ERROR(page_run(i, j));
      } else {
        const uint64_t start = *delta ? pl->n_tokens : i * P, end = partial_end ? n_tokens : j * P;
        const uint64_t whole_begin = *delta ? i + 1 : i, whole_end = partial_end ? j - 1 : j;
        const uint64_t delta_page = *delta ? i : UINT64_MAX;
        if (kv && whole_begin < whole_end) {
          if (*delta) SSA_RETURN_IF_ERROR(row_run(start, whole_begin * P, delta_page));
          SSA_RETURN_IF_ERROR(page_run(whole_begin, whole_end));
          if (partial_end) SSA_RETURN_IF_ERROR(row_run(whole_end * P, end, UINT64_MAX));
        } else {
          SSA_RETURN_IF_ERROR(row_run(start, end, delta_page));
        }
      }
      i = j;
    }
    return absl::OkStatus();
  };

  for (uint32_t l = 0; l < s.layers.size(); ++l) {
    const LayerStore& L = s.layers[l];
    const SnapshotRecord::Layer* pl =
        prev != nullptr && l < prev->layers.size() ? &prev->layers[l] : nullptr;
    SnapshotRecord::Layer& rl = rec->layers[l];
    const uint64_t needed = lay.pages_for(L.n_tokens);
    if (L.kv_pages.size() < needed || (L.codebooks && L.code_pages.size() < needed)) {
      return make_error(SSA_ERR_INTERNAL,
                        absl::StrCat("layer ", l, " holds ", L.kv_pages.size(), " KV and ",
                                     L.code_pages.size(), " code pages for ", L.n_tokens,
                                     " tokens (", needed, " needed)"));
    }
    rl.n_tokens = L.n_tokens;
    rl.trained_at_tokens = L.trained_at_tokens;
    if (L.codebooks) {
      rl.codebooks = L.codebooks;
      if (pl != nullptr && pl->codebooks.get() == L.codebooks.get() && pl->codebooks_entry >= 0) {
        cb_refs[l] = pl->codebooks_entry;
      } else {
        const PqCodebooks& cb = *L.codebooks;
        const size_t floats =
            size_t{cb.n_kv_heads} * cb.subspaces * cb.centroids * cb.sub_dim;
        const size_t square = size_t{cb.n_kv_heads} * cb.head_dim() * cb.head_dim();
        const bool query_aware = proxy_is_query_aware(s.config.proxy);
        const size_t rotation_floats = proxy_has_transform(s.config.proxy) ? square : 0;
        if (cb.rotation.size() != rotation_floats || cb.query_transform.size() != (query_aware ? square : 0)) {
          return make_error(SSA_ERR_INTERNAL,
                            absl::StrCat("layer ", l, " codebooks hold ", cb.rotation.size(), " key and ",
                                         cb.query_transform.size(), " query transform floats, the proxy needs ",
                                         rotation_floats, " and ", query_aware ? square : 0));
        }
        const QueryMoments* qm = cb.trained_moments.get();
        if (!moments_fit(qm, cb.n_kv_heads, cb.head_dim())) {
          return make_error(SSA_ERR_INTERNAL, absl::StrCat("layer ", l, " query moments do not fit the codebooks"));
        }
        if (cb.data.size() != floats) {
          return make_error(SSA_ERR_INTERNAL,
                            absl::StrCat("layer ", l, " codebooks hold ", cb.data.size(),
                                         " floats, their shape says ", floats));
        }
        uint8_t hdr[snap::kCodebooksHeaderBytes];
        snap::put_u32(hdr + 0, cb.n_kv_heads);
        snap::put_u32(hdr + 4, cb.subspaces);
        snap::put_u32(hdr + 8, cb.centroids);
        snap::put_u32(hdr + 12, cb.sub_dim);
        cb_refs[l] = new_ref();
        SSA_RETURN_IF_ERROR(w.begin(SectionKind::kCodebooks, l, snap::kSectionAlign));
        SSA_RETURN_IF_ERROR(w.write(hdr, sizeof hdr));
        SSA_RETURN_IF_ERROR(w.write(cb.data.data(), floats * sizeof(float)));
        SSA_RETURN_IF_ERROR(w.write(cb.rotation.data(), cb.rotation.size() * sizeof(float)));
        if (query_aware) {
          SSA_RETURN_IF_ERROR(w.write(cb.query_transform.data(), square * sizeof(float)));
          SSA_RETURN_IF_ERROR(write_query_moments(w, qm, cb.n_kv_heads, cb.head_dim()));
        }
        w.end();
      }
    }
    // Queries shown since the codebooks were trained (or to a layer not trained
    // yet): the next training learns from them, so they are saved too.
    const QueryMoments* trained = L.codebooks ? L.codebooks->trained_moments.get() : nullptr;
    if (L.query_moments != nullptr && L.query_moments.get() != trained) {
      rl.queries = L.query_moments;
      if (pl != nullptr && pl->queries.get() == L.query_moments.get() && pl->queries_entry >= 0) {
        query_refs[l] = pl->queries_entry;
      } else {
        if (!proxy_is_query_aware(s.config.proxy) || !moments_fit(L.query_moments.get(), s.config.n_kv_heads, s.config.head_dim)) {
          return make_error(SSA_ERR_INTERNAL, absl::StrCat("layer ", l, " query moments do not fit the session"));
        }
        query_refs[l] = new_ref();
        SSA_RETURN_IF_ERROR(w.begin(SectionKind::kQueries, l, snap::kSectionAlign));
        SSA_RETURN_IF_ERROR(write_query_moments(w, L.query_moments.get(), s.config.n_kv_heads, s.config.head_dim));
        w.end();
      }
    }
    rl.kv.assign(L.kv_pages.begin(), L.kv_pages.begin() + needed);
    SSA_RETURN_IF_ERROR(write_pages(l, true, L.kv_pages, L.n_tokens, pl, kv_refs[l], kv_row_refs[l]));
    if (L.codebooks) {
      rl.code.assign(L.code_pages.begin(), L.code_pages.begin() + needed);
      SSA_RETURN_IF_ERROR(write_pages(l, false, L.code_pages, L.n_tokens, pl, code_refs[l], code_row_refs[l]));
    }
  }

  // Final table: the kept entries of prev in their order, then the new ones, so a
  // later entry still wins for a page that several runs hold.
  std::vector<int64_t> old_to_new(prev ? prev->sections.size() : 0, -1);
  auto mark = [&](int64_t ref) {
    if (ref >= 0) old_to_new[static_cast<size_t>(ref)] = 0;
  };
  mark(config_ref);
  mark(meta_ref);
  for (size_t l = 0; l < s.layers.size(); ++l) {
    mark(cb_refs[l]);
    mark(query_refs[l]);
    for (int64_t r : kv_refs[l]) mark(r);
    for (int64_t r : code_refs[l]) mark(r);
    for (const RowRefs* rr : {&kv_row_refs[l], &code_row_refs[l]}) {
      for (const auto& [page, runs] : *rr) {
        for (int64_t r : runs) mark(r);
      }
    }
  }
  std::vector<SectionEntry>& table = out->table;
  table.clear();
  for (size_t j = 0; j < old_to_new.size(); ++j) {
    if (old_to_new[j] < 0) continue;
    old_to_new[j] = static_cast<int64_t>(table.size());
    table.push_back(prev->sections[j]);
  }
  const int64_t first_new = static_cast<int64_t>(table.size());
  table.insert(table.end(), w.entries.begin(), w.entries.end());
  auto remap = [&](int64_t ref) -> int64_t {
    if (ref == kNone) return -1;
    return ref >= 0 ? old_to_new[static_cast<size_t>(ref)] : first_new + (-1 - ref);
  };
  rec->config_entry = remap(config_ref);
  rec->layers_entry = remap(layers_ref);
  rec->metadata_entry = remap(meta_ref);
  for (size_t l = 0; l < s.layers.size(); ++l) {
    SnapshotRecord::Layer& rl = rec->layers[l];
    rl.codebooks_entry = remap(cb_refs[l]);
    rl.queries_entry = remap(query_refs[l]);
    rl.kv_entry.resize(kv_refs[l].size());
    for (size_t i = 0; i < kv_refs[l].size(); ++i)
      rl.kv_entry[i] = static_cast<uint32_t>(remap(kv_refs[l][i]));
    rl.code_entry.resize(code_refs[l].size());
    for (size_t i = 0; i < code_refs[l].size(); ++i)
      rl.code_entry[i] = static_cast<uint32_t>(remap(code_refs[l][i]));
    for (const auto& [page, runs] : kv_row_refs[l]) {
      for (int64_t r : runs) rl.kv_rows[page].push_back(static_cast<uint32_t>(remap(r)));
    }
    for (const auto& [page, runs] : code_row_refs[l]) {
      for (int64_t r : runs) rl.code_rows[page].push_back(static_cast<uint32_t>(remap(r)));
    }
  }
  rec->sections = table;
  out->record = std::move(rec);
  return absl::OkStatus();
}

// Writes the table after the sections and returns the superblock for it.
absl::Status finish_file(SectionWriter& w, const std::vector<SectionEntry>& table,
                         uint64_t generation, uint64_t file_id, snap::Superblock* sb) {
  SSA_RETURN_IF_ERROR(w.pad_to(snap::kSectionAlign));
  const std::string bytes = snap::encode_table(table, generation, file_id);
  sb->table_offset = w.pos();
  sb->table_length = bytes.size();
  sb->table_xxh3 = XXH3_64bits(bytes.data(), bytes.size());
  SSA_RETURN_IF_ERROR(w.write_raw(bytes.data(), bytes.size()));
  SSA_RETURN_IF_ERROR(w.flush());
  sb->generation = generation;
  sb->slot = snap::slot_for_generation(generation);
  sb->file_length = w.pos();
  sb->file_id = file_id;
  return absl::OkStatus();
}

// A full file written to a temporary beside `target` ("<temp_base>.tmp...":
// the name a later save cleans dead writers' temporaries by), fsynced, renamed
// over target, the directory fsynced.
struct FullFile {
  snap::Superblock sb;
  BodyResult body;
  struct stat stbuf;
};

absl::Status write_full_file(ssa_session& s, const std::string& target, const std::string& temp_base,
                             const HeldRange& held, const snap::ShardInfo* shard, FullFile* out) {
  static std::atomic<uint64_t> tmp_counter{0};
  const snap::FileIo& io = snap::file_io();
  SnapshotState& st = state_of(s);
  const std::string tmp = snap::temp_name(temp_base, tmp_counter.fetch_add(1));
  const int fd = io.open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return snap::io_error("cannot create temporary snapshot file", tmp, errno);
  snap::FdGuard guard(fd);
  bool renamed = false;
  struct Unlinker {
    const std::string& tmp;
    bool& renamed;
    snap::FdGuard& guard;
    ~Unlinker() {
      if (!renamed) {
        guard.reset();
        snap::file_io().unlink(tmp.c_str());
      }
    }
  } unlinker{tmp, renamed, guard};

  if (io.fstat(fd, &out->stbuf) != 0) return snap::io_error("cannot stat", tmp, errno);

  SectionWriter w(fd, tmp, snap::kHeaderAreaBytes);
  if (!w.ok()) return make_error(SSA_ERR_OUT_OF_MEMORY, "cannot allocate a hash state");
  SSA_RETURN_IF_ERROR(write_body(s, st, nullptr, w, &out->body, held, shard));
  const uint64_t file_id = snap::random_id();
  SSA_RETURN_IF_ERROR(finish_file(w, out->body.table, 1, file_id, &out->sb));
  // Header area: slot 0 holds generation 1; slot 1 stays zero (invalid) until
  // the first checkpoint.
  std::unique_ptr<uint8_t[]> header(new uint8_t[snap::kHeaderAreaBytes]());
  snap::encode_superblock(out->sb, header.get() + snap::kSlotOffset[0]);
  SSA_RETURN_IF_ERROR(snap::pwrite_all(fd, header.get(), snap::kHeaderAreaBytes, 0, tmp));
  SSA_RETURN_IF_ERROR(snap::fsync_fd(fd, tmp));
  guard.reset();
  if (io.rename(tmp.c_str(), target.c_str()) != 0) {
    return make_error(SSA_ERR_IO, absl::StrCat("cannot rename '", tmp, "' to '", target,
                                               "': ", strerror(errno)));
  }
  renamed = true;
  // From here target holds the new file; only its durability is in question.
  SSA_RETURN_IF_ERROR(snap::fsync_parent_dir(target));
  // Temporary files of writers killed mid-save are removed here, by the next save.
  (void)snap::remove_stale_temps(temp_base);
  return absl::OkStatus();
}

// Callers hold s.snapshot_mu and s.mu (shared).
// A save through a symbolic link replaces the link's target (the link stays);
// the temporary file lies beside the target so the rename stays in one directory.
absl::Status save_locked(ssa_session& s, const std::string& path) {
  absl::StatusOr<std::string> resolved = snap::resolve_save_target(path);
  if (!resolved.ok()) return resolved.status();
  FullFile f;
  SSA_RETURN_IF_ERROR(write_full_file(s, *resolved, *resolved, HeldRange{}, nullptr, &f));
  SnapshotRecord& rec = *f.body.record;
  rec.path = path;
  rec.dev = f.stbuf.st_dev;
  rec.ino = f.stbuf.st_ino;
  rec.file_id = f.sb.file_id;
  rec.generation = 1;
  rec.file_length = f.sb.file_length;
  state_of(s).record = std::move(f.body.record);
  return absl::OkStatus();
}

// Callers hold s.snapshot_mu and s.mu (shared).
absl::Status checkpoint_locked(ssa_session& s, const std::string& path) {
  const snap::FileIo& io = snap::file_io();
  SnapshotState& st = state_of(s);
  const std::shared_ptr<SnapshotRecord> prev = st.record;
  if (!prev || prev->path != path) return save_locked(s, path);

  // Non-blocking: a FIFO at the path must not hang the open.
  const int fd = io.open(path.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK, 0);
  if (fd < 0) {
    if (errno == ENOENT) return save_locked(s, path);
    return snap::io_error("cannot open snapshot for a checkpoint", path, errno);
  }
  snap::FdGuard guard(fd);
  struct stat stbuf;
  if (io.fstat(fd, &stbuf) != 0) return snap::io_error("cannot stat", path, errno);
  if (!S_ISREG(stbuf.st_mode)) {
    return make_error(SSA_ERR_IO, absl::StrCat("cannot checkpoint to '", path,
                                               "': it is not a regular file"));
  }
  const int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  snap::Superblock cur;
  struct stat now;
  // Generation 2^64-1 cannot be followed by a checkpoint (the next one would wrap
  // to 0 and lose to the slot it replaces): a full save starts again at 1. A file
  // of an older format version is rewritten whole too: its config section, which
  // a checkpoint keeps, was written under that version's rules.
  const bool same_file =
      stbuf.st_dev == prev->dev && stbuf.st_ino == prev->ino &&
      prev->generation < UINT64_MAX &&
      snap::read_superblock(fd, path, &cur, &now).ok() && cur.format_version == snap::kFormatVersion &&
      static_cast<uint64_t>(now.st_size) >= prev->file_length &&
      cur.generation == prev->generation && cur.file_id == prev->file_id &&
      cur.file_length == prev->file_length;
  uint64_t live = snap::kHeaderAreaBytes;
  for (const SectionEntry& e : prev->sections) live += e.length;
  const uint64_t dead = prev->file_length > live ? prev->file_length - live : 0;
  if (!same_file || (dead > live && dead > kCompactFloorBytes)) {
    guard.reset();
    return save_locked(s, path);
  }

  SectionWriter w(fd, path, snap::align_up(prev->file_length, snap::kSectionAlign));
  if (!w.ok()) return make_error(SSA_ERR_OUT_OF_MEMORY, "cannot allocate a hash state");
  BodyResult body;
  SSA_RETURN_IF_ERROR(write_body(s, st, prev.get(), w, &body));
  snap::Superblock sb;
  SSA_RETURN_IF_ERROR(finish_file(w, body.table, prev->generation + 1, prev->file_id, &sb));
  // New sections and table must be durable before the superblock points at them.
  SSA_RETURN_IF_ERROR(snap::fsync_fd(fd, path));

  uint8_t old_slot[snap::kSuperblockBytes];
  const uint64_t slot_off = snap::kSlotOffset[sb.slot];
  SSA_RETURN_IF_ERROR(snap::pread_exact(fd, old_slot, sizeof old_slot, slot_off, path));
  uint8_t slot[snap::kSuperblockBytes];
  snap::encode_superblock(sb, slot);
  absl::Status commit = snap::pwrite_all(fd, slot, sizeof slot, slot_off, path);
  if (commit.ok()) commit = snap::fsync_fd(fd, path);
  if (!commit.ok()) {
    // Put the slot back so the file keeps saying what the session's record says;
    // the other slot still holds the previous generation either way.
    (void)snap::pwrite_all(fd, old_slot, sizeof old_slot, slot_off, path);
    (void)io.fsync(fd);
    return commit;
  }

  SnapshotRecord& rec = *body.record;
  rec.path = path;
  rec.dev = prev->dev;
  rec.ino = prev->ino;
  rec.file_id = prev->file_id;
  rec.generation = sb.generation;
  rec.file_length = sb.file_length;
  st.record = std::move(body.record);
  return absl::OkStatus();
}

}  // namespace

absl::Status write_rank_file(ssa_session& s, const std::string& target, const std::string& temp_base,
                             const snap::ShardInfo& shard, const HeldRange& held, snap::RankFile* out) {
  FullFile f;
  SSA_RETURN_IF_ERROR(write_full_file(s, target, temp_base, held, &shard, &f));
  out->file_id = f.sb.file_id;
  out->generation = f.sb.generation;
  out->file_length = f.sb.file_length;
  out->table_xxh3 = f.sb.table_xxh3;
  return absl::OkStatus();
}

absl::Status snapshot_save(ssa_session& s, const char* path) {
  if (s.rt->group != nullptr) return group_save(s, path);
  SSA_RETURN_IF_ERROR(snap::check_path(path));
  // The file records the pages it holds by identity (record.h); a reservation's
  // steps write into its last page in place: it ends here.
  SSA_RETURN_IF_ERROR(session_settle(s, true));
  std::lock_guard snap_lock(s.snapshot_mu);
  std::shared_lock lock(s.mu);
  return save_locked(s, path);
}

absl::Status snapshot_checkpoint(ssa_session& s, const char* path) {
  // A group's snapshot is a set of files under one manifest: saved whole.
  if (s.rt->group != nullptr) return group_save(s, path);
  SSA_RETURN_IF_ERROR(snap::check_path(path));
  // The file records the pages it holds by identity (record.h); a reservation's
  // steps write into its last page in place: it ends here.
  SSA_RETURN_IF_ERROR(session_settle(s, true));
  std::lock_guard snap_lock(s.snapshot_mu);
  std::shared_lock lock(s.mu);
  return checkpoint_locked(s, path);
}

absl::Status session_set_metadata(ssa_session& s, const void* bytes, size_t n) {
  if (bytes == nullptr && n > 0) return invalid_argument("metadata bytes are NULL but n is ", n);
  if (n > kMaxMetadataBytes) {
    return invalid_argument("metadata of ", n, " bytes exceeds the limit of ", kMaxMetadataBytes);
  }
  std::string copy = n > 0 ? std::string(static_cast<const char*>(bytes), n) : std::string();
  std::unique_lock lock(s.mu);
  s.metadata.swap(copy);
  return absl::OkStatus();
}

absl::Status session_get_metadata(const ssa_session& s, void* buf, size_t cap, size_t* n_out) {
  if (n_out == nullptr) return invalid_argument("n_out is NULL");
  if (buf == nullptr && cap > 0) return invalid_argument("buf is NULL but cap is ", cap);
  SSA_RETURN_IF_ERROR(
      check_no_overlap({CallerBuffer{buf, cap, "buf", true}, CallerBuffer{n_out, sizeof *n_out, "n_out", true}}));
  std::shared_lock lock(s.mu);
  *n_out = s.metadata.size();
  if (s.metadata.size() <= cap && !s.metadata.empty()) memcpy(buf, s.metadata.data(), s.metadata.size());
  return absl::OkStatus();
}

}  // namespace ssa
