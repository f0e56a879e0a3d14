# Every resource that takes tags (AWS, Azure) or labels (Google Cloud) carries an owner and a
# cost centre.
package tags

import rego.v1

required := {"owner", "cost-center"}

deny contains msg if {
	some rc in input.resource_changes
	some action in rc.change.actions
	action in {"create", "update"}
	some field in ["tags", "labels"]
	field in object.keys(rc.change.after)
	missing := required - keys(rc.change.after[field])
	count(missing) > 0
	msg := sprintf("%s has no %s %s", [rc.address, concat(", ", sort(missing)), field])
}

# A resource given no tags at all has them null.
keys(tags) := object.keys(tags) if is_object(tags)

keys(tags) := set() if not is_object(tags)
