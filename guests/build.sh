#!/usr/bin/env bash
# Build every guest component in release for wasm32-wasip2 into guests/dist/
# and check each one is a WebAssembly component (not a core module).
set -euo pipefail
cd "$(dirname "$0")"

target=wasm32-wasip2
if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx "$target"; then
    rustup target add "$target"
fi

${CARGO:-cargo} build --release --workspace --target "$target"

rm -rf dist
mkdir -p dist
status=0
for wasm in target/"$target"/release/*.wasm; do
    name=$(basename "$wasm" .wasm)
    cp "$wasm" "dist/${name//_/-}.wasm"
done
# A component starts with "\0asm" and the component layer/version 0d 00 01 00;
# a core module has 01 00 00 00.
for wasm in dist/*.wasm; do
    header=$(od -An -tx1 -N8 "$wasm" | tr -d ' \n')
    if [ "$header" = "0061736d0d000100" ]; then kind=component; else kind="NOT a component ($header)"; status=1; fi
    printf '%-28s %8d bytes  %s\n' "$(basename "$wasm")" "$(wc -c <"$wasm")" "$kind"
done
exit $status
