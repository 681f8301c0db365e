/* Links against an installed libssa and checks the run-time version matches. */
#include <stdio.h>

#include <ssa.h>

int main(void) {
  ssa_runtime *rt = NULL;
  ssa_runtime_options o;
  ssa_runtime_options_init(&o);
  o.backend = SSA_BACKEND_CPU;
  if (ssa_runtime_create(&o, &rt) != SSA_OK) {
    fprintf(stderr, "runtime: %s\n", ssa_last_error_message());
    return 1;
  }
  ssa_runtime_destroy(rt);
  if (ssa_version() != SSA_VERSION_MAJOR * 10000u + SSA_VERSION_MINOR * 100u + SSA_VERSION_PATCH) {
    fprintf(stderr, "header/library version mismatch\n");
    return 1;
  }
  printf("consumer ok: libssa %s\n", ssa_version_string());
  return 0;
}
