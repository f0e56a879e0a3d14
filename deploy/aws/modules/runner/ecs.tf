locals {
  container_name = "terrace"
}

resource "aws_ecs_cluster" "this" {
  count = var.ecs_handoff.enabled ? 1 : 0

  name = var.name

  setting {
    name  = "containerInsights"
    value = "enabled"
  }

  tags = var.tags
}

# The registry reaches the task as a secret, so that its ExternalIds stay out of the task
# definition, which anyone allowed ecs:DescribeTaskDefinition can read.
resource "aws_ssm_parameter" "tenants" {
  count = var.ecs_handoff.enabled ? 1 : 0

  name   = "/${var.name}/tenants"
  type   = "SecureString"
  key_id = local.kms_key_arn
  value  = jsonencode(local.registry)
  tags   = var.tags
}

# Runs one handed-off job: the function overrides the command with the same `terrace-aws task` and
# adds TERRACE_JOB_REF, the reference to the job it staged in the customer's bucket.
resource "aws_ecs_task_definition" "this" {
  count = var.ecs_handoff.enabled ? 1 : 0

  family                   = var.name
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = var.ecs_handoff.cpu
  memory                   = var.ecs_handoff.memory
  task_role_arn            = aws_iam_role.runner.arn
  execution_role_arn       = aws_iam_role.execution[0].arn

  # A new revision never deregisters the old one: a task the function starts between the two
  # steps of an apply still finds the revision it names.
  skip_destroy = true

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = "X86_64"
  }

  dynamic "ephemeral_storage" {
    for_each = var.ecs_handoff.ephemeral_storage_size == null ? [] : [var.ecs_handoff.ephemeral_storage_size]

    content {
      size_in_gib = ephemeral_storage.value
    }
  }

  # As on Lambda, only /tmp is writable (workdirs, terraform's home): nothing a job writes
  # elsewhere (/var/tmp) can outlast it for the next job.
  volume {
    name = "tmp"
  }

  container_definitions = jsonencode([{
    name                   = local.container_name
    image                  = var.image_uri
    essential              = true
    command                = ["terrace-aws", "task"]
    readonlyRootFilesystem = true
    # SIGTERM interrupts the job, which goes back on the queue; Fargate allows at most 120 s.
    stopTimeout = 120
    environment = [for k, v in local.task_environment : { name = k, value = v }]
    secrets     = [{ name = "TERRACE_TENANTS", valueFrom = aws_ssm_parameter.tenants[0].arn }]
    mountPoints = [{ sourceVolume = "tmp", containerPath = "/tmp", readOnly = false }]
    logConfiguration = {
      logDriver = "awslogs"
      options = {
        awslogs-group         = aws_cloudwatch_log_group.this["task"].name
        awslogs-region        = local.region
        awslogs-stream-prefix = "task"
      }
    }
  }])

  tags = var.tags
}
