#!/usr/bin/env bash
# Installs Azurite (the Azure Storage emulator the tests run the Azure Blob store and queue
# against) with npm into .cache/azurite, idempotently; installs nodejs/npm with apt-get first if
# npm is missing. Prints the azurite executable's path.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="3.35.0"
dir="$repo_root/.cache/azurite"
bin="$dir/node_modules/.bin/azurite"
installed() {
    [[ -x "$bin" ]] && command -v node >/dev/null 2>&1 &&
        node -e "process.exit(require(process.argv[1]).version === process.argv[2] ? 0 : 1)" \
            "$dir/node_modules/azurite/package.json" "$version"
}
if installed 2>/dev/null; then
    echo "$bin"
    exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
    echo "installing nodejs and npm with apt-get" >&2
    sudo=""
    [[ "$(id -u)" == 0 ]] || sudo="sudo"
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nodejs npm >&2
fi
echo "installing azurite@$version into $dir" >&2
rm -rf "$dir"
mkdir -p "$dir"
npm install --prefix "$dir" "azurite@$version" --no-audit --no-fund --silent >&2
installed || { echo "azurite $version did not install into $dir" >&2; exit 1; }
echo "$bin"
