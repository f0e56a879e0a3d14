# Test-only: rollbacks from one version of a template to the one before.
terraform {
  required_providers {
    testcloud = {
      source  = "terrace/testcloud"
      version = "0.1.0"
    }
  }
}

provider "testcloud" {}

variable "cidr" {
  type = string
}

# Not used by the resources: shows that a rollback gets the values of sensitive variables.
variable "token" {
  type      = string
  sensitive = true
}

resource "testcloud_network" "core" {
  name = "core"
  cidr = var.cidr
}
