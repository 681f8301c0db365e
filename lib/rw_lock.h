// The session lock: a readers-writer lock that prefers writers. glibc's default
// rwlock prefers readers, so a stream of decodes could hold off an append
// forever; here a waiting writer stops new readers. Built on pthread_rwlock so
// ThreadSanitizer understands it (prebuilt Abseil is not TSan-instrumented).
// Not recursive: a thread must not take the shared lock twice.
#pragma once

#include <pthread.h>

namespace ssa {

class RwLock {
 public:
  RwLock() {
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&rw_, &attr);
    pthread_rwlockattr_destroy(&attr);
  }
  ~RwLock() { pthread_rwlock_destroy(&rw_); }
  RwLock(const RwLock&) = delete;
  RwLock& operator=(const RwLock&) = delete;

  // The Lockable and SharedLockable interfaces (std::unique_lock, std::shared_lock).
  void lock() { pthread_rwlock_wrlock(&rw_); }
  void unlock() { pthread_rwlock_unlock(&rw_); }
  bool try_lock() { return pthread_rwlock_trywrlock(&rw_) == 0; }
  void lock_shared() { pthread_rwlock_rdlock(&rw_); }
  void unlock_shared() { pthread_rwlock_unlock(&rw_); }

 private:
  pthread_rwlock_t rw_;
};

}  // namespace ssa
