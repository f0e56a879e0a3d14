# No S3 bucket readable by the world: no public ACL, and every public access block on.
package aws.s3

import rego.v1

public_acls := {"public-read", "public-read-write", "authenticated-read"}

block_settings := ["block_public_acls", "block_public_policy", "ignore_public_acls", "restrict_public_buckets"]

changed contains rc if {
	some rc in input.resource_changes
	some action in rc.change.actions
	action in {"create", "update"}
}

deny contains msg if {
	some rc in changed
	rc.type in {"aws_s3_bucket_acl", "aws_s3_bucket"}
	rc.change.after.acl in public_acls
	msg := sprintf("%s gives the bucket the public ACL %q", [rc.address, rc.change.after.acl])
}

deny contains msg if {
	some rc in changed
	rc.type == "aws_s3_bucket_public_access_block"
	some setting in block_settings
	rc.change.after[setting] == false
	msg := sprintf("%s turns %s off: the bucket could be made public", [rc.address, setting])
}
