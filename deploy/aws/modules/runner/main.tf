data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

data "aws_region" "current" {}

locals {
  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition
  region     = data.aws_region.current.id

  # The README's settings; a longer job goes to the ECS task (timeout minus TERRACE_DEADLINE_MARGIN).
  function_timeout = 900
  function_arn     = "arn:${local.partition}:lambda:${local.region}:${local.account_id}:function:${var.name}"

  # Null fields are left out: the function reads `prefix` as a string and refuses unknown ones.
  registry = { for tenant, target in var.tenants : tenant => { for field, value in target : field => value if value != null } }

  # The registry is sensitive for its ExternalIds; the role ARNs are not, and IAM policies show them.
  customer_role_arns = distinct(nonsensitive([for target in values(var.tenants) : target.role_arn]))
  has_tenants        = nonsensitive(length(var.tenants) > 0)

  ecr                = regex("^(?P<account>[0-9]{12})\\.dkr\\.ecr\\.(?P<region>[a-z0-9-]+)\\.amazonaws\\.com(?:\\.cn)?/(?P<repository>[a-z0-9._/-]+?)(?::[A-Za-z0-9._-]+)?(?:@sha256:[0-9a-f]{64})?$", var.image_uri)
  ecr_repository_arn = "arn:${local.partition}:ecr:${local.ecr.region}:${local.ecr.account}:repository/${local.ecr.repository}"

  log_groups = merge(
    { function = "/aws/lambda/${var.name}" },
    var.ecs_handoff.enabled ? { task = "/ecs/${var.name}" } : {},
  )
  log_group_arns = { for k, name in local.log_groups : k => "arn:${local.partition}:logs:${local.region}:${local.account_id}:log-group:${name}" }

  # Both the function and the task run jobs; the task reads the registry from SSM (below).
  task_environment = merge(var.environment_variables, {
    TERRACE_JOBS_QUEUE_URL    = aws_sqs_queue.this["jobs"].url
    TERRACE_RESULTS_QUEUE_URL = aws_sqs_queue.this["results"].url
    TERRACE_LOG               = var.logs.filter
  }, local.templates == null ? {} : { TERRACE_TEMPLATES = local.templates.url })

  # The published templates' bucket, when templates are not the image's.
  templates = var.templates == null ? null : {
    bucket_arn = "arn:${local.partition}:s3:::${var.templates.bucket}"
    prefix     = trim(var.templates.prefix, "/")
    url        = trim("s3://${var.templates.bucket}/${trim(var.templates.prefix, "/")}", "/")
  }
  function_environment = merge(local.task_environment, { TERRACE_TENANTS = jsonencode(local.registry) }, var.ecs_handoff.enabled ? {
    TERRACE_ECS_CLUSTER         = aws_ecs_cluster.this[0].name
    TERRACE_ECS_TASK_DEFINITION = aws_ecs_task_definition.this[0].arn
    TERRACE_ECS_CONTAINER       = local.container_name
    TERRACE_ECS_SUBNETS         = join(",", var.ecs_handoff.subnet_ids)
    TERRACE_ECS_SECURITY_GROUPS = join(",", var.ecs_handoff.security_group_ids)
  } : {})

  kms_key_arn = var.kms_key_arn != null ? var.kms_key_arn : aws_kms_key.this[0].arn
}

resource "aws_kms_key" "this" {
  count = var.kms_key_arn == null ? 1 : 0

  description             = "${var.name}: the function's environment, queues and logs"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy                  = data.aws_iam_policy_document.kms[0].json
  tags                    = var.tags
}

resource "aws_kms_alias" "this" {
  count = var.kms_key_arn == null ? 1 : 0

  name          = "alias/${var.name}"
  target_key_id = aws_kms_key.this[0].key_id
}

data "aws_iam_policy_document" "kms" {
  count = var.kms_key_arn == null ? 1 : 0

  # The account's IAM policies decide who else may use the key (the runner's role, the platform's senders).
  statement {
    sid       = "AccountAdministers"
    actions   = ["kms:*"]
    resources = ["*"]

    principals {
      type        = "AWS"
      identifiers = ["arn:${local.partition}:iam::${local.account_id}:root"]
    }
  }

  statement {
    sid       = "LogGroups"
    actions   = ["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"]
    resources = ["*"]

    principals {
      type        = "Service"
      identifiers = ["logs.${local.region}.${data.aws_partition.current.dns_suffix}"]
    }

    condition {
      test     = "ArnEquals"
      variable = "kms:EncryptionContext:aws:logs:arn"
      values   = values(local.log_group_arns)
    }
  }
}

resource "aws_cloudwatch_log_group" "this" {
  for_each = local.log_groups

  name              = each.value
  retention_in_days = var.logs.retention_in_days
  kms_key_id        = local.kms_key_arn
  tags              = var.tags
}
