output "role" {
  description = "The role the runner assumes: its `arn`, and its `name`, to attach further policies to."
  value = {
    arn  = aws_iam_role.this.arn
    name = aws_iam_role.this.name
  }
}

output "state" {
  description = "Where the runner keeps this account's states: the `bucket` (name) and its `bucket_arn`, the key `prefix` of the runner's objects in it, and the `lease_table` (name; null without one)."
  value = {
    bucket      = aws_s3_bucket.this.id
    bucket_arn  = aws_s3_bucket.this.arn
    prefix      = var.prefix
    lease_table = one(aws_dynamodb_table.lease[*].name)
  }
}

output "tenant_registry_entry" {
  description = "This account as one tenant of the runner's registry: the value of `tenants[\"<tenant>\"]` in the runner module (TERRACE_TENANTS). Sensitive: it holds the ExternalId."
  sensitive   = true
  value = {
    role_arn    = aws_iam_role.this.arn
    external_id = var.external_id
    bucket      = aws_s3_bucket.this.id
    prefix      = var.prefix
    lease_table = one(aws_dynamodb_table.lease[*].name)
    region      = aws_s3_bucket.this.region
    kms_key_id  = var.kms_key_arn

    client_side_kms_key = var.client_side_kms_key_arn
  }
}
