# What a hostile provider or provisioner would try: read the runner's environment through
# /proc (terraform is the provisioner shell's parent, the runner terraform's), and list its
# own. It records what it got in the test cloud's folder, as `<name>-probe.txt`:
#   uid=<its uid>
#   runner_environ=<readable|denied>
#   own_env=<the names of its own variables, comma-separated>
#   leftover=<the pid of a process it leaves running, detached from terraform>
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
      out="$TESTCLOUD_ROOT/${var.name}-probe.txt"
      runner=$(cut -d' ' -f4 "/proc/$PPID/stat")
      echo "uid=$(id -u)" > "$out"
      echo "tmpdir=$TMPDIR" >> "$out"
      echo "runner_pid=$runner" >> "$out"
      if cat "/proc/$runner/environ" > /dev/null 2>&1; then
        echo "runner_environ=readable" >> "$out"
        tr '\0' '\n' < "/proc/$runner/environ" | cut -d= -f1 | sort | tr '\n' ',' | sed 's/^/runner_env=/' >> "$out"
        echo >> "$out"
      else
        echo "runner_environ=denied" >> "$out"
      fi
      env | cut -d= -f1 | sort | tr '\n' ',' | sed 's/^/own_env=/' >> "$out"
      echo >> "$out"
      setsid sleep 600 < /dev/null > /dev/null 2>&1 &
      echo "leftover=$!" >> "$out"
    EOT
  }
}
