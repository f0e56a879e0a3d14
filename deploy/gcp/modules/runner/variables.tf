# ---------------------------------------------------------------------------------------------
# Where and what
# ---------------------------------------------------------------------------------------------

variable "project_id" {
  description = "The project the runner is deployed in (the operator's project, not a customer's)."
  type        = string
}

variable "region" {
  description = "The region of the Cloud Run service and the Cloud Run Job, and of the Cloud Scheduler jobs unless sweeps.region names another."
  type        = string
}

variable "name" {
  description = "Prefix of every resource's name: the service, the job and the topics are called NAME, NAME-task, NAME-jobs, …; the service accounts NAME-runner, NAME-pusher and NAME-scheduler. Give each runner of a project its own (one runner per tenant that must not reach another, see the README). At most 20 characters, so that NAME-scheduler is still a service account id."
  type        = string
  default     = "terrace"

  # A Cloud Run service's name, whose longest derived name, NAME-scheduler, must still be a
  # service account id (at most 30 characters).
  validation {
    condition     = can(regex("^[a-z]([a-z0-9-]*[a-z0-9])?$", var.name)) && length("${var.name}-scheduler") <= 30
    error_message = "name must be 1 to 20 characters, lowercase letters, digits and hyphens, starting with a letter and not ending with a hyphen."
  }
}

variable "deletion_protection" {
  description = "Keep terraform from deleting the Cloud Run service and job (the provider's default). Set false, and apply, before destroying the runner or renaming it."
  type        = bool
  default     = true
}

variable "templates" {
  description = <<-EOT
    A bucket of yours the runner reads templates from at run time, so a new template version needs no new image:
    { bucket, prefix }. Publish to it with `terrace template publish NAME VERSION --to gs://BUCKET/PREFIX`. The service
    and the job get TERRACE_TEMPLATES=gs://BUCKET/PREFIX, and the runner's service account roles/storage.objectViewer
    on the bucket (the whole bucket: keep templates in a bucket of their own). null: the templates in the image.
  EOT
  type = object({
    bucket = string
    prefix = optional(string, "")
  })
  default = null

  validation {
    condition     = var.templates == null || can(regex("^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$", var.templates.bucket))
    error_message = "templates.bucket must be a Cloud Storage bucket name (lowercase letters, digits, dots, hyphens and underscores)."
  }
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
    # The platform's age key (age1…) this tenant's sensitive outputs are sealed to (docs/outputs.md).
    outputs_recipient = optional(string)
    # The Ed25519 public keys allowed to send this tenant's jobs and cancels: with any, only
    # signed ones run (docs/signing.md).
    senders = optional(list(string))
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

  # The targets' attributes, in one rule whose message gives the form of each.
  validation {
    condition = alltrue(flatten([
      for target in values(var.tenants) : [
        can(regex("^[^@\\s]+@[^@\\s]+\\.gserviceaccount\\.com$", target.service_account)),
        can(regex("^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$", target.bucket)),
        target.kms_key == null || can(regex("^projects/[^/]+/locations/[^/]+/keyRings/[^/]+/cryptoKeys/[^/]+$", target.kms_key)),
      ]
    ]))
    error_message = "Each tenant's service_account must be a service account email (NAME@PROJECT.iam.gserviceaccount.com), its bucket a bucket name, and its kms_key, when given, projects/P/locations/L/keyRings/R/cryptoKeys/K."
  }
}

variable "manage_tenant_impersonation" {
  description = "Also grant the runner's service account roles/iam.serviceAccountTokenCreator on each tenant's service account (and on nothing else) from here. Leave false when the customers grant it on their side (the customer module does); set true only where the operator administers the tenants' projects too."
  type        = bool
  default     = false
}

# ---------------------------------------------------------------------------------------------
# The container, the service and the Cloud Run Job
# ---------------------------------------------------------------------------------------------

variable "container" {
  description = <<-EOT
    What runs in the service and in the Cloud Run Job alike:
    - image (required): the runner's image, built from deploy/Dockerfile with --target gcp
      (entry point terrace-gcp), e.g. REGION-docker.pkg.dev/PROJECT/REPOSITORY/terrace-gcp@sha256:….
      Pin it by digest: the service and the Cloud Run Job must run the same build.
    - cpu ("2"): CPU limit of each instance and of the job's task (terraform and its providers run in it).
    - memory ("4Gi"): memory limit of each instance and of the job's task. Cloud Run's file system
      is in memory, the jobs' workdirs and providers included: 2Gi at the least, in Mi or Gi.
    - env ({}): more environment (TERRACE_PASS_ENV, TERRACE_GRACE, TERRACE_LEASE_TTL,
      TERRACE_TERRAFORM_USER, TERRACE_LOG, …). Not for secrets, and not for the variables this
      module sets itself nor the emulator-only ones.
  EOT
  type = object({
    image  = string
    cpu    = optional(string, "2")
    memory = optional(string, "4Gi")
    env    = optional(map(string), {})
  })
  nullable = false

  validation {
    condition = try(
      endswith(var.container.memory, "Gi") ? tonumber(trimsuffix(var.container.memory, "Gi")) >= 2 : tonumber(trimsuffix(var.container.memory, "Mi")) >= 2048,
      false,
    )
    error_message = "container.memory must be given in Mi or Gi and be at least 2Gi."
  }

  validation {
    condition     = length(trimspace(var.container.image)) > 0
    error_message = "container.image must name the runner's image."
  }

  validation {
    condition = length(setintersection(keys(var.container.env), [
      "TERRACE_TENANTS", "TERRACE_PUSH_AUDIENCE", "TERRACE_PUSH_SERVICE_ACCOUNTS", "TERRACE_REQUEST_TIMEOUT",
      "TERRACE_CLOUD_RUN_JOB", "TERRACE_JOBS_TOPIC", "TERRACE_RESULTS_TOPIC", "TERRACE_REQUEUE_WAIT",
      "TERRACE_TASK_LEASE_WAIT", "TERRACE_JOB_REF", "TERRACE_GCS_ANONYMOUS", "TERRACE_GCS_ENDPOINT",
    ])) == 0
    error_message = "container.env must not set a variable the module sets (use its own input) or one meant for emulators only."
  }
}

variable "service" {
  description = <<-EOT
    The Cloud Run service, which Pub/Sub pushes the jobs to and Cloud Scheduler calls:
    - ingress ("INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER"): internal and Cloud Load Balancing, which
      still admits the push subscription and the scheduler jobs of this project; or
      "INGRESS_TRAFFIC_ALL", which lets them reach it from anywhere. Either way every request needs
      an OIDC token of the pusher's or the scheduler's service account.
    - audience (null): the audience of the push subscription's and the scheduler jobs' OIDC tokens
      (TERRACE_PUSH_AUDIENCE), added to the service's custom audiences, a full https:// URL.
      Null: the service's deterministic URL, https://NAME-PROJECT_NUMBER.REGION.run.app.
    - request_timeout_seconds (600): the request timeout, 60 to 3600, also TERRACE_REQUEST_TIMEOUT.
      A job whose timeout (plus a 30 s margin) does not fit is handed to the Cloud Run Job. Keep it
      at most pubsub.ack_deadline_seconds: a push still running at the deadline is delivered again.
    - requeue_wait_seconds (60): TERRACE_REQUEUE_WAIT, how long the answer to a push whose
      workspace is busy is held before a fresh copy goes back on the jobs topic. Keep it below the
      request timeout and well below the ack deadline.
    - max_concurrency (2): requests (jobs) one instance takes at once, 1 to 4, as each runs
      terraform and its providers.
    - instances ({ min = 0, max = 10 }): instances kept warm, and the most the service scales to,
      which bounds how many jobs run at once (max × max_concurrency).
  EOT
  type = object({
    ingress                 = optional(string, "INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER")
    audience                = optional(string)
    request_timeout_seconds = optional(number, 600)
    requeue_wait_seconds    = optional(number, 60)
    max_concurrency         = optional(number, 2)
    instances               = optional(object({ min = optional(number, 0), max = optional(number, 10) }), {})
  })
  default  = {}
  nullable = false

  validation {
    condition     = contains(["INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER", "INGRESS_TRAFFIC_ALL"], var.service.ingress)
    error_message = "service.ingress must be INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER or INGRESS_TRAFFIC_ALL."
  }

  validation {
    condition     = var.service.audience == null || can(regex("^https://[^\\s]+$", var.service.audience))
    error_message = "service.audience must be a full https:// URL (Cloud Run takes custom audiences as URLs)."
  }

  validation {
    condition = alltrue([
      var.service.request_timeout_seconds >= 60 && var.service.request_timeout_seconds <= 3600,
      var.service.requeue_wait_seconds >= 0,
      contains([1, 2, 3, 4], var.service.max_concurrency),
      0 <= var.service.instances.min && var.service.instances.min <= var.service.instances.max && var.service.instances.max >= 1,
    ])
    error_message = "service takes a request_timeout_seconds from 60 to 3600, a requeue_wait_seconds of 0 or more, a max_concurrency from 1 to 4, and instances with a max of 1 or more and a min from 0 to max."
  }
}

variable "task" {
  description = <<-EOT
    The Cloud Run Job (NAME-task) that runs the jobs too long for a request:
    - timeout ("3600s"): its default task timeout, in seconds as Cloud Run takes it, from 60s to
      86400s. The service overrides it on every execution it starts (the job's timeout, plus the
      lease wait, plus 5 minutes); this applies only to executions started by hand.
    - max_retries (3): how often a failed task is retried, 0 to 10. An interrupted task keeps its
      staged message, so the retry runs the job again; a job that already has a final result is
      not run twice.
    - lease_wait_seconds (240): TERRACE_TASK_LEASE_WAIT, how long a task waits for a busy
      workspace before its job goes back on the jobs topic.
  EOT
  type = object({
    timeout            = optional(string, "3600s")
    max_retries        = optional(number, 3)
    lease_wait_seconds = optional(number, 240)
  })
  default  = {}
  nullable = false

  validation {
    condition     = var.task.max_retries >= 0 && var.task.max_retries <= 10 && var.task.lease_wait_seconds >= 0
    error_message = "task.max_retries must be from 0 to 10, and task.lease_wait_seconds not negative."
  }

  validation {
    condition     = can(regex("^[0-9]+s$", var.task.timeout)) && try(tonumber(trimsuffix(var.task.timeout, "s")) >= 60 && tonumber(trimsuffix(var.task.timeout, "s")) <= 86400, false)
    error_message = "task.timeout must be from 60s to 86400s."
  }
}

# ---------------------------------------------------------------------------------------------
# Pub/Sub
# ---------------------------------------------------------------------------------------------

variable "pubsub" {
  description = <<-EOT
    The topics and subscriptions:
    - ack_deadline_seconds (600): the push subscription's ack deadline, 10 to 600, how long a push
      may take before Pub/Sub delivers the message again. At least the longest job the service
      runs itself.
    - max_delivery_attempts (5): deliveries of a job message before it goes to the dead-letter
      topic, 5 to 100 (5 to 10 recommended). Waiting for a busy workspace does not count: the
      runner publishes a fresh copy.
    - message_retention_duration ("604800s"): how long the topics and subscriptions keep messages
      (unacknowledged job messages, dead letters), from 600s to 604800s.
    - kms_key_name (null): a Cloud KMS key (projects/P/locations/L/keyRings/R/cryptoKeys/K) that
      encrypts the topics' messages (CMEK); the Pub/Sub service agent is granted
      roles/cloudkms.cryptoKeyEncrypterDecrypter on it. Null: Google-managed keys.
  EOT
  type = object({
    ack_deadline_seconds       = optional(number, 600)
    max_delivery_attempts      = optional(number, 5)
    message_retention_duration = optional(string, "604800s")
    kms_key_name               = optional(string)
  })
  default  = {}
  nullable = false

  validation {
    condition     = can(regex("^[0-9]+s$", var.pubsub.message_retention_duration)) && try(tonumber(trimsuffix(var.pubsub.message_retention_duration, "s")) >= 600 && tonumber(trimsuffix(var.pubsub.message_retention_duration, "s")) <= 604800, false)
    error_message = "pubsub.message_retention_duration must be from 600s to 604800s (a subscription keeps messages at most 7 days)."
  }

  validation {
    condition     = var.pubsub.kms_key_name == null || can(regex("^projects/[^/]+/locations/[^/]+/keyRings/[^/]+/cryptoKeys/[^/]+$", var.pubsub.kms_key_name))
    error_message = "pubsub.kms_key_name must be projects/P/locations/L/keyRings/R/cryptoKeys/K."
  }

  validation {
    condition     = var.pubsub.ack_deadline_seconds >= 10 && var.pubsub.ack_deadline_seconds <= 600 && var.pubsub.max_delivery_attempts >= 5 && var.pubsub.max_delivery_attempts <= 100
    error_message = "pubsub.ack_deadline_seconds must be from 10 to 600, and pubsub.max_delivery_attempts from 5 to 100."
  }
}

# ---------------------------------------------------------------------------------------------
# Cloud Scheduler
# ---------------------------------------------------------------------------------------------

variable "sweeps" {
  description = <<-EOT
    When Cloud Scheduler calls the sweeps, and for whom:
    - backup ("0 * * * *"): when the backup sweep runs (cron, in time_zone): hourly by default,
      which the sweep is built for.
    - drift ("30 6 * * *"): when the drift sweep runs; it publishes a drift-check job for each
      applied workspace. Empty (""): no drift sweep (an empty backup schedule likewise drops the
      backup sweep, which is not advised).
    - time_zone ("Etc/UTC"): the time zone of both schedules (tz database name).
    - region (null): the region of the Cloud Scheduler jobs, where Cloud Scheduler is not offered
      in region. Null: region.
    - tenants ([]): the tenants the sweeps cover. Empty: every registered tenant (the body is {}).
  EOT
  type = object({
    backup    = optional(string, "0 * * * *")
    drift     = optional(string, "30 6 * * *")
    time_zone = optional(string, "Etc/UTC")
    region    = optional(string)
    tenants   = optional(list(string), [])
  })
  default  = {}
  nullable = false
}
