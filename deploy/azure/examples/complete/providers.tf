# Two sides, two sets of providers. Sign in (az login, or ARM_* variables in CI) as a principal
# that may deploy on both sides; where the customer applies their side themselves, give them the
# customer module alone and pass its tenant_registry_entry on to the runner.
#
# Both storage accounts refuse shared keys. The modules create their queues and container
# through Azure Resource Manager, so the provider needs no data-plane access to them
# (`data_plane_available = false`; with azurerm 4 the storage account resource would otherwise
# read its queue service's properties from the data plane); anything that still reaches the data
# plane does so with Entra ID (`storage_use_azuread`).

# The operator's subscription: the runner.
provider "azurerm" {
  subscription_id     = var.operator.subscription_id
  tenant_id           = var.operator.tenant_id
  storage_use_azuread = true

  features {
    storage {
      data_plane_available = false
    }
  }
}

# The customer's subscription and tenant: the state container, the app registration and its
# role assignments.
provider "azurerm" {
  alias               = "customer"
  subscription_id     = var.customer.subscription_id
  tenant_id           = var.customer.tenant_id
  storage_use_azuread = true
  # Whoever applies this in the customer's subscription may hold no subscription-wide right to
  # register resource providers; Microsoft.Storage and Microsoft.Authorization are all it uses.
  resource_provider_registrations = "none"

  features {
    storage {
      data_plane_available = false
    }
  }
}

provider "azuread" {
  alias     = "customer"
  tenant_id = var.customer.tenant_id
}
