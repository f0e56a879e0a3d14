# Test-only library module: a cluster on a network.
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

variable "network_id" {
  type = string
}

variable "node_count" {
  type = number
}

resource "testcloud_cluster" "this" {
  name       = var.name
  network_id = var.network_id
  region     = "eu-west-1"
  node_count = var.node_count
}

output "id" {
  value = testcloud_cluster.this.id
}
