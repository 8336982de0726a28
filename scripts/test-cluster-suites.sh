#!/usr/bin/env bash
# The end-to-end suites of banlieue-tests against a real cluster:
#
#   scripts/test-cluster-suites.sh KUBECONFIG [SUITE...]    (make test-cluster KUBECONFIG=...)
#
# Every suite (tests/*.rs of tests/Cargo.toml), or the SUITEs named (api_semantics ...).
# CI runs it after `make test` against a kube-apiserver v1.24 it starts (.ci/run). It runs
# the test binaries of make test's build, recompiling nothing (a run without make test
# first builds them). libvirtd runs for the suites that boot a guest, and the cluster is
# left as found (scripts/test-cluster.sh), however the run ends.
set -euo pipefail
kubeconfig=${1:?usage: scripts/test-cluster-suites.sh KUBECONFIG [SUITE...]}
shift
[ -f "$kubeconfig" ] || { echo "no kubeconfig at $kubeconfig" >&2; exit 2; }
BANLIEUE_TEST_KUBECONFIG=$(cd "$(dirname "$kubeconfig")" && pwd)/$(basename "$kubeconfig")
export BANLIEUE_TEST_KUBECONFIG
cd "$(dirname "$0")/.."
root=$(pwd)
export CARGO_TERM_COLOR=never

version=$(kubectl --kubeconfig "$BANLIEUE_TEST_KUBECONFIG" get --raw /version | sed -n 's/.*"gitVersion": *"\([^"]*\)".*/\1/p')
echo "end-to-end suites against Kubernetes ${version:-?} ($BANLIEUE_TEST_KUBECONFIG)"

# The binaries `cargo test --workspace` (make test) built: the same command, not run.
# (`cargo test -p banlieue-tests` would resolve features for that package alone and
# build every suite again.)
build=$(mktemp)
cargo test --workspace --locked --no-run --message-format=json >"$build"
mapfile -t suites < <(python3 -c '
import json, os, sys
manifest = os.path.realpath(sys.argv[2] + "/tests/Cargo.toml")
suites = {}
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or m["target"]["kind"] != ["test"]:
        continue
    if os.path.realpath(m["manifest_path"]) == manifest:
        # conformance asks no cluster anything (a driver against its backend): named, it runs.
        if (len(sys.argv) == 3 and m["target"]["name"] not in ("conformance",)) or m["target"]["name"] in sys.argv[3:]:
            suites[m["target"]["name"]] = m["executable"]
for name in sorted(suites):
    print(name, suites[name])
' "$build" "$root" "$@")
rm -f "$build"
[ ${#suites[@]} -gt 0 ] || { echo "no such suite: $*" >&2; exit 2; }

# libvirtd for the suites that boot a guest, stopped afterwards unless it ran already
# (make test stops its own: in CI, this run starts and stops one).
pidfile=${BANLIEUE_LIBVIRTD_DIR:-/tmp/banlieue-libvirtd}/run/libvirtd.pid
stop_libvirtd=tests/backends/libvirtd/stop.sh
if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then stop_libvirtd=true; fi
tests/backends/libvirtd/start.sh >/dev/null
cleanup() { "$stop_libvirtd" >/dev/null 2>&1 || true; }
trap cleanup EXIT
snapshot=$(mktemp)
scripts/test-cluster.sh snapshot >"$snapshot"
# Only once the snapshot is whole: restore removes whatever is not in it.
cleanup() {
    "$stop_libvirtd" >/dev/null 2>&1 || true
    scripts/test-cluster.sh restore "$snapshot" || true
    rm -f "$snapshot"
}
tests/backends/libvirtd/build-guest.sh >/dev/null
guests/build.sh >/dev/null

# As cargo runs them: from the package's directory, every suite however the others end.
failed=()
for suite in "${suites[@]}"; do
    name=${suite%% *}
    echo "     Running $name against ${version:-the cluster}"
    (cd tests && "${suite#* }") || failed+=("$name")
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "failed against Kubernetes ${version:-?}: ${failed[*]}" >&2
    exit 1
fi
echo "every suite passed against Kubernetes ${version:-?}"
