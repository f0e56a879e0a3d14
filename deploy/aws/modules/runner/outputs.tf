output "account_id" {
  description = "The account the runner runs in."
  value       = local.account_id
}

output "runner_role_arn" {
  description = "The role the function and the ECS task run as: the principal each customer's role trusts (with its ExternalId)."
  value       = aws_iam_role.runner.arn
}

output "runner_role_name" {
  description = "Name of the runner role."
  value       = aws_iam_role.runner.name
}

output "function_name" {
  description = "Name of the Lambda function."
  value       = aws_lambda_function.this.function_name
}

output "function_arn" {
  description = "ARN of the Lambda function."
  value       = aws_lambda_function.this.arn
}

output "jobs_queue_url" {
  description = "URL of the jobs queue: where the platform sends job messages."
  value       = aws_sqs_queue.this["jobs"].url
}

output "jobs_queue_arn" {
  description = "ARN of the jobs queue."
  value       = aws_sqs_queue.this["jobs"].arn
}

output "results_queue_url" {
  description = "URL of the results queue: every result, rejection and handoff."
  value       = aws_sqs_queue.this["results"].url
}

output "results_queue_arn" {
  description = "ARN of the results queue."
  value       = aws_sqs_queue.this["results"].arn
}

output "dead_letter_queue_urls" {
  description = "URLs of the dead-letter queues: `jobs` (job messages received max_receive_count times) and `events` (sweeps that failed every retry)."
  value       = { for k, q in aws_sqs_queue.dead_letter : k => q.url }
}

output "dead_letter_queue_arns" {
  description = "ARNs of the dead-letter queues, by the same keys."
  value       = { for k, q in aws_sqs_queue.dead_letter : k => q.arn }
}

output "kms_key_arn" {
  description = "The KMS key of the environment, queues, logs and the task's registry (created or given)."
  value       = local.kms_key_arn
}

output "ecs_cluster_arn" {
  description = "ARN of the ECS cluster long jobs run in (null without the handoff)."
  value       = one(aws_ecs_cluster.this[*].arn)
}

output "ecs_task_definition_arn" {
  description = "ARN of the task definition of long jobs (null without the handoff)."
  value       = one(aws_ecs_task_definition.this[*].arn)
}

output "log_group_names" {
  description = "Log groups: `function`, and `task` with the handoff."
  value       = { for k, g in aws_cloudwatch_log_group.this : k => g.name }
}

output "schedule_arns" {
  description = "ARNs of the sweeps' schedules, by sweep."
  value       = { for k, s in aws_scheduler_schedule.this : k => s.arn }
}
