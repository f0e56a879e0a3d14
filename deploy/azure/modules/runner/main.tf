# The Azure runner: the queues, the runner's identity, and three Container Apps jobs from one
# image (an event-driven one for the jobs queue, the hourly backup sweep, the drift sweep).

module "storage" {
  source = "../storage-account"

  name                 = var.storage.account_name
  resource_group_name  = var.resource_group_name
  location             = var.location
  replication_type     = var.storage.replication_type
  customer_managed_key = var.storage.customer_managed_key
  tags                 = var.tags

  network = {
    allowed_ip_ranges  = var.storage.allowed_ip_ranges
    allowed_subnet_ids = var.storage.allowed_subnet_ids
  }
  diagnostics = {
    log_analytics_workspace_id = azurerm_log_analytics_workspace.this.id
    services                   = ["queue"]
  }
}

resource "azurerm_storage_queue" "this" {
  for_each = local.queue_names

  name               = each.value
  storage_account_id = module.storage.account.id
}

resource "azurerm_user_assigned_identity" "runner" {
  name                = "${var.name}-runner"
  resource_group_name = var.resource_group_name
  location            = var.location
  tags                = var.tags
}

resource "azurerm_role_assignment" "this" {
  for_each = local.role_assignments

  scope                = each.value.scope
  role_definition_name = each.value.role
  principal_id         = each.value.principal_id
  principal_type       = each.value.principal_type
  description          = "Terrace runner ${var.name}: ${each.key}"

  depends_on = [azurerm_storage_queue.this]
}

resource "azurerm_log_analytics_workspace" "this" {
  name                = "${var.name}-logs"
  resource_group_name = var.resource_group_name
  location            = var.location
  retention_in_days   = var.environment.log_retention_in_days
  sku                 = "PerGB2018"
  tags                = var.tags
}

resource "azurerm_container_app_environment" "this" {
  name                       = "${var.name}-env"
  resource_group_name        = var.resource_group_name
  location                   = var.location
  logs_destination           = "log-analytics"
  log_analytics_workspace_id = azurerm_log_analytics_workspace.this.id
  infrastructure_subnet_id   = var.environment.infrastructure_subnet_id

  workload_profile {
    name                  = "Consumption"
    workload_profile_type = "Consumption"
  }

  tags = var.tags
}

resource "azurerm_container_app_job" "this" {
  for_each = local.jobs

  name                         = "${var.name}-${each.key}"
  resource_group_name          = var.resource_group_name
  location                     = var.location
  container_app_environment_id = azurerm_container_app_environment.this.id
  workload_profile_name        = "Consumption"
  replica_timeout_in_seconds   = var.replica.timeout_seconds
  replica_retry_limit          = var.replica.retry_limit

  identity {
    type         = "UserAssigned"
    identity_ids = [azurerm_user_assigned_identity.runner.id]
  }

  # The registry holds no credential, but it names every customer's tenant and app: kept out
  # of the job's plain configuration, which readers of the resource group can see.
  secret {
    name  = local.tenants_secret
    value = local.tenants_json
  }

  dynamic "registry" {
    for_each = var.registry[*]

    content {
      server   = registry.value.login_server
      identity = azurerm_user_assigned_identity.runner.id
    }
  }

  dynamic "event_trigger_config" {
    for_each = each.value.cron == null ? [each.key] : []

    content {
      parallelism              = 1
      replica_completion_count = 1

      scale {
        min_executions              = 0
        max_executions              = var.scaling.max_executions
        polling_interval_in_seconds = var.scaling.polling_interval_seconds

        # KEDA's azure-queue scaler, signed in as the runner's identity (no connection string):
        # one execution per visible message. Messages kept invisible (a running job's, a busy
        # workspace's delayed copy) are not counted, or each poll would start executions that
        # find nothing to take.
        rules {
          name             = "jobs-queue"
          custom_rule_type = "azure-queue"
          metadata = {
            accountName         = module.storage.account.name
            queueName           = local.queue_names.jobs
            queueLength         = "1"
            queueLengthStrategy = "visibleonly"
          }
          identity_id = azurerm_user_assigned_identity.runner.id
        }
      }
    }
  }

  dynamic "schedule_trigger_config" {
    for_each = each.value.cron == null ? [] : [each.value.cron]

    content {
      cron_expression          = schedule_trigger_config.value
      parallelism              = 1
      replica_completion_count = 1
    }
  }

  template {
    container {
      name   = "terrace"
      image  = var.image
      args   = each.value.args
      cpu    = var.replica.cpu
      memory = var.replica.memory

      env {
        name        = "TERRACE_TENANTS"
        secret_name = local.tenants_secret
      }

      dynamic "env" {
        for_each = each.value.cron == null ? local.settings : merge(local.settings, local.sweep_settings)

        content {
          name  = env.key
          value = env.value
        }
      }
    }
  }

  tags = var.tags

  lifecycle {
    precondition {
      condition     = length(setsubtract(var.sweeps.tenants, keys(var.tenants))) == 0
      error_message = "sweeps.tenants may only name tenants registered in tenants."
    }
  }

  # Executions must find their queues and roles in place (KEDA included).
  depends_on = [azurerm_role_assignment.this]
}
