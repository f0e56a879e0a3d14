variable "project_id" {
  description = "The customer's project: the state bucket and the service account Terrace impersonates live here."
  type        = string
}

variable "tenant" {
  description = "The tenant's name in the runner's registry (the key of its tenants map), as jobs name it."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9._-]{0,62}$", var.tenant)) && !endswith(var.tenant, ".")
    error_message = "tenant must be 1 to 63 characters, lowercase letters, digits, '-', '_' and '.', starting with a letter or a digit and not ending with '.'."
  }
}

variable "runner_service_account_email" {
  description = "The runner's own service account (the runner module's runner_service_account_email): it alone is granted roles/iam.serviceAccountTokenCreator on this tenant's service account."
  type        = string

  validation {
    condition     = can(regex("^[^@\\s]+@[^@\\s]+\\.gserviceaccount\\.com$", var.runner_service_account_email))
    error_message = "runner_service_account_email must be a service account email."
  }
}

variable "service_account_id" {
  description = "The account id of the service account Terrace impersonates for this tenant (6 to 30 characters)."
  type        = string
  default     = "terrace"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.service_account_id))
    error_message = "service_account_id must be 6 to 30 characters, lowercase letters, digits and hyphens, starting with a letter."
  }
}

variable "project_roles" {
  description = "Project roles the tenant's service account gets in project_id: whatever the resources of the templates this tenant runs need. Basic roles (owner, editor, viewer) and roles that let it act as or mint tokens for other service accounts are refused."
  type        = list(string)
  default     = []

  validation {
    condition = alltrue([
      for role in var.project_roles : !contains([
        "roles/owner", "roles/editor", "roles/viewer",
        "roles/iam.serviceAccountUser", "roles/iam.serviceAccountTokenCreator",
      ], role)
    ])
    error_message = "project_roles must not hold basic roles, roles/iam.serviceAccountUser or roles/iam.serviceAccountTokenCreator."
  }
}

variable "enable_apis" {
  description = "Enable the APIs Terrace needs in project_id (Cloud Storage, IAM Service Account Credentials). They are never disabled on destroy."
  type        = bool
  default     = true
}

# ---------------------------------------------------------------------------------------------
# The state bucket
# ---------------------------------------------------------------------------------------------

variable "bucket_name" {
  description = "The state bucket's name (globally unique)."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$", var.bucket_name)) && !startswith(var.bucket_name, "goog")
    error_message = "bucket_name must be 3 to 63 characters, lowercase letters, digits, '.', '-' and '_', and must not start with goog."
  }
}

variable "location" {
  description = "The state bucket's location: a region, a dual-region or a multi-region (e.g. EU)."
  type        = string
}

variable "prefix" {
  description = "Where in the bucket Terrace keeps its states (PREFIX/TENANT/WORKSPACE/…). When set (and restrict_to_prefix), the tenant's service account may reach only the objects under it. Empty: the whole bucket."
  type        = string
  default     = "terrace"

  validation {
    condition     = var.prefix == "" || can(regex("^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$", var.prefix))
    error_message = "prefix must be empty or path segments of letters, digits, '.', '_' and '-' joined by '/', with no leading or trailing '/'."
  }
}

variable "restrict_to_prefix" {
  description = "Limit the tenant's service account, with an IAM condition, to the objects under prefix and to listings within it. False: the whole bucket (as when prefix is empty)."
  type        = bool
  default     = true
}

variable "noncurrent_version_retention_days" {
  description = "Days a noncurrent object version (an overwritten lease, state copy or marker) is kept before it is deleted. Terrace keeps every state version as an object of its own; this is the bucket's own safety net."
  type        = number
  default     = 30

  validation {
    condition     = var.noncurrent_version_retention_days >= 1
    error_message = "noncurrent_version_retention_days must be at least 1."
  }
}

variable "kms_key_name" {
  description = "A Cloud KMS key (projects/P/locations/L/keyRings/R/cryptoKeys/K) for the bucket's default encryption and for every object Terrace writes (the registry entry's kms_key). The Cloud Storage service agent and the tenant's service account get roles/cloudkms.cryptoKeyEncrypterDecrypter on it. The key must be in the bucket's location. Null: Google-managed keys."
  type        = string
  default     = null

  validation {
    condition     = var.kms_key_name == null || can(regex("^projects/[^/]+/locations/[^/]+/keyRings/[^/]+/cryptoKeys/[^/]+$", var.kms_key_name))
    error_message = "kms_key_name must be projects/P/locations/L/keyRings/R/cryptoKeys/K."
  }
}

variable "access_log_bucket" {
  description = "A bucket (another one) that receives this bucket's usage logs. Null: no usage logs (Cloud Audit Logs' Data Access logs are the finer record)."
  type        = string
  default     = null
}

variable "force_destroy" {
  description = "Let terraform destroy the bucket with the states in it. Keep false outside tests."
  type        = bool
  default     = false
}

variable "labels" {
  description = "Labels set on the bucket."
  type        = map(string)
  default     = {}
}
