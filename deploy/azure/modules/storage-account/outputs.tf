output "account" {
  description = "The storage account: resource `id`, `name`, and its `blob_endpoint` and `queue_endpoint` (https://ACCOUNT.blob.core.windows.net, without a trailing slash)."
  value = {
    id             = azurerm_storage_account.this.id
    name           = azurerm_storage_account.this.name
    blob_endpoint  = trimsuffix(azurerm_storage_account.this.primary_blob_endpoint, "/")
    queue_endpoint = trimsuffix(azurerm_storage_account.this.primary_queue_endpoint, "/")
  }
}
