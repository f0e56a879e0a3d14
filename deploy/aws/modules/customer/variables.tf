variable "name" {
  description = "Prefix of the names of the bucket, lease table and role."
  type        = string
  default     = "terrace"

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]{0,29}$", var.name))
    error_message = "name must be 1 to 30 lower-case letters, digits or '-', starting with a letter or digit (it starts the bucket's name)."
  }
}

variable "runner_role_arn" {
  description = "The runner's role (the runner module's `runner_role_arn`): the only principal that may assume this account's role. It must exist when the role is created."
  type        = string

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:role/.+$", var.runner_role_arn))
    error_message = "runner_role_arn must be an IAM role ARN (arn:aws:iam::<account>:role/<name>)."
  }
}

variable "external_id" {
  description = "The ExternalId the runner must present (sts:ExternalId): the guard against a confused deputy. Given by the runner's operator, unique to this account."
  type        = string
  sensitive   = true

  validation {
    condition     = length(var.external_id) >= 16 && length(var.external_id) <= 1224 && can(regex("^[A-Za-z0-9+=,.@:/_-]+$", var.external_id))
    error_message = "external_id must be 16 to 1224 characters from [A-Za-z0-9+=,.@:/_-]."
  }
}

variable "prefix" {
  description = "Key prefix of everything the runner keeps in the bucket (`<prefix>/<tenant>/<workspace>/…`); the role reaches nothing else in it."
  type        = string
  default     = "terrace"

  validation {
    condition     = can(regex("^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$", var.prefix))
    error_message = "prefix must be one or more path segments of letters, digits, '_', '.' or '-', without a leading or trailing '/'."
  }
}

variable "bucket_name" {
  description = "Name of the state bucket; null for a unique name starting with \"<name>-state-\"."
  type        = string
  default     = null
}

variable "kms_key_arn" {
  description = "KMS key for the bucket's and the table's encryption (SSE-KMS); null for SSE-S3 (AES256) on the bucket and the AWS managed key (aws/dynamodb) on the table. The role may then use the key, and the runner writes with it (`kms_key_id` in the registry entry)."
  type        = string
  default     = null

  validation {
    condition     = var.kms_key_arn == null || can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/.+$", var.kms_key_arn))
    error_message = "kms_key_arn must be a KMS key ARN (arn:aws:kms:<region>:<account>:key/<id>), or null for SSE-S3."
  }
}

variable "noncurrent_version_expiration_days" {
  description = "Days a replaced or deleted object's old version is kept. The runner writes every state version as an object of its own, so old versions are only a safety net."
  type        = number
  default     = 90

  validation {
    condition     = var.noncurrent_version_expiration_days >= 1
    error_message = "noncurrent_version_expiration_days must be at least 1."
  }
}

variable "access_log_bucket" {
  description = "Bucket that receives the state bucket's server access logs; null for none."
  type        = string
  default     = null
}

variable "access_log_prefix" {
  description = "Key prefix of the access logs in access_log_bucket."
  type        = string
  default     = "s3-access/"
}

variable "create_lease_table" {
  description = "Create the DynamoDB lease table. Without it, the runner leases workspaces with a lock object in the bucket."
  type        = bool
  default     = true
}

variable "lease_table_name" {
  description = "Name of the lease table; null for \"<name>-leases\"."
  type        = string
  default     = null
}

variable "role_name" {
  description = "Name of the role the runner assumes; null for \"<name>-runner\"."
  type        = string
  default     = null
}

variable "role_policy_arns" {
  description = "Managed policies attached to the role, by a name of your choice: what the templates' resources need. The keys must be known at plan time."
  type        = map(string)
  default     = {}
}

variable "permissions_boundary" {
  description = "ARN of the role's permissions boundary."
  type        = string
  default     = null
}

variable "tags" {
  description = "Tags of the bucket, the table and the role."
  type        = map(string)
  default     = {}
}
