#!/usr/bin/env bash
# Install what is needed and run every test. Set BANLIEUE_TEST_KUBECONFIG to run
# the end-to-end suites against a real cluster instead of the embedded server.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
export CARGO_TERM_COLOR=never
# Guest components first: the runtime and end-to-end tests load them from guests/dist.
guests/build.sh
(cd guests && cargo test --locked --target x86_64-unknown-linux-gnu)
# One build of everything, then the tests (suites start the servers they need).
cargo build --workspace --all-targets --locked
cargo run -q -p banlieue --locked -- crdgen --check
cargo test --workspace --locked --no-fail-fast
