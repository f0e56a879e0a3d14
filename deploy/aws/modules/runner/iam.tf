# The ECS task runs jobs as the function does (it assumes the customers' roles and sends to the
# queues), so both run as this one role: customers trust a single ARN.
resource "aws_iam_role" "runner" {
  name = "${var.name}-runner"

  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      { Sid = "Function", Effect = "Allow", Action = "sts:AssumeRole", Principal = { Service = "lambda.amazonaws.com" } },
      {
        Sid       = "Task"
        Effect    = "Allow"
        Action    = "sts:AssumeRole"
        Principal = { Service = "ecs-tasks.amazonaws.com" }
        Condition = {
          ArnLike      = { "aws:SourceArn" = "arn:${local.partition}:ecs:${local.region}:${local.account_id}:*" }
          StringEquals = { "aws:SourceAccount" = local.account_id }
        }
      },
    ]
  })

  permissions_boundary = var.permissions_boundary
  tags                 = var.tags
}

data "aws_iam_policy_document" "runner" {
  source_policy_documents = data.aws_iam_policy_document.customer_roles[*].json

  statement {
    sid = "ConsumeJobs"
    actions = [
      "sqs:ReceiveMessage",
      "sqs:DeleteMessage",
      "sqs:ChangeMessageVisibility",
      "sqs:GetQueueAttributes",
    ]
    resources = [aws_sqs_queue.this["jobs"].arn]
  }

  # Busy jobs and the drift sweep's checks go back on the jobs queue, results on theirs, and the
  # sweeps (asynchronous invocations) that failed every retry on the events dead-letter queue.
  statement {
    sid     = "SendMessages"
    actions = ["sqs:SendMessage"]
    resources = [
      aws_sqs_queue.this["jobs"].arn,
      aws_sqs_queue.this["results"].arn,
      aws_sqs_queue.dead_letter["events"].arn,
    ]
  }

  statement {
    sid       = "UseKey"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [local.kms_key_arn]
  }

  statement {
    sid       = "WriteLogs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${local.log_group_arns["function"]}:*"]
  }

  # Published templates: each job reads its version's listing and, when the runner's copy
  # differs, its files.
  dynamic "statement" {
    for_each = local.templates == null ? [] : [local.templates]
    content {
      sid       = "ReadTemplates"
      actions   = ["s3:GetObject"]
      resources = [statement.value.prefix == "" ? "${statement.value.bucket_arn}/*" : "${statement.value.bucket_arn}/${statement.value.prefix}/*"]
    }
  }

  # Without it S3 answers a missing object with 403, not 404, and a job naming a version not
  # published would be retried instead of refused. A GET carries no s3:prefix to condition on.
  dynamic "statement" {
    for_each = local.templates == null ? [] : [local.templates]
    content {
      sid       = "ListTemplates"
      actions   = ["s3:ListBucket"]
      resources = [statement.value.bucket_arn]
    }
  }

  # X-Ray takes no resource.
  statement {
    sid       = "Trace"
    actions   = ["xray:PutTraceSegments", "xray:PutTelemetryRecords"]
    resources = ["*"]
  }
}

# An IAM statement needs a resource: without tenants, there is none.
data "aws_iam_policy_document" "customer_roles" {
  count = local.has_tenants ? 1 : 0

  statement {
    sid       = "AssumeCustomerRoles"
    actions   = ["sts:AssumeRole"]
    resources = local.customer_role_arns
  }
}

data "aws_iam_policy_document" "handoff" {
  count = var.ecs_handoff.enabled ? 1 : 0

  statement {
    sid     = "RunTask"
    actions = ["ecs:RunTask"]
    # Every revision of the family, so that a new one is never refused while the function's
    # environment catches up.
    resources = ["arn:${local.partition}:ecs:${local.region}:${local.account_id}:task-definition/${aws_ecs_task_definition.this[0].family}:*"]

    condition {
      test     = "ArnEquals"
      variable = "ecs:cluster"
      values   = [aws_ecs_cluster.this[0].arn]
    }
  }

  statement {
    sid       = "PassTaskRoles"
    actions   = ["iam:PassRole"]
    resources = [aws_iam_role.runner.arn, aws_iam_role.execution[0].arn]

    condition {
      test     = "StringEquals"
      variable = "iam:PassedToService"
      values   = ["ecs-tasks.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "scheduler" {
  name = "${var.name}-scheduler"

  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Action    = "sts:AssumeRole"
      Principal = { Service = "scheduler.amazonaws.com" }
      Condition = { StringEquals = { "aws:SourceAccount" = local.account_id } }
    }]
  })

  permissions_boundary = var.permissions_boundary
  tags                 = var.tags
}

data "aws_iam_policy_document" "scheduler" {
  # The function's ARN is spelled out: the function waits for the roles' policies, so cannot come first.
  statement {
    sid       = "InvokeFunction"
    actions   = ["lambda:InvokeFunction"]
    resources = [local.function_arn]
  }
}

resource "aws_iam_role" "execution" {
  count = var.ecs_handoff.enabled ? 1 : 0

  name = "${var.name}-ecs-execution"

  assume_role_policy = jsonencode({
    Version   = "2012-10-17"
    Statement = [{ Effect = "Allow", Action = "sts:AssumeRole", Principal = { Service = "ecs-tasks.amazonaws.com" } }]
  })

  permissions_boundary = var.permissions_boundary
  tags                 = var.tags
}

data "aws_iam_policy_document" "execution" {
  count = var.ecs_handoff.enabled ? 1 : 0

  # The layers come from the image's repository only; ECR takes no resource for the token.
  statement {
    sid       = "PullImage"
    actions   = ["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]
    resources = [local.ecr_repository_arn]
  }

  statement {
    sid       = "EcrToken"
    actions   = ["ecr:GetAuthorizationToken"]
    resources = ["*"]
  }

  statement {
    sid       = "ReadRegistry"
    actions   = ["ssm:GetParameters"]
    resources = [aws_ssm_parameter.tenants[0].arn]
  }

  statement {
    sid       = "DecryptRegistry"
    actions   = ["kms:Decrypt"]
    resources = [local.kms_key_arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["ssm.${local.region}.${data.aws_partition.current.dns_suffix}"]
    }
  }

  statement {
    sid       = "WriteLogs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${local.log_group_arns["task"]}:*"]
  }
}

resource "aws_iam_role_policy" "this" {
  for_each = merge(
    {
      runner    = { role = aws_iam_role.runner.id, policy = data.aws_iam_policy_document.runner.json }
      scheduler = { role = aws_iam_role.scheduler.id, policy = data.aws_iam_policy_document.scheduler.json }
    },
    var.ecs_handoff.enabled ? {
      handoff   = { role = aws_iam_role.runner.id, policy = data.aws_iam_policy_document.handoff[0].json }
      execution = { role = aws_iam_role.execution[0].id, policy = data.aws_iam_policy_document.execution[0].json }
    } : {},
  )

  name   = each.key
  role   = each.value.role
  policy = each.value.policy
}
