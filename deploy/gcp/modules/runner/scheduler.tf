locals {
  # Both sweeps take the same body: {} for every registered tenant, or the tenants named.
  sweep_body = length(var.sweeps.tenants) == 0 ? "{}" : jsonencode({ tenants = var.sweeps.tenants })

  # An empty schedule leaves its sweep out.
  schedules = {
    for sweep, schedule in {
      backup = var.sweeps.backup
      drift  = var.sweeps.drift
    } : sweep => schedule if trimspace(schedule) != ""
  }
}

resource "google_cloud_scheduler_job" "sweep" {
  for_each = local.schedules

  project     = var.project_id
  region      = coalesce(var.sweeps.region, var.region)
  name        = "${var.name}-${each.key}-sweep"
  description = "Calls POST /sweeps/${each.key} on the Terrace runner."
  schedule    = each.value
  time_zone   = var.sweeps.time_zone
  # Cloud Scheduler waits at most 30 minutes for an HTTP target.
  attempt_deadline = "${min(var.service.request_timeout_seconds, 1800)}s"

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
