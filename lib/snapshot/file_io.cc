#include "snapshot/file_io.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>

#include "absl/strings/str_cat.h"
#include "status.h"

namespace ssa::snap {
namespace {

int posix_open(const char* path, int flags, mode_t mode) { return ::open(path, flags, mode); }

const FileIo kPosix = {
    posix_open, ::close, ::pread, ::pwrite, ::fsync, ::fstat, ::rename, ::unlink, ::mmap, ::munmap,
};

std::atomic<const FileIo*> g_io{&kPosix};

// Largest single transfer: Linux moves at most ~2 GiB per call anyway.
constexpr size_t kMaxChunk = size_t{1} << 30;

}  // namespace

const FileIo& posix_file_io() { return kPosix; }
const FileIo& file_io() { return *g_io.load(std::memory_order_acquire); }
void set_file_io(const FileIo* io) { g_io.store(io ? io : &kPosix, std::memory_order_release); }

absl::Status io_error(const char* op, const std::string& path, int err) {
  return make_error(err == ENOMEM ? SSA_ERR_OUT_OF_MEMORY : SSA_ERR_IO,
                    absl::StrCat(op, " '", path, "': ", strerror(err)));
}

absl::Status pwrite_all(int fd, const void* data, size_t n, uint64_t offset,
                        const std::string& path) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const size_t chunk = n < kMaxChunk ? n : kMaxChunk;
    const ssize_t w = file_io().pwrite(fd, p, chunk, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return io_error("cannot write", path, errno);
    }
    if (w == 0) return io_error("cannot write", path, EIO);
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

absl::Status pread_exact(int fd, void* data, size_t n, uint64_t offset, const std::string& path) {
  uint8_t* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    const size_t chunk = n < kMaxChunk ? n : kMaxChunk;
    const ssize_t r = file_io().pread(fd, p, chunk, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return io_error("cannot read", path, errno);
    }
    if (r == 0) {
      return make_error(SSA_ERR_CORRUPT,
                        absl::StrCat("snapshot '", path, "' ends early: wanted ", n,
                                     " more bytes at offset ", offset));
    }
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return absl::OkStatus();
}

absl::Status pread_upto(int fd, void* data, size_t n, uint64_t offset, const std::string& path,
                        size_t* got) {
  uint8_t* p = static_cast<uint8_t*>(data);
  *got = 0;
  while (n > 0) {
    const size_t chunk = n < kMaxChunk ? n : kMaxChunk;
    const ssize_t r = file_io().pread(fd, p, chunk, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return io_error("cannot read", path, errno);
    }
    if (r == 0) break;
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
    *got += static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

absl::Status fsync_fd(int fd, const std::string& path) {
  while (file_io().fsync(fd) != 0) {
    if (errno == EINTR) continue;
    return io_error("cannot fsync", path, errno);
  }
  return absl::OkStatus();
}

std::string parent_dir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return std::string(".");
  if (slash == 0) return std::string("/");
  return path.substr(0, slash);
}

absl::Status fsync_parent_dir(const std::string& path) {
  const std::string dir = parent_dir(path);
  const int fd = file_io().open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
  if (fd < 0) return io_error("cannot open directory", dir, errno);
  FdGuard guard(fd);
  return fsync_fd(fd, dir);
}

}  // namespace ssa::snap
