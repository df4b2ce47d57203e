#!/usr/bin/env bash
# Installs every build, test and benchmark dependency of weightfloor from Debian packages.
# Idempotent: packages already present are left alone. Runs as root or through sudo.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config ninja-build
  clang libclang-rt-dev            # libFuzzer and sanitizer runtimes
  liburing-dev                     # io_uring reads (materializer, staging)
  libnng-dev                       # control-plane transport
  libprotobuf-c-dev protobuf-c-compiler
  libcriterion-dev                 # unit and integration tests
  libxxhash-dev                    # xxh3 digests and checksums
  libjson-c-dev                    # safetensors headers, config, reference manifests
  fio                              # benchmark anchor
  openssl                          # the TLS transport test makes its own certificates
  procps util-linux                # pgrep, fallocate, flock for scripts
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "setup: all ${#PKGS[@]} packages present"
else
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: CUDA toolkit found at /usr/local/cuda ($(/usr/local/cuda/bin/nvcc --version | tail -n 2 | head -n 1))"
else
  echo "setup: no CUDA toolkit at /usr/local/cuda: cuda/ will be skipped by the build"
fi
