// Snapshot benchmark: save/load throughput against raw sequential write/read of
// the same bytes on the same disk in the same run; the cost of a checkpoint after
// 1K new tokens; and a large snapshot restored with SSA_LOAD_MMAP in a fresh
// process, with its resident set measured from /proc/self/status.
//
//   snapshot_bench [--dir DIR] [--gib G] [--mmap-gib M] [--reps R]
//   snapshot_bench --load-mmap PATH     (the fresh process; run by the above)
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "bench_workload.h"
#include "cpu/thread_pool.h"
#include "decode/decode.h"
#include "runtime.h"
#include "session.h"
#include "snapshot/snapshot.h"
#include "status.h"
#include "support/handles.h"

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void die(const absl::Status& st, const char* what) {
  if (st.ok()) return;
  fprintf(stderr, "%s: %s\n", what, std::string(st.message()).c_str());
  exit(1);
}

long rss_kib() { return ssa_bench::proc_kib("/proc/self/status", "VmRSS:"); }

// One worker per hardware thread (runtime options' default).
ssa_test::RuntimePtr make_runtime() { return ssa_test::make_runtime(0, 0x5EED); }

// The paper's shape: 16 query heads, 4 KV heads, head dim 256, fp16 KV, 256-token pages.
ssa_session_config bench_config(uint32_t n_layers) {
  ssa_session_config c = ssa_test::make_config(n_layers, 16, 4, 256, SSA_DTYPE_F16);
  c.model_fingerprint = 0xBE9C4;
  c.index_regrow_factor = 0.0f;  // train once; later keys are encoded
  c.index_train_sample = 4096;
  c.index_iterations = 4;
  return c;
}

std::unique_ptr<ssa_session> build(ssa_runtime* rt, const ssa_session_config& cfg, uint64_t tokens,
                                   uint64_t seed) {
  absl::StatusOr<std::unique_ptr<ssa_session>> s = ssa::create_session(rt, cfg);
  die(s.status(), "create");
  for (uint32_t l = 0; l < cfg.n_layers; ++l) {
    ssa_bench::StructuredKv gen(cfg.n_kv_heads, cfg.head_dim, seed + l);
    std::vector<uint8_t> K, V;
    for (uint64_t done = 0; done < tokens;) {
      const uint64_t n = std::min<uint64_t>(8192, tokens - done);
      gen.next(n, static_cast<ssa::DType>(cfg.kv_dtype), &K, &V);
      die(ssa::session_append(**s, l, K.data(), V.data(), n), "append");
      done += n;
    }
  }
  return *std::move(s);
}

void drop_cache(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  fdatasync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

// Raw sequential write (8 MiB pwrites, fsync, like a save) and read of n bytes.
double raw_write(const std::string& path, uint64_t n) {
  std::vector<uint8_t> buf(8 << 20);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 131 + 7);
  const auto t0 = Clock::now();
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  for (uint64_t off = 0; off < n;) {
    const size_t c = static_cast<size_t>(std::min<uint64_t>(buf.size(), n - off));
    if (pwrite(fd, buf.data(), c, static_cast<off_t>(off)) != static_cast<ssize_t>(c)) exit(1);
    off += c;
  }
  fsync(fd);
  close(fd);
  return seconds_since(t0);
}

double raw_read(const std::string& path) {
  std::vector<uint8_t> buf(8 << 20);
  const auto t0 = Clock::now();
  const int fd = open(path.c_str(), O_RDONLY);
  uint64_t sum = 0;
  for (off_t off = 0;;) {
    const ssize_t r = pread(fd, buf.data(), buf.size(), off);
    if (r <= 0) break;
    sum += buf[0];
    off += r;
  }
  close(fd);
  if (sum == 12345) puts("");
  return seconds_since(t0);
}

// The same, into newly allocated memory (as a load must populate n new bytes).
double raw_read_fresh(const std::string& path, uint64_t n) {
  const auto t0 = Clock::now();
  uint8_t* mem = static_cast<uint8_t*>(malloc(n));
  const int fd = open(path.c_str(), O_RDONLY);
  for (uint64_t off = 0; off < n;) {
    const size_t c = static_cast<size_t>(std::min<uint64_t>(8 << 20, n - off));
    const ssize_t r = pread(fd, mem + off, c, static_cast<off_t>(off));
    if (r <= 0) break;
    off += static_cast<uint64_t>(r);
  }
  close(fd);
  free(mem);
  return seconds_since(t0);
}

uint64_t file_bytes(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

using ssa_bench::median;

double sparse_decode_all_layers(ssa_session& s) {
  const ssa::KvLayout& L = s.layout;
  std::vector<uint16_t> q(size_t{L.n_q_heads} * L.head_dim), out(q.size());
  for (size_t i = 0; i < q.size(); ++i) q[i] = ssa::f32_to_f16(0.01f * static_cast<float>(i % 97) - 0.4f);
  ssa_decode_params p = ssa_test::params(SSA_METHOD_SSA);  // 50x, h 0.4, sink and local 128
  p.seed = 1;
  const auto t0 = Clock::now();
  for (uint32_t l = 0; l < L.n_layers; ++l) die(ssa::decode(s, l, q.data(), out.data(), p, nullptr), "decode");
  return seconds_since(t0);
}

int load_mmap_child(const char* path) {
  auto rt = make_runtime();
  const long rss0 = rss_kib();
  const auto t0 = Clock::now();
  absl::StatusOr<std::unique_ptr<ssa_session>> s = ssa::snapshot_load(rt.get(), path, SSA_LOAD_MMAP);
  die(s.status(), "mmap load");
  const double t_load = seconds_since(t0);
  const long rss1 = rss_kib();
  const double t_dec = sparse_decode_all_layers(**s);
  const long rss2 = rss_kib();
  printf("| mmap load of %.2f GiB | %.3f s | RSS before %.0f MiB, after load %.0f MiB, after one SSA "
         "decode (50x) per layer %.0f MiB (%.2f s) |\n",
         static_cast<double>(file_bytes(path)) / (1u << 30), t_load, rss0 / 1024.0, rss1 / 1024.0,
         rss2 / 1024.0, t_dec);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/tmp";
  double gib = 1.0, mmap_gib = 4.0;
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--load-mmap" && i + 1 < argc) return load_mmap_child(argv[i + 1]);
    if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--gib" && i + 1 < argc) gib = atof(argv[++i]);
    else if (a == "--mmap-gib" && i + 1 < argc) mmap_gib = atof(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: %s [--dir DIR] [--gib G] [--mmap-gib M] [--reps R]\n", argv[0]);
      return 2;
    }
  }
  auto rt = make_runtime();
  const uint32_t n_layers = 8;
  const ssa_session_config cfg = bench_config(n_layers);
  const uint64_t per_token = 2ull * cfg.n_kv_heads * cfg.head_dim * 2;  // K+V bytes per token-layer
  const uint64_t tokens = static_cast<uint64_t>(gib * (1ull << 30) / per_token / n_layers) / 256 * 256 + 100;
  const std::string snap = dir + "/bench.snap", raw = dir + "/bench.raw";

  printf("## Snapshot throughput (%u layers x %llu tokens, 16q/4kv heads, d=256, fp16, pages of 256)\n\n",
         n_layers, static_cast<unsigned long long>(tokens));
  auto t0 = Clock::now();
  auto s = build(rt.get(), cfg, tokens, 1);
  printf("built in %.1f s\n\n", seconds_since(t0));

  std::vector<double> t_save, t_raw_w, t_load_cold, t_raw_r_cold, t_raw_f_cold, t_load_warm,
      t_raw_r_warm, t_raw_f_warm, t_verify, t_mmap;
  uint64_t bytes = 0;
  for (int r = 0; r < reps; ++r) {
    unlink(snap.c_str());
    t0 = Clock::now();
    die(ssa::snapshot_save(*s, snap.c_str()), "save");
    t_save.push_back(seconds_since(t0));
    bytes = file_bytes(snap);
    t_raw_w.push_back(raw_write(raw, bytes));

    drop_cache(snap);
    drop_cache(raw);
    t0 = Clock::now();
    { die(ssa::snapshot_load(rt.get(), snap.c_str(), 0).status(), "load"); }
    t_load_cold.push_back(seconds_since(t0));
    t_raw_r_cold.push_back(raw_read(raw));
    drop_cache(raw);
    t_raw_f_cold.push_back(raw_read_fresh(raw, bytes));
    // Warm: both files now in the page cache.
    t0 = Clock::now();
    { die(ssa::snapshot_load(rt.get(), snap.c_str(), 0).status(), "load"); }
    t_load_warm.push_back(seconds_since(t0));
    t_raw_r_warm.push_back(raw_read(raw));
    t_raw_f_warm.push_back(raw_read_fresh(raw, bytes));
    t0 = Clock::now();
    { die(ssa::snapshot_load(rt.get(), snap.c_str(), SSA_LOAD_VERIFY | SSA_LOAD_MMAP).status(), "load"); }
    t_verify.push_back(seconds_since(t0));
    t0 = Clock::now();
    { die(ssa::snapshot_load(rt.get(), snap.c_str(), SSA_LOAD_MMAP).status(), "load"); }
    t_mmap.push_back(seconds_since(t0));
  }
  const double gb = static_cast<double>(bytes) / 1e9;
  auto row = [&](const char* what, double ours, double rawt) {
    printf("| %s | %.3f s | %.2f GB/s | %.3f s | %.2f GB/s | %.0f%% |\n", what, ours, gb / ours, rawt,
           gb / rawt, 100.0 * rawt / ours);
  };
  printf("snapshot file: %.3f GB; medians of %d runs\n\n", gb, reps);
  printf("| operation | libssa | libssa rate | raw same bytes | raw rate | libssa / raw |\n");
  printf("|---|---|---|---|---|---|\n");
  row("save (temp, fsync, rename, dir fsync) vs write+fsync", median(t_save), median(t_raw_w));
  row("load, cold cache (reads + verifies all) vs read into one 8 MiB buffer", median(t_load_cold),
      median(t_raw_r_cold));
  row("load, cold cache vs read into new memory", median(t_load_cold), median(t_raw_f_cold));
  row("load, warm cache (reads + verifies all) vs read into one 8 MiB buffer", median(t_load_warm),
      median(t_raw_r_warm));
  row("load, warm cache vs read into new memory", median(t_load_warm), median(t_raw_f_warm));
  printf("| load MMAP+VERIFY (hashes mapped KV) | %.3f s | %.2f GB/s | | | |\n", median(t_verify),
         gb / median(t_verify));
  printf("| load MMAP (KV mapped, not read) | %.3f s | | | | |\n\n", median(t_mmap));

  // Checkpoint after 1K new tokens in every layer.
  printf("## Checkpoint after 1K new tokens per layer\n\n");
  die(ssa::snapshot_save(*s, snap.c_str()), "save");
  const uint64_t before = file_bytes(snap);
  for (uint32_t l = 0; l < n_layers; ++l) {
    ssa_bench::StructuredKv gen(cfg.n_kv_heads, cfg.head_dim, 999 + l);
    std::vector<uint8_t> K, V;
    gen.next(1024, static_cast<ssa::DType>(cfg.kv_dtype), &K, &V);
    die(ssa::session_append(*s, l, K.data(), V.data(), 1024), "append");
  }
  t0 = Clock::now();
  die(ssa::snapshot_checkpoint(*s, snap.c_str()), "checkpoint");
  const double t_ckpt = seconds_since(t0);
  const uint64_t grown = file_bytes(snap) - before;
  t0 = Clock::now();
  die(ssa::snapshot_save(*s, (snap + ".full").c_str()), "save");
  const double t_full = seconds_since(t0);
  const uint64_t full = file_bytes(snap + ".full");
  unlink((snap + ".full").c_str());
  printf("| | bytes written | time |\n|---|---|---|\n");
  printf("| checkpoint (+1024 tokens x %u layers) | %.2f MiB | %.3f s |\n", n_layers,
         static_cast<double>(grown) / (1 << 20), t_ckpt);
  printf("| full save of the same session | %.2f MiB | %.3f s |\n", static_cast<double>(full) / (1 << 20),
         t_full);
  printf("| new KV+codes of 1024 tokens x %u layers | %.2f MiB | |\n\n", n_layers,
         static_cast<double>(1024ull * n_layers * (per_token + cfg.n_kv_heads * cfg.pq_subspaces)) / (1 << 20));
  s.reset();
  unlink(raw.c_str());
  unlink(snap.c_str());

  if (mmap_gib > 0) {
    printf("## SSA_LOAD_MMAP of a large snapshot, in a fresh process\n\n");
    const uint64_t big_tokens =
        static_cast<uint64_t>(mmap_gib * (1ull << 30) / per_token / n_layers) / 256 * 256;
    t0 = Clock::now();
    auto big = build(rt.get(), cfg, big_tokens, 7);
    const double t_build = seconds_since(t0);
    t0 = Clock::now();
    die(ssa::snapshot_save(*big, snap.c_str()), "save");
    printf("(%u layers x %llu tokens built in %.1f s, saved in %.1f s)\n\n", n_layers,
           static_cast<unsigned long long>(big_tokens), t_build, seconds_since(t0));
    big.reset();
    drop_cache(snap);
    fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
      execl("/proc/self/exe", argv[0], "--load-mmap", snap.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    unlink(snap.c_str());
  }
  return 0;
}
