#!/usr/bin/env bash
# Install fakepve (PyPI, AGPL-3.0 test fake; only ever run as a separate process)
# with the `crypto` extra the fixture needs to make its TLS certificate.
# Idempotent: does nothing when the pinned version is already importable.
set -euo pipefail
version=0.5.0
python=${FAKEPVE_PYTHON:-python3}
if "$python" -c "import fakepve, cryptography, sys; sys.exit(fakepve.__version__ != '$version')" 2>/dev/null \
    && command -v "${FAKEPVE:-fakepve}" >/dev/null; then
    echo "fakepve $version already installed"
    exit 0
fi
"$python" -m pip install --quiet "fakepve[crypto]==$version"
command -v pyenv >/dev/null && pyenv rehash || true
"${FAKEPVE:-fakepve}" --version
