locals {
  job_id = "projects/${var.project_id}/locations/${var.region}/jobs/${var.name}-task"

  # Both the service and the Cloud Run Job: the registry, where jobs go back and results go.
  common_env = merge(var.container.env, {
    TERRACE_TENANTS         = local.tenants_json
    TERRACE_JOBS_TOPIC      = google_pubsub_topic.this["jobs"].id
    TERRACE_RESULTS_TOPIC   = google_pubsub_topic.this["results"].id
    TERRACE_REQUEST_TIMEOUT = tostring(var.service.request_timeout_seconds)
    TERRACE_REQUEUE_WAIT    = tostring(var.service.requeue_wait_seconds)
    TERRACE_TASK_LEASE_WAIT = tostring(var.task.lease_wait_seconds)
    }, var.templates == null ? {} : {
    TERRACE_TEMPLATES = trim("gs://${var.templates.bucket}/${trim(var.templates.prefix, "/")}", "/")
  })

  # The environment of the service's and of the job's containers: the service alone learns who
  # may call it and where long jobs go.
  env = {
    task = local.common_env
    service = merge(local.common_env, {
      TERRACE_PUSH_AUDIENCE         = local.audience
      TERRACE_PUSH_SERVICE_ACCOUNTS = join(",", [google_service_account.this["pusher"].email, google_service_account.this["scheduler"].email])
      TERRACE_CLOUD_RUN_JOB         = local.job_id
    })
  }

  limits = {
    cpu    = var.container.cpu
    memory = var.container.memory
  }

  # Second generation, for the service and the job: full Linux compatibility for the per-job
  # users terraform runs as and the runner's non-dumpable process.
  execution_environment = "EXECUTION_ENVIRONMENT_GEN2"
}

resource "google_cloud_run_v2_service" "this" {
  project             = var.project_id
  location            = var.region
  name                = var.name
  description         = "Terrace runner: runs the job messages Pub/Sub pushes and the sweeps Cloud Scheduler calls."
  ingress             = var.service.ingress
  custom_audiences    = [local.audience]
  labels              = var.labels
  deletion_protection = var.deletion_protection

  template {
    service_account                  = local.runner_email
    execution_environment            = local.execution_environment
    timeout                          = "${var.service.request_timeout_seconds}s"
    max_instance_request_concurrency = var.service.max_concurrency
    labels                           = var.labels

    scaling {
      min_instance_count = var.service.instances.min
      max_instance_count = var.service.instances.max
    }

    containers {
      image = var.container.image

      # CPU is allocated while a request runs, and every job runs inside its push's request.
      resources {
        limits            = local.limits
        cpu_idle          = true
        startup_cpu_boost = true
      }

      ports {
        container_port = 8080
      }

      dynamic "env" {
        for_each = local.env.service
        content {
          name  = env.key
          value = env.value
        }
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
      service_account       = local.runner_email
      execution_environment = local.execution_environment
      timeout               = var.task.timeout
      max_retries           = var.task.max_retries

      containers {
        image = var.container.image
        # The service's executions override these args with the same ["task"] and add
        # TERRACE_JOB_REF, the staged message's reference, and their own task timeout.
        args = ["task"]

        dynamic "env" {
          for_each = local.env.task
          content {
            name  = env.key
            value = env.value
          }
        }

        resources {
          limits = local.limits
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

# Published templates: the runner reads each job's version (and the modules it pins) at run time.
resource "google_storage_bucket_iam_member" "templates" {
  count = var.templates == null ? 0 : 1

  bucket = var.templates.bucket
  role   = "roles/storage.objectViewer"
  member = local.runner
}
