terraform {
  required_version = ">= 1.5"

  required_providers {
    # 4.73.0 is the first release with `identity_id` on Container Apps job scale rules, which lets
    # KEDA read the jobs queue as the runner's identity instead of with a connection string.
    azurerm = { source = "hashicorp/azurerm", version = ">= 4.73.0, < 6.0.0" }
  }
}
