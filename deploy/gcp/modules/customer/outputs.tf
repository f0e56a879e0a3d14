output "tenant" {
  description = "The tenant's name in the runner's registry: the key of its entry in the runner module's tenants."
  value       = var.tenant
}

output "tenant_registry_entry" {
  description = <<-EOT
    This tenant's target in the runner's registry: use it as the value of tenants[tenant] in the
    runner module (TERRACE_TENANTS). Its service_account is the service account the runner
    impersonates for this tenant, its bucket the state bucket's name, its prefix
    state_bucket.prefix and its kms_key state_bucket.kms_key_name (null without one).
  EOT
  value = {
    service_account = google_service_account.tenant.email
    bucket          = google_storage_bucket.states.name
    prefix          = var.state_bucket.prefix
    kms_key         = var.state_bucket.kms_key_name
  }
}
