locals {
  job_id = "projects/${var.project_id}/locations/${var.region}/jobs/${var.name}-task"

  # Both the service and the Cloud Run Job: the registry, where jobs go back and results go.
  common_env = merge(var.env, {
    TERRACE_TENANTS         = local.tenants_json
    TERRACE_JOBS_TOPIC      = google_pubsub_topic.this["jobs"].id
    TERRACE_RESULTS_TOPIC   = google_pubsub_topic.this["results"].id
    TERRACE_REQUEST_TIMEOUT = tostring(var.request_timeout_seconds)
    TERRACE_REQUEUE_WAIT    = tostring(var.requeue_wait_seconds)
    TERRACE_TASK_LEASE_WAIT = tostring(var.task_lease_wait_seconds)
  })

  # The service alone: who may call it, and where long jobs go.
  service_env = merge(local.common_env, {
    TERRACE_PUSH_AUDIENCE         = local.audience
    TERRACE_PUSH_SERVICE_ACCOUNTS = join(",", [google_service_account.this["pusher"].email, google_service_account.this["scheduler"].email])
    TERRACE_CLOUD_RUN_JOB         = local.job_id
  })

  limits = {
    cpu    = var.cpu
    memory = var.memory
  }
}

resource "google_cloud_run_v2_service" "this" {
  project             = var.project_id
  location            = var.region
  name                = var.name
  description         = "Terrace runner: runs the job messages Pub/Sub pushes and the sweeps Cloud Scheduler calls."
  ingress             = var.ingress
  custom_audiences    = [local.audience]
  labels              = var.labels
  deletion_protection = var.deletion_protection

  template {
    service_account                  = google_service_account.this["runner"].email
    timeout                          = "${var.request_timeout_seconds}s"
    max_instance_request_concurrency = var.max_concurrency
    # Second generation: full Linux compatibility for the per-job users terraform runs as and
    # the runner's non-dumpable process.
    execution_environment = "EXECUTION_ENVIRONMENT_GEN2"
    labels                = var.labels

    scaling {
      min_instance_count = var.min_instances
      max_instance_count = var.max_instances
    }

    containers {
      image = var.image

      dynamic "env" {
        for_each = local.service_env
        content {
          name  = env.key
          value = env.value
        }
      }

      # CPU is allocated while a request runs, and every job runs inside its push's request.
      resources {
        limits            = local.limits
        cpu_idle          = true
        startup_cpu_boost = true
      }

      ports {
        container_port = 8080
      }
    }
  }

  depends_on = [google_project_service.this]
}

resource "google_cloud_run_v2_job" "task" {
  project             = var.project_id
  location            = var.region
  name                = "${var.name}-task"
  labels              = var.labels
  deletion_protection = var.deletion_protection

  template {
    task_count = 1
    labels     = var.labels

    template {
      service_account       = google_service_account.this["runner"].email
      timeout               = "${var.task_timeout_seconds}s"
      max_retries           = var.task_max_retries
      execution_environment = "EXECUTION_ENVIRONMENT_GEN2"

      containers {
        image = var.image
        # The service's executions override these args with the same ["task"] and add
        # TERRACE_JOB_REF, the staged message's reference, and their own task timeout.
        args = ["task"]

        resources {
          limits = local.limits
        }

        dynamic "env" {
          for_each = local.common_env
          content {
            name  = env.key
            value = env.value
          }
        }
      }
    }
  }

  depends_on = [google_project_service.this]
}

# Only the push subscription's and the scheduler's accounts may invoke the service; nobody
# unauthenticated (the service checks the tokens again itself).
resource "google_cloud_run_v2_service_iam_member" "invoker" {
  for_each = toset(["pusher", "scheduler"])

  project  = google_cloud_run_v2_service.this.project
  location = google_cloud_run_v2_service.this.location
  name     = google_cloud_run_v2_service.this.name
  role     = "roles/run.invoker"
  member   = "serviceAccount:${google_service_account.this[each.key].email}"
}

# The runner starts executions of its own job, with the reference and timeout as overrides.
resource "google_cloud_run_v2_job_iam_member" "runner" {
  project  = google_cloud_run_v2_job.task.project
  location = google_cloud_run_v2_job.task.location
  name     = google_cloud_run_v2_job.task.name
  role     = "roles/run.jobsExecutorWithOverrides"
  member   = local.runner
}
