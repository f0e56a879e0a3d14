terraform {
  required_version = ">= 1.5"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 6.0, < 8.0"
    }
  }
}

# The operator's project, where the runner runs.
provider "google" {
  alias   = "runner"
  project = var.runner_project_id
  region  = var.region
}

# The customer's project, where the tenant's states and service account live. In practice the
# customer applies the customer module with credentials of their own.
provider "google" {
  alias   = "customer"
  project = var.customer_project_id
  region  = var.region
}
