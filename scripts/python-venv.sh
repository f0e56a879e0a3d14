#!/usr/bin/env bash
# Makes a Python virtualenv at $1 (replacing what is there), installing Debian's python3-venv
# with apt-get first where the machine's python3 cannot make one.
set -euo pipefail
venv="$1"
if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    echo "installing python3-venv with apt-get" >&2
    sudo=""
    [[ "$(id -u)" == 0 ]] || sudo="sudo"
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv >&2
fi
rm -rf "$venv"
python3 -m venv "$venv"
