resource "aws_lambda_function" "this" {
  #checkov:skip=CKV_AWS_272:Lambda code signing covers .zip packages only; a container image is pinned by image_uri (use a digest)
  #checkov:skip=CKV_AWS_117:A VPC is optional (function.subnet_ids): the function needs only AWS APIs and what the templates' providers reach

  function_name = var.name
  description   = "Terrace: runs Terraform jobs from the jobs queue, and the backup and drift sweeps"
  role          = aws_iam_role.runner.arn
  package_type  = "Image"
  image_uri     = var.image_uri
  # The image's OpenTofu is the linux_amd64 build.
  architectures = ["x86_64"]

  memory_size                    = var.function.memory_size
  timeout                        = local.function_timeout
  reserved_concurrent_executions = var.function.reserved_concurrent_executions
  kms_key_arn                    = local.kms_key_arn

  ephemeral_storage {
    size = var.function.ephemeral_storage_size
  }

  environment {
    variables = local.function_environment
  }

  tracing_config {
    mode = "Active"
  }

  dead_letter_config {
    target_arn = aws_sqs_queue.dead_letter["events"].arn
  }

  dynamic "vpc_config" {
    for_each = length(var.function.subnet_ids) > 0 ? [true] : []

    content {
      subnet_ids         = var.function.subnet_ids
      security_group_ids = var.function.security_group_ids
    }
  }

  tags = var.tags

  # The log group first, so that Lambda does not create it without retention and key; the policy
  # first, so that the first invocation can do its work.
  depends_on = [
    aws_cloudwatch_log_group.this,
    aws_iam_role_policy.this,
    aws_iam_role_policy_attachment.vpc_access,
  ]

  lifecycle {
    precondition {
      condition     = length(jsonencode(local.function_environment)) <= 4096
      error_message = "The function's environment (the tenant registry and the settings) exceeds the 4 KB Lambda allows: register fewer tenants with this function."
    }
  }
}

# ENIs in the subnets, for vpc_config.
resource "aws_iam_role_policy_attachment" "vpc_access" {
  count = length(var.function.subnet_ids) > 0 ? 1 : 0

  role       = aws_iam_role.runner.name
  policy_arn = "arn:${local.partition}:iam::aws:policy/service-role/AWSLambdaVPCAccessExecutionRole"
}
