output "runner_service_account_email" {
  description = "The runner's own service account (RUNNER): each customer grants it roles/iam.serviceAccountTokenCreator on their service account (the customer module's runner_service_account_email)."
  value       = local.runner_email
}

output "service_accounts" {
  description = "The module's service accounts' emails: runner (the service and its job run as it), pusher (signs the push subscription's OIDC tokens), scheduler (signs the sweeps' OIDC tokens)."
  value       = { for role, account in google_service_account.this : role => account.email }
}

output "cloud_run" {
  description = <<-EOT
    The Cloud Run service and job:
    - service: its id, name, URL (uri), and the audience every OIDC token sent to it carries
      (TERRACE_PUSH_AUDIENCE);
    - job: the Cloud Run Job that runs jobs too long for a request, its name and its id
      projects/P/locations/L/jobs/J (TERRACE_CLOUD_RUN_JOB).
  EOT
  value = {
    service = {
      id       = google_cloud_run_v2_service.this.id
      name     = google_cloud_run_v2_service.this.name
      uri      = google_cloud_run_v2_service.this.uri
      audience = local.audience
    }
    job = {
      id   = local.job_id
      name = google_cloud_run_v2_job.task.name
    }
  }
}

output "pubsub" {
  description = <<-EOT
    The Pub/Sub resources' ids:
    - topics (projects/P/topics/T), by role: jobs (publish {"job": {…}} here), results (every new
      result and rejection), dead-letter;
    - subscriptions: jobs (the push to the service) and dead-letters (pull; keeps what the push
      gave up on).
  EOT
  value = {
    topics = { for role, topic in google_pubsub_topic.this : role => topic.id }
    subscriptions = {
      jobs         = google_pubsub_subscription.jobs.id
      dead-letters = google_pubsub_subscription.dead_letters.id
    }
  }
}

output "scheduler_jobs" {
  description = "The sweep schedules' names, by sweep (backup, drift; a sweep without a schedule has none)."
  value       = { for sweep, job in google_cloud_scheduler_job.sweep : sweep => job.name }
}
