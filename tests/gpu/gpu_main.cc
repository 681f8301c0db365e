// Runs the GPU tests, or reports them skipped (exit code kSkipped, which ctest
// shows as "Skipped": tests/gpu/CMakeLists.txt) when no CUDA device is usable.
#define DOCTEST_CONFIG_IMPLEMENT
#include <cuda_runtime.h>
#include <doctest/doctest.h>
#include <stdio.h>

namespace {
constexpr int kSkipped = 77;
}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    printf("skipped: no CUDA device\n");
    return kSkipped;
  }
  return doctest::Context(argc, argv).run();
}
