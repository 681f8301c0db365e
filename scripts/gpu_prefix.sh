# Sourced by the GPU scripts: where scripts/gpu_check.sh unpacks the Abseil,
# xxHash and doctest .deb files on the GPU machine (never into /), and how the
# programs built against them find their shared libraries.
SSA_PREFIX=/tmp/prefix
ssa_prefix_libs() { export LD_LIBRARY_PATH=$SSA_PREFIX/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}; }
