#!/usr/bin/env bash
# Installs the static checkers for deploy/ (checkov for the Terraform modules and the
# CloudFormation template, cfn-lint for the template, podman-compose for the self-hosted
# compose file) into a virtualenv under .cache/deploy-checks, idempotently. Prints the
# virtualenv's bin folder.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
checkov_version="3.3.30"
cfn_lint_version="1.58.0"
podman_compose_version="1.6.0"
venv="$repo_root/.cache/deploy-checks"
if [[ -x "$venv/bin/checkov" && -x "$venv/bin/cfn-lint" ]] &&
    [[ "$("$venv/bin/pip" show checkov 2>/dev/null | sed -n 's/^Version: //p')" == "$checkov_version" ]] &&
    [[ "$("$venv/bin/pip" show cfn-lint 2>/dev/null | sed -n 's/^Version: //p')" == "$cfn_lint_version" ]] &&
    [[ "$("$venv/bin/pip" show podman-compose 2>/dev/null | sed -n 's/^Version: //p')" == "$podman_compose_version" ]]; then
    echo "$venv/bin"
    exit 0
fi
echo "installing checkov $checkov_version, cfn-lint $cfn_lint_version and podman-compose $podman_compose_version into $venv" >&2
"$repo_root/scripts/python-venv.sh" "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "checkov==$checkov_version" "cfn-lint==$cfn_lint_version" \
    "podman-compose==$podman_compose_version" >&2
echo "$venv/bin"
