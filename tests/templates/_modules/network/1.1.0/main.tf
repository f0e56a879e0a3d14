# Test-only library module: a network (1.1.0: 10.2.0.0/16).
terraform {
  required_providers {
    testcloud = {
      source  = "terrace/testcloud"
      version = "0.1.0"
    }
  }
}

variable "name" {
  type = string
}

resource "testcloud_network" "this" {
  name = var.name
  cidr = "10.2.0.0/16"
}

output "id" {
  value = testcloud_network.this.id
}

output "cidr" {
  value = testcloud_network.this.cidr
}
