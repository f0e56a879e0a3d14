output "queue_urls" {
  description = "Where the platform sends job messages (`jobs`: `{\"job\": {\"tenant\": \"acme\", …}}`), and where results, rejections and handoffs arrive (`results`)."
  value = {
    jobs    = module.runner.queues["jobs"].url
    results = module.runner.queues["results"].url
  }
}

output "runner_role_arn" {
  description = "The principal customers' roles trust."
  value       = module.runner.runner_role_arn
}

output "acme" {
  description = "acme's side: the `role_arn` the runner assumes in acme's account, and where it keeps acme's `state` (bucket, prefix, lease table)."
  value = {
    role_arn = module.acme.role.arn
    state    = module.acme.state
  }
}
