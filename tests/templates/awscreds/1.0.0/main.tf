# What an AWS provider does with the config file the function gives terraform: run its
# credential_process. The provisioner records the document it got and the names of the
# variables terraform saw, in the test cloud's folder, and prints the document, as a careless
# script would, for the log's redaction to catch.
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
    command = <<-EOT
      process="$(sed -n 's/^credential_process = //p' "$AWS_CONFIG_FILE")"
      sh -c "$process" > "$TESTCLOUD_ROOT/${var.name}-first.json"
      sh -c "$process"
      sh -c "$process" > "$TESTCLOUD_ROOT/${var.name}-second.json"
      env | cut -d= -f1 | sort > "$TESTCLOUD_ROOT/${var.name}-env.txt"
      TERRACE_CREDENTIALS_TOKEN=wrong sh -c "$process" 2> "$TESTCLOUD_ROOT/${var.name}-refused.txt" || true
    EOT
  }
}
