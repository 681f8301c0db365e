#!/usr/bin/env bash
# Unpacks FlashInfer's CUDA headers (include/flashinfer and the CCCL they need)
# from the flashinfer-python wheel into .flashinfer/ (git-ignored), for the
# FlashInfer baseline of bench/gpu_decode_bench:
#   cmake -DSSA_FLASHINFER_DIR=$PWD/.flashinfer   (scripts/gpu.sh check does this)
# Only the headers: the wheel itself (about 100 MB, JIT-built through many Python
# dependencies) does not fit a GPU machine without network; the headers are ~33 MB.
#   bash scripts/fetch_flashinfer_headers.sh [dest]     FLASHINFER_VERSION=0.7.4
set -euo pipefail
VERSION=${FLASHINFER_VERSION:-0.7.4}
DEST=${1:-.flashinfer}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --no-deps --only-binary=:all: "flashinfer-python==$VERSION" -d "$tmp" -q
whl=$(ls "$tmp"/flashinfer_python-*.whl)
rm -rf "$DEST"
mkdir -p "$DEST"
python3 - "$whl" "$DEST" <<'PY'
import os, sys, zipfile
whl, dest = sys.argv[1:]
parts = (("flashinfer/data/include/", "include/"), ("flashinfer/data/cccl/", "cccl/"))
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        for prefix, sub in parts:
            if name.startswith(prefix) and not name.endswith("/"):
                out = os.path.join(dest, sub + name[len(prefix):])
                os.makedirs(os.path.dirname(out), exist_ok=True)
                with open(out, "wb") as f:
                    f.write(z.read(name))
PY
echo "$VERSION" >"$DEST/VERSION"
du -sh "$DEST"
