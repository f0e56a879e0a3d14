# One runner in the operator's project serving one tenant, acme, whose state bucket and service
# account are in the customer's project. The customer's registry entry is the runner's tenant
# registry; the runner's service account is the one the customer lets impersonate theirs.

module "runner" {
  source = "../../modules/runner"

  providers = {
    google = google.runner
  }

  project_id = var.runner_project_id
  region     = var.region
  name       = "terrace-acme"
  container  = { image = var.image }

  tenants = {
    (module.acme.tenant) = module.acme.tenant_registry_entry
  }

  # Look for drift every six hours (the backup sweep stays hourly).
  sweeps = { drift = "15 */6 * * *" }
}

module "acme" {
  source = "../../modules/customer"

  providers = {
    google = google.customer
  }

  project_id                   = var.customer_project_id
  tenant                       = "acme"
  runner_service_account_email = module.runner.runner_service_account_email

  state_bucket = {
    name     = var.state_bucket_name
    location = var.region
    prefix   = "terrace"
  }
}
