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

# Filled by the runner: tenant, workspace, job, template and its version.
variable "terrace_tags" {
  type = map(string)
}

# The test cloud's networks take no tags: the tags are an output, where a changed tag is a
# change terraform plans, as it would be on a real cloud's resource.
resource "testcloud_network" "main" {
  name = var.name
  cidr = "10.0.0.0/16"
}

output "tags" {
  value = var.terrace_tags
}
