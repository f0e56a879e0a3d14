variable "runner_project_id" {
  description = "The operator's project, for the runner."
  type        = string
}

variable "customer_project_id" {
  description = "The customer's project, for tenant acme's state bucket and service account."
  type        = string
}

variable "region" {
  description = "The region of the runner and of the customer's bucket."
  type        = string
  default     = "europe-west1"
}

variable "image" {
  description = "The runner's image (deploy/Dockerfile, --target gcp), pinned by digest."
  type        = string
}

variable "state_bucket_name" {
  description = "The name of acme's state bucket (globally unique)."
  type        = string
}
