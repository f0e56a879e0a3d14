/**
 * Terrace's runner on Google Cloud: the Cloud Run service that Pub/Sub pushes job messages to
 * and Cloud Scheduler calls for the sweeps, the Cloud Run Job it hands long jobs to, the jobs,
 * results and dead-letter topics, and the three service accounts (the runner, the pusher, the
 * scheduler). See deploy/gcp/README.md for what each setting means to the runner.
 */

data "google_project" "this" {
  project_id = var.project_id
}

locals {
  # The service's deterministic URL, known before the service exists (its env names it).
  audience = coalesce(var.service.audience, "https://${var.name}-${data.google_project.this.number}.${var.region}.run.app")

  # The runner parses the registry strictly: a missing prefix is "", a null one an error.
  tenants_json = jsonencode({
    for tenant, target in var.tenants : tenant => { for key, value in target : key => value if value != null }
  })

  pubsub_agent = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-pubsub.iam.gserviceaccount.com"

  apis = toset(var.enable_apis ? [
    "cloudscheduler.googleapis.com",
    "iam.googleapis.com",
    "iamcredentials.googleapis.com",
    "pubsub.googleapis.com",
    "run.googleapis.com",
  ] : [])

  service_accounts = {
    runner = {
      display_name = "Terrace runner (${var.name})"
      description  = "Runs the Terrace service and its Cloud Run Job. Can only impersonate the tenants' service accounts, publish to its topics and start its job."
    }
    pusher = {
      display_name = "Terrace push invoker (${var.name})"
      description  = "Signs the OIDC tokens of the jobs push subscription; may only invoke the Terrace service."
    }
    scheduler = {
      display_name = "Terrace scheduler invoker (${var.name})"
      description  = "Signs the OIDC tokens of the sweep schedules; may only invoke the Terrace service."
    }
  }

  runner_email = google_service_account.this["runner"].email
  runner       = "serviceAccount:${local.runner_email}"

  # Who may mint tokens for whom: the Pub/Sub service agent for the pusher (push tokens; older
  # projects need it granted), and, when asked, the runner for each tenant's service account
  # only, never project-wide.
  token_creators = merge(
    {
      pubsub-agent = {
        service_account_id = google_service_account.this["pusher"].name
        member             = local.pubsub_agent
      }
    },
    var.manage_tenant_impersonation ? {
      for tenant, target in var.tenants : "tenant-${tenant}" => {
        service_account_id = "projects/-/serviceAccounts/${target.service_account}"
        member             = local.runner
      }
    } : {},
  )
}

resource "google_project_service" "this" {
  for_each = local.apis

  project            = var.project_id
  service            = each.value
  disable_on_destroy = false
}

resource "google_service_account" "this" {
  for_each = local.service_accounts

  project      = var.project_id
  account_id   = "${var.name}-${each.key}"
  display_name = each.value.display_name
  description  = each.value.description

  depends_on = [google_project_service.this]
}

resource "google_service_account_iam_member" "token_creator" {
  for_each = local.token_creators

  service_account_id = each.value.service_account_id
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = each.value.member
}

check "timing" {
  assert {
    condition     = var.service.request_timeout_seconds <= var.pubsub.ack_deadline_seconds
    error_message = "service.request_timeout_seconds (${var.service.request_timeout_seconds}) is above pubsub.ack_deadline_seconds (${var.pubsub.ack_deadline_seconds}): a job running in a push past the ack deadline is delivered again while it runs."
  }

  assert {
    condition     = var.service.requeue_wait_seconds < var.service.request_timeout_seconds && 2 * var.service.requeue_wait_seconds <= var.pubsub.ack_deadline_seconds
    error_message = "service.requeue_wait_seconds (${var.service.requeue_wait_seconds}) must stay below the request timeout and well below the ack deadline, or Pub/Sub delivers a held message again and the copies multiply."
  }
}

check "sweep_tenants" {
  assert {
    condition     = length(setsubtract(var.sweeps.tenants, keys(var.tenants))) == 0
    error_message = "sweeps.tenants names tenants that are not registered: ${join(", ", setsubtract(var.sweeps.tenants, keys(var.tenants)))}."
  }
}
