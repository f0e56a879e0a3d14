locals {
  objects = "${aws_s3_bucket.this.arn}/${var.prefix}/*"
}

data "aws_iam_policy_document" "trust" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "AWS"
      identifiers = [var.runner_role_arn]
    }

    condition {
      test     = "StringEquals"
      variable = "sts:ExternalId"
      values   = [var.external_id]
    }
  }
}

resource "aws_iam_role" "this" {
  name                 = coalesce(var.role_name, "${var.name}-runner")
  description          = "Assumed by the Terrace runner for its jobs"
  assume_role_policy   = data.aws_iam_policy_document.trust.json
  max_session_duration = 3600
  permissions_boundary = var.permissions_boundary
  tags                 = var.tags
}

data "aws_iam_policy_document" "access" {
  statement {
    sid       = "StateObjects"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]
    resources = [local.objects]
  }

  statement {
    sid       = "ListStateObjects"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.this.arn]

    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${var.prefix}/*"]
    }
  }

  dynamic "statement" {
    for_each = aws_dynamodb_table.lease[*].arn

    content {
      sid       = "Leases"
      actions   = ["dynamodb:GetItem", "dynamodb:UpdateItem"]
      resources = [statement.value]
    }
  }

  dynamic "statement" {
    for_each = var.kms_key_arn == null ? [] : [var.kms_key_arn]

    content {
      sid       = "StateKey"
      actions   = ["kms:GenerateDataKey", "kms:Decrypt"]
      resources = [statement.value]
    }
  }
}

resource "aws_iam_role_policy" "access" {
  name   = "terrace-state"
  role   = aws_iam_role.this.id
  policy = data.aws_iam_policy_document.access.json
}

resource "aws_iam_role_policy_attachment" "this" {
  for_each = var.role_policy_arns

  role       = aws_iam_role.this.name
  policy_arn = each.value
}
