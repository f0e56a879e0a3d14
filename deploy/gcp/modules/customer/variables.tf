variable "project_id" {
  description = "The customer's project: the state bucket and the service account Terrace impersonates live here."
  type        = string
}

variable "enable_apis" {
  description = "Enable the APIs Terrace needs in project_id (Cloud Storage, IAM Service Account Credentials). They are never disabled on destroy."
  type        = bool
  default     = true
}

variable "tenant" {
  description = "The tenant's name in the runner's registry (the key of its tenants map), as jobs name it."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9._-]{0,62}$", var.tenant)) && !endswith(var.tenant, ".")
    error_message = "tenant must be 1 to 63 characters, lowercase letters, digits, '-', '_' and '.', starting with a letter or a digit and not ending with '.'."
  }
}

# ---------------------------------------------------------------------------------------------
# The tenant's service account
# ---------------------------------------------------------------------------------------------

variable "service_account" {
  description = <<-EOT
    The service account the runner impersonates for this tenant (the registry entry's
    service_account):
    - account_id ("terrace"): its account id, 6 to 30 characters.
    - project_roles ([]): the project roles it gets in project_id, whatever the resources of the
      templates this tenant runs need. Basic roles (owner, editor, viewer) and roles that let it
      act as or mint tokens for other service accounts are refused.
  EOT
  type = object({
    account_id    = optional(string, "terrace")
    project_roles = optional(list(string), [])
  })
  default  = {}
  nullable = false

  validation {
    condition = alltrue([
      for role in var.service_account.project_roles : !contains([
        "roles/owner", "roles/editor", "roles/viewer",
        "roles/iam.serviceAccountUser", "roles/iam.serviceAccountTokenCreator",
      ], role)
    ])
    error_message = "service_account.project_roles must not hold basic roles, roles/iam.serviceAccountUser or roles/iam.serviceAccountTokenCreator."
  }

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.service_account.account_id))
    error_message = "service_account.account_id must be 6 to 30 characters, lowercase letters, digits and hyphens, starting with a letter."
  }
}

# ---------------------------------------------------------------------------------------------
# The state bucket
# ---------------------------------------------------------------------------------------------

variable "state_bucket" {
  description = <<-EOT
    The state bucket:
    - name (required): its globally unique name.
    - location (required): a region, a dual-region or a multi-region (e.g. EU).
    - prefix ("terrace"): where in the bucket Terrace keeps its states (PREFIX/TENANT/WORKSPACE/…),
      the registry entry's prefix. Empty: the whole bucket.
    - restrict_to_prefix (true): with a prefix, limit the tenant's service account, with an IAM
      condition, to the objects under it and to listings within it. False: the whole bucket.
    - noncurrent_version_retention_days (30): days a noncurrent object version (an overwritten
      lease, state copy or marker) is kept before it is deleted. Terrace keeps every state version
      as an object of its own; this is the bucket's own safety net.
    - kms_key_name (null): a Cloud KMS key (projects/P/locations/L/keyRings/R/cryptoKeys/K) for the
      bucket's default encryption and for every object Terrace writes (the registry entry's
      kms_key), in the bucket's location. The Cloud Storage service agent and the tenant's service
      account get roles/cloudkms.cryptoKeyEncrypterDecrypter on it. Null: Google-managed keys.
    - access_log_bucket (null): a bucket (another one) that receives this bucket's usage logs.
      Null: no usage logs (Cloud Audit Logs' Data Access logs are the finer record).
    - force_destroy (false): let terraform destroy the bucket with the states in it. Keep false
      outside tests.
    - labels ({}): labels set on the bucket.
  EOT
  type = object({
    name                              = string
    location                          = string
    prefix                            = optional(string, "terrace")
    restrict_to_prefix                = optional(bool, true)
    noncurrent_version_retention_days = optional(number, 30)
    kms_key_name                      = optional(string)
    access_log_bucket                 = optional(string)
    force_destroy                     = optional(bool, false)
    labels                            = optional(map(string), {})
  })

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$", var.state_bucket.name)) && !startswith(var.state_bucket.name, "goog")
    error_message = "state_bucket.name must be 3 to 63 characters, lowercase letters, digits, '.', '-' and '_', and must not start with goog."
  }

  validation {
    condition     = var.state_bucket.prefix == "" || can(regex("^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$", var.state_bucket.prefix))
    error_message = "state_bucket.prefix must be empty or path segments of letters, digits, '.', '_' and '-' joined by '/', with no leading or trailing '/'."
  }

  validation {
    condition     = var.state_bucket.noncurrent_version_retention_days >= 1
    error_message = "state_bucket.noncurrent_version_retention_days must be at least 1."
  }

  validation {
    condition     = var.state_bucket.kms_key_name == null || can(regex("^projects/[^/]+/locations/[^/]+/keyRings/[^/]+/cryptoKeys/[^/]+$", var.state_bucket.kms_key_name))
    error_message = "state_bucket.kms_key_name must be projects/P/locations/L/keyRings/R/cryptoKeys/K."
  }
}

# ---------------------------------------------------------------------------------------------
# The runner
# ---------------------------------------------------------------------------------------------

variable "runner_service_account_email" {
  description = <<-EOT
    The runner's own service account (the runner module's runner_service_account_email): it alone
    is granted roles/iam.serviceAccountTokenCreator on this tenant's service account.
  EOT
  type        = string

  validation {
    condition     = can(regex("^[^@\\s]+@[^@\\s]+\\.gserviceaccount\\.com$", var.runner_service_account_email))
    error_message = "runner_service_account_email must be a service account email."
  }
}
