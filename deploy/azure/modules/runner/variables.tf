variable "name" {
  description = "Prefix of every resource's name (the jobs are `<name>-jobs`, `<name>-backup` and `<name>-drift`): 2 to 25 lowercase letters, digits and hyphens, starting with a letter."
  type        = string
  nullable    = false

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,23}[a-z0-9]$", var.name)) && !strcontains(var.name, "--")
    error_message = "name must be 2 to 25 lowercase letters, digits and single hyphens, start with a letter and end with a letter or digit."
  }
}

variable "resource_group_name" {
  description = "Existing resource group for every resource of the runner."
  type        = string
  nullable    = false
}

variable "location" {
  description = "Azure region of every resource of the runner."
  type        = string
  nullable    = false
}

variable "image" {
  description = "The runner's image, built from deploy/Dockerfile, target azure (e.g. `myregistry.azurecr.io/terrace-azure:1.4.0`). Pin a tag or digest."
  type        = string
  nullable    = false
}

variable "registry" {
  description = "An Azure Container Registry to pull `image` from with the runner's identity: its `login_server` and resource ID (`acr_id`), on which the identity is given AcrPull. Null: the image is public."
  type = object({
    login_server = string
    acr_id       = string
  })
  default = null
}

variable "tenants" {
  description = <<-EOT
    The tenant registry (TERRACE_TENANTS): tenant name => its target. The customer module's
    `tenant_registry_entry` output is one such value. `container_url` is the state container
    (https://ACCOUNT.blob.core.windows.net/CONTAINER, never with a SAS), `tenant_id` and `client_id`
    the customer's tenant and app registration, `subscription_id` where terraform works.
  EOT
  type = map(object({
    container_url   = string
    prefix          = optional(string, "")
    tenant_id       = string
    client_id       = string
    subscription_id = optional(string)
    # The platform's age key (age1…) this tenant's sensitive outputs are sealed to (docs/outputs.md).
    outputs_recipient = optional(string)
    # The Ed25519 public keys allowed to send this tenant's jobs and cancels: with any, only
    # signed ones run (docs/signing.md).
    senders = optional(list(string))
  }))
  nullable = false

  validation {
    condition = alltrue([
      for name in keys(var.tenants) : can(regex("^[a-z0-9][a-z0-9._-]{0,62}$", name)) && !endswith(name, ".")
    ])
    error_message = "Tenant names must be 1 to 63 lowercase letters, digits, '-', '_' or '.', start with a letter or digit and not end with '.'."
  }

  validation {
    condition = alltrue([
      for t in values(var.tenants) : can(regex("^https://[^/?#]+/[a-z0-9][a-z0-9-]{1,61}[a-z0-9]/?$", t.container_url))
    ])
    error_message = "Each container_url must be https://ACCOUNT.blob.core.windows.net/CONTAINER, without a query (the runner reaches the container as the customer's app, never with a SAS)."
  }

  validation {
    condition = alltrue(flatten([
      for t in values(var.tenants) : [
        for id in compact([t.tenant_id, t.client_id, t.subscription_id]) :
        can(regex("^[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$", id))
      ]
    ]))
    error_message = "tenant_id, client_id and subscription_id must be GUIDs."
  }
}

variable "storage" {
  description = <<-EOT
    The queues' storage account. `account_name`: 3 to 24 lowercase letters and digits, unique across
    Azure. `replication_type`: queues hold only messages in transit, hence ZRS; choose GZRS where a
    regional outage must not lose queued jobs. `allowed_ip_ranges` and `allowed_subnet_ids` close its
    firewall to all else (the platform sending jobs and the runner's own subnet must then be among
    them). `customer_managed_key`: encrypt the queues, which carry jobs' variables, with a key of your
    own (`key_vault_key_id`, and the `user_assigned_identity_id` allowed to use it).
  EOT
  type = object({
    account_name       = string
    replication_type   = optional(string, "ZRS")
    allowed_ip_ranges  = optional(list(string), [])
    allowed_subnet_ids = optional(list(string), [])
    customer_managed_key = optional(object({
      key_vault_key_id          = string
      user_assigned_identity_id = string
    }))
  })
  nullable = false

  validation {
    condition     = can(regex("^[a-z0-9]{3,24}$", var.storage.account_name))
    error_message = "storage.account_name must be 3 to 24 lowercase letters and digits."
  }
}

variable "templates" {
  description = <<-EOT
    A blob container of yours the runner reads templates from at run time, so a new template version needs no new
    image: { storage_account_id, container, prefix }. Publish to it with
    `terrace template publish NAME VERSION --to az://ACCOUNT/CONTAINER/PREFIX`. Every execution gets
    TERRACE_TEMPLATES=az://ACCOUNT/CONTAINER/PREFIX, and the runner's identity Storage Blob Data Reader on that
    container. null: the templates in the image.
  EOT
  type = object({
    storage_account_id = string
    container          = string
    prefix             = optional(string, "")
  })
  default = null

  validation {
    condition     = var.templates == null || can(regex("^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft.Storage/storageAccounts/[a-z0-9]{3,24}$", var.templates.storage_account_id))
    error_message = "templates.storage_account_id must be a storage account's resource ID (/subscriptions/…/resourceGroups/…/providers/Microsoft.Storage/storageAccounts/NAME)."
  }
}

variable "queue_names" {
  description = "Names of the `jobs` queue (TERRACE_QUEUE_URL; its poison queue is `<jobs>-poison`, as Azure Functions names them) and the `results` queue (TERRACE_RESULTS_QUEUE_URL)."
  type = object({
    jobs    = optional(string, "terrace-jobs")
    results = optional(string, "terrace-results")
  })
  default  = {}
  nullable = false

  validation {
    condition = alltrue([
      for queue in [var.queue_names.jobs, "${var.queue_names.jobs}-poison", var.queue_names.results] :
      can(regex("^[a-z0-9]([a-z0-9]|-[a-z0-9]){2,62}$", queue))
    ])
    error_message = "Queue names must be 3 to 63 lowercase letters, digits and single hyphens, starting and ending with a letter or digit (jobs leaves room for -poison)."
  }
}

variable "platform_principals" {
  description = <<-EOT
    The platform's own identities (name => `principal_id`, `principal_type`), which send jobs and read
    results: each may send to the jobs queue and receive from the results and poison queues. Keep
    the jobs queue writable by these only: whoever can send there can start a job for any
    registered tenant.
  EOT
  type = map(object({
    principal_id   = string
    principal_type = optional(string, "ServicePrincipal")
  }))
  default  = {}
  nullable = false

  validation {
    condition     = alltrue([for p in values(var.platform_principals) : contains(["ServicePrincipal", "User", "Group"], p.principal_type)])
    error_message = "principal_type must be ServicePrincipal, User or Group."
  }
}

variable "replica" {
  description = <<-EOT
    Each execution's replica. `timeout_seconds`: the jobs' replicaTimeout and TERRACE_REPLICA_TIMEOUT;
    a job whose own timeout exceeds it less `deadline_margin_seconds` (TERRACE_DEADLINE_MARGIN) is
    rejected. `cpu` (0.25 to 4, in steps of 0.25) and `memory` (twice `cpu` in GiB on the Consumption
    profile): terraform and its providers run in it. `retry_limit`: keep 0, the queue already
    redelivers a failed execution's message (up to `messages.max_dequeues`).
  EOT
  type = object({
    timeout_seconds         = optional(number, 1800)
    deadline_margin_seconds = optional(number, 30)
    cpu                     = optional(number, 1)
    memory                  = optional(string, "2Gi")
    retry_limit             = optional(number, 0)
  })
  default  = {}
  nullable = false

  validation {
    condition     = var.replica.cpu >= 0.25 && var.replica.cpu <= 4 && floor(var.replica.cpu * 4) == var.replica.cpu * 4
    error_message = "replica.cpu must be 0.25 to 4, in steps of 0.25."
  }

  validation {
    condition     = try(tonumber(trimsuffix(var.replica.memory, "Gi")) == var.replica.cpu * 2, false)
    error_message = "replica.memory must be twice replica.cpu in GiB, as the Consumption profile requires (e.g. 2Gi for 1 vCPU)."
  }

  validation {
    condition     = var.replica.timeout_seconds > var.replica.deadline_margin_seconds && var.replica.deadline_margin_seconds >= 0 && var.replica.retry_limit >= 0
    error_message = "replica.timeout_seconds must exceed replica.deadline_margin_seconds (or every job is rejected); neither it nor retry_limit may be negative."
  }
}

variable "messages" {
  description = <<-EOT
    How the runner handles messages. `max_dequeues` (TERRACE_MAX_DEQUEUES): a message received more
    often goes to the poison queue. `visibility_timeout_seconds` (TERRACE_VISIBILITY_TIMEOUT, 3 or
    more): how long a received message stays invisible, extended every third of it while its job
    runs. `retry_delay_seconds` (TERRACE_RETRY_DELAY): how long a message waits after trouble that may
    pass.
  EOT
  type = object({
    max_dequeues               = optional(number, 5)
    visibility_timeout_seconds = optional(number, 60)
    retry_delay_seconds        = optional(number, 30)
  })
  default  = {}
  nullable = false

  validation {
    condition = alltrue([
      var.messages.max_dequeues >= 1,
      var.messages.visibility_timeout_seconds >= 3,
      var.messages.retry_delay_seconds >= 0,
      alltrue([for n in values(var.messages) : floor(n) == n]),
    ])
    error_message = "messages takes whole numbers: max_dequeues 1 or more, visibility_timeout_seconds 3 or more, retry_delay_seconds 0 or more."
  }
}

variable "scaling" {
  description = <<-EOT
    How the event-driven job scales on the jobs queue (KEDA's azure-queue scaler, one execution per
    message). `max_executions`: the most jobs running at once. `polling_interval_seconds`: how often
    KEDA looks at the queue, so the longest a new job waits for its execution to start.
  EOT
  type = object({
    max_executions           = optional(number, 10)
    polling_interval_seconds = optional(number, 10)
  })
  default  = {}
  nullable = false

  validation {
    condition     = alltrue([for n in values(var.scaling) : n >= 1 && floor(n) == n])
    error_message = "scaling.max_executions and scaling.polling_interval_seconds must be whole numbers, 1 or more."
  }
}

variable "terraform" {
  description = <<-EOT
    How each job's terraform runs. `grace_seconds` (TERRACE_GRACE): how long terraform has after an
    interrupt; Container Apps gives a replica 30 s after SIGTERM and a job cannot change that, so this
    plus a few seconds for the result and the lease must fit in 30. `lease_ttl_seconds`
    (TERRACE_LEASE_TTL; null: 60). `pass_env` (TERRACE_PASS_ENV): the runner's variables terraform may
    see, normally none. `user` (TERRACE_TERRAFORM_USER: `per-job`, `UID[:GID]` or `root`; null: a user
    of each job's own). `log_filter` (TERRACE_LOG): the runner's tracing filter.
  EOT
  type = object({
    grace_seconds     = optional(number, 20)
    lease_ttl_seconds = optional(number)
    pass_env          = optional(list(string), [])
    user              = optional(string)
    log_filter        = optional(string, "info")
  })
  default  = {}
  nullable = false

  validation {
    condition = alltrue([
      try(var.terraform.lease_ttl_seconds >= 1, true),
      var.terraform.grace_seconds >= 1,
      var.terraform.grace_seconds <= 25,
    ])
    error_message = "terraform.grace_seconds must be 1 to 25, so that an interrupted job still saves its result within Container Apps' 30 s grace period; terraform.lease_ttl_seconds, when set, 1 or more."
  }
}

variable "sweeps" {
  description = <<-EOT
    The scheduled sweeps. The backup sweep runs every hour. The drift sweep (`drift_enabled`) runs at
    `drift_cron`, a five-field cron expression in UTC, and queues a drift check for every applied
    workspace. `tenants` (TERRACE_SWEEP_TENANTS): the registered tenants both sweeps cover (empty: all).
  EOT
  type = object({
    drift_enabled = optional(bool, true)
    drift_cron    = optional(string, "0 4 * * *")
    tenants       = optional(list(string), [])
  })
  default  = {}
  nullable = false

  validation {
    condition     = length(split(" ", trimspace(var.sweeps.drift_cron))) == 5
    error_message = "sweeps.drift_cron must be a five-field cron expression (minute hour day month weekday)."
  }
}

variable "environment" {
  description = <<-EOT
    The Container Apps environment the jobs run in, and its Log Analytics workspace.
    `infrastructure_subnet_id`: a subnet of yours (/27 or larger, delegated to
    Microsoft.App/environments) to run the environment in your virtual network, for instance behind a
    NAT gateway whose fixed IPs customers can allow; null: Azure's own network.
    `log_retention_in_days`: how long the workspace keeps the jobs' logs and the queues' resource
    logs, 30 to 730.
  EOT
  type = object({
    infrastructure_subnet_id = optional(string)
    log_retention_in_days    = optional(number, 30)
  })
  default  = {}
  nullable = false

  validation {
    condition     = floor(var.environment.log_retention_in_days) == var.environment.log_retention_in_days && var.environment.log_retention_in_days >= 30 && var.environment.log_retention_in_days <= 730
    error_message = "environment.log_retention_in_days must be a whole number of days, 30 to 730."
  }
}

variable "tags" {
  description = "Tags for every resource of the runner."
  type        = map(string)
  default     = {}
  nullable    = false
}
