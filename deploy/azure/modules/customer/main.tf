# The customer's side: a storage account and private container for Terrace's state, and an app
# registration that the runner's managed identity signs in as through workload identity
# federation (no secret anywhere), with access to that container only, and to whatever
# `workloads.role_assignments` grants for the templates' resources. Apply it with the customer's
# subscription (azurerm) and tenant (azuread).

data "azurerm_client_config" "current" {}

data "azuread_client_config" "current" {}

locals {
  tenant_id       = data.azuread_client_config.current.tenant_id
  subscription_id = coalesce(var.workloads.subscription_id, data.azurerm_client_config.current.subscription_id)
  container_url   = "${module.storage.account.blob_endpoint}/${azurerm_storage_container.state.name}"
  owners          = distinct(concat([data.azuread_client_config.current.object_id], var.application.owners))

  role_assignments = merge(var.workloads.role_assignments, {
    state = {
      scope                = "${module.storage.account.id}/blobServices/default/containers/${azurerm_storage_container.state.name}"
      role_definition_name = "Storage Blob Data Contributor"
    }
  })
}

module "storage" {
  source = "../storage-account"

  name                 = var.state_storage.account_name
  resource_group_name  = var.resource_group_name
  location             = var.location
  tags                 = var.tags
  replication_type     = var.state_storage.replication_type
  customer_managed_key = var.state_storage.customer_managed_key

  blob_properties = {
    versioning_enabled              = var.state_storage.versioning_enabled
    delete_retention_days           = var.state_storage.retention_days.deleted_blobs
    container_delete_retention_days = var.state_storage.retention_days.deleted_containers
  }
  network = {
    allowed_ip_ranges  = var.state_storage.allowed_ip_ranges
    allowed_subnet_ids = var.state_storage.allowed_subnet_ids
  }
  diagnostics = var.state_storage.log_analytics_workspace_id == null ? null : {
    log_analytics_workspace_id = var.state_storage.log_analytics_workspace_id
    services                   = ["blob"]
  }
}

resource "azurerm_storage_container" "state" {
  #checkov:skip=CKV2_AZURE_21:Storage Insights reads classic logs with the account key, and shared keys are off; the module's diagnostics send blob reads, writes and deletes to Log Analytics instead.
  name                  = var.state_storage.container_name
  storage_account_id    = module.storage.account.id
  container_access_type = "private"
}

# Terrace writes its own versions as create-once blobs; blob versioning is a safety net against
# anything else overwriting or deleting them. The lease record is rewritten on every renewal, so
# previous versions are expired here rather than kept for ever.
resource "azurerm_storage_management_policy" "previous_versions" {
  count = var.state_storage.versioning_enabled ? 1 : 0

  storage_account_id = module.storage.account.id

  rule {
    name    = "expire-previous-versions"
    enabled = true

    filters {
      blob_types   = ["blockBlob"]
      prefix_match = ["${azurerm_storage_container.state.name}/"]
    }

    actions {
      version {
        delete_after_days_since_creation = var.state_storage.retention_days.previous_versions
      }
    }
  }
}

resource "azuread_application" "runner" {
  display_name     = var.application.display_name
  owners           = local.owners
  sign_in_audience = "AzureADMyOrg"
  notes            = "Terrace: the runner acts as this app, through a federated credential trusting its managed identity. It holds no secret."
}

resource "azuread_service_principal" "runner" {
  client_id                    = azuread_application.runner.client_id
  owners                       = local.owners
  app_role_assignment_required = false
}

# The runner presents a token of its managed identity, for api://AzureADTokenExchange, as this
# app's client assertion.
resource "azuread_application_federated_identity_credential" "runner" {
  #checkov:skip=CKV_AZURE_249:Not a GitHub Actions trust: the issuer is Entra ID and the subject is exactly the runner's managed identity's object ID, with no wildcard.
  application_id = azuread_application.runner.id
  display_name   = var.application.federated_credential_name
  description    = "Terrace runner (managed identity ${var.runner_identity.principal_id})"
  audiences      = ["api://AzureADTokenExchange"]
  issuer         = "https://login.microsoftonline.com/${var.runner_identity.tenant_id}/v2.0"
  subject        = var.runner_identity.principal_id
}

resource "azurerm_role_assignment" "runner" {
  for_each = local.role_assignments

  scope                = each.value.scope
  role_definition_name = each.value.role_definition_name
  principal_id         = azuread_service_principal.runner.object_id
  principal_type       = "ServicePrincipal"
  description          = "Terrace runner: ${each.key}"
}
