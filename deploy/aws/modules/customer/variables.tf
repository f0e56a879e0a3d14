variable "name" {
  description = "Prefix of the names of the bucket, lease table and role."
  type        = string
  default     = "terrace"

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]{0,29}$", var.name)) && !startswith(var.name, "xn--") && !startswith(var.name, "sthree-")
    error_message = "name must be 1 to 30 lower-case letters, digits or '-', starting with a letter or digit but not with xn-- or sthree- (it starts the bucket's name)."
  }
}

variable "runner_role_arn" {
  description = <<-EOT
    The runner's role (the runner module's `runner_role_arn`): the only principal that may assume this account's
    role. It must exist when the role is created.
  EOT
  type        = string

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:role/.+$", var.runner_role_arn))
    error_message = "runner_role_arn must be an IAM role ARN (arn:aws:iam::<account>:role/<name>)."
  }
}

variable "external_id" {
  description = <<-EOT
    The ExternalId the runner must present (sts:ExternalId): the guard against a confused deputy. Given by the
    runner's operator, unique to this account.
  EOT
  type        = string
  sensitive   = true

  validation {
    condition     = length(var.external_id) >= 16 && length(var.external_id) <= 1224 && can(regex("^[A-Za-z0-9+=,.@:/_-]+$", var.external_id))
    error_message = "external_id must be 16 to 1224 characters from [A-Za-z0-9+=,.@:/_-]."
  }
}

variable "prefix" {
  description = <<-EOT
    Key prefix of everything the runner keeps in the bucket (`<prefix>/<tenant>/<workspace>/…`); the role reaches
    nothing else in it.
  EOT
  type        = string
  default     = "terrace"

  validation {
    condition     = can(regex("^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$", var.prefix))
    error_message = "prefix must be one or more path segments of letters, digits, '_', '.' or '-', without a leading or trailing '/'."
  }
}

variable "bucket" {
  description = <<-EOT
    The state bucket:
    - name (null): its name; null for a unique name starting with "<name>-state-".
    - access_logs (null): where the bucket's server access logs go, the `bucket` that receives them and the key
      `prefix` ("s3-access/") they get there; null for no access logs.
    - noncurrent_version_expiration_days (90): days a replaced or deleted object's old version is kept, at least 1.
      The runner writes every state version as an object of its own, so old versions are only a safety net.
  EOT
  type = object({
    name = optional(string)
    access_logs = optional(object({
      bucket = string
      prefix = optional(string, "s3-access/")
    }))
    noncurrent_version_expiration_days = optional(number, 90)
  })
  default  = {}
  nullable = false

  validation {
    condition     = var.bucket.noncurrent_version_expiration_days >= 1
    error_message = "bucket.noncurrent_version_expiration_days must be at least 1."
  }
}

variable "lease_table" {
  description = <<-EOT
    The DynamoDB lease table:
    - create (true): create it. Without it, the runner leases workspaces with a lock object in the bucket.
    - name (null): its name; null for "<name>-leases".
  EOT
  type = object({
    create = optional(bool, true)
    name   = optional(string)
  })
  default  = {}
  nullable = false
}

variable "role" {
  description = <<-EOT
    The role the runner assumes:
    - name (null): its name; null for "<name>-runner".
    - policy_arns ({}): managed policies attached to it, by a name of your choice: what the templates' resources
      need. The keys must be known at plan time.
    - permissions_boundary (null): the ARN of its permissions boundary.
  EOT
  type = object({
    name                 = optional(string)
    policy_arns          = optional(map(string), {})
    permissions_boundary = optional(string)
  })
  default  = {}
  nullable = false
}

variable "tags" {
  description = "Tags of the bucket, the table and the role."
  type        = map(string)
  default     = {}
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

variable "client_side_kms_key_arn" {
  description = "KMS key that seals every state before it leaves the runner (client-side envelope encryption: a data key per object, the workspace as encryption context); null to leave states as terraform writes them, under the bucket's encryption. The role may use it for that only (`client_side_kms_key` in the registry entry)."
  type        = string
  default     = null

  validation {
    condition     = var.client_side_kms_key_arn == null || can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/.+$", var.client_side_kms_key_arn))
    error_message = "client_side_kms_key_arn must be a KMS key ARN (arn:aws:kms:<region>:<account>:key/<id>), or null."
  }
}

variable "old_client_side_kms_key_arns" {
  description = "KMS keys that sealed states before `client_side_kms_key_arn` replaced them: the role may still decrypt with them (never make data keys), so older versions and backups stay readable."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for arn in var.old_client_side_kms_key_arns : can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/.+$", arn))])
    error_message = "old_client_side_kms_key_arns must be KMS key ARNs (arn:aws:kms:<region>:<account>:key/<id>)."
  }
}
