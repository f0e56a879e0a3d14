# No Cloud Storage bucket readable by the world: no IAM grant to allUsers or
# allAuthenticatedUsers, and public access prevention enforced.
package gcp.storage

import rego.v1

public_members := {"allUsers", "allAuthenticatedUsers"}

changed contains rc if {
	some rc in input.resource_changes
	some action in rc.change.actions
	action in {"create", "update"}
}

deny contains msg if {
	some rc in changed
	rc.type == "google_storage_bucket_iam_member"
	rc.change.after.member in public_members
	msg := sprintf("%s grants %s on the bucket to %s", [rc.address, rc.change.after.role, rc.change.after.member])
}

deny contains msg if {
	some rc in changed
	rc.type == "google_storage_bucket_iam_binding"
	some member in rc.change.after.members
	member in public_members
	msg := sprintf("%s grants %s on the bucket to %s", [rc.address, rc.change.after.role, member])
}

warn contains msg if {
	some rc in changed
	rc.type == "google_storage_bucket"
	rc.change.after.public_access_prevention != "enforced"
	msg := sprintf("%s does not enforce public access prevention", [rc.address])
}
