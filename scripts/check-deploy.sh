#!/usr/bin/env bash
# The static checks over deploy/: the Terraform modules are formatted (`terraform fmt`), checkov
# finds no failed check in the modules and the CloudFormation template (a skip is only inline,
# with its reason), and cfn-lint passes the template. `terraform validate` needs the real
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
echo "deploy/ checks passed" >&2
