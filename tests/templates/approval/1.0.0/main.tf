terraform {
  required_version = ">= 1.10"
}

variable "name" {
  type = string
}

variable "secret" {
  type      = string
  sensitive = true
}

# Given again to the apply of an approved plan: no plan or state keeps it.
variable "token" {
  type      = string
  sensitive = true
  ephemeral = true
}

variable "fail" {
  type    = bool
  default = false
}

resource "terraform_data" "app" {
  input = var.name

  lifecycle {
    precondition {
      condition     = !var.fail
      error_message = "asked to fail"
    }
  }

  provisioner "local-exec" {
    command     = "test -n \"$TOKEN\""
    environment = { TOKEN = var.token }
  }
}

resource "terraform_data" "secret" {
  input = var.secret
}

output "name" {
  value = terraform_data.app.output
}
