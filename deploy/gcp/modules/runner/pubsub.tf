locals {
  topics = {
    jobs        = "Job messages ({\"job\": {…}}) for the Terrace runner; the drift sweep and busy jobs publish here too."
    results     = "Every new result and every rejection of the Terrace runner."
    dead-letter = "Job messages the Terrace runner did not take after max_delivery_attempts deliveries."
  }

  # Topic-level grants: the runner publishes busy jobs' copies, drift checks and results; the
  # Pub/Sub service agent moves undeliverable messages to the dead-letter topic.
  topic_publishers = {
    runner-jobs        = { topic = "jobs", member = local.runner }
    runner-results     = { topic = "results", member = local.runner }
    pubsub-dead-letter = { topic = "dead-letter", member = local.pubsub_agent }
  }
}

resource "google_pubsub_topic" "this" {
  for_each = local.topics

  project                    = var.project_id
  name                       = "${var.name}-${each.key}"
  labels                     = merge(var.labels, { terrace-topic = each.key })
  kms_key_name               = var.pubsub.kms_key_name
  message_retention_duration = var.pubsub.message_retention_duration

  depends_on = [google_project_service.this, google_kms_crypto_key_iam_member.pubsub]
}

resource "google_pubsub_topic_iam_member" "publisher" {
  for_each = local.topic_publishers

  project = var.project_id
  topic   = google_pubsub_topic.this[each.value.topic].name
  role    = "roles/pubsub.publisher"
  member  = each.value.member
}

# Pub/Sub pushes each job message to the service, signed as the pusher, and gives up on it
# after max_delivery_attempts deliveries (a busy workspace's wait does not count: the runner
# acknowledges it and publishes a fresh copy).
resource "google_pubsub_subscription" "jobs" {
  project                    = var.project_id
  name                       = "${var.name}-jobs-push"
  topic                      = google_pubsub_topic.this["jobs"].id
  ack_deadline_seconds       = var.pubsub.ack_deadline_seconds
  message_retention_duration = var.pubsub.message_retention_duration
  labels                     = var.labels

  push_config {
    push_endpoint = "${google_cloud_run_v2_service.this.uri}/pubsub"

    oidc_token {
      service_account_email = google_service_account.this["pusher"].email
      audience              = local.audience
    }
  }

  retry_policy {
    minimum_backoff = "10s"
    maximum_backoff = "600s"
  }

  dead_letter_policy {
    dead_letter_topic     = google_pubsub_topic.this["dead-letter"].id
    max_delivery_attempts = var.pubsub.max_delivery_attempts
  }

  expiration_policy {
    ttl = ""
  }

  depends_on = [google_cloud_run_v2_service_iam_member.invoker]
}

# The Pub/Sub service agent must be able to acknowledge what it forwards to the dead-letter
# topic.
resource "google_pubsub_subscription_iam_member" "dead_letter_subscriber" {
  subscription = google_pubsub_subscription.jobs.id
  role         = "roles/pubsub.subscriber"
  member       = local.pubsub_agent
}

# A dead-letter topic without a subscription drops what it gets: this one keeps the dead
# letters for the operator to read (and to publish again once the cause is fixed).
resource "google_pubsub_subscription" "dead_letters" {
  project                    = var.project_id
  name                       = "${var.name}-dead-letters"
  topic                      = google_pubsub_topic.this["dead-letter"].id
  message_retention_duration = var.pubsub.message_retention_duration
  retain_acked_messages      = false
  ack_deadline_seconds       = 60
  labels                     = var.labels

  expiration_policy {
    ttl = ""
  }
}

# With CMEK, the Pub/Sub service agent encrypts and decrypts the topics' messages.
resource "google_kms_crypto_key_iam_member" "pubsub" {
  count = var.pubsub.kms_key_name == null ? 0 : 1

  crypto_key_id = var.pubsub.kms_key_name
  role          = "roles/cloudkms.cryptoKeyEncrypterDecrypter"
  member        = local.pubsub_agent

  # The service agent exists once the Pub/Sub API is enabled.
  depends_on = [google_project_service.this]
}
