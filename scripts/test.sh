#!/usr/bin/env bash
# Install what is needed and run every test. Set BANLIEUE_TEST_KUBECONFIG to run
# the end-to-end suites against a real cluster instead of the embedded server.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
export CARGO_TERM_COLOR=never
# One build of everything, then the tests (the end-to-end suites start their own servers).
cargo build --workspace --all-targets --locked
cargo run -q -p banlieue --locked -- crdgen --check
cargo test --workspace --locked --no-fail-fast
if [ -x guests/build.sh ]; then guests/build.sh; fi
