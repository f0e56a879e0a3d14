/**
 * A Terrace customer's side on Google Cloud: the state bucket, the service account the runner
 * impersonates for this tenant, and the grants between them. Apply it in the customer's project;
 * hand its tenant_registry_entry output to the runner's tenants map.
 */

# The APIs Terrace needs in project_id, with enable_apis (never disabled on destroy).
resource "google_project_service" "this" {
  for_each = local.apis

  project            = var.project_id
  service            = each.value
  disable_on_destroy = false
}

locals {
  apis = toset(var.enable_apis ? [
    "iam.googleapis.com",
    "iamcredentials.googleapis.com",
    "storage.googleapis.com",
  ] : [])

  tenant = "serviceAccount:${google_service_account.tenant.email}"

  # With a key: Cloud Storage's service agent encrypts the objects; the tenant's service account
  # is granted it too, as the runner's deployment notes ask.
  kms_members = var.state_bucket.kms_key_name == null ? {} : {
    storage-agent = "serviceAccount:${data.google_storage_project_service_account.this[0].email_address}"
    tenant        = local.tenant
  }

  # With a prefix, the tenant's service account reaches only PREFIX/…: its objects, and
  # listings whose prefix lies under it (Terrace lists nothing else).
  object_condition = var.state_bucket.prefix == "" || !var.state_bucket.restrict_to_prefix ? [] : [{
    title       = "terrace-prefix"
    description = "Only the objects under ${var.state_bucket.prefix}/ and listings within it."
    expression = join(" || ", [
      "resource.name.startsWith(\"projects/_/buckets/${var.state_bucket.name}/objects/${var.state_bucket.prefix}/\")",
      "api.getAttribute(\"storage.googleapis.com/objectListPrefix\", \"\").startsWith(\"${var.state_bucket.prefix}/\")",
    ])
  }]
}

resource "google_service_account" "tenant" {
  project      = var.project_id
  account_id   = var.service_account.account_id
  display_name = "Terrace (${var.tenant})"
  description  = "Impersonated by the Terrace runner for tenant ${var.tenant}: reaches the state bucket and whatever the tenant's templates manage."

  depends_on = [google_project_service.this]
}

# The runner's service account, and nothing else, may mint tokens for this one.
resource "google_service_account_iam_member" "runner" {
  service_account_id = google_service_account.tenant.name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = "serviceAccount:${var.runner_service_account_email}"
}

resource "google_project_iam_member" "tenant" {
  for_each = toset(var.service_account.project_roles)

  project = var.project_id
  role    = each.value
  member  = local.tenant
}

data "google_storage_project_service_account" "this" {
  count = var.state_bucket.kms_key_name == null ? 0 : 1

  project = var.project_id

  depends_on = [google_project_service.this]
}

resource "google_kms_crypto_key_iam_member" "this" {
  for_each = local.kms_members

  crypto_key_id = var.state_bucket.kms_key_name
  role          = "roles/cloudkms.cryptoKeyEncrypterDecrypter"
  member        = each.value
}

resource "google_storage_bucket" "states" {
  project                     = var.project_id
  name                        = var.state_bucket.name
  location                    = var.state_bucket.location
  storage_class               = "STANDARD"
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = var.state_bucket.force_destroy
  labels                      = var.state_bucket.labels

  versioning {
    enabled = true
  }

  # Terrace writes every state version as an object of its own; overwritten objects (the lease,
  # the current state's copy, change marks) keep their old versions this long.
  lifecycle_rule {
    condition {
      days_since_noncurrent_time = var.state_bucket.noncurrent_version_retention_days
      with_state                 = "ARCHIVED"
    }
    action {
      type = "Delete"
    }
  }

  lifecycle_rule {
    condition {
      age = 1
    }
    action {
      type = "AbortIncompleteMultipartUpload"
    }
  }

  dynamic "encryption" {
    for_each = var.state_bucket.kms_key_name == null ? [] : [var.state_bucket.kms_key_name]
    content {
      default_kms_key_name = encryption.value
    }
  }

  dynamic "logging" {
    for_each = var.state_bucket.access_log_bucket == null ? [] : [var.state_bucket.access_log_bucket]
    content {
      log_bucket        = logging.value
      log_object_prefix = var.state_bucket.name
    }
  }

  depends_on = [google_project_service.this, google_kms_crypto_key_iam_member.this]
}

resource "google_storage_bucket_iam_member" "tenant" {
  bucket = google_storage_bucket.states.name
  role   = "roles/storage.objectAdmin"
  member = local.tenant

  dynamic "condition" {
    for_each = local.object_condition
    content {
      title       = condition.value.title
      description = condition.value.description
      expression  = condition.value.expression
    }
  }
}
