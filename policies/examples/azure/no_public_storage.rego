# No Azure storage open to the world: no account that lets containers be public, and no
# container that is.
package azure.storage

import rego.v1

changed contains rc if {
	some rc in input.resource_changes
	some action in rc.change.actions
	action in {"create", "update"}
}

deny contains msg if {
	some rc in changed
	rc.type == "azurerm_storage_account"
	rc.change.after.allow_nested_items_to_be_public != false
	msg := sprintf("%s lets its containers be made public: set allow_nested_items_to_be_public = false", [rc.address])
}

deny contains msg if {
	some rc in changed
	rc.type == "azurerm_storage_container"
	rc.change.after.container_access_type != "private"
	msg := sprintf("%s is readable by anyone (container_access_type %q)", [rc.address, rc.change.after.container_access_type])
}
