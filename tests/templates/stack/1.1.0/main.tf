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

variable "node_count" {
  type = number
}

# Both from the module library, at the versions template.yaml pins.
module "network" {
  source = "./modules/network"
  name   = "${var.name}-net"
}

module "cluster" {
  source     = "./modules/cluster"
  name       = var.name
  network_id = module.network.id
  node_count = var.node_count
}

output "network_cidr" {
  value = module.network.cidr
}

output "cluster_id" {
  value = module.cluster.id
}
