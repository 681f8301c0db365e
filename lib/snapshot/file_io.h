// Every file system call the snapshot code makes goes through one table of
// function pointers, so tests can replace any of them (fail the n-th write, fsync
// or rename; return short writes) and check that each failure surfaces as
// SSA_ERR_IO with the previous snapshot left intact.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <string>

#include "absl/status/status.h"

namespace ssa::snap {

struct FileIo {
  int (*open)(const char* path, int flags, mode_t mode);
  int (*close)(int fd);
  ssize_t (*pread)(int fd, void* buf, size_t n, off_t offset);
  ssize_t (*pwrite)(int fd, const void* buf, size_t n, off_t offset);
  int (*fsync)(int fd);
  int (*fstat)(int fd, struct stat* st);
  int (*rename)(const char* from, const char* to);
  int (*unlink)(const char* path);
  void* (*mmap)(void* addr, size_t n, int prot, int flags, int fd, off_t offset);
  int (*munmap)(void* addr, size_t n);
};

// The plain POSIX table.
const FileIo& posix_file_io();
// The table in use now (posix_file_io() unless a test replaced it).
const FileIo& file_io();
// Replaces the table (nullptr restores POSIX). The table must outlive its use.
// Not thread-safe against snapshot calls running at the same time: for tests.
void set_file_io(const FileIo* io);

// Helpers on top of the table: retry EINTR and short transfers, and turn errno
// into a status with a message naming the operation and the path: ENOMEM (no
// memory for a mapping or a kernel buffer) is SSA_ERR_OUT_OF_MEMORY, every other
// errno SSA_ERR_IO.
absl::Status io_error(const char* op, const std::string& path, int err);
absl::Status pwrite_all(int fd, const void* data, size_t n, uint64_t offset,
                        const std::string& path);
// Reads exactly n bytes; a short read (end of file) is SSA_ERR_CORRUPT.
absl::Status pread_exact(int fd, void* data, size_t n, uint64_t offset,
                         const std::string& path);
// Reads up to n bytes, fewer only at the end of the file; *got says how many.
absl::Status pread_upto(int fd, void* data, size_t n, uint64_t offset, const std::string& path,
                        size_t* got);
absl::Status fsync_fd(int fd, const std::string& path);
// The directory part of a path ("." for a bare name, "/" for a name in the root).
std::string parent_dir(const std::string& path);
// Opens the directory holding `path` and fsyncs it (makes a rename durable).
absl::Status fsync_parent_dir(const std::string& path);

// Closes fd on scope exit unless released.
class FdGuard {
 public:
  explicit FdGuard(int fd = -1) : fd_(fd) {}
  ~FdGuard() { reset(); }
  FdGuard(const FdGuard&) = delete;
  FdGuard& operator=(const FdGuard&) = delete;
  int get() const { return fd_; }
  void reset(int fd = -1) {
    if (fd_ >= 0) file_io().close(fd_);
    fd_ = fd;
  }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

}  // namespace ssa::snap
