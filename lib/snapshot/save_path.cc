#include "snapshot/save_path.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "snapshot/file_io.h"
#include "status.h"

namespace ssa::snap {
namespace {

// The host name with every character but [A-Za-z0-9-] replaced, so it parses
// back out of a file name.
std::string host_tag() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  std::string h(buf);
  for (char& c : h) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
    if (!ok) c = '_';
  }
  return h;
}

bool all_digits(const std::string& s) {
  if (s.empty() || s.size() > 19) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

}  // namespace

absl::StatusOr<std::string> resolve_save_target(const std::string& path) {
  std::string cur = path;
  for (int hops = 0;; ++hops) {
    struct stat st;
    if (lstat(cur.c_str(), &st) != 0) {
      if (errno == ENOENT) return cur;  // a new file (or a dangling link's target)
      return io_error("cannot stat", cur, errno);
    }
    if (S_ISREG(st.st_mode)) return cur;
    if (!S_ISLNK(st.st_mode)) {
      return make_error(SSA_ERR_IO, absl::StrCat("cannot save to '", cur,
                                                 "': it exists and is not a regular file"));
    }
    if (hops == 40) return io_error("cannot resolve", path, ELOOP);
    std::vector<char> buf(static_cast<size_t>(st.st_size > 0 ? st.st_size : PATH_MAX) + 1);
    const ssize_t n = readlink(cur.c_str(), buf.data(), buf.size());
    if (n < 0) return io_error("cannot read link", cur, errno);
    if (static_cast<size_t>(n) >= buf.size()) return io_error("cannot read link", cur, ENAMETOOLONG);
    std::string target(buf.data(), static_cast<size_t>(n));
    if (target.empty()) return io_error("cannot read link", cur, ENOENT);
    if (target[0] != '/') {
      const size_t slash = cur.find_last_of('/');
      if (slash != std::string::npos) target = cur.substr(0, slash + 1) + target;
    }
    cur = std::move(target);
  }
}

std::string base_name(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string temp_name(const std::string& target, uint64_t n) {
  return absl::StrCat(target, ".tmp.", host_tag(), ".", getpid(), ".", n);
}

int remove_stale_temps(const std::string& target) {
  const std::string dir = parent_dir(target);
  const std::string prefix = absl::StrCat(base_name(target), ".tmp.", host_tag(), ".");
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return 0;
  std::vector<std::string> stale;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = name.substr(prefix.size());  // "<pid>.<n>"
    const size_t dot = rest.find('.');
    if (dot == std::string::npos) continue;
    const std::string pid_s = rest.substr(0, dot), n_s = rest.substr(dot + 1);
    if (!all_digits(pid_s) || !all_digits(n_s)) continue;
    const long long pid = strtoll(pid_s.c_str(), nullptr, 10);
    if (pid <= 0 || pid > INT_MAX || pid == getpid()) continue;
    // Only a writer that is certainly gone: EPERM means alive under another user.
    if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    stale.push_back(dir + "/" + name);
  }
  closedir(d);
  int removed = 0;
  for (const std::string& p : stale) removed += file_io().unlink(p.c_str()) == 0 ? 1 : 0;
  return removed;
}

}  // namespace ssa::snap
