# A provisioner that allocates memory until it is refused: the runner's per-process limit
# (TERRACE_JOB_MEMORY) must stop it, not the machine.
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

resource "testcloud_network" "n" {
  name = var.name

  provisioner "local-exec" {
    command = "python3 -c 'b = []\nwhile True: b.append(bytearray(64 << 20))'"
  }
}
