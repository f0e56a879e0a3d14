variable "name" {
  description = "Name of the storage account: 3 to 24 lowercase letters and digits, unique across Azure (the calling modules check it)."
  type        = string
  nullable    = false
}

variable "resource_group_name" {
  description = "Resource group of the storage account."
  type        = string
  nullable    = false
}

variable "location" {
  description = "Azure region of the storage account."
  type        = string
  nullable    = false
}

variable "replication_type" {
  description = "Redundancy of the account: LRS, ZRS, GRS, RAGRS, GZRS or RAGZRS."
  type        = string
  nullable    = false

  validation {
    condition     = contains(["LRS", "ZRS", "GRS", "RAGRS", "GZRS", "RAGZRS"], var.replication_type)
    error_message = "replication_type must be one of LRS, ZRS, GRS, RAGRS, GZRS or RAGZRS."
  }
}

variable "network" {
  description = <<-EOT
    Who may reach the account. `public_network_access_enabled`: whether its public endpoints answer at
    all (turn it off only where every client comes through a private endpoint). `allowed_ip_ranges`
    (public IPv4 addresses or CIDR ranges) and `allowed_subnet_ids` (subnets with the Microsoft.Storage
    service endpoint): naming any closes the firewall to everything else; naming none leaves it open,
    access resting on Entra ID alone (shared keys are off).
  EOT
  type = object({
    public_network_access_enabled = optional(bool, true)
    allowed_ip_ranges             = optional(list(string), [])
    allowed_subnet_ids            = optional(list(string), [])
  })
  default  = {}
  nullable = false
}

variable "customer_managed_key" {
  description = <<-EOT
    Encrypt the account (blobs and queues alike) with a key of your own instead of a Microsoft-managed one:
    `key_vault_key_id` (version-less for automatic rotation) and the `user_assigned_identity_id` that may
    wrap and unwrap with it.
  EOT
  type = object({
    key_vault_key_id          = string
    user_assigned_identity_id = string
  })
  default = null
}

variable "blob_properties" {
  description = <<-EOT
    The blob service's data protection, as azurerm's `blob_properties` block names it.
    `versioning_enabled`: keep a previous version of every blob that is overwritten or deleted.
    `delete_retention_days` and `container_delete_retention_days`: how long a deleted (or
    overwritten) blob, and a deleted container, can still be restored, each 1 to 365 days.
  EOT
  type = object({
    versioning_enabled              = optional(bool, false)
    delete_retention_days           = optional(number, 7)
    container_delete_retention_days = optional(number, 7)
  })
  default  = {}
  nullable = false

  validation {
    condition     = alltrue([for days in [var.blob_properties.delete_retention_days, var.blob_properties.container_delete_retention_days] : days >= 1 && days <= 365])
    error_message = "blob_properties.delete_retention_days and .container_delete_retention_days must each be between 1 and 365."
  }
}

variable "diagnostics" {
  description = <<-EOT
    Send the storage services' resource logs to a Log Analytics workspace: `log_analytics_workspace_id`,
    the `services` to log (blob, queue, table, file) and the log `categories`
    (StorageRead, StorageWrite, StorageDelete). Null: no diagnostic settings.
  EOT
  type = object({
    log_analytics_workspace_id = string
    services                   = set(string)
    categories                 = optional(set(string), ["StorageRead", "StorageWrite", "StorageDelete"])
  })
  default = null

  validation {
    condition     = var.diagnostics == null || length(setsubtract(try(var.diagnostics.services, []), ["blob", "queue", "table", "file"])) == 0
    error_message = "diagnostics.services may only name blob, queue, table and file."
  }
}

variable "tags" {
  description = "Tags for the storage account."
  type        = map(string)
  default     = {}
  nullable    = false
}
