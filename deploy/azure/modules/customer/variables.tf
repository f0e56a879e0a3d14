variable "resource_group_name" {
  description = "Existing resource group, in the customer's subscription, for the state's storage account."
  type        = string
  nullable    = false
}

variable "location" {
  description = "Azure region of the state's storage account."
  type        = string
  nullable    = false
}

variable "state_storage" {
  description = <<-EOT
    Where Terrace keeps this customer's state. `account_name`: 3 to 24 lowercase letters and digits,
    unique across Azure. `container_name` and `prefix`: the private container, and the folder in it,
    that the runner's registry names. `replication_type`: GZRS by default (choose GRS where the region
    has no availability zones). `customer_managed_key`: encrypt with a key of the customer's own
    (`key_vault_key_id`, and the `user_assigned_identity_id` allowed to use it). `allowed_ip_ranges`
    and `allowed_subnet_ids` close the account's firewall to all else: list the runner's outbound IPs
    (the runner module's `environment.outbound_ip_addresses` output, stable behind a NAT gateway) and
    whatever else reads the account. `versioning_enabled` keeps the previous version of every
    overwritten or deleted blob for `retention_days.previous_versions` days; deleted blobs and
    containers can be restored for `retention_days.deleted_blobs` and
    `retention_days.deleted_containers` days. `log_analytics_workspace_id`: a workspace of the
    customer's to send the account's blob logs (reads, writes, deletes) to; null: no diagnostic
    settings.
  EOT
  type = object({
    account_name     = string
    container_name   = optional(string, "terrace-state")
    prefix           = optional(string, "terrace")
    replication_type = optional(string, "GZRS")
    customer_managed_key = optional(object({
      key_vault_key_id          = string
      user_assigned_identity_id = string
    }))
    allowed_ip_ranges  = optional(list(string), [])
    allowed_subnet_ids = optional(list(string), [])
    versioning_enabled = optional(bool, true)
    retention_days = optional(object({
      deleted_blobs      = optional(number, 30)
      deleted_containers = optional(number, 30)
      previous_versions  = optional(number, 30)
    }), {})
    log_analytics_workspace_id = optional(string)
  })
  nullable = false

  validation {
    condition     = can(regex("^[a-z0-9]{3,24}$", var.state_storage.account_name))
    error_message = "state_storage.account_name must be 3 to 24 lowercase letters and digits."
  }

  validation {
    condition     = can(regex("^[a-z0-9]([a-z0-9]|-[a-z0-9]){2,62}$", var.state_storage.container_name))
    error_message = "state_storage.container_name must be 3 to 63 lowercase letters, digits and single hyphens, starting and ending with a letter or digit."
  }

  validation {
    condition     = !startswith(var.state_storage.prefix, "/") && !endswith(var.state_storage.prefix, "/")
    error_message = "state_storage.prefix is a folder inside the container, without a leading or trailing slash (it may be empty)."
  }

  validation {
    condition     = alltrue([for days in values(var.state_storage.retention_days) : days >= 1 && days <= 365])
    error_message = "Each of state_storage.retention_days must be between 1 and 365."
  }
}

variable "runner_identity" {
  description = "The runner's managed identity that the customer's app trusts: its `tenant_id` and `principal_id` (object ID). The runner module's `identity` output fits as is."
  type = object({
    tenant_id    = string
    principal_id = string
  })
  nullable = false

  validation {
    condition = alltrue([
      for id in values(var.runner_identity) : can(regex("^[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$", id))
    ])
    error_message = "runner_identity.tenant_id and runner_identity.principal_id must be GUIDs."
  }
}

variable "application" {
  description = "The app registration the runner acts as in the customer's tenant: its `display_name`, extra `owners` (object IDs; whoever applies this module is always one), and the name of its federated credential."
  type = object({
    display_name              = optional(string, "terrace-runner")
    owners                    = optional(list(string), [])
    federated_credential_name = optional(string, "terrace-runner")
  })
  default  = {}
  nullable = false
}

variable "workloads" {
  description = <<-EOT
    What terraform works on, as this customer's app. `subscription_id`: the subscription the registry
    records for it (ARM_SUBSCRIPTION_ID); null: the subscription of this module's azurerm provider.
    `role_assignments`: what the templates' resources need, granted to the app (name => `scope`,
    `role_definition_name`), e.g. `{ workloads = { scope = "/subscriptions/…/resourceGroups/app",
    role_definition_name = "Contributor" } }`. Storage Blob Data Contributor on the state container
    is always granted (as `state`).
  EOT
  type = object({
    subscription_id = optional(string)
    role_assignments = optional(map(object({
      scope                = string
      role_definition_name = string
    })), {})
  })
  default  = {}
  nullable = false

  validation {
    condition     = var.workloads.subscription_id == null || can(regex("^[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$", var.workloads.subscription_id))
    error_message = "workloads.subscription_id must be a GUID."
  }

  validation {
    condition     = !contains(keys(var.workloads.role_assignments), "state")
    error_message = "The name `state` is taken by the state container's own role assignment."
  }
}

variable "tags" {
  description = "Tags for the customer's Azure resources."
  type        = map(string)
  default     = {}
  nullable    = false
}
