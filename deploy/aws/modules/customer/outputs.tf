output "role_arn" {
  description = "ARN of the role the runner assumes."
  value       = aws_iam_role.this.arn
}

output "role_name" {
  description = "Name of that role, to attach further policies to."
  value       = aws_iam_role.this.name
}

output "bucket" {
  description = "Name of the state bucket."
  value       = aws_s3_bucket.this.id
}

output "bucket_arn" {
  description = "ARN of the state bucket."
  value       = aws_s3_bucket.this.arn
}

output "prefix" {
  description = "Key prefix of the runner's objects in the bucket."
  value       = var.prefix
}

output "lease_table" {
  description = "Name of the lease table (null without one)."
  value       = one(aws_dynamodb_table.lease[*].name)
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
  }
}
