#!/usr/bin/env bash
# The project's test command (README): every test of every crate, on the emulated HCA.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --release "$@"
