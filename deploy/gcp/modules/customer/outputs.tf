output "service_account_email" {
  description = "The service account the runner impersonates for this tenant."
  value       = google_service_account.tenant.email
}

output "bucket" {
  description = "The state bucket's name."
  value       = google_storage_bucket.states.name
}

output "tenant" {
  description = "The tenant's name in the runner's registry."
  value       = var.tenant
}

output "tenant_registry_entry" {
  description = "This tenant's target in the runner's registry: use it as the value of tenants[tenant] in the runner module (TERRACE_TENANTS)."
  value = {
    service_account = google_service_account.tenant.email
    bucket          = google_storage_bucket.states.name
    prefix          = var.prefix
    kms_key         = var.kms_key_name
  }
}
