#!/usr/bin/env bash
# Download FlashInfer for the GPU machine (no network there) into .whl-fi/ (git-ignored):
# flashinfer-python and the one wheel it imports that the machine's image lacks (apache-tvm-ffi;
# torch, numpy, ninja, nvidia-ml-py, jinja2, requests, einops, tabulate, click, tqdm, packaging
# and the cuda-* bindings are there). `scripts/gpu_validate.sh fi OUT` installs them.
#
#   scripts/fetch_flashinfer_wheels.sh [VERSION]    # default: the version the extra pins
#
# A device call carries at most 64 MiB with the working tree, so the files are dealt into
# numbered folders of at most PIECE_MIB (56) each, a wheel larger than that split into pieces
# (NAME.partNN): carry .whl-fi/1 in one call, .whl-fi/2 in the next (the machine keeps what the
# last call left while it stays warm), then run the stage; it joins the pieces and checks
# .whl-fi/*/SHA256SUMS. With 0.6.18.post1 (18 MiB) and apache-tvm-ffi (3 MiB) one folder holds all.
set -euo pipefail
version=${1:-0.6.18.post1}
piece=$(( ${PIECE_MIB:-56} << 20 ))
cd "$(dirname "$0")/.."
dl=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux2014_x86_64)
rm -rf .whl-fi && mkdir -p .whl-fi/get
"${dl[@]}" -d .whl-fi/get "flashinfer-python==$version"
fi_whl=$(ls .whl-fi/get/flashinfer_python-*.whl)
# what it needs at import and the image lacks: its own pin of apache-tvm-ffi
tvm=$(unzip -p "$fi_whl" '*/METADATA' | sed -n 's/^Requires-Dist: \(apache-tvm-ffi[^;]*\)$/\1/p')
"${dl[@]}" -d .whl-fi/get "${tvm:-apache-tvm-ffi<0.2}"
(cd .whl-fi/get && sha256sum ./*.whl | sed 's# \./# #') >.whl-fi/SHA256SUMS
# deal files (and pieces of large ones) into folders of at most $piece bytes
n=1 used=0
mkdir -p .whl-fi/1
for f in .whl-fi/get/*.whl; do
    size=$(stat -c %s "$f")
    if [ "$size" -gt "$piece" ]; then
        split -b "$piece" -d -a 2 "$f" "$f.part"
        rm "$f"
    fi
done
for f in $(ls -S .whl-fi/get/*); do
    size=$(stat -c %s "$f")
    if [ $((used + size)) -gt "$piece" ] && [ "$used" -gt 0 ]; then
        n=$((n + 1)) used=0
        mkdir -p ".whl-fi/$n"
    fi
    mv "$f" ".whl-fi/$n/"
    used=$((used + size))
done
rmdir .whl-fi/get
for d in .whl-fi/*/; do cp .whl-fi/SHA256SUMS "$d"; done
rm .whl-fi/SHA256SUMS
du -ab .whl-fi | sort -k2
echo "carry, one call each (the last one running the stage): $(ls -d .whl-fi/*/ | tr '\n' ' ')"
