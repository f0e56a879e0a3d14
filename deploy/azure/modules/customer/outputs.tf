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

output "application" {
  description = <<-EOT
    The app registration the runner acts as: the customer's `tenant_id`, the app's `client_id`, and
    its service principal's object ID (`service_principal_object_id`), for role assignments made
    outside this module.
  EOT
  value = {
    tenant_id                   = local.tenant_id
    client_id                   = azuread_application.runner.client_id
    service_principal_object_id = azuread_service_principal.runner.object_id
  }
}
