output "identity" {
  description = "The runner's user-assigned managed identity (`RUNNER`): resource `id`, `client_id`, `principal_id` (its object ID, the subject customers trust) and `tenant_id`, which the customer module's `runner_identity` takes as is; and the `federated_credential` (`issuer`, `subject`, `audience`) for customers who register their app by hand."
  value = {
    id           = azurerm_user_assigned_identity.runner.id
    client_id    = azurerm_user_assigned_identity.runner.client_id
    principal_id = azurerm_user_assigned_identity.runner.principal_id
    tenant_id    = azurerm_user_assigned_identity.runner.tenant_id
    federated_credential = {
      issuer   = "https://login.microsoftonline.com/${azurerm_user_assigned_identity.runner.tenant_id}/v2.0"
      subject  = azurerm_user_assigned_identity.runner.principal_id
      audience = "api://AzureADTokenExchange"
    }
  }
}

output "queues" {
  description = "The queues: the `urls` of the `jobs`, `poison` and `results` queues, and the storage account they are in (`storage_account_id`, `storage_account_name`)."
  value = {
    urls                 = local.queue_urls
    storage_account_id   = module.storage.account.id
    storage_account_name = module.storage.account.name
  }
}

output "jobs" {
  description = "The Container Apps jobs, by kind (`jobs`, `backup`, `drift`): resource `id` and `name`."
  value       = { for kind, job in azurerm_container_app_job.this : kind => { id = job.id, name = job.name } }
}

output "environment" {
  description = <<-EOT
    Where the jobs run: the Container Apps environment's resource `id`; the `log_analytics_workspace_id`
    holding the jobs' logs and the queues' resource logs; and the `outbound_ip_addresses` the jobs reach
    customers' storage from, for their firewalls (stable only behind a NAT gateway on
    `environment.infrastructure_subnet_id`).
  EOT
  value = {
    id                         = azurerm_container_app_environment.this.id
    log_analytics_workspace_id = azurerm_log_analytics_workspace.this.id
    outbound_ip_addresses      = azurerm_container_app_job.this["jobs"].outbound_ip_addresses
  }
}
