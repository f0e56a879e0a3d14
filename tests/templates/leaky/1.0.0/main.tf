# A template that shows a secret everywhere terraform can: in a resource attribute (plan and
# apply output), in a plain output and in an error-free state. The variable is sensitive, as its
# template.yaml says (Terrace refuses a template whose declarations disagree), but the values
# derived from it are declared `nonsensitive`, so terraform itself does not mask them: only
# Terrace's redaction stands between the secret and the logs and results.
terraform {
  required_providers {
    testcloud = {
      source  = "terrace/testcloud"
      version = "0.1.0"
    }
  }
}

provider "testcloud" {}

variable "name" {
  type = string
}

variable "token" {
  type      = string
  sensitive = true
}

resource "testcloud_network" "leak" {
  name = nonsensitive("${var.name}-${var.token}")
}

output "connection" {
  value = nonsensitive("token=${var.token}")
}

# The secret itself as a sensitive output: masked in every result, and sealed to the platform's
# key when the runner has one (docs/outputs.md).
output "token" {
  value     = var.token
  sensitive = true
}

# A sensitive value terraform derives itself: the runner's redaction does not know it (it knows
# the variables' values), so only the runner's handling of outputs keeps it out of logs.
output "token_digest" {
  value     = sensitive(sha256(var.token))
  sensitive = true
}
