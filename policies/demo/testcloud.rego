# The demo's policies on the test cloud (`make demo` runs a job against each rule).
package testcloud

import rego.v1

# A cluster of more than 8 nodes needs a capacity review first: the plan may not be applied.
deny contains msg if {
	some rc in input.resource_changes
	rc.type == "testcloud_cluster"
	not "delete" in rc.change.actions
	rc.change.after.node_count > 8
	msg := sprintf(
		"%s would have %d nodes; clusters of more than 8 need a capacity review",
		[rc.address, rc.change.after.node_count],
	)
}

# Small nodes are fine for a demo, not for production: reported, and the job goes on.
warn contains msg if {
	some rc in input.resource_changes
	rc.type == "testcloud_cluster"
	rc.change.after.instance_type == "small"
	msg := sprintf("%s runs on small nodes: not for production", [rc.address])
}
