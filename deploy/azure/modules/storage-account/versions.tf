terraform {
  required_version = ">= 1.5"

  required_providers {
    # 4.49.0 brings the `storage.data_plane_available` feature, with which the provider manages
    # an account that refuses shared keys without reaching its data plane.
    azurerm = { source = "hashicorp/azurerm", version = ">= 4.49.0, < 6.0.0" }
  }
}
