variable "name" {
  description = "Name of the function, and prefix of every other resource's name (queues, roles, schedules, ECS cluster, log groups)."
  type        = string
  default     = "terrace"

  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,40}$", var.name))
    error_message = "name must be 1 to 40 letters, digits, '-' or '_' (role and schedule names add suffixes to it)."
  }
}

variable "image_uri" {
  description = "The function's image (deploy/aws/Dockerfile) in Amazon ECR, e.g. 123456789012.dkr.ecr.eu-west-1.amazonaws.com/terrace-aws@sha256:…. Used by the Lambda function and the ECS task alike; prefer a digest to a tag."
  type        = string

  validation {
    condition     = can(regex("^[0-9]{12}\\.dkr\\.ecr\\.[a-z0-9-]+\\.amazonaws\\.com(\\.cn)?/[a-z0-9._/-]+(:[A-Za-z0-9._-]+)?(@sha256:[0-9a-f]{64})?$", var.image_uri))
    error_message = "image_uri must be an Amazon ECR image URI (<account>.dkr.ecr.<region>.amazonaws.com/<repository>[:tag][@sha256:digest]): Lambda runs images from ECR only."
  }
}

variable "tenants" {
  description = <<-EOT
    The tenant registry (TERRACE_TENANTS): tenant name => the customer's role, ExternalId, bucket and, optionally,
    key prefix, DynamoDB lease table, region and KMS key for the objects the function writes. The customer module's
    `tenant_registry_entry` output is one such value. The function may assume only these roles.
    With no tenant, the event source mapping and the schedules are created disabled (the function does not start
    without one): deploy the runner, hand its `runner_role_arn` to customers, then register them.
    Lambda allows 4 KB of environment in all, which bounds the number of tenants.
  EOT
  type = map(object({
    role_arn    = string
    external_id = string
    bucket      = string
    prefix      = optional(string, "")
    lease_table = optional(string)
    region      = optional(string)
    kms_key_id  = optional(string)
  }))
  default   = {}
  sensitive = true

  validation {
    condition     = alltrue([for t in values(var.tenants) : can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:role/.+$", t.role_arn))])
    error_message = "Every tenant's role_arn must be an IAM role ARN (arn:aws:iam::<account>:role/<name>)."
  }

  validation {
    condition     = alltrue([for t in values(var.tenants) : length(t.external_id) >= 2 && length(t.external_id) <= 1224 && can(regex("^[A-Za-z0-9+=,.@:/_-]+$", t.external_id))])
    error_message = "Every tenant needs an external_id of 2 to 1224 characters from [A-Za-z0-9+=,.@:/_-] (what STS accepts)."
  }
}

variable "log_filter" {
  description = "TERRACE_LOG: the tracing filter of the function and the ECS task (e.g. \"info\", \"info,aws=warn\")."
  type        = string
  default     = "info"
}

variable "environment_variables" {
  description = "Further settings for the function and the ECS task, e.g. TERRACE_LEASE_TTL, TERRACE_TASK_LEASE_WAIT, TERRACE_PASS_ENV (see deploy/aws/README.md). May not set what the module sets."
  type        = map(string)
  default     = {}

  validation {
    condition = length(setintersection(keys(var.environment_variables), [
      "TERRACE_TENANTS", "TERRACE_JOBS_QUEUE_URL", "TERRACE_RESULTS_QUEUE_URL", "TERRACE_LOG",
      "TERRACE_ECS_CLUSTER", "TERRACE_ECS_TASK_DEFINITION", "TERRACE_ECS_CONTAINER",
      "TERRACE_ECS_SUBNETS", "TERRACE_ECS_SECURITY_GROUPS",
    ])) == 0
    error_message = "environment_variables may not set a variable the module sets (TERRACE_TENANTS, the queue URLs, TERRACE_LOG, TERRACE_ECS_*): use the module's own variables."
  }
}

variable "memory_size" {
  description = "Memory of the function, in MB. Terraform and its providers run in the function."
  type        = number
  default     = 2048

  validation {
    condition     = var.memory_size >= 1024 && var.memory_size <= 10240
    error_message = "memory_size must be between 1024 and 10240 MB."
  }
}

variable "ephemeral_storage_size" {
  description = "Size of the function's /tmp, in MB: workdirs, providers and terraform's home are there."
  type        = number
  default     = 2048

  validation {
    condition     = var.ephemeral_storage_size >= 512 && var.ephemeral_storage_size <= 10240
    error_message = "ephemeral_storage_size must be between 512 and 10240 MB."
  }
}

variable "reserved_concurrent_executions" {
  description = "Reserved concurrency of the function: the most jobs (batches) that run at once, and what the account keeps for it."
  type        = number
  default     = 10

  validation {
    condition     = var.reserved_concurrent_executions >= 1
    error_message = "reserved_concurrent_executions must be at least 1 (0 would stop the function)."
  }
}

variable "batch_size" {
  description = "Jobs a function invocation takes from the queue at once. Keep 1 where tenants must not reach each other: on Lambda, jobs of one batch share a user (docs/SECURITY.md)."
  type        = number
  default     = 1

  validation {
    condition     = var.batch_size >= 1 && var.batch_size <= 10
    error_message = "batch_size must be between 1 and 10."
  }
}

variable "maximum_concurrency" {
  description = "The most concurrent invocations the jobs queue's event source mapping starts (2 to 1000); null for no limit but reserved_concurrent_executions."
  type        = number
  default     = null

  validation {
    condition     = var.maximum_concurrency == null || (coalesce(var.maximum_concurrency, 2) >= 2 && coalesce(var.maximum_concurrency, 2) <= 1000)
    error_message = "maximum_concurrency must be between 2 and 1000, or null."
  }
}

variable "jobs_visibility_timeout_seconds" {
  description = "Visibility timeout of the jobs queue. Lambda requires at least the function's timeout (900 s) for an event source mapping; while a job runs, the function keeps its message invisible itself (120 s at a time, renewed every 30 s)."
  type        = number
  default     = 900

  validation {
    condition     = var.jobs_visibility_timeout_seconds >= 900 && var.jobs_visibility_timeout_seconds <= 43200
    error_message = "jobs_visibility_timeout_seconds must be between 900 (the function's timeout) and 43200."
  }
}

variable "max_receive_count" {
  description = "Receives of a job message before it moves to the jobs dead-letter queue."
  type        = number
  default     = 5

  validation {
    condition     = var.max_receive_count >= 1 && var.max_receive_count <= 1000
    error_message = "max_receive_count must be between 1 and 1000."
  }
}

variable "message_retention_seconds" {
  description = "How long the jobs and results queues keep a message. The dead-letter queues keep theirs 14 days."
  type        = number
  default     = 345600

  validation {
    condition     = var.message_retention_seconds >= 60 && var.message_retention_seconds <= 1209600
    error_message = "message_retention_seconds must be between 60 and 1209600 (14 days)."
  }
}

variable "backup_schedule_expression" {
  description = "When the backup sweep runs (EventBridge Scheduler expression)."
  type        = string
  default     = "rate(1 hour)"

  validation {
    condition     = can(regex("^(rate|cron)\\(.+\\)$", var.backup_schedule_expression))
    error_message = "backup_schedule_expression must be a rate(…) or cron(…) expression."
  }
}

variable "drift_schedule_expression" {
  description = "When the drift sweep runs (EventBridge Scheduler expression); null for no drift sweep."
  type        = string
  default     = "rate(1 day)"

  validation {
    condition     = var.drift_schedule_expression == null || can(regex("^(rate|cron)\\(.+\\)$", var.drift_schedule_expression))
    error_message = "drift_schedule_expression must be a rate(…) or cron(…) expression, or null."
  }
}

variable "schedule_timezone" {
  description = "Time zone of cron schedule expressions (IANA name)."
  type        = string
  default     = "UTC"
}

variable "kms_key_arn" {
  description = <<-EOT
    KMS key for the function's environment, the queues and the log groups. null creates one (rotated yearly).
    A key of your own must let CloudWatch Logs (logs.<region>.amazonaws.com) use it. Whoever sends to the jobs queue
    or reads the results queue needs kms:GenerateDataKey and kms:Decrypt on the key.
  EOT
  type        = string
  default     = null

  validation {
    condition     = var.kms_key_arn == null || can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/.+$", var.kms_key_arn))
    error_message = "kms_key_arn must be a KMS key ARN (arn:aws:kms:<region>:<account>:key/<id>), or null for a key of the module's."
  }
}

variable "log_retention_in_days" {
  description = "Retention of the function's and the ECS task's log groups."
  type        = number
  default     = 365

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_in_days)
    error_message = "log_retention_in_days must be a retention CloudWatch Logs offers (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288 or 3653)."
  }
}

variable "vpc_subnet_ids" {
  description = "Subnets to run the function in; empty runs it outside a VPC. The subnets need a route to AWS's APIs and to whatever the templates' providers reach."
  type        = list(string)
  default     = []
}

variable "vpc_security_group_ids" {
  description = "Security groups of the function when it runs in vpc_subnet_ids."
  type        = list(string)
  default     = []
}

variable "enable_ecs_handoff" {
  description = "Create the ECS cluster and Fargate task that run jobs too long for Lambda. Without it, such jobs are rejected."
  type        = bool
  default     = true
}

variable "ecs_subnet_ids" {
  description = "Subnets of the ECS task (TERRACE_ECS_SUBNETS); required with enable_ecs_handoff. The task gets no public IP: the subnets need a NAT gateway or VPC endpoints."
  type        = list(string)
  default     = []
}

variable "ecs_security_group_ids" {
  description = "Security groups of the ECS task (TERRACE_ECS_SECURITY_GROUPS); empty uses the VPC's default group."
  type        = list(string)
  default     = []
}

variable "ecs_task_cpu" {
  description = "CPU units of the ECS task."
  type        = number
  default     = 1024
}

variable "ecs_task_memory" {
  description = "Memory of the ECS task, in MiB (a combination Fargate offers with ecs_task_cpu)."
  type        = number
  default     = 4096
}

variable "ecs_ephemeral_storage_size" {
  description = "Ephemeral storage of the ECS task, in GiB (21 to 200); null for Fargate's 20 GiB."
  type        = number
  default     = null

  validation {
    condition     = var.ecs_ephemeral_storage_size == null || (coalesce(var.ecs_ephemeral_storage_size, 21) >= 21 && coalesce(var.ecs_ephemeral_storage_size, 21) <= 200)
    error_message = "ecs_ephemeral_storage_size must be between 21 and 200 GiB, or null."
  }
}

variable "permissions_boundary" {
  description = "ARN of the permissions boundary of the roles the module creates."
  type        = string
  default     = null
}

variable "tags" {
  description = "Tags of every resource that takes them."
  type        = map(string)
  default     = {}
}
