output "jobs_topic" {
  description = "Publish acme's job messages ({\"job\": {…, \"tenant\": \"acme\", …}}) here."
  value       = module.runner.topics["jobs"]
}

output "runner" {
  description = "The runner's service (name, URL, audience), topics and service accounts."
  value = {
    service          = module.runner.service
    topics           = module.runner.topics
    service_accounts = module.runner.service_accounts
  }
}

output "acme" {
  description = "acme's entry in the runner's tenant registry."
  value       = module.acme.tenant_registry_entry
}
