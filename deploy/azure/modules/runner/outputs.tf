output "identity" {
  description = "The runner's user-assigned managed identity (`RUNNER`): resource `id`, `client_id`, `principal_id` (its object ID, the subject customers trust) and `tenant_id`."
  value = {
    id           = azurerm_user_assigned_identity.runner.id
    client_id    = azurerm_user_assigned_identity.runner.client_id
    principal_id = azurerm_user_assigned_identity.runner.principal_id
    tenant_id    = azurerm_user_assigned_identity.runner.tenant_id
  }
}

output "federated_credential" {
  description = "What a customer's app registration must trust, for customers who do not use the customer module: `issuer`, `subject` and `audience` of its federated identity credential."
  value = {
    issuer   = "https://login.microsoftonline.com/${azurerm_user_assigned_identity.runner.tenant_id}/v2.0"
    subject  = azurerm_user_assigned_identity.runner.principal_id
    audience = "api://AzureADTokenExchange"
  }
}

output "queue_urls" {
  description = "URLs of the `jobs`, `poison` and `results` queues."
  value       = local.queue_urls
}

output "storage_account" {
  description = "The queues' storage account: resource `id` and `name`."
  value = {
    id   = module.storage.account.id
    name = module.storage.account.name
  }
}

output "container_app_environment_id" {
  description = "Resource ID of the Container Apps environment."
  value       = azurerm_container_app_environment.this.id
}

output "jobs" {
  description = "The Container Apps jobs, by kind (`jobs`, `backup`, `drift`): resource `id` and `name`."
  value       = { for kind, job in azurerm_container_app_job.this : kind => { id = job.id, name = job.name } }
}

output "outbound_ip_addresses" {
  description = "Public IPs the jobs reach customers' storage from, for their firewalls. Stable only behind a NAT gateway on `infrastructure_subnet_id`."
  value       = azurerm_container_app_job.this["jobs"].outbound_ip_addresses
}

output "log_analytics_workspace_id" {
  description = "Resource ID of the Log Analytics workspace holding the jobs' logs and the queues' resource logs."
  value       = azurerm_log_analytics_workspace.this.id
}
