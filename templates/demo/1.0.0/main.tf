terraform {
  required_providers {
    testcloud = {
      source  = "terrace/testcloud"
      version = "0.1.0"
    }
  }
}

# The test cloud keeps its resources as JSON files in the folder named by TESTCLOUD_ROOT
# (passed through to terraform by the runner, like a real provider's credentials).
provider "testcloud" {}

resource "testcloud_network" "main" {
  name = "${var.cluster_name}-net"
  cidr = var.cidr
}

resource "testcloud_cluster" "main" {
  name          = var.cluster_name
  network_id    = testcloud_network.main.id
  region        = var.region
  node_count    = var.node_count
  instance_type = var.instance_type
}
