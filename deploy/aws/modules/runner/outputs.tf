output "function" {
  description = "The Lambda function: its `name`, the `account_id` it runs in, its `arn`, and the `role_name` of the runner role, to attach further policies to."
  value = {
    name       = aws_lambda_function.this.function_name
    account_id = local.account_id
    arn        = aws_lambda_function.this.arn
    role_name  = aws_iam_role.runner.name
  }
}

output "runner_role_arn" {
  description = "The role the function and the ECS task run as: the principal each customer's role trusts (with its ExternalId)."
  value       = aws_iam_role.runner.arn
}

output "queues" {
  description = <<-EOT
    The queues, each with its `url` and `arn`: `jobs`, where the platform sends job messages; `results`, every
    result, rejection and handoff; and the dead-letter queues `jobs-dlq` (job messages received
    queues.max_receive_count times) and `events-dlq` (sweeps that failed every retry).
  EOT
  value = {
    for k, q in merge(aws_sqs_queue.this, { for name, queue in aws_sqs_queue.dead_letter : "${name}-dlq" => queue }) :
    k => { url = q.url, arn = q.arn }
  }
}

output "kms_key_arn" {
  description = "The KMS key of the environment, queues, logs and the task's registry (created or given)."
  value       = local.kms_key_arn
}

output "ecs_handoff" {
  description = "The ECS cluster long jobs run in (`cluster_arn`) and their task definition (`task_definition_arn`); null without the handoff."
  value = var.ecs_handoff.enabled ? {
    cluster_arn         = aws_ecs_cluster.this[0].arn
    task_definition_arn = aws_ecs_task_definition.this[0].arn
  } : null
}

output "log_group_names" {
  description = "Log groups: `function`, and `task` with the handoff."
  value       = { for k, g in aws_cloudwatch_log_group.this : k => g.name }
}

output "schedule_arns" {
  description = "ARNs of the sweeps' schedules, by sweep (`backup-sweep`, `drift-sweep`)."
  value       = { for k, s in aws_scheduler_schedule.this : k => s.arn }
}
