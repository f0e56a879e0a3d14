output "jobs_queue_url" {
  description = "Where the platform sends job messages (`{\"job\": {\"tenant\": \"acme\", …}}`)."
  value       = module.runner.jobs_queue_url
}

output "results_queue_url" {
  description = "Where results, rejections and handoffs arrive."
  value       = module.runner.results_queue_url
}

output "runner_role_arn" {
  description = "The principal customers' roles trust."
  value       = module.runner.runner_role_arn
}

output "acme_role_arn" {
  description = "The role the runner assumes in acme's account."
  value       = module.acme.role_arn
}

output "acme_bucket" {
  description = "acme's state bucket."
  value       = module.acme.bucket
}
