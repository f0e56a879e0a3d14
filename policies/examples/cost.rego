# A plan may raise the monthly cost by at most 500 (in the price books' currency); over 100
# is reported. Needs the runner's price books: without an estimate, neither rule fires.
package cost

import rego.v1

deny contains msg if {
	input.terrace.cost.monthly_delta > 500
	msg := sprintf("the plan raises the monthly cost by %.2f %s, over the 500 allowed without a review", [input.terrace.cost.monthly_delta, input.terrace.cost.currency])
}

warn contains msg if {
	delta := input.terrace.cost.monthly_delta
	delta > 100
	delta <= 500
	msg := sprintf("the plan raises the monthly cost by %.2f %s", [delta, input.terrace.cost.currency])
}
