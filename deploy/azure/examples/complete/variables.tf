variable "operator" {
  description = "The operator's side: `tenant_id` and `subscription_id` where the runner runs, and the globally unique name of its queues' storage account."
  type = object({
    tenant_id            = string
    subscription_id      = string
    storage_account_name = string
  })
}

variable "customer" {
  description = "The customer's side (tenant \"acme\"): `tenant_id` and `subscription_id`, and the globally unique name of the state's storage account."
  type = object({
    tenant_id            = string
    subscription_id      = string
    storage_account_name = string
  })
}

variable "location" {
  description = "Azure region for both sides."
  type        = string
  default     = "westeurope"
}

variable "image" {
  description = "The runner's image, built from deploy/Dockerfile (target azure) and pushed to a registry the jobs can pull from."
  type        = string
}

variable "registry" {
  description = "The Azure Container Registry holding `image` (`login_server`, `acr_id`), pulled from with the runner's identity. Null: a public image."
  type = object({
    login_server = string
    acr_id       = string
  })
  default = null
}

variable "platform_principals" {
  description = "The platform's identities (name => `principal_id`, `principal_type`), which send jobs and read results."
  type = map(object({
    principal_id   = string
    principal_type = optional(string, "ServicePrincipal")
  }))
  default = {}
}
