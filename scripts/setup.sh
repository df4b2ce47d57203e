#!/usr/bin/env bash
# Installs every build, test and benchmark dependency of weightfloor from Debian packages.
# Idempotent: packages already present are left alone. Runs as root or through sudo.
# Prints one line per step; apt's output goes to a log whose path is printed on failure.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config ninja-build
  clang libclang-rt-dev            # libFuzzer and sanitizer runtimes
  clang-format                     # bookworm's is 14, the version the tree is formatted with
  liburing-dev                     # io_uring reads (materializer, staging)
  libnng-dev                       # control-plane transport
  libprotobuf-c-dev protobuf-c-compiler
  libcriterion-dev                 # unit and integration tests
  libxxhash-dev                    # xxh3 digests and checksums
  libjson-c-dev                    # safetensors headers, config, reference manifests
  fio                              # benchmark anchor
  gnuplot-nox                      # docs/plots: bench/plots/plots.sh draws BENCHMARKS.md's PNGs
  openssl                          # the TLS transport test makes its own certificates
  procps util-linux                # pgrep, fallocate, flock for scripts
  go-md2man man-db                 # roff man pages from docs/man/*.md; man -w in the install test
  zsh                              # the zsh completion's test
  libmicrohttpd-dev                # the daemons' /metrics, /healthz, /readyz
  prometheus                       # promtool and a real server for the metrics test
  systemd                          # deploy/systemd: systemd-analyze verify and security, sysusers
  yamllint                         # deploy/k8s lint (its python3-yaml reads the manifests too)
)

. "$(dirname "$0")/lib.sh"
# Quiet: apt's output goes to a log; a caller (demo.sh, test.sh) may pass its own in WF_LOG.
own_log=""
if [ -z "${WF_LOG:-}" ]; then
  own_log=$(mktemp -d "${TMPDIR:-/tmp}/weightfloor-setup.XXXXXX")
  wf_log_open "$own_log"
  trap 'rc=$?; if [ $rc = 0 ]; then rm -rf "$own_log"; else echo "setup: log kept in $WF_LOG" >&2; fi' EXIT
fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "setup: all ${#PKGS[@]} packages present"
else
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  # Another apt (unattended-upgrades, a second demo) may hold the dpkg or lists lock: wait for
  # it rather than fail.
  apt_opts=(-o DPkg::Lock::Timeout=600 -o Acquire::Retries=3)
  wf_step "setup: apt-get update" $SUDO apt-get "${apt_opts[@]}" update
  wf_step "setup: installing ${#missing[@]} packages (${missing[*]})" \
    $SUDO apt-get "${apt_opts[@]}" install -y --no-install-recommends "${missing[@]}"
fi

if [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: CUDA toolkit found at /usr/local/cuda ($(/usr/local/cuda/bin/nvcc --version | tail -n 2 | head -n 1))"
else
  echo "setup: no CUDA toolkit at /usr/local/cuda: cuda/ will be skipped by the build"
fi
