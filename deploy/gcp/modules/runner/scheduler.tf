locals {
  # Both sweeps take the same body: {} for every registered tenant, or the tenants named.
  sweep_body = length(var.sweep_tenants) == 0 ? "{}" : jsonencode({ tenants = var.sweep_tenants })

  sweeps = {
    for sweep, schedule in {
      backup = var.backup_schedule
      drift  = var.drift_schedule
    } : sweep => schedule if schedule != null
  }
}

resource "google_cloud_scheduler_job" "sweep" {
  for_each = local.sweeps

  project     = var.project_id
  region      = coalesce(var.scheduler_region, var.region)
  name        = "${var.name}-${each.key}-sweep"
  description = "Calls POST /sweeps/${each.key} on the Terrace runner."
  schedule    = each.value
  time_zone   = var.schedule_time_zone
  # Cloud Scheduler waits at most 30 minutes for an HTTP target.
  attempt_deadline = "${min(var.request_timeout_seconds, 1800)}s"

  http_target {
    http_method = "POST"
    uri         = "${google_cloud_run_v2_service.this.uri}/sweeps/${each.key}"
    body        = base64encode(local.sweep_body)
    headers = {
      "Content-Type" = "application/json"
    }

    oidc_token {
      service_account_email = google_service_account.this["scheduler"].email
      audience              = local.audience
    }
  }

  depends_on = [google_project_service.this, google_cloud_run_v2_service_iam_member.invoker]
}
