# Terraform's and the AWS provider's versions are the modules' (>= 1.5, >= 5.0).
terraform {
  required_providers {
    aws    = { source = "hashicorp/aws" }
    random = { source = "hashicorp/random", version = ">= 3.5" }
  }
}
