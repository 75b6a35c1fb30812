#!/usr/bin/env bash
# The project's test command: install what the tests need, then run every test of every crate
# (the examples included: tests/examples.rs runs each one). Extra arguments go to cargo test.
#
# The tests need a C compiler and the kernel and rdma-core headers (the ABI checks compile C
# probes), rdma-core's and perftest's programs (they run unmodified on the emulator), valgrind
# (instruction counts) and rsvg-convert (the latency plots are rendered). On Debian or Ubuntu
# this script installs the missing ones with apt-get (through sudo when not root).
set -euo pipefail
cd "$(dirname "$0")/.."

# The independent software the emulator and the provider are judged by (UCX, Open MPI, qperf,
# librdmacm's tools, libfabric), tshark for the captures and iproute2 for the network namespace
# of the raw Ethernet tests.
PACKAGES=(gcc libc6-dev linux-libc-dev libibverbs-dev ibverbs-utils ibverbs-providers perftest
          valgrind librsvg2-bin tshark iproute2 ucx-utils libucx-dev openmpi-bin libopenmpi-dev
          qperf libfabric-bin rdmacm-utils librdmacm-dev)

missing=()
if command -v dpkg-query >/dev/null 2>&1; then
    for p in "${PACKAGES[@]}"; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
            missing+=("$p")
        fi
    done
else
    echo "tools/test.sh: not a Debian system; make sure the equivalents of these are installed:" \
        "${PACKAGES[*]}" >&2
fi

if [ "${#missing[@]}" -gt 0 ]; then
    SUDO=()
    if [ "$(id -u)" != 0 ]; then
        if ! command -v sudo >/dev/null 2>&1; then
            echo "tools/test.sh: missing Debian packages: ${missing[*]}" >&2
            echo "tools/test.sh: not root and no sudo; install them, then run this again" >&2
            exit 1
        fi
        SUDO=(sudo)
    fi
    echo "== installing Debian packages: ${missing[*]}"
    "${SUDO[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Every test binary runs even after one fails (so the summary counts them all); each binary's
# start is stamped with the time since this script began, and one line closes the run.
echo "== cargo test --workspace --release --no-fail-fast $*"
# mawk (Debian's awk) reads a pipe in blocks unless told to read it line by line.
AWK=(awk)
if awk -W version 2>/dev/null | grep -qi mawk; then AWK=(awk -W interactive); fi
set +e
cargo test --workspace --release --no-fail-fast "$@" 2>&1 | "${AWK[@]}" -f tools/test-summary.awk
rc=${PIPESTATUS[0]}
exit "$rc"
