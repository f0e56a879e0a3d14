# A storage account as Terrace wants every one of its own: Entra ID only (no shared keys, no
# SAS, no local users), TLS 1.2, HTTPS, no anonymous access, infrastructure encryption, soft
# delete. The runner keeps its queues here; a customer keeps Terrace's state here.

locals {
  # The firewall closes as soon as something is named to let through.
  firewall_closed = length(var.network.allowed_ip_ranges) + length(var.network.allowed_subnet_ids) > 0
}

resource "azurerm_storage_account" "this" {
  #checkov:skip=CKV_AZURE_33:Classic queue logging (queue_properties) needs shared keys and is gone from azurerm 5; the diagnostic setting below logs reads, writes and deletes to Log Analytics.
  #checkov:skip=CKV_AZURE_35:The firewall denies by default as soon as network.allowed_ip_ranges or network.allowed_subnet_ids name anything; a Consumption Container Apps environment has no fixed egress to name, so by default access rests on Entra ID alone.
  #checkov:skip=CKV_AZURE_59:Public endpoints are the caller's choice (network.public_network_access_enabled): the runner's jobs and the customer's runner reach the account over them unless private endpoints are set up outside this module.
  #checkov:skip=CKV_AZURE_206:Redundancy is the caller's choice (replication_type): the runner's transient queues default to ZRS, a customer's state to GZRS.
  #checkov:skip=CKV2_AZURE_1:Microsoft-managed keys with infrastructure (double) encryption by default; customer_managed_key switches to a key of the caller's own.
  #checkov:skip=CKV2_AZURE_33:Private endpoints (and their DNS zones) belong to the caller's network, outside this module.
  name                     = var.name
  resource_group_name      = var.resource_group_name
  location                 = var.location
  account_kind             = "StorageV2"
  account_tier             = "Standard"
  account_replication_type = var.replication_type
  access_tier              = "Hot"

  min_tls_version                   = "TLS1_2"
  https_traffic_only_enabled        = true
  public_network_access_enabled     = var.network.public_network_access_enabled
  allow_nested_items_to_be_public   = false
  shared_access_key_enabled         = false
  default_to_oauth_authentication   = true
  local_user_enabled                = false
  sftp_enabled                      = false
  cross_tenant_replication_enabled  = false
  allowed_copy_scope                = "AAD"
  infrastructure_encryption_enabled = true
  # Queues and tables under the account's key too (by default they keep a service key of their
  # own, which a customer-managed key would not cover): queue messages carry jobs' variables.
  queue_encryption_key_type = "Account"
  table_encryption_key_type = "Account"

  tags = var.tags

  network_rules {
    default_action             = local.firewall_closed ? "Deny" : "Allow"
    bypass                     = ["AzureServices"]
    ip_rules                   = var.network.allowed_ip_ranges
    virtual_network_subnet_ids = var.network.allowed_subnet_ids
  }

  blob_properties {
    versioning_enabled = var.blob_properties.versioning_enabled

    delete_retention_policy {
      days = var.blob_properties.delete_retention_days
    }

    container_delete_retention_policy {
      days = var.blob_properties.container_delete_retention_days
    }
  }

  dynamic "identity" {
    for_each = var.customer_managed_key[*]

    content {
      type         = "UserAssigned"
      identity_ids = [identity.value.user_assigned_identity_id]
    }
  }

  dynamic "customer_managed_key" {
    for_each = var.customer_managed_key[*]

    content {
      key_vault_key_id          = customer_managed_key.value.key_vault_key_id
      user_assigned_identity_id = customer_managed_key.value.user_assigned_identity_id
    }
  }
}

# One diagnostic setting per storage service logged (`<service>Services/default`).
resource "azurerm_monitor_diagnostic_setting" "service" {
  for_each = var.diagnostics == null ? toset([]) : var.diagnostics.services

  name                       = "terrace-${each.key}"
  target_resource_id         = "${azurerm_storage_account.this.id}/${each.key}Services/default"
  log_analytics_workspace_id = var.diagnostics.log_analytics_workspace_id

  dynamic "enabled_log" {
    for_each = var.diagnostics.categories

    content {
      category = enabled_log.value
    }
  }
}
