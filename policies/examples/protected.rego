# A resource tagged or labelled `protected = "true"` is never destroyed, nor replaced.
package protected

import rego.v1

protected(before) if object.get(object.get(before, "tags", {}), "protected", "") == "true"

protected(before) if object.get(object.get(before, "labels", {}), "protected", "") == "true"

deny contains msg if {
	some rc in input.resource_changes
	"delete" in rc.change.actions
	protected(rc.change.before)
	msg := sprintf("%s is protected and would be %s", [rc.address, verb(rc.change.actions)])
}

verb(actions) := "replaced" if "create" in actions

verb(actions) := "destroyed" if not "create" in actions
