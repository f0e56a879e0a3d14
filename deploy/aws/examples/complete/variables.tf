variable "region" {
  description = "Region of the runner."
  type        = string
  default     = "eu-west-1"
}

variable "customer_region" {
  description = "Region of the customer's bucket and lease table."
  type        = string
  default     = "eu-west-1"
}

variable "customer_deployment_role_arn" {
  description = "A role in the customer's account that this configuration may assume to create the bucket, table and role there."
  type        = string
}

variable "image_uri" {
  description = "The function's image in ECR (deploy/aws/Dockerfile), by digest."
  type        = string
}

variable "ecs_subnet_ids" {
  description = "Private subnets (with a NAT gateway or VPC endpoints) for the ECS task of long jobs."
  type        = list(string)
}

variable "ecs_security_group_ids" {
  description = "Security groups of the ECS task; empty for the VPC's default."
  type        = list(string)
  default     = []
}
