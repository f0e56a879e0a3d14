locals {
  queue_names = {
    jobs    = var.queue_names.jobs
    poison  = "${var.queue_names.jobs}-poison"
    results = var.queue_names.results
  }
  queue_urls   = { for role, queue in local.queue_names : role => "${module.storage.account.queue_endpoint}/${queue}" }
  queue_scopes = { for role, queue in local.queue_names : role => "${module.storage.account.id}/queueServices/default/queues/${queue}" }

  # What each principal may do on each queue. The runner receives, updates (extends the
  # visibility of) and deletes messages on the jobs queue and sends some back there (busy
  # workspaces, the drift sweep's checks): only the Contributor role may update a message. It
  # only sends to the other two, which are created here (it would create the poison queue on
  # first use, as Contributor, where no IaC had made it). KEDA reads the jobs queue as the same
  # identity. The platform sends jobs and takes results and dead letters.
  runner_queue_roles = {
    jobs    = "Storage Queue Data Contributor"
    poison  = "Storage Queue Data Message Sender"
    results = "Storage Queue Data Message Sender"
  }
  platform_queue_roles = {
    jobs    = "Storage Queue Data Message Sender"
    poison  = "Storage Queue Data Message Processor"
    results = "Storage Queue Data Message Processor"
  }

  role_assignments = merge(
    {
      for queue, role in local.runner_queue_roles : "runner-${queue}" => {
        scope          = local.queue_scopes[queue]
        role           = role
        principal_id   = azurerm_user_assigned_identity.runner.principal_id
        principal_type = "ServicePrincipal"
      }
    },
    {
      for pair in setproduct(keys(var.platform_principals), keys(local.platform_queue_roles)) : "platform-${pair[0]}-${pair[1]}" => {
        scope          = local.queue_scopes[pair[1]]
        role           = local.platform_queue_roles[pair[1]]
        principal_id   = var.platform_principals[pair[0]].principal_id
        principal_type = var.platform_principals[pair[0]].principal_type
      }
    },
    var.templates == null ? {} : {
      runner-templates = {
        scope          = "${var.templates.storage_account_id}/blobServices/default/containers/${var.templates.container}"
        role           = "Storage Blob Data Reader"
        principal_id   = azurerm_user_assigned_identity.runner.principal_id
        principal_type = "ServicePrincipal"
      }
    },
    var.registry == null ? {} : {
      runner-acr = {
        scope          = var.registry.acr_id
        role           = "AcrPull"
        principal_id   = azurerm_user_assigned_identity.runner.principal_id
        principal_type = "ServicePrincipal"
      }
    },
  )

  # The registry, as the runner reads it: optional fields left out rather than null.
  tenants_json = jsonencode({
    for tenant, target in var.tenants : tenant => { for field, value in target : field => value if value != null }
  })

  # Every execution's settings (the image sets TERRACE_TEMPLATES, unless `templates` names a
  # container, TERRACE_TERRAFORM and TERRACE_TF_CLI_CONFIG). TERRACE_TENANTS comes from the jobs' secret (main.tf).
  settings = merge(
    {
      TERRACE_QUEUE_URL                  = local.queue_urls.jobs
      TERRACE_POISON_QUEUE_URL           = local.queue_urls.poison
      TERRACE_RESULTS_QUEUE_URL          = local.queue_urls.results
      TERRACE_MANAGED_IDENTITY_CLIENT_ID = azurerm_user_assigned_identity.runner.client_id
      TERRACE_MAX_DEQUEUES               = tostring(var.messages.max_dequeues)
      TERRACE_VISIBILITY_TIMEOUT         = tostring(var.messages.visibility_timeout_seconds)
      TERRACE_RETRY_DELAY                = tostring(var.messages.retry_delay_seconds)
      TERRACE_REPLICA_TIMEOUT            = tostring(var.replica.timeout_seconds)
      TERRACE_DEADLINE_MARGIN            = tostring(var.replica.deadline_margin_seconds)
      TERRACE_GRACE                      = tostring(var.terraform.grace_seconds)
      TERRACE_LOG                        = var.terraform.log_filter
    },
    { for setting, value in {
      TERRACE_LEASE_TTL      = var.terraform.lease_ttl_seconds == null ? null : tostring(var.terraform.lease_ttl_seconds)
      TERRACE_PASS_ENV       = length(var.terraform.pass_env) == 0 ? null : join(",", var.terraform.pass_env)
      TERRACE_TERRAFORM_USER = var.terraform.user
      TERRACE_TEMPLATES = var.templates == null ? null : trim(
        "az://${element(split("/", var.templates.storage_account_id), 8)}/${var.templates.container}/${trim(var.templates.prefix, "/")}", "/"
      )
    } : setting => value if value != null },
  )
  sweep_settings = length(var.sweeps.tenants) == 0 ? {} : { TERRACE_SWEEP_TENANTS = join(",", var.sweeps.tenants) }

  # The three jobs: `jobs` takes one message from the jobs queue per execution (no argument),
  # the sweeps run on their schedules.
  jobs = merge(
    { jobs = { cron = null, args = null } },
    {
      for sweep, cron in { backup = "0 * * * *", drift = var.sweeps.drift_enabled ? var.sweeps.drift_cron : null } :
      sweep => { cron = cron, args = ["sweep", sweep] } if cron != null
    },
  )
  tenants_secret = "terrace-tenants"
}
