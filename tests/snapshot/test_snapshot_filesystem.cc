// The file system around a snapshot: paths that are not regular files (never a
// hang), a reader racing another process's checkpoints (never a spurious
// error), a mapping refused for lack of memory, saves killed mid-write (their
// temporary files removed by the next save), saves through symbolic links.
#include <doctest/doctest.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "snapshot/file_io.h"
#include "snapshot/format.h"
#include "snapshot/save_path.h"
#include "support/snapshot_image.h"
#include "support/snapshot_helpers.h"

using namespace ssa;
using namespace ssa::test;

namespace {

int count_with(const std::string& dir, const std::string& part) {
  int n = 0;
  for (const std::string& f : list_dir(dir)) n += f.find(part) != std::string::npos ? 1 : 0;
  return n;
}

// Runs fn in a child process bounded by an alarm; fn returns 0 on success or the
// number of the failed check. A hang shows as SIGALRM.
int in_child(int seconds, const std::function<int()>& fn) {
  fflush(nullptr);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    alarm(static_cast<unsigned>(seconds));
    _exit(fn());
  }
  int ws = 0;
  REQUIRE(waitpid(pid, &ws, 0) == pid);
  if (WIFSIGNALED(ws)) return 1000 + WTERMSIG(ws);
  return WIFEXITED(ws) ? WEXITSTATUS(ws) : 999;
}

bool says(const char* needle) {
  const char* m = ssa_last_error_message();
  if (m != nullptr && strstr(m, needle) != nullptr) return true;
  fprintf(stderr, "message '%s' lacks '%s'\n", m ? m : "(null)", needle);
  return false;
}

}  // namespace

TEST_CASE("a FIFO, a device or a directory at the path fails at once, never hangs") {
  auto rt = make_runtime();
  const std::string dir = temp_dir(), fifo = dir + "/fifo";
  REQUIRE(mkfifo(fifo.c_str(), 0644) == 0);
  auto s = make_session(rt.get(), small_config(), 20, 1);
  REQUIRE(s);
  for (const std::string& p : {fifo, std::string("/dev/null"), dir}) {
    CAPTURE(p);
    const int rc = in_child(20, [&]() -> int {
      ssa_session* const sentinel = reinterpret_cast<ssa_session*>(uintptr_t{0x5a5a});
      for (uint32_t flags : {0u, uint32_t{SSA_LOAD_VERIFY}, uint32_t{SSA_LOAD_MMAP}}) {
        ssa_session* out = sentinel;
        const ssa_status st = ssa_session_load(rt.get(), p.c_str(), flags, &out);
        if (st != SSA_ERR_IO) {
          fprintf(stderr, "flags %u: status %d: %s\n", flags, st, ssa_last_error_message());
          return 1;
        }
        if (out != sentinel || !says("not a regular file")) return 2;
        out = sentinel;
        ssa_session_config want = small_config();
        if (ssa_session_load_checked(rt.get(), p.c_str(), flags, &want, &out) != SSA_ERR_IO) return 3;
        if (out != sentinel || !says("not a regular file")) return 4;
      }
      ssa_snapshot_info info{};
      ssa_snapshot_info_init(&info);
      if (ssa_snapshot_inspect(p.c_str(), &info) != SSA_ERR_IO || !says("not a regular file")) return 5;
      if (info.generation != 0) return 6;
      // A checkpoint or save to it is refused too (never replaces it, never
      // blocks). Not tried on the device: a regression would replace /dev/null.
      if (p == "/dev/null") return 0;
      if (ssa_session_checkpoint(s.get(), p.c_str()) != SSA_ERR_IO) return 7;
      if (ssa_session_save(s.get(), p.c_str()) != SSA_ERR_IO) return 8;
      return 0;
    });
    CHECK_MESSAGE(rc == 0, "child check " << rc << std::string(rc == 1000 + SIGALRM ? " (hung)" : ""));
  }
  struct stat st;
  REQUIRE(lstat(fifo.c_str(), &st) == 0);
  CHECK(S_ISFIFO(st.st_mode));  // still the FIFO
}

namespace {

// Sleeps around reads and stats, widening every window between a reader's steps
// in which a commit can land (the writer commits every few milliseconds).
ssize_t slow_pread(int fd, void* b, size_t n, off_t o) {
  thread_local std::mt19937 rng(std::random_device{}());
  std::this_thread::sleep_for(std::chrono::microseconds(rng() % 40));
  return snap::posix_file_io().pread(fd, b, n, o);
}
int slow_fstat(int fd, struct stat* st) {
  thread_local std::mt19937 rng(std::random_device{}() ^ 1);
  const int r = snap::posix_file_io().fstat(fd, st);
  std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
  return r;
}

}  // namespace

TEST_CASE("a reader racing another process's checkpoints never sees a spurious error") {
  auto rt = make_runtime();
  const std::string dir = temp_dir(), path = dir + "/race.snap";
  ssa_session_config cfg = small_config();
  cfg.index_min_tokens = 48;
  {
    auto s = make_session(rt.get(), cfg, 40, 2);
    REQUIRE(s);
    const std::string m = "n=40";
    REQUIRE(session_set_metadata(*s, m.data(), m.size()).ok());
    REQUIRE(snapshot_save(*s, path.c_str()).ok());
  }
  // Shared with the writer: a stop flag and its commit count.
  auto* shared = static_cast<std::atomic<int>*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  REQUIRE(shared != MAP_FAILED);
  new (&shared[0]) std::atomic<int>(0);  // stop
  new (&shared[1]) std::atomic<int>(0);  // commits
  fflush(nullptr);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    alarm(60);
    auto wrt = make_runtime();
    absl::StatusOr<std::unique_ptr<ssa_session>> w = snapshot_load(wrt.get(), path.c_str(), 0);
    if (!w.ok()) _exit(3);
    std::mt19937_64 rng(3);
    for (int i = 0; shared[0].load() == 0 && i < 100000; ++i) {
      if (!append_all_layers(**w, 3, rng).ok()) _exit(4);
      const std::string m = "n=" + std::to_string(session_length(**w));
      if (!session_set_metadata(**w, m.data(), m.size()).ok()) _exit(5);
      const absl::Status st = i % 16 == 15 ? snapshot_save(**w, path.c_str())
                                            : snapshot_checkpoint(**w, path.c_str());
      if (!st.ok()) _exit(6);
      shared[1].fetch_add(1);
    }
    _exit(0);
  }
  snap::FileIo slow = snap::posix_file_io();
  slow.pread = slow_pread;
  slow.fstat = slow_fstat;
  snap::set_file_io(&slow);
  int ok = 0, errors = 0, inconsistent = 0;
  std::string first_error;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(4);
  for (int i = 0; std::chrono::steady_clock::now() < until || shared[1].load() < 20; ++i) {
    if (i > 200000) break;
    ssa_snapshot_info info{};
    info.struct_size = sizeof info;
    const absl::Status in = snapshot_inspect(path.c_str(), &info);
    absl::StatusOr<std::unique_ptr<ssa_session>> r =
        snapshot_load(rt.get(), path.c_str(), i % 2 ? SSA_LOAD_MMAP : 0);
    for (const absl::Status& st : {in, r.status()}) {
      if (st.ok()) {
        ++ok;
      } else {
        ++errors;
        if (first_error.empty()) first_error = std::string(st.message());
      }
    }
    if (r.ok()) {  // a committed state: metadata written with exactly that length
      std::string meta;
      {
        std::shared_lock l((*r)->mu);
        meta = (*r)->metadata;
      }
      if (meta != "n=" + std::to_string(session_length(**r))) ++inconsistent;
    }
  }
  snap::set_file_io(nullptr);
  shared[0].store(1);
  int ws = 0;
  REQUIRE(waitpid(pid, &ws, 0) == pid);
  const int commits = shared[1].load();
  munmap(shared, 4096);
  CHECK_MESSAGE((WIFEXITED(ws) && WEXITSTATUS(ws) == 0), "writer status " << ws);
  MESSAGE("reads ok: " << ok << ", spurious errors: " << errors << ", writer commits: " << commits);
  CHECK_MESSAGE(errors == 0, first_error);
  CHECK(inconsistent == 0);
  CHECK(commits >= 20);
  CHECK(ok >= 20);
}

namespace {

void* enomem_mmap(void*, size_t, int, int, int, off_t) {
  errno = ENOMEM;
  return MAP_FAILED;
}

}  // namespace

TEST_CASE("a mapping refused for lack of memory is SSA_ERR_OUT_OF_MEMORY") {
  auto rt = make_runtime();
  const std::string dir = temp_dir(), path = dir + "/m.snap";
  auto s = make_session(rt.get(), small_config(), 50, 4);
  REQUIRE(s);
  REQUIRE(snapshot_save(*s, path.c_str()).ok());
  {
    snap::FileIo io = snap::posix_file_io();
    io.mmap = enomem_mmap;
    snap::set_file_io(&io);
    ssa_session* const sentinel = reinterpret_cast<ssa_session*>(uintptr_t{0x77});
    ssa_session* out = sentinel;
    const ssa_status st = ssa_session_load(rt.get(), path.c_str(), SSA_LOAD_MMAP, &out);
    const std::string msg = ssa_last_error_message();
    snap::set_file_io(nullptr);
    CHECK(st == SSA_ERR_OUT_OF_MEMORY);
    CHECK(out == sentinel);
    CHECK(msg.find("cannot map") != std::string::npos);
  }
#if defined(__SANITIZE_ADDRESS__)
  MESSAGE("RLIMIT_AS part skipped: AddressSanitizer reserves more address space than any limit allows");
#else
  // For real: a file whose committed span is 8 GiB (sparse) mapped under an
  // address-space limit of what the process uses plus 1 GiB.
  SnapshotImage img;
  img.bytes = read_file(path);
  REQUIRE(img.parse());
  img.sb.file_length = uint64_t{8} << 30;
  img.reseal_superblock();
  REQUIRE(write_file(path, img.bytes.data(), img.bytes.size()));
  REQUIRE(truncate(path.c_str(), static_cast<off_t>(img.sb.file_length)) == 0);
  REQUIRE(snapshot_load(rt.get(), path.c_str(), SSA_LOAD_MMAP).ok());  // maps without a limit
  const int rc = in_child(30, [&]() -> int {
    FILE* f = fopen("/proc/self/status", "r");
    if (!f) return 1;
    char line[256];
    unsigned long long vm_kb = 0;
    while (fgets(line, sizeof line, f)) sscanf(line, "VmSize: %llu kB", &vm_kb);
    fclose(f);
    if (vm_kb == 0) return 2;
    struct rlimit lim;
    lim.rlim_cur = lim.rlim_max = (vm_kb << 10) + (uint64_t{1} << 30);
    if (setrlimit(RLIMIT_AS, &lim) != 0) return 3;
    ssa_session* out = nullptr;
    if (ssa_session_load(rt.get(), path.c_str(), SSA_LOAD_MMAP, &out) != SSA_ERR_OUT_OF_MEMORY) return 4;
    if (out != nullptr) return 5;
    return 0;
  });
  CHECK_MESSAGE(rc == 0, "child check " << rc);
#endif
}

namespace {

std::atomic<int> g_writes_left{0};
ssize_t killing_pwrite(int fd, const void* b, size_t n, off_t o) {
  const ssize_t r = snap::posix_file_io().pwrite(fd, b, n, o);
  if (--g_writes_left == 0) raise(SIGKILL);
  return r;
}

}  // namespace

TEST_CASE("temporary files of saves killed mid-write are removed by the next save") {
  auto rt = make_runtime();  // one thread: nothing but the caller runs at fork()
  const std::string dir = temp_dir(), path = dir + "/t.snap";
  ssa_session_config cfg = small_config();
  cfg.page_tokens = 256;  // large pages: several writes per save
  cfg.head_dim = 256;
  cfg.n_kv_heads = 4;
  cfg.n_q_heads = 4;
  auto s = make_session(rt.get(), cfg, 600, 5);
  REQUIRE(s);
  REQUIRE(snapshot_save(*s, path.c_str()).ok());
  constexpr int kKills = 24;
  for (int k = 0; k < kKills; ++k) {
    fflush(nullptr);
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      snap::FileIo io = snap::posix_file_io();
      io.pwrite = killing_pwrite;
      g_writes_left = 1 + k % 3;
      snap::set_file_io(&io);
      (void)snapshot_save(*s, path.c_str());
      _exit(0);  // not reached: the save was killed
    }
    int ws = 0;
    REQUIRE(waitpid(pid, &ws, 0) == pid);
    REQUIRE((WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL));
  }
  CHECK(count_with(dir, "t.snap.tmp.") == kKills);  // each kill left its file

  // Files that must survive: a live writer's, another host's, another snapshot's.
  const std::string mine = snap::temp_name(path, 7);
  const std::string suffix = "." + std::to_string(getpid()) + ".7";
  REQUIRE(mine.size() > suffix.size());
  const std::string prefix = mine.substr(0, mine.size() - suffix.size());  // PATH.tmp.HOST
  const pid_t live = fork();
  REQUIRE(live >= 0);
  if (live == 0) {
    pause();
    _exit(0);
  }
  const std::string live_tmp = prefix + "." + std::to_string(live) + ".0";
  const std::string other_host = path + ".tmp.elsewhere-host.12345678.0";
  const std::string other_snap = snap::temp_name(dir + "/u.snap", 0) + "1";
  for (const std::string& f : {live_tmp, other_host, other_snap}) REQUIRE(write_file(f, "x", 1));

  REQUIRE(snapshot_save(*s, path.c_str()).ok());
  std::vector<std::string> want = {"t.snap", live_tmp.substr(dir.size() + 1),
                                   other_host.substr(dir.size() + 1), other_snap.substr(dir.size() + 1)};
  std::sort(want.begin(), want.end());
  CHECK(list_dir(dir) == want);
  kill(live, SIGKILL);
  REQUIRE(waitpid(live, nullptr, 0) == live);
  REQUIRE(snapshot_save(*s, path.c_str()).ok());  // now that writer is gone too
  CHECK(count_with(dir, "t.snap.tmp.") == 1);      // only the other host's remains
  auto back = snapshot_load(rt.get(), path.c_str(), SSA_LOAD_VERIFY);
  REQUIRE(back.ok());
  CHECK(store_diff(*s, **back) == "");
}

TEST_CASE("a save through a symbolic link replaces the link's target and keeps the link") {
  auto rt = make_runtime();
  const std::string dir = temp_dir(), other = temp_dir();
  const std::string real = dir + "/real.snap", link = dir + "/link.snap", chain = dir + "/chain.snap";
  auto s = make_session(rt.get(), small_config(), 70, 6);
  REQUIRE(s);
  REQUIRE(snapshot_save(*s, real.c_str()).ok());
  REQUIRE(symlink("real.snap", link.c_str()) == 0);  // relative
  REQUIRE(symlink(link.c_str(), chain.c_str()) == 0);  // absolute, to a link
  const std::string abs_link = other + "/abs.snap";
  REQUIRE(symlink(real.c_str(), abs_link.c_str()) == 0);  // from another directory
  auto is_link = [](const std::string& p) {
    struct stat st;
    return lstat(p.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
  };
  std::mt19937_64 rng(7);
  for (const std::string& via : {link, chain, abs_link}) {
    CAPTURE(via);
    REQUIRE(append_all_layers(*s, 9, rng).ok());
    REQUIRE(snapshot_save(*s, via.c_str()).ok());
    CHECK(is_link(via));
    auto back = snapshot_load(rt.get(), real.c_str(), SSA_LOAD_VERIFY);
    REQUIRE(back.ok());
    CHECK(store_diff(*s, **back) == "");
    // A checkpoint through the link appends to the target in place.
    struct stat before, after;
    REQUIRE(stat(real.c_str(), &before) == 0);
    REQUIRE(append_all_layers(*s, 5, rng).ok());
    REQUIRE(snapshot_checkpoint(*s, via.c_str()).ok());
    REQUIRE(stat(real.c_str(), &after) == 0);
    CHECK(before.st_ino == after.st_ino);
    CHECK(is_link(via));
    back = snapshot_load(rt.get(), via.c_str(), 0);
    REQUIRE(back.ok());
    CHECK(store_diff(*s, **back) == "");
  }
  CHECK(list_dir(other) == std::vector<std::string>{"abs.snap"});  // no temp file beside the link
  // A dangling link: the save creates its target.
  const std::string dangling = dir + "/dangling.snap";
  REQUIRE(symlink("new.snap", dangling.c_str()) == 0);
  REQUIRE(snapshot_save(*s, dangling.c_str()).ok());
  CHECK(is_link(dangling));
  CHECK(file_size(dir + "/new.snap") > 4096);
  // A loop of links is an error that names the path; nothing is written.
  const std::string a = dir + "/a.snap", b = dir + "/b.snap";
  REQUIRE(symlink("b.snap", a.c_str()) == 0);
  REQUIRE(symlink("a.snap", b.c_str()) == 0);
  const std::vector<std::string> before_loop = list_dir(dir);
  const absl::Status st = snapshot_save(*s, a.c_str());
  CHECK(status_code(st) == SSA_ERR_IO);
  CHECK(std::string(st.message()).find("a.snap") != std::string::npos);
  CHECK(list_dir(dir) == before_loop);
}
