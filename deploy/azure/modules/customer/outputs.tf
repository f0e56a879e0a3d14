output "tenant_registry_entry" {
  description = "This customer's entry in the runner's tenant registry (TERRACE_TENANTS): give it as a value of the runner module's `tenants`."
  value = {
    container_url   = local.container_url
    prefix          = var.state_storage.prefix
    tenant_id       = local.tenant_id
    client_id       = azuread_application.runner.client_id
    subscription_id = local.subscription_id
  }
}

output "tenant_id" {
  description = "The customer's tenant ID."
  value       = local.tenant_id
}

output "client_id" {
  description = "Client ID of the app registration the runner acts as."
  value       = azuread_application.runner.client_id
}

output "state" {
  description = "Where the state is kept: `storage_account_id`, `storage_account_name`, `container_name`, `container_url` and `prefix`."
  value = {
    storage_account_id   = module.storage.account.id
    storage_account_name = module.storage.account.name
    container_name       = azurerm_storage_container.state.name
    container_url        = local.container_url
    prefix               = var.state_storage.prefix
  }
}

output "service_principal_object_id" {
  description = "Object ID of the app's service principal, for role assignments made outside this module."
  value       = azuread_service_principal.runner.object_id
}
