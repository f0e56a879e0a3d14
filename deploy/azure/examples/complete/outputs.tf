output "jobs_queue_url" {
  description = "Where the platform sends jobs (`{\"job\": {…, \"tenant\": \"acme\"}}`)."
  value       = module.runner.queues.urls.jobs
}

output "results_queue_url" {
  description = "Where results and rejections arrive."
  value       = module.runner.queues.urls.results
}

output "acme" {
  description = "acme's entry in the runner's tenant registry."
  value       = module.acme.tenant_registry_entry
}
