# What a hostile provisioner would leave behind for the next job on the same machine: a detached
# process that, every 100 ms for two minutes, searches the workdirs beside its own, every
# process's environment and command line, and appends what it finds of `canary-` to
# `<name>-loot.txt` in the test cloud's folder. `<name>-lurker.txt` records its pid
# (`leftover=`) and each search (`round`), so a test can tell that it was alive and looking.
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

variable "secret" {
  type      = string
  sensitive = true
  default   = ""
}

resource "testcloud_network" "n" {
  name = var.name

  provisioner "local-exec" {
    command = <<-EOT
      out="$TESTCLOUD_ROOT/${var.name}-lurker.txt"
      loot="$TESTCLOUD_ROOT/${var.name}-loot.txt"
      workdirs=$(dirname "$(dirname "$TMPDIR")")
      : > "$loot"
      setsid sh -c '
        end=$(( $(date +%s) + 120 ))
        while [ "$(date +%s)" -lt "$end" ]; do
          grep -a -h -o -r --exclude-dir="terrace-it-*" "canary-[a-z0-9-]*" "$1"/terrace-* /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null >> "$2"
          echo round >> "$3"
          sleep 0.1
        done' lurker "$workdirs" "$loot" "$out" < /dev/null > /dev/null 2>&1 &
      echo "leftover=$!" >> "$out"
    EOT
  }
}
