terraform {
  required_version = ">= 1.5"

  required_providers {
    azuread = { source = "hashicorp/azuread", version = ">= 3.0.0, < 4.0.0" }
    # 4.49.0: see ../storage-account/versions.tf.
    azurerm = { source = "hashicorp/azurerm", version = ">= 4.49.0, < 6.0.0" }
  }
}
