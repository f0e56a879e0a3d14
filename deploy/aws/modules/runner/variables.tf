variable "name" {
  description = "Name of the function, and prefix of every other resource's name (queues, roles, schedules, ECS cluster, log groups)."
  type        = string
  default     = "terrace"

  validation {
    condition     = can(regex("^[A-Za-z0-9_-]+$", var.name)) && length(var.name) <= 40
    error_message = "name must be 1 to 40 letters, digits, '-' or '_' (role and schedule names add suffixes to it)."
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
    # The platform's age key (age1…) this tenant's sensitive outputs are sealed to (docs/outputs.md).
    outputs_recipient = optional(string)
    # The Ed25519 public keys allowed to send this tenant's jobs and cancels: with any, only
    # signed ones run (docs/signing.md).
    senders = optional(list(string))
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

  # The function refuses an empty one (the quick-create stack's LeaseTableName is "" without a table).
  validation {
    condition     = alltrue([for t in values(var.tenants) : alltrue([for v in [t.lease_table, t.region, t.kms_key_id] : v == null ? true : trimspace(v) != ""])])
    error_message = "A tenant's lease_table, region and kms_key_id must be left out (null) rather than empty."
  }
}

variable "image_uri" {
  description = "The image built from deploy/Dockerfile with `--target aws`, in Amazon ECR, e.g. 123456789012.dkr.ecr.eu-west-1.amazonaws.com/terrace-aws@sha256:…. Used by the Lambda function and the ECS task alike; prefer a digest to a tag."
  type        = string

  validation {
    condition     = can(regex("^[0-9]{12}\\.dkr\\.ecr\\.[a-z0-9-]+\\.amazonaws\\.com(\\.cn)?/[a-z0-9._/-]+(:[A-Za-z0-9._-]+)?(@sha256:[0-9a-f]{64})?$", var.image_uri))
    error_message = "image_uri must be an Amazon ECR image URI (<account>.dkr.ecr.<region>.amazonaws.com/<repository>[:tag][@sha256:digest]): Lambda runs images from ECR only."
  }
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
    error_message = "environment_variables may not set a variable the module sets (TERRACE_TENANTS, the queue URLs, TERRACE_LOG, the TERRACE_ECS_ cluster, task definition, container, subnets and security groups): use the module's own variables."
  }
}

variable "function" {
  description = <<-EOT
    The Lambda function:
    - memory_size (2048): its memory in MB, 1024 to 10240. Terraform and its providers run in the function.
    - ephemeral_storage_size (2048): the size of its /tmp in MB, 512 to 10240: workdirs, providers and
      terraform's home are there.
    - reserved_concurrent_executions (10): its reserved concurrency, at least 1: the most jobs (batches) that
      run at once, and what the account keeps for it.
    - subnet_ids ([]): subnets to run it in; empty runs it outside a VPC. The subnets need a route to AWS's APIs
      and to whatever the templates' providers reach.
    - security_group_ids ([]): its security groups when it runs in subnet_ids.
  EOT
  type = object({
    memory_size                    = optional(number, 2048)
    ephemeral_storage_size         = optional(number, 2048)
    reserved_concurrent_executions = optional(number, 10)
    subnet_ids                     = optional(list(string), [])
    security_group_ids             = optional(list(string), [])
  })
  default  = {}
  nullable = false

  validation {
    condition     = var.function.memory_size >= 1024 && var.function.memory_size <= 10240
    error_message = "function.memory_size must be from 1024 to 10240 MB."
  }

  validation {
    condition     = var.function.ephemeral_storage_size >= 512 && var.function.ephemeral_storage_size <= 10240
    error_message = "function.ephemeral_storage_size must be from 512 to 10240 MB."
  }

  validation {
    condition     = var.function.reserved_concurrent_executions >= 1
    error_message = "function.reserved_concurrent_executions must be at least 1 (0 would stop the function)."
  }
}

variable "queues" {
  description = <<-EOT
    The jobs queue and its event source mapping:
    - visibility_timeout_seconds (900): the jobs queue's visibility timeout, 900 to 43200. Lambda requires at
      least the function's timeout (900 s) for an event source mapping; while a job runs, the function keeps
      its message invisible itself (120 s at a time, renewed every 30 s).
    - max_receive_count (5): receives of a job message, 1 to 1000, before it moves to the jobs dead-letter queue.
    - message_retention_seconds (345600): how long the jobs and results queues keep a message, 60 to 1209600.
      The dead-letter queues keep theirs 14 days.
    - maximum_concurrency (null): the most concurrent invocations the event source mapping starts, 2 to 1000;
      null for no limit but function.reserved_concurrent_executions.
    - batch_size (1): jobs a function invocation takes from the queue at once, 1 to 10. Keep 1 where tenants
      must not reach each other: on Lambda, jobs of one batch share a user (docs/SECURITY.md).
    - fifo (false): make the jobs queue (and its dead-letter queue) FIFO, named `<name>-jobs.fifo`, with
      content-based deduplication. The platform sends each job with MessageGroupId = "<tenant>/<workspace>":
      a workspace's requests then run in the order sent, one at a time, and a busy workspace's request waits at
      the head of its group (counting a receive each time) instead of being sent again behind later ones.
  EOT
  type = object({
    visibility_timeout_seconds = optional(number, 900)
    max_receive_count          = optional(number, 5)
    message_retention_seconds  = optional(number, 345600)
    maximum_concurrency        = optional(number)
    batch_size                 = optional(number, 1)
    fifo                       = optional(bool, false)
  })
  default  = {}
  nullable = false

  validation {
    condition     = var.queues.max_receive_count >= 1 && var.queues.max_receive_count <= 1000 && var.queues.message_retention_seconds >= 60 && var.queues.message_retention_seconds <= 1209600
    error_message = "queues.max_receive_count must be from 1 to 1000, and queues.message_retention_seconds from 60 to 1209600 (14 days)."
  }

  validation {
    condition     = var.queues.visibility_timeout_seconds >= 900 && var.queues.visibility_timeout_seconds <= 43200
    error_message = "queues.visibility_timeout_seconds must be from 900 (the function's timeout) to 43200."
  }

  validation {
    condition     = var.queues.maximum_concurrency == null || (coalesce(var.queues.maximum_concurrency, 2) >= 2 && coalesce(var.queues.maximum_concurrency, 2) <= 1000)
    error_message = "queues.maximum_concurrency must be from 2 to 1000, or null."
  }

  validation {
    condition     = var.queues.batch_size >= 1 && var.queues.batch_size <= 10
    error_message = "queues.batch_size must be from 1 to 10."
  }
}

variable "schedules" {
  description = <<-EOT
    When EventBridge Scheduler invokes the sweeps:
    - backup ("rate(1 hour)"): the backup sweep's rate(…) or cron(…) expression.
    - drift ("rate(1 day)"): the drift sweep's expression; empty ("") for no drift sweep.
    - timezone ("UTC"): the time zone of cron expressions (IANA name).
    - tenants ([]): sweep only these registered tenants; empty for every tenant in `tenants`.
  EOT
  type = object({
    backup   = optional(string, "rate(1 hour)")
    drift    = optional(string, "rate(1 day)")
    timezone = optional(string, "UTC")
    tenants  = optional(list(string), [])
  })
  default  = {}
  nullable = false

  validation {
    condition     = can(regex("^(rate|cron)\\(.+\\)$", var.schedules.backup)) && (var.schedules.drift == "" || can(regex("^(rate|cron)\\(.+\\)$", var.schedules.drift)))
    error_message = "schedules.backup must be a rate(…) or cron(…) expression, and schedules.drift one too, or empty for no drift sweep."
  }
}

variable "ecs_handoff" {
  description = <<-EOT
    The ECS cluster and Fargate task that run jobs too long for Lambda:
    - enabled (true): create them. Without them, such jobs are rejected.
    - subnet_ids: the task's subnets (TERRACE_ECS_SUBNETS), required while enabled. The task gets no public IP:
      the subnets need a NAT gateway or VPC endpoints.
    - security_group_ids ([]): the task's security groups (TERRACE_ECS_SECURITY_GROUPS); empty uses the VPC's
      default group.
    - cpu (1024): the task's CPU units, a size Fargate offers (256 to 16384).
    - memory (4096): the task's memory in MiB, a combination Fargate offers with cpu.
    - ephemeral_storage_size (null): the task's ephemeral storage in GiB, 21 to 200; null for Fargate's 20 GiB.
  EOT
  type = object({
    enabled                = optional(bool, true)
    subnet_ids             = optional(list(string), [])
    security_group_ids     = optional(list(string), [])
    cpu                    = optional(number, 1024)
    memory                 = optional(number, 4096)
    ephemeral_storage_size = optional(number)
  })
  default  = {}
  nullable = false

  validation {
    condition     = !var.ecs_handoff.enabled || length(var.ecs_handoff.subnet_ids) > 0
    error_message = "ecs_handoff.subnet_ids is required while ecs_handoff.enabled is true (the ECS task runs in them)."
  }

  validation {
    condition     = contains([256, 512, 1024, 2048, 4096, 8192, 16384], var.ecs_handoff.cpu)
    error_message = "ecs_handoff.cpu must be a Fargate task size: 256, 512, 1024, 2048, 4096, 8192 or 16384."
  }

  validation {
    condition     = var.ecs_handoff.ephemeral_storage_size == null || (coalesce(var.ecs_handoff.ephemeral_storage_size, 21) >= 21 && coalesce(var.ecs_handoff.ephemeral_storage_size, 21) <= 200)
    error_message = "ecs_handoff.ephemeral_storage_size must be from 21 to 200 GiB, or null."
  }
}

variable "logs" {
  description = <<-EOT
    The function's and the ECS task's logs:
    - filter ("info"): TERRACE_LOG, their tracing filter (e.g. "info", "info,aws=warn").
    - retention_in_days (365): the retention of their log groups, one CloudWatch Logs offers.
  EOT
  type = object({
    filter            = optional(string, "info")
    retention_in_days = optional(number, 365)
  })
  # Spelled out as well, so that checkov sees the retention it checks (CKV_AWS_338).
  default  = { filter = "info", retention_in_days = 365 }
  nullable = false

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.logs.retention_in_days)
    error_message = "logs.retention_in_days must be a retention CloudWatch Logs offers (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288 or 3653)."
  }
}

variable "templates" {
  description = <<-EOT
    A bucket of yours the runner reads templates from at run time, so a new template version needs no new image:
    { bucket, prefix }. Publish to it with `terrace template publish NAME VERSION --to s3://BUCKET/PREFIX`. The
    function and the task get TERRACE_TEMPLATES=s3://BUCKET/PREFIX, s3:GetObject under the prefix and s3:ListBucket
    on the bucket (without which S3 answers a missing version with 403, not 404; keep templates in a bucket of their
    own). null: the templates in the image.
  EOT
  type = object({
    bucket = string
    prefix = optional(string, "")
  })
  default = null

  validation {
    condition     = var.templates == null || can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.templates.bucket))
    error_message = "templates.bucket must be an S3 bucket name (3-63 lowercase letters, digits, dots and hyphens)."
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
