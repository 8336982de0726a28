#!/usr/bin/env bash
# The browser console page (docs/console.md) into target/console-page, which the console
# server serves with --console-page-dir: console-page/'s files and, vendored from npm at the
# versions console-page/package-lock.json pins, xterm.js and noVNC's ES modules (nothing is
# loaded from elsewhere at run time). npm installs into target/console-page-npm, not the
# source tree. Idempotent: nothing is installed or replaced when it is up to date.
set -euo pipefail
cd "$(dirname "$0")/.."

src=console-page
out=target/console-page
npm_dir=target/console-page-npm

command -v npm >/dev/null || { echo "npm not found: scripts/install-deps.sh installs it" >&2; exit 1; }

# The packages, once per change of the lock file (from npm's cache when it has them).
mkdir -p "$npm_dir"
if ! cmp -s "$src/package-lock.json" "$npm_dir/package-lock.json" || ! cmp -s "$src/package.json" "$npm_dir/package.json" || [ ! -d "$npm_dir/node_modules" ]; then
  cp "$src/package.json" "$src/package-lock.json" "$npm_dir/"
  npm ci --prefix "$npm_dir" --prefer-offline --no-audit --no-fund --loglevel=error >&2
fi
modules=$npm_dir/node_modules

# The page, assembled aside and put in place only when it differs.
stage=$(mktemp -d "target/console-page.XXXXXX")
trap 'rm -rf "$stage"' EXIT
cp "$src/index.html" "$src/console.js" "$src/console.css" "$stage/"
mkdir -p "$stage/vendor/novnc"
cp "$modules/@xterm/xterm/lib/xterm.mjs" "$modules/@xterm/xterm/css/xterm.css" "$stage/vendor/"
cp "$modules/@xterm/xterm/LICENSE" "$stage/vendor/xterm.LICENSE"
cp -r "$modules/@novnc/novnc/core" "$modules/@novnc/novnc/vendor" "$stage/vendor/novnc/"
cp "$modules/@novnc/novnc/LICENSE.txt" "$stage/vendor/novnc/LICENSE.txt"
# The versions served, for whoever looks.
node -e 'const l = require(process.argv[1]).packages; for (const p of ["@xterm/xterm", "@novnc/novnc"]) console.log(p + " " + l["node_modules/" + p].version)' \
  "$PWD/$src/package-lock.json" >"$stage/vendor/VERSIONS"

if [ -d "$out" ] && diff -rq "$stage" "$out" >/dev/null; then
  echo "$out: up to date"
else
  chmod -R a+rX "$stage"
  rm -rf "$out"
  mv "$stage" "$out"
  echo "$out: built"
fi
