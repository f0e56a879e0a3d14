# ---------------------------------------------------------------------------------------------
# Where and what
# ---------------------------------------------------------------------------------------------

variable "project_id" {
  description = "The project the runner is deployed in (the operator's project, not a customer's)."
  type        = string
}

variable "region" {
  description = "The region of the Cloud Run service, the Cloud Run Job and the Cloud Scheduler jobs."
  type        = string
}

variable "name" {
  description = "Prefix of every resource's name: the service, the job and the topics are called NAME, NAME-task, NAME-jobs, …; the service accounts NAME-runner, NAME-pusher and NAME-scheduler. Give each runner of a project its own (one runner per tenant that must not reach another, see the README)."
  type        = string
  default     = "terrace"

  validation {
    # NAME-scheduler must be a valid service account id (6 to 30 characters).
    condition     = can(regex("^[a-z][a-z0-9-]{0,18}[a-z0-9]$", var.name))
    error_message = "name must be 2 to 20 characters, lowercase letters, digits and hyphens, starting with a letter and not ending with a hyphen."
  }
}

variable "image" {
  description = "The runner's image, built from deploy/gcp/Dockerfile (entry point terrace-gcp), e.g. REGION-docker.pkg.dev/PROJECT/REPOSITORY/terrace-gcp@sha256:…. Pin it by digest: the service and the Cloud Run Job must run the same build."
  type        = string

  validation {
    condition     = length(trimspace(var.image)) > 0
    error_message = "image must name the runner's image."
  }
}

variable "deletion_protection" {
  description = "Keep terraform from deleting the Cloud Run service and job (the provider's default). Set false, and apply, before destroying the runner or renaming it."
  type        = bool
  default     = true
}

variable "labels" {
  description = "Labels set on every resource that takes them."
  type        = map(string)
  default     = {}
}

variable "enable_apis" {
  description = "Enable the APIs the runner needs in project_id (Cloud Run, Pub/Sub, Cloud Scheduler, IAM, IAM Service Account Credentials). They are never disabled on destroy."
  type        = bool
  default     = true
}

# ---------------------------------------------------------------------------------------------
# Tenants
# ---------------------------------------------------------------------------------------------

variable "tenants" {
  description = <<-EOT
    The tenant registry, rendered as JSON into TERRACE_TENANTS on the service and the Cloud Run
    Job: each tenant's name maps to the customer's service account the runner impersonates, the
    customer's state bucket, and optionally a prefix in it and a Cloud KMS key for every object
    written. The customer module's tenant_registry_entry output is one such value. A message
    cannot choose another target than its tenant's.
  EOT
  type = map(object({
    service_account = string
    bucket          = string
    prefix          = optional(string)
    kms_key         = optional(string)
  }))

  validation {
    condition     = length(var.tenants) > 0
    error_message = "tenants must register at least one tenant: the runner refuses to start without one."
  }

  validation {
    condition = alltrue([
      for tenant in keys(var.tenants) : can(regex("^[a-z0-9][a-z0-9._-]{0,62}$", tenant)) && !endswith(tenant, ".")
    ])
    error_message = "Each tenant name must be 1 to 63 characters, lowercase letters, digits, '-', '_' and '.', starting with a letter or a digit and not ending with '.'."
  }

  validation {
    condition = alltrue([
      for target in values(var.tenants) : can(regex("^[^@\\s]+@[^@\\s]+\\.gserviceaccount\\.com$", target.service_account))
    ])
    error_message = "Each tenant's service_account must be a service account email (NAME@PROJECT.iam.gserviceaccount.com)."
  }

  validation {
    condition = alltrue([
      for target in values(var.tenants) : can(regex("^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$", target.bucket))
    ])
    error_message = "Each tenant's bucket must be a bucket name."
  }

  validation {
    condition = alltrue([
      for target in values(var.tenants) : target.kms_key == null || can(regex("^projects/[^/]+/locations/[^/]+/keyRings/[^/]+/cryptoKeys/[^/]+$", target.kms_key))
    ])
    error_message = "Each tenant's kms_key, when given, must be projects/P/locations/L/keyRings/R/cryptoKeys/K."
  }
}

variable "manage_tenant_impersonation" {
  description = "Also grant the runner's service account roles/iam.serviceAccountTokenCreator on each tenant's service account (and on nothing else) from here. Leave false when the customers grant it on their side (the customer module does); set true only where the operator administers the tenants' projects too."
  type        = bool
  default     = false
}

# ---------------------------------------------------------------------------------------------
# The service and the Cloud Run Job
# ---------------------------------------------------------------------------------------------

variable "ingress" {
  description = "The service's ingress. INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER (internal and Cloud Load Balancing) still admits the push subscription and the scheduler jobs of this project; INGRESS_TRAFFIC_ALL lets them reach it from anywhere. Either way every request needs an OIDC token of the pusher's or the scheduler's service account."
  type        = string
  default     = "INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER"

  validation {
    condition     = contains(["INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER", "INGRESS_TRAFFIC_ALL"], var.ingress)
    error_message = "ingress must be INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER or INGRESS_TRAFFIC_ALL."
  }
}

variable "audience" {
  description = "The audience of the push subscription's and the scheduler jobs' OIDC tokens (TERRACE_PUSH_AUDIENCE), added to the service's custom audiences. Default: the service's deterministic URL, https://NAME-PROJECT_NUMBER.REGION.run.app."
  type        = string
  default     = null

  validation {
    condition     = var.audience == null || can(regex("^https://[^\\s]+$", var.audience))
    error_message = "audience must be a full https:// URL (Cloud Run takes custom audiences as URLs)."
  }
}

variable "cpu" {
  description = "CPU limit of each instance and of the Cloud Run Job's task (terraform and its providers run in it)."
  type        = string
  default     = "2"
}

variable "memory" {
  description = "Memory limit of each instance and of the Cloud Run Job's task. Cloud Run's file system is in memory, the jobs' workdirs and providers included: 2Gi at the least."
  type        = string
  default     = "4Gi"

  validation {
    condition = try(
      endswith(var.memory, "Gi") ? tonumber(trimsuffix(var.memory, "Gi")) >= 2 : tonumber(trimsuffix(var.memory, "Mi")) >= 2048,
      false,
    )
    error_message = "memory must be given in Mi or Gi and be at least 2Gi."
  }
}

variable "max_concurrency" {
  description = "Requests (jobs) one instance takes at once. Each runs terraform and its providers: 1 to 4."
  type        = number
  default     = 2

  validation {
    condition     = var.max_concurrency >= 1 && var.max_concurrency <= 4 && floor(var.max_concurrency) == var.max_concurrency
    error_message = "max_concurrency must be a whole number from 1 to 4."
  }
}

variable "min_instances" {
  description = "Instances kept warm."
  type        = number
  default     = 0
}

variable "max_instances" {
  description = "The most instances the service scales to: bounds how many jobs run at once (max_instances × max_concurrency)."
  type        = number
  default     = 10

  validation {
    condition     = var.max_instances >= 1
    error_message = "max_instances must be at least 1."
  }
}

variable "request_timeout_seconds" {
  description = "The service's request timeout, also set as TERRACE_REQUEST_TIMEOUT. A job whose timeout (plus a 30 s margin) does not fit is handed to the Cloud Run Job. Keep it at most ack_deadline_seconds: a push still running at the ack deadline is delivered again."
  type        = number
  default     = 600

  validation {
    condition     = var.request_timeout_seconds >= 60 && var.request_timeout_seconds <= 3600
    error_message = "request_timeout_seconds must be from 60 to 3600."
  }
}

variable "requeue_wait_seconds" {
  description = "TERRACE_REQUEUE_WAIT: how long the answer to a push whose workspace is busy is held before a fresh copy goes back on the jobs topic. Keep it below the request timeout and well below the ack deadline."
  type        = number
  default     = 60

  validation {
    condition     = var.requeue_wait_seconds >= 0
    error_message = "requeue_wait_seconds must not be negative."
  }
}

variable "task_lease_wait_seconds" {
  description = "TERRACE_TASK_LEASE_WAIT: how long a Cloud Run Job task waits for a busy workspace before its job goes back on the jobs topic."
  type        = number
  default     = 240

  validation {
    condition     = var.task_lease_wait_seconds >= 0
    error_message = "task_lease_wait_seconds must not be negative."
  }
}

variable "task_timeout_seconds" {
  description = "The Cloud Run Job's default task timeout. The service overrides it on every execution it starts (the job's timeout, plus the lease wait, plus 5 minutes); this applies only to executions started by hand."
  type        = number
  default     = 3600

  validation {
    condition     = var.task_timeout_seconds >= 60 && var.task_timeout_seconds <= 86400
    error_message = "task_timeout_seconds must be from 60 to 86400."
  }
}

variable "task_max_retries" {
  description = "How often a failed Cloud Run Job task is retried. An interrupted task keeps its staged message, so the retry runs the job again; a job that already has a final result is not run twice."
  type        = number
  default     = 3

  validation {
    condition     = var.task_max_retries >= 0 && var.task_max_retries <= 10
    error_message = "task_max_retries must be from 0 to 10."
  }
}

variable "env" {
  description = "More environment for the service and the Cloud Run Job (TERRACE_PASS_ENV, TERRACE_GRACE, TERRACE_LEASE_TTL, TERRACE_TERRAFORM_USER, TERRACE_LOG, …). Not for secrets, and not for the variables this module sets itself."
  type        = map(string)
  default     = {}

  validation {
    condition = length(setintersection(keys(var.env), [
      "TERRACE_TENANTS", "TERRACE_PUSH_AUDIENCE", "TERRACE_PUSH_SERVICE_ACCOUNTS", "TERRACE_REQUEST_TIMEOUT",
      "TERRACE_CLOUD_RUN_JOB", "TERRACE_JOBS_TOPIC", "TERRACE_RESULTS_TOPIC", "TERRACE_REQUEUE_WAIT",
      "TERRACE_TASK_LEASE_WAIT", "TERRACE_JOB_REF", "TERRACE_GCS_ANONYMOUS", "TERRACE_GCS_ENDPOINT",
    ])) == 0
    error_message = "env must not set a variable the module sets (use its own input) or one meant for emulators only."
  }
}

# ---------------------------------------------------------------------------------------------
# Pub/Sub
# ---------------------------------------------------------------------------------------------

variable "ack_deadline_seconds" {
  description = "The push subscription's ack deadline: how long a push may take before Pub/Sub delivers the message again. At least the longest job the service runs itself (Pub/Sub allows at most 600 s)."
  type        = number
  default     = 600

  validation {
    condition     = var.ack_deadline_seconds >= 10 && var.ack_deadline_seconds <= 600
    error_message = "ack_deadline_seconds must be from 10 to 600."
  }
}

variable "max_delivery_attempts" {
  description = "Deliveries of a job message before it goes to the dead-letter topic (5 to 10 recommended). Waiting for a busy workspace does not count: the runner publishes a fresh copy."
  type        = number
  default     = 5

  validation {
    condition     = var.max_delivery_attempts >= 5 && var.max_delivery_attempts <= 100
    error_message = "max_delivery_attempts must be from 5 to 100."
  }
}

variable "message_retention_duration" {
  description = "How long the topics and subscriptions keep messages (unacknowledged job messages, dead letters), from 600s to 604800s."
  type        = string
  default     = "604800s"

  validation {
    condition     = can(regex("^[0-9]+s$", var.message_retention_duration)) && try(tonumber(trimsuffix(var.message_retention_duration, "s")) >= 600 && tonumber(trimsuffix(var.message_retention_duration, "s")) <= 604800, false)
    error_message = "message_retention_duration must be from 600s to 604800s (a subscription keeps messages at most 7 days)."
  }
}

variable "kms_key_name" {
  description = "A Cloud KMS key (projects/P/locations/L/keyRings/R/cryptoKeys/K) that encrypts the topics' messages (CMEK). The Pub/Sub service agent is granted roles/cloudkms.cryptoKeyEncrypterDecrypter on it. Null: Google-managed keys."
  type        = string
  default     = null

  validation {
    condition     = var.kms_key_name == null || can(regex("^projects/[^/]+/locations/[^/]+/keyRings/[^/]+/cryptoKeys/[^/]+$", var.kms_key_name))
    error_message = "kms_key_name must be projects/P/locations/L/keyRings/R/cryptoKeys/K."
  }
}

# ---------------------------------------------------------------------------------------------
# Cloud Scheduler
# ---------------------------------------------------------------------------------------------

variable "backup_schedule" {
  description = "When the backup sweep runs (cron, in schedule_time_zone): hourly by default, which the sweep is built for."
  type        = string
  default     = "0 * * * *"
}

variable "drift_schedule" {
  description = "When the drift sweep runs (cron, in schedule_time_zone): it publishes a drift-check job for each applied workspace. Null: no drift sweep."
  type        = string
  default     = "30 6 * * *"
}

variable "scheduler_region" {
  description = "The region of the Cloud Scheduler jobs, where Cloud Scheduler is not offered in region. Null: region."
  type        = string
  default     = null
}

variable "schedule_time_zone" {
  description = "The time zone of the schedules (tz database name)."
  type        = string
  default     = "Etc/UTC"
}

variable "sweep_tenants" {
  description = "The tenants the sweeps cover. Empty: every registered tenant (the body is {})."
  type        = list(string)
  default     = []
}
