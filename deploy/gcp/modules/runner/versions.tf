terraform {
  required_version = ">= 1.5"

  required_providers {
    google = {
      source = "hashicorp/google"
      # 6.0 brought deletion_protection on the Cloud Run v2 service and job (on by default).
      version = ">= 6.0"
    }
  }
}
