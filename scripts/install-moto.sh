#!/usr/bin/env bash
# Installs moto's server (the AWS emulator the tests run S3, DynamoDB, SQS, STS and ECS
# against) into a virtualenv under .cache/moto, idempotently. Prints the moto_server path.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="5.2.5"
venv="$repo_root/.cache/moto"
server="$venv/bin/moto_server"
if [[ -x "$server" ]] && "$venv/bin/python" -c "import moto, sys; sys.exit(moto.__version__ != '$version')" 2>/dev/null; then
    echo "$server"
    exit 0
fi
echo "installing moto[server]==$version into $venv" >&2
"$repo_root/scripts/python-venv.sh" "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "moto[server]==$version" >&2
echo "$server"
