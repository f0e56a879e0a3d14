output "runner_service_account_email" {
  description = "The runner's own service account (RUNNER): each customer grants it roles/iam.serviceAccountTokenCreator on their service account (the customer module's runner_service_account_email)."
  value       = google_service_account.this["runner"].email
}

output "service_accounts" {
  description = "The module's service accounts' emails: runner (the service and its job run as it), pusher (signs the push subscription's OIDC tokens), scheduler (signs the sweeps' OIDC tokens)."
  value       = { for role, account in google_service_account.this : role => account.email }
}

output "service" {
  description = "The Cloud Run service: its id, name, URL, and the audience every OIDC token sent to it carries (TERRACE_PUSH_AUDIENCE)."
  value = {
    id       = google_cloud_run_v2_service.this.id
    name     = google_cloud_run_v2_service.this.name
    uri      = google_cloud_run_v2_service.this.uri
    audience = local.audience
  }
}

output "job_id" {
  description = "The Cloud Run Job that runs jobs too long for a request (TERRACE_CLOUD_RUN_JOB): projects/P/locations/L/jobs/J."
  value       = local.job_id
}

output "topics" {
  description = "The topics' ids (projects/P/topics/T), by role: jobs (publish {\"job\": {…}} here), results (every new result and rejection), dead-letter."
  value       = { for role, topic in google_pubsub_topic.this : role => topic.id }
}

output "subscriptions" {
  description = "The subscriptions' ids: jobs (the push to the service) and dead-letters (pull; keeps what the push gave up on)."
  value = {
    jobs         = google_pubsub_subscription.jobs.id
    dead-letters = google_pubsub_subscription.dead_letters.id
  }
}

output "scheduler_jobs" {
  description = "The sweep schedules' names, by sweep (backup, drift)."
  value       = { for sweep, job in google_cloud_scheduler_job.sweep : sweep => job.name }
}
