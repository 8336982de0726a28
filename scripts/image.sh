#!/usr/bin/env bash
# Build banlieue's container image with buildah (no Docker daemon): the `banlieue`
# binary (stripped), the shared libraries it links (libvirt's client among them),
# CA certificates and the built-in components, on an empty base — no shell, no
# package manager. Runs as user 65532. Tagged banlieue:<version> and
# banlieue:<git commit>, with the OCI labels source, version and revision.
#
#   scripts/image.sh                      build (release profile)
#   PUSH=127.0.0.1:5000 scripts/image.sh  build, then push both tags there
#   PROFILE=debug scripts/image.sh        use target/debug (tests: no second build)
set -euo pipefail
cd "$(dirname "$0")/.."

PROFILE=${PROFILE:-release}
# vfs works everywhere (no overlayfs in nested containers); podman must use the same
# driver to see the image: `podman --storage-driver vfs run localhost/banlieue:<tag>`.
STORAGE_DRIVER=${STORAGE_DRIVER:-vfs}
buildah() { command buildah --storage-driver "$STORAGE_DRIVER" "$@"; }
SOURCE_URL=https://github.com/banlieue/banlieue
die() { echo "image: $*" >&2; exit 1; }

command -v buildah >/dev/null || die "buildah is not installed (apt-get install -y buildah)"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
[ -n "$version" ] || die "no workspace version in Cargo.toml"
revision=$(git rev-parse HEAD 2>/dev/null) || die "not a git checkout: the image is tagged with the commit"
git diff --quiet HEAD -- host sdk wit guests Cargo.lock || echo "image: warning: uncommitted changes; the :${revision:0:12} tag will not match them" >&2

# Every install root must pin the image it runs (registry and tag).
scripts/check-images.sh deploy deploy/overlays/*/

if [ "$PROFILE" = release ]; then
    cargo build --release --locked -p banlieue
    binary=target/release/banlieue
else
    binary=target/$PROFILE/banlieue
    [ -x "$binary" ] || die "$binary not built (cargo build -p banlieue)"
fi
[ -f guests/dist/provider-libvirt.wasm ] || die "guests/dist is empty: run guests/build.sh first"
# The browser console page (xterm.js and noVNC vendored from npm).
scripts/console-page.sh >/dev/null

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/root
mkdir -p "$root/usr/bin" "$root/usr/lib/banlieue/components" "$root/usr/share/banlieue" "$root/etc/ssl/certs" "$root/tmp" "$stage/cache"
cp -r target/console-page "$root/usr/share/banlieue/console-page"
cp "$binary" "$root/usr/bin/banlieue"
strip "$root/usr/bin/banlieue"
cp guests/dist/provider-*.wasm guests/dist/placement-*.wasm "$root/usr/lib/banlieue/components/"
# The dynamic loader and every library the binary links, at the paths it looks them up.
for lib in $(ldd "$binary" | grep -oE '/[^ ]+\.so[^ ]*'); do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
done
cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
printf 'root:x:0:0:root:/:/sbin/nologin\nbanlieue:x:65532:65532:banlieue:/:/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nbanlieue:x:65532:\n' >"$root/etc/group"
chmod 1777 "$root/tmp"

image=localhost/banlieue
ctr=$(buildah from scratch)
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true; rm -rf "$stage"' EXIT
buildah copy --quiet "$ctr" "$root/" / >/dev/null
# The component cache (BANLIEUE_CACHE_DIR), the one place the image's user writes.
buildah copy --quiet --chown 65532:65532 "$ctr" "$stage/cache" /var/cache/banlieue >/dev/null
buildah config \
    --user 65532:65532 \
    --entrypoint '["/usr/bin/banlieue"]' \
    --cmd 'run' \
    --workingdir / \
    --env BANLIEUE_BUILTIN_DIR=/usr/lib/banlieue/components \
    --env BANLIEUE_CONSOLE_PAGE_DIR=/usr/share/banlieue/console-page \
    --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    --port 9464 \
    --label org.opencontainers.image.source=$SOURCE_URL \
    --label org.opencontainers.image.version="$version" \
    --label org.opencontainers.image.revision="$revision" \
    --label org.opencontainers.image.title=banlieue \
    --label org.opencontainers.image.licenses=Apache-2.0 \
    "$ctr"
buildah commit --quiet --format oci --timestamp 0 "$ctr" "$image:$version" >/dev/null
buildah tag "$image:$version" "$image:$revision"
echo "built $image:$version and $image:$revision"

if [ -n "${PUSH:-}" ]; then
    for tag in "$version" "$revision"; do
        buildah push --quiet --tls-verify=false --format oci "$image:$tag" "docker://$PUSH/banlieue:$tag"
        echo "pushed $PUSH/banlieue:$tag"
    done
fi
