# A set of networks, one per name: tests add names to a workspace that already has some.
terraform {
  required_providers {
    testcloud = {
      source  = "terrace/testcloud"
      version = "0.1.0"
    }
  }
}

provider "testcloud" {}

variable "networks" {
  type = list(string)
}

resource "testcloud_network" "n" {
  for_each = toset(var.networks)
  name     = each.key
}
