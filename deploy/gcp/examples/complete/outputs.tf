output "jobs_topic" {
  description = "Publish acme's job messages ({\"job\": {…, \"tenant\": \"acme\", …}}) here."
  value       = module.runner.pubsub.topics["jobs"]
}

output "runner" {
  description = "The runner's service (name, URL, audience), topics and subscriptions, and service accounts."
  value = {
    service          = module.runner.cloud_run.service
    pubsub           = module.runner.pubsub
    service_accounts = module.runner.service_accounts
  }
}

output "acme" {
  description = "acme's entry in the runner's tenant registry."
  value       = module.acme.tenant_registry_entry
}
