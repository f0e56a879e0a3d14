# One runner, in the operator's subscription, and one customer, "acme", in a subscription (and
# tenant) of their own. The customer's app trusts the runner's identity; the runner's registry
# takes the customer's entry.

resource "azurerm_resource_group" "runner" {
  name     = "rg-terrace-runner"
  location = var.location
}

module "runner" {
  source = "../../modules/runner"

  name                = "terrace"
  resource_group_name = azurerm_resource_group.runner.name
  location            = azurerm_resource_group.runner.location
  image               = var.image
  registry            = var.registry
  storage             = { account_name = var.operator.storage_account_name }
  platform_principals = var.platform_principals

  tenants = {
    acme = module.acme.tenant_registry_entry
  }
  sweeps = {
    drift_cron = "30 5 * * 1-5"
  }
}

# acme's resource groups: one for the state's storage account, and one for what acme's
# templates deploy, the only one the runner's app may manage.
resource "azurerm_resource_group" "acme" {
  for_each = {
    state     = "rg-terrace-state"
    workloads = "rg-acme-workloads"
  }
  provider = azurerm.customer

  name     = each.value
  location = var.location
}

module "acme" {
  source = "../../modules/customer"
  providers = {
    azurerm = azurerm.customer
    azuread = azuread.customer
  }

  resource_group_name = azurerm_resource_group.acme["state"].name
  location            = azurerm_resource_group.acme["state"].location
  runner_identity     = module.runner.identity
  state_storage       = { account_name = var.customer.storage_account_name }

  workloads = {
    role_assignments = {
      workloads = {
        scope                = azurerm_resource_group.acme["workloads"].id
        role_definition_name = "Contributor"
      }
    }
  }
}
