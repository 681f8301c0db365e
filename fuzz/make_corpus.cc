// Writes the seed corpus: small valid snapshots (full saves and checkpointed
// files, with and without an index and metadata, a query-aware session's) and a
// few damaged copies.
#include <stdio.h>
#include <sys/stat.h>

#include <string>

#include "snapshot/format.h"
#include "support/snapshot_helpers.h"

using namespace ssa;
using namespace ssa::test;

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  mkdir(dir.c_str(), 0755);
  auto rt = make_runtime(1);
  ssa_session_config cfg = small_config(0x5EEDull);
  cfg.n_layers = 2;
  cfg.n_q_heads = 2;
  cfg.n_kv_heads = 1;
  cfg.head_dim = 32;
  cfg.pq_subspaces = 8;
  cfg.pq_centroids = 4;
  cfg.index_min_tokens = 24;
  int written = 0;
  auto check = [](const absl::Status& st) {
    if (!st.ok()) {
      fprintf(stderr, "%s\n", std::string(st.message()).c_str());
      exit(1);
    }
  };
  auto save = [&](ssa_session& s, const std::string& name, bool checkpoint) {
    const std::string p = dir + "/" + name;
    const absl::Status st = checkpoint ? snapshot_checkpoint(s, p.c_str()) : snapshot_save(s, p.c_str());
    if (!st.ok()) {
      fprintf(stderr, "%s: %s\n", name.c_str(), std::string(st.message()).c_str());
      exit(1);
    }
    ++written;
  };
  std::mt19937_64 rng(1);
  for (ssa_dtype dt : {SSA_DTYPE_F16, SSA_DTYPE_F32}) {
    cfg.kv_dtype = dt;
    const std::string tag = dt == SSA_DTYPE_F16 ? "f16" : "f32";
    auto empty = make_session(rt.get(), cfg, 0, 1);
    save(*empty, "valid_empty_" + tag, false);
    auto small = make_session(rt.get(), cfg, 9, 2);  // no index yet
    save(*small, "valid_small_" + tag, false);
    auto indexed = make_session(rt.get(), cfg, 40, 3);
    check(session_set_metadata(*indexed, "meta", 4));
    save(*indexed, "valid_indexed_" + tag, false);
    // A checkpointed file: several generations, superseded runs, new codebooks.
    auto grow = make_session(rt.get(), cfg, 20, 4);
    save(*grow, "valid_checkpointed_" + tag, false);
    check(append_all_layers(*grow, 10, rng));
    save(*grow, "valid_checkpointed_" + tag, true);
    check(session_truncate(*grow, 18));
    check(append_all_layers(*grow, 12, rng));
    check(session_update_index(*grow));
    save(*grow, "valid_checkpointed_" + tag, true);
    // Many small checkpoints: pages held by row runs on top of page runs, and
    // pages held by row runs alone.
    auto rows = make_session(rt.get(), cfg, 70, 5);
    check(session_update_index(*rows));
    save(*rows, "valid_row_runs_" + tag, false);
    for (int t = 0; t < 6; ++t) {
      check(append_all_layers(*rows, 3 + t * 5, rng));
      save(*rows, "valid_row_runs_" + tag, true);
    }
  }
  // A query-aware session: queries shown before and after its layers train, so
  // that codebooks and queries sections hold them (a checkpoint adds a second).
  {
    ssa_session_config qc = cfg;
    qc.kv_dtype = SSA_DTYPE_F16;
    qc.proxy = SSA_PROXY_QPQ;
    auto q = make_session(rt.get(), qc, 0, 6);
    auto observe = [&](uint32_t layer, uint64_t n) {
      std::vector<uint8_t> rows(n * qc.n_q_heads * qc.head_dim * 2);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      for (uint64_t i = 0; i < n * qc.n_q_heads * qc.head_dim; ++i) store_from_f32(rows.data(), DType::kF16, i, nd(rng));
      check(session_observe_queries(*q, layer, rows.data(), n));
    };
    observe(0, 5);
    observe(1, 3);
    check(append_all_layers(*q, 30, rng));  // past index_min_tokens: trained
    observe(0, 2);
    save(*q, "valid_queries_f16", false);
    observe(1, 4);
    save(*q, "valid_queries_f16", true);
  }
  // Damaged copies of one valid file.
  const std::vector<uint8_t> good = read_file(dir + "/valid_checkpointed_f16");
  auto put = [&](const std::string& name, std::vector<uint8_t> bytes) {
    write_file(dir + "/" + name, bytes.data(), bytes.size());
    ++written;
  };
  put("bad_truncated_header", std::vector<uint8_t>(good.begin(), good.begin() + 100));
  put("bad_truncated_tail", std::vector<uint8_t>(good.begin(), good.end() - 700));
  std::vector<uint8_t> m = good;
  m[snap::get_u64(good.data() + snap::kSbTableOffsetOff) + 70] ^= 0x10;
  put("bad_table_flip", m);
  m = good;
  m[m.size() / 2] ^= 0x01;
  put("bad_middle_flip", m);
  m = good;
  snap::put_u32(m.data() + 2048 + snap::kSbVersionOff, 9);  // newer slot claims version 9
  put("bad_version", m);
  put("bad_garbage", std::vector<uint8_t>(3000, 0xA5));
  printf("wrote %d corpus files to %s\n", written, dir.c_str());
  return 0;
}
