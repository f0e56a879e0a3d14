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
  name                 = coalesce(var.role.name, "${var.name}-runner")
  description          = "Assumed by the Terrace runner for its jobs"
  assume_role_policy   = data.aws_iam_policy_document.trust.json
  max_session_duration = 3600
  permissions_boundary = var.role.permissions_boundary
  tags                 = var.tags
}

resource "aws_iam_role_policy" "access" {
  name   = "terrace-state"
  role   = aws_iam_role.this.id
  policy = data.aws_iam_policy_document.access.json
}

data "aws_iam_policy_document" "access" {
  source_policy_documents = concat(
    data.aws_iam_policy_document.leases[*].json,
    data.aws_iam_policy_document.state_key[*].json,
    data.aws_iam_policy_document.sealing_key[*].json,
    data.aws_iam_policy_document.old_sealing_keys[*].json,
  )

  statement {
    sid       = "StateObjects"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]
    resources = ["${aws_s3_bucket.this.arn}/${var.prefix}/*"]
  }

  # Not limited to the prefix: S3 answers a read of a missing key with 404 only to a caller
  # that may list the bucket (otherwise 403), and the runner takes only 404 as "not there yet".
  # The bucket is the runner's own; listing shows key names, never contents.
  statement {
    sid       = "ListStateObjects"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.this.arn]
  }
}

# The lease table and the key have a document each: a statement needs a resource, and
# without the table or the key there is none.
data "aws_iam_policy_document" "leases" {
  count = var.lease_table.create ? 1 : 0

  statement {
    sid       = "Leases"
    actions   = ["dynamodb:GetItem", "dynamodb:UpdateItem"]
    resources = [aws_dynamodb_table.lease[0].arn]
  }
}

data "aws_iam_policy_document" "state_key" {
  count = var.kms_key_arn == null ? 0 : 1

  statement {
    sid       = "StateKey"
    actions   = ["kms:GenerateDataKey", "kms:Decrypt"]
    resources = [var.kms_key_arn]
  }
}

# Client-side sealing: a data key per state object, always with the workspace as its
# encryption context.
data "aws_iam_policy_document" "sealing_key" {
  count = var.client_side_kms_key_arn == null ? 0 : 1

  statement {
    sid       = "SealingKey"
    actions   = ["kms:GenerateDataKey", "kms:Decrypt"]
    resources = [var.client_side_kms_key_arn]

    condition {
      test     = "ForAllValues:StringEquals"
      variable = "kms:EncryptionContextKeys"
      values   = ["terrace:workspace"]
    }
    condition {
      test     = "Null"
      variable = "kms:EncryptionContextKeys"
      values   = ["false"]
    }
  }
}

# Keys rotated out: they still open what they sealed.
data "aws_iam_policy_document" "old_sealing_keys" {
  count = length(var.old_client_side_kms_key_arns) == 0 ? 0 : 1

  statement {
    sid       = "OldSealingKeys"
    actions   = ["kms:Decrypt"]
    resources = var.old_client_side_kms_key_arns

    condition {
      test     = "ForAllValues:StringEquals"
      variable = "kms:EncryptionContextKeys"
      values   = ["terrace:workspace"]
    }
    condition {
      test     = "Null"
      variable = "kms:EncryptionContextKeys"
      values   = ["false"]
    }
  }
}

resource "aws_iam_role_policy_attachment" "this" {
  for_each = var.role.policy_arns

  role       = aws_iam_role.this.name
  policy_arn = each.value
}
