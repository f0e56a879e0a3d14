# The operator's account: the function, its queues, schedules and ECS task.
provider "aws" {
  region = var.region
}

# The customer's account. In practice the customer applies modules/customer (or launches
# customer-quick-create.yaml) in their own account and sends back its outputs; here one
# configuration reaches both accounts through a role the operator may assume there.
provider "aws" {
  alias  = "customer"
  region = var.customer.region

  assume_role {
    role_arn = var.customer.deployment_role_arn
  }
}

locals {
  tags = { Project = "terrace", Example = "complete" }
}

# The operator chooses each customer's ExternalId and hands it over with the runner's role ARN.
resource "random_password" "acme_external_id" {
  length  = 32
  special = false
}

module "runner" {
  source = "../../modules/runner"

  image_uri   = var.image_uri
  ecs_handoff = var.ecs_network

  # The customer module's output is the registry entry as it stands; no field is copied by hand.
  tenants = {
    acme = module.acme.tenant_registry_entry
  }

  tags = local.tags
}

module "acme" {
  source = "../../modules/customer"

  providers = {
    aws = aws.customer
  }

  name            = "acme-terrace"
  runner_role_arn = module.runner.runner_role_arn
  external_id     = random_password.acme_external_id.result

  tags = local.tags
}
