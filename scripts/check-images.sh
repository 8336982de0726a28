#!/usr/bin/env bash
# Every container image an install root renders must name a registry and a tag (or a
# digest): without an overlay's `images` entry kustomize leaves `image: banlieue`,
# which no cluster can pull, or an overlay can forget `newTag`.
#
#   scripts/check-images.sh deploy deploy/overlays/local-registry
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 KUSTOMIZE_ROOT..." >&2; exit 2; }
for root in "$@"; do
    rendered=$(kubectl kustomize "$root") || { echo "check-images: kubectl kustomize $root failed" >&2; exit 1; }
    images=$(sed -nE 's/^\s+(- )?image: ([^ ]+)$/\2/p' <<<"$rendered")
    [ -n "$images" ] || { echo "check-images: $root renders no container image" >&2; exit 1; }
    for image in $images; do
        if ! grep -qE '^([^/]+\.[^/]+|localhost)(:[0-9]+)?/.+(:[^:/@]+|@sha256:[0-9a-f]{64})$' <<<"$image"; then
            echo "check-images: $root: image \"$image\" has no registry or no tag; set images[].newName and images[].newTag (or digest) in $root/kustomization.yaml" >&2
            exit 1
        fi
    done
done
