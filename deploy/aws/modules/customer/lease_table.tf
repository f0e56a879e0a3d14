# The runner's workspace leases. No TTL: a lease's item also keeps the workspace's fence counter,
# which must never go back, so an expired item must not be deleted.
resource "aws_dynamodb_table" "lease" {
  count = var.lease_table.create ? 1 : 0

  name                        = coalesce(var.lease_table.name, "${var.name}-leases")
  billing_mode                = "PAY_PER_REQUEST"
  hash_key                    = "pk"
  deletion_protection_enabled = true

  attribute {
    name = "pk"
    type = "S"
  }

  point_in_time_recovery {
    enabled = true
  }

  server_side_encryption {
    enabled     = true
    kms_key_arn = var.kms_key_arn
  }

  tags = var.tags
}
