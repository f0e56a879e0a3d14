variable "region" {
  description = "Region of the runner."
  type        = string
  default     = "eu-west-1"
}

variable "image_uri" {
  description = "The image built from deploy/Dockerfile with `--target aws`, in ECR, by digest."
  type        = string
}

variable "ecs_network" {
  description = <<-EOT
    Where the ECS task of long jobs runs:
    - subnet_ids: private subnets, with a NAT gateway or VPC endpoints.
    - security_group_ids ([]): its security groups; empty for the VPC's default.
  EOT
  type = object({
    subnet_ids         = list(string)
    security_group_ids = optional(list(string), [])
  })
}

variable "customer" {
  description = <<-EOT
    The customer's account:
    - deployment_role_arn: a role there that this configuration may assume to create the bucket, table and role.
    - region ("eu-west-1"): the region of the bucket and the lease table.
  EOT
  type = object({
    deployment_role_arn = string
    region              = optional(string, "eu-west-1")
  })
}
