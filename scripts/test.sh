#!/usr/bin/env bash
# Install what is needed and run every test. Set BANLIEUE_TEST_KUBECONFIG to run
# the end-to-end suites against a real cluster instead of the embedded server.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
export CARGO_TERM_COLOR=never
# libvirtd with qemu (TCG) and the test guest: one per run, shared by every suite that
# boots a VM (banlieue-test-backends' libvirtd), stopped again however the run ends.
tests/backends/libvirtd/start.sh >/dev/null
cleanup() { tests/backends/libvirtd/stop.sh >/dev/null 2>&1 || true; }
# On a shared cluster, remove what the run added however it ends.
if [ -n "${BANLIEUE_TEST_KUBECONFIG:-}" ]; then
  snapshot=$(mktemp)
  scripts/test-cluster.sh snapshot >"$snapshot"
  cleanup() { tests/backends/libvirtd/stop.sh >/dev/null 2>&1 || true; scripts/test-cluster.sh restore "$snapshot" || true; }
fi
trap cleanup EXIT
tests/backends/libvirtd/build-guest.sh >/dev/null
# Guest components first: the runtime and end-to-end tests load them from guests/dist.
guests/build.sh
(cd guests && cargo test --locked --target x86_64-unknown-linux-gnu)
# One build of everything, then the tests (suites start the servers they need).
cargo build --workspace --all-targets --locked
cargo run -q -p banlieue --locked -- crdgen --check
cargo run -q -p banlieue --locked -- rbacgen --check
# The control plane crate stays free of import circles (docs/architecture.md).
python3 scripts/module-cycles.py host/controller/src
make --no-print-directory docs
cargo test --workspace --locked --no-fail-fast
