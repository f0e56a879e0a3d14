#!/usr/bin/env bash
# The static checks over deploy/: the Terraform modules are formatted (`terraform fmt`), checkov
# finds no failed check in the modules and the CloudFormation template (a skip is only inline,
# with its reason), cfn-lint passes the template, and the self-hosted compose file renders (and
# refuses to without a store). `terraform validate` needs the real
# providers (hashicorp/aws, google, azurerm, azuread), which these machines cannot download.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
bin="$(scripts/install-deploy-checks.sh)"
terraform="$(scripts/install-terraform.sh)"

echo "== terraform fmt -check -recursive deploy" >&2
env -u TF_CLI_CONFIG_FILE "$terraform" fmt -check -recursive -diff deploy

echo "== checkov" >&2
"$bin/checkov" --directory deploy --framework terraform cloudformation \
    --quiet --compact --skip-download --download-external-modules false

echo "== cfn-lint" >&2
mapfile -t templates < <(grep -rl --include='*.yaml' --include='*.yml' '^AWSTemplateFormatVersion' deploy | sort)
((${#templates[@]})) || { echo "no CloudFormation template under deploy/" >&2; exit 1; }
"$bin/cfn-lint" -- "${templates[@]}"
echo "== podman-compose config (deploy/self-hosted/compose.yaml)" >&2
CONTAINERS_CONF="$(scripts/install-podman.sh)"
export CONTAINERS_CONF
if rendered="$(env -u TERRACE_STORE "$bin/podman-compose" -f deploy/self-hosted/compose.yaml config 2>&1)" ||
    ! grep -q 'required variable TERRACE_STORE is missing' <<<"$rendered"; then
    echo "compose.yaml renders without TERRACE_STORE, or fails otherwise: $rendered" >&2
    exit 1
fi
rendered="$(env TERRACE_STORE='s3://acme-states/terrace?lease_table=terrace-leases' \
    "$bin/podman-compose" -f deploy/self-hosted/compose.yaml config)"
for want in 'image: localhost/terrace-worker:dev' 'TERRACE_AMQP_PASSWORD_FILE: /run/secrets/amqp-password' \
    'replicas: 2' '- serve'; do
    grep -qF -- "$want" <<<"$rendered" || { echo "compose.yaml renders without \`$want\`:" >&2; echo "$rendered" >&2; exit 1; }
done
echo "deploy/ checks passed" >&2
