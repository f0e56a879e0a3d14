# jobs: what the function runs; failed receives go to the jobs dead-letter queue.
# events: the function's asynchronous invocations (the sweeps) that failed every retry.
resource "aws_sqs_queue" "dead_letter" {
  for_each = toset(["jobs", "events"])

  # A FIFO queue's dead-letter queue is FIFO too.
  name                              = "${var.name}-${each.key}-dlq${each.key == "jobs" && var.queues.fifo ? ".fifo" : ""}"
  fifo_queue                        = each.key == "jobs" && var.queues.fifo ? true : null
  message_retention_seconds         = 1209600
  kms_master_key_id                 = local.kms_key_arn
  kms_data_key_reuse_period_seconds = 300
  tags                              = var.tags
}

# The jobs queue is standard by default: a busy workspace's job is sent again with a delay
# (order is kept by the jobs' `sequence`). With queues.fifo it is FIFO, one message group per
# workspace: each workspace's requests are delivered in order, one at a time, and a busy one
# waits at the head of its group instead (docs/ordering.md).
resource "aws_sqs_queue" "this" {
  for_each = {
    jobs    = { visibility_timeout_seconds = var.queues.visibility_timeout_seconds, dead_letter = "jobs", fifo = var.queues.fifo }
    results = { visibility_timeout_seconds = 30, dead_letter = null, fifo = false }
  }

  name                              = "${var.name}-${each.key}${each.value.fifo ? ".fifo" : ""}"
  fifo_queue                        = each.value.fifo ? true : null
  content_based_deduplication       = each.value.fifo ? true : null
  visibility_timeout_seconds        = each.value.visibility_timeout_seconds
  message_retention_seconds         = var.queues.message_retention_seconds
  kms_master_key_id                 = local.kms_key_arn
  kms_data_key_reuse_period_seconds = 300
  tags                              = var.tags

  redrive_policy = each.value.dead_letter == null ? null : jsonencode({
    deadLetterTargetArn = aws_sqs_queue.dead_letter[each.value.dead_letter].arn
    maxReceiveCount     = var.queues.max_receive_count
  })
}

resource "aws_sqs_queue_redrive_allow_policy" "jobs" {
  queue_url = aws_sqs_queue.dead_letter["jobs"].id

  redrive_allow_policy = jsonencode({
    redrivePermission = "byQueue"
    sourceQueueArns   = [aws_sqs_queue.this["jobs"].arn]
  })
}

resource "aws_lambda_event_source_mapping" "jobs" {
  event_source_arn        = aws_sqs_queue.this["jobs"].arn
  function_name           = aws_lambda_function.this.arn
  batch_size              = var.queues.batch_size
  function_response_types = ["ReportBatchItemFailures"]
  enabled                 = local.has_tenants

  dynamic "scaling_config" {
    for_each = var.queues.maximum_concurrency == null ? [] : [var.queues.maximum_concurrency]

    content {
      maximum_concurrency = scaling_config.value
    }
  }
}
