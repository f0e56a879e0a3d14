# A template that shows a secret everywhere terraform can: in a resource attribute (plan and
# apply output), in a plain output and in an error-free state. Terraform itself does not mask
# it (the variable is not marked sensitive here); only Terrace's redaction stands between the
# secret and the logs and results.
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
  type = string
}

resource "testcloud_network" "leak" {
  name = "${var.name}-${var.token}"
}

output "connection" {
  value = "token=${var.token}"
}
