locals {
  # Schedule name suffix => expression; the suffix is also the event the function gets.
  schedules = { for sweep, expression in { backup-sweep = var.schedules.backup, drift-sweep = var.schedules.drift } : sweep => expression if expression != "" }
}

resource "aws_scheduler_schedule" "this" {
  #checkov:skip=CKV_AWS_297:The input is a constant ({"terrace":"<sweep>"} and tenant names), nothing to protect; a CMK would also need kms:Decrypt on the scheduler's role, which may only invoke the function
  for_each = local.schedules

  name                         = "${var.name}-${each.key}"
  description                  = "Terrace ${each.key}"
  schedule_expression          = each.value
  schedule_expression_timezone = var.schedules.timezone
  state                        = local.has_tenants ? "ENABLED" : "DISABLED"

  flexible_time_window {
    mode = "OFF"
  }

  lifecycle {
    precondition {
      condition     = length(setsubtract(var.schedules.tenants, nonsensitive(keys(var.tenants)))) == 0
      error_message = "schedules.tenants names a tenant that is not in tenants."
    }
  }

  target {
    arn      = aws_lambda_function.this.arn
    role_arn = aws_iam_role.scheduler.arn
    input    = jsonencode(merge({ terrace = each.key }, length(var.schedules.tenants) == 0 ? {} : { tenants = var.schedules.tenants }))

    # A sweep that cannot start within the hour is left to the next one.
    retry_policy {
      maximum_event_age_in_seconds = 3600
      maximum_retry_attempts       = 3
    }
  }
}
