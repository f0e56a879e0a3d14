//! Cost estimates: a workspace's monthly cost before and after a plan, resource by resource,
//! from the plan's JSON (`terraform show -json`) and a folder of price books; and the budget a
//! job may set on the increase.
//!
//! A price book (format 1, `docs/templates.md` has the whole of it) maps a resource type to
//! its cost components, each a unit price per hour or per month, times a quantity, where the
//! price and the quantity may come from the resource's attributes:
//!
//! ```yaml
//! price_book: 1
//! name: aws-us-east-1
//! currency: USD
//! as_of: 2025-01-15
//! resources:
//!   aws_instance:
//!     components:
//!       - name: instance
//!         per: hour
//!         price: { by: instance_type, values: { t3.micro: 0.0104, t3.small: 0.0208 } }
//!         source: https://aws.amazon.com/ec2/pricing/on-demand/
//!     usage_based: [data transfer out]
//!   aws_ebs_volume:
//!     components:
//!       - { name: storage, per: month, quantity: { attribute: size }, price: { by: type, values: { gp3: 0.08 } }, source: https://aws.amazon.com/ebs/pricing/ }
//!   aws_vpc: { free: true }
//! ```
//!
//! What is not priced is said, never guessed: a type no book has, a price or quantity whose
//! attribute is known only after apply, a value the book has no price for, and the charges a
//! book names as usage-based (requests, transfer, storage used).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::job::{Budget, OnUnpriced};

mod books;
pub use books::{
    BookRef, Component, Per, Price, PriceBook, PriceBookError, PriceBooks, Pricing, Quantity,
};

/// The price book format this runner reads.
pub const FORMAT: u32 = 1;

/// Hours in a month, as cloud price lists count them (365 × 24 / 12).
pub const HOURS_PER_MONTH: f64 = 730.0;

/// How many of the largest changes an estimate names.
pub const TOP: usize = 5;

/// The estimate of one plan.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Estimate {
    pub currency: String,
    /// The books that priced this plan's resources.
    pub price_books: Vec<BookRef>,
    pub monthly_before: f64,
    pub monthly_after: f64,
    pub monthly_delta: f64,
    /// Every priced resource (free ones are only counted).
    pub resources: Vec<ResourceCost>,
    /// The largest changes, by how much they move the monthly cost.
    pub top: Vec<Contributor>,
    /// What the estimate leaves out, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_priced: Vec<Unpriced>,
    /// Resources whose type is free.
    #[serde(default)]
    pub free: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetCheck>,
}

/// One resource's monthly cost before and after (none: it does not exist then).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ResourceCost {
    pub address: String,
    #[serde(rename = "type")]
    pub resource_type: String,
    /// `create`, `update`, `replace`, `delete` or `no-op`.
    pub action: String,
    pub monthly_before: Option<f64>,
    pub monthly_after: Option<f64>,
    pub monthly_delta: f64,
    pub components: Vec<ComponentCost>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ComponentCost {
    pub name: String,
    pub monthly_before: Option<f64>,
    pub monthly_after: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Contributor {
    pub address: String,
    pub monthly_delta: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Unpriced {
    pub address: String,
    #[serde(rename = "type")]
    pub resource_type: String,
    pub action: String,
    pub reason: String,
}

/// A budget held against an estimate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BudgetCheck {
    pub max_monthly_increase: f64,
    pub exceeded: bool,
    /// Why it is exceeded, naming the largest increases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Rounds money to a hundredth of a cent, so sums read as they add.
fn money(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

/// Formats an amount as a person reads it: `12.50`.
pub fn show(x: f64) -> String {
    format!("{x:.2}")
}

/// Formats a change with its sign: `+12.50`, `-3.00`.
pub fn show_delta(x: f64) -> String {
    if x >= 0.0 {
        format!("+{x:.2}")
    } else {
        format!("{x:.2}")
    }
}

/// Estimates the plan `plan_json` (terraform's `show -json` of a saved plan) with `books`.
///
/// # Errors
/// Output that is not a plan's JSON.
pub fn estimate(plan_json: &[u8], books: &PriceBooks) -> Result<Estimate, String> {
    let plan: Value =
        serde_json::from_slice(plan_json).map_err(|e| format!("the plan is not JSON: {e}"))?;
    let changes = plan
        .get("resource_changes")
        .map(|c| c.as_array().ok_or("resource_changes is not a list"))
        .transpose()?
        .map_or(&[][..], Vec::as_slice);
    let mut est = Estimate {
        currency: books.currency.clone(),
        ..Estimate::default()
    };
    let mut used = std::collections::BTreeSet::new();
    for rc in changes {
        if rc.get("mode").and_then(Value::as_str) != Some("managed") {
            continue;
        }
        let address = rc.get("address").and_then(Value::as_str).unwrap_or("?");
        let ty = rc.get("type").and_then(Value::as_str).unwrap_or("?");
        let change = rc.get("change").unwrap_or(&Value::Null);
        let action = action_name(change.get("actions"));
        let unpriced = |reason: String| Unpriced {
            address: address.to_owned(),
            resource_type: ty.to_owned(),
            action: action.clone(),
            reason,
        };
        let Some(pricing) = books.pricing(ty) else {
            est.not_priced
                .push(unpriced("its type is in no price book".into()));
            continue;
        };
        used.extend(books.book_of(ty));
        if pricing.free {
            est.free += 1;
        }
        if !pricing.usage_based.is_empty() && action != "delete" {
            est.not_priced.push(unpriced(format!(
                "usage-based: {}",
                pricing.usage_based.join(", ")
            )));
        }
        if pricing.components.is_empty() {
            continue;
        }
        let before = Some(change.get("before").unwrap_or(&Value::Null)).filter(|v| !v.is_null());
        let after = Some(change.get("after").unwrap_or(&Value::Null)).filter(|v| !v.is_null());
        let unknown = change.get("after_unknown").unwrap_or(&Value::Null);
        let field = |name: &str| change.get(name).unwrap_or(&Value::Null);
        let sensitive = (field("before_sensitive"), field("after_sensitive"));
        let mut cost = ResourceCost {
            address: address.to_owned(),
            resource_type: ty.to_owned(),
            action: action.clone(),
            monthly_before: before.map(|_| 0.0),
            monthly_after: after.map(|_| 0.0),
            monthly_delta: 0.0,
            components: Vec::new(),
        };
        let mut reasons = Vec::new();
        for c in &pricing.components {
            let mut side = |values: Option<&Value>,
                            unknown: &Value,
                            sensitive: &Value,
                            total: &mut Option<f64>| {
                let values = values?;
                match monthly(c, values, unknown, sensitive) {
                    Ok(m) => {
                        *total = total.map(|t| t + m);
                        Some(m)
                    }
                    Err(why) => {
                        reasons.push(format!("{}: {why}", c.name));
                        None
                    }
                }
            };
            let b = side(before, &Value::Null, sensitive.0, &mut cost.monthly_before);
            let a = side(after, unknown, sensitive.1, &mut cost.monthly_after);
            cost.components.push(ComponentCost {
                name: c.name.clone(),
                monthly_before: b.map(money),
                monthly_after: a.map(money),
            });
        }
        reasons.dedup();
        if !reasons.is_empty() {
            est.not_priced.push(unpriced(reasons.join("; ")));
        }
        cost.monthly_before = cost.monthly_before.map(money);
        cost.monthly_after = cost.monthly_after.map(money);
        cost.monthly_delta =
            money(cost.monthly_after.unwrap_or(0.0) - cost.monthly_before.unwrap_or(0.0));
        est.monthly_before += cost.monthly_before.unwrap_or(0.0);
        est.monthly_after += cost.monthly_after.unwrap_or(0.0);
        est.resources.push(cost);
    }
    est.price_books = used.into_iter().map(|i| books.books[i].clone()).collect();
    est.monthly_before = money(est.monthly_before);
    est.monthly_after = money(est.monthly_after);
    est.monthly_delta = money(est.monthly_after - est.monthly_before);
    let mut top: Vec<Contributor> = est
        .resources
        .iter()
        .filter(|r| r.monthly_delta != 0.0)
        .map(|r| Contributor {
            address: r.address.clone(),
            monthly_delta: r.monthly_delta,
        })
        .collect();
    top.sort_by(|a, b| {
        b.monthly_delta
            .abs()
            .total_cmp(&a.monthly_delta.abs())
            .then_with(|| a.address.cmp(&b.address))
    });
    top.truncate(TOP);
    est.top = top;
    Ok(est)
}

impl Estimate {
    /// Holds `budget` against the estimate; the check is kept in [`Estimate::budget`].
    ///
    /// # Errors
    /// A budget in another currency than the books'.
    pub fn check(&mut self, budget: &Budget) -> Result<&BudgetCheck, String> {
        if let Some(currency) = budget.currency.as_deref()
            && currency != self.currency
        {
            return Err(format!(
                "budget.currency is {currency}, but this runner's price books are in {}",
                self.currency
            ));
        }
        let max = budget.max_monthly_increase;
        let mut why = Vec::new();
        if self.monthly_delta > max + 1e-9 {
            let mut increases: Vec<&ResourceCost> = self
                .resources
                .iter()
                .filter(|r| r.monthly_delta > 0.0)
                .collect();
            increases.sort_by(|a, b| b.monthly_delta.total_cmp(&a.monthly_delta));
            let named: Vec<String> = increases
                .iter()
                .take(3)
                .map(|r| format!("{} {}", r.address, show_delta(r.monthly_delta)))
                .collect();
            why.push(format!(
                "the plan raises the monthly cost by {} {} (from {} to {}), over the budget's max_monthly_increase of {}; the largest increases: {}",
                show(self.monthly_delta),
                self.currency,
                show(self.monthly_before),
                show(self.monthly_after),
                show(max),
                named.join(", ")
            ));
        }
        if budget.on_unpriced == OnUnpriced::Stop {
            let changing: Vec<String> = self
                .not_priced
                .iter()
                .filter(|u| !matches!(u.action.as_str(), "no-op" | "delete"))
                .filter(|u| !u.reason.starts_with("usage-based"))
                .map(|u| format!("{} ({})", u.address, u.reason))
                .collect();
            if !changing.is_empty() {
                why.push(format!(
                    "the budget cannot be checked (on_unpriced: stop): {} cannot be priced",
                    changing.join(", ")
                ));
            }
        }
        self.budget = Some(BudgetCheck {
            max_monthly_increase: max,
            exceeded: !why.is_empty(),
            reason: (!why.is_empty()).then(|| why.join("; ")),
        });
        Ok(self.budget.as_ref().expect("just set"))
    }

    /// One line for a log or a summary: `10.00 → 130.45 USD a month (+120.45)`.
    pub fn headline(&self) -> String {
        format!(
            "{} → {} {} a month ({})",
            show(self.monthly_before),
            show(self.monthly_after),
            self.currency,
            show_delta(self.monthly_delta)
        )
    }

    /// The estimate's free text (addresses, reasons) with `redactor`'s secrets masked.
    #[must_use]
    pub fn redacted(&self, redactor: &crate::job::redact::Redactor) -> Self {
        let mut e = self.clone();
        for r in &mut e.resources {
            r.address = redactor.redact(&r.address);
        }
        for t in &mut e.top {
            t.address = redactor.redact(&t.address);
        }
        for u in &mut e.not_priced {
            u.address = redactor.redact(&u.address);
            u.reason = redactor.redact(&u.reason);
        }
        if let Some(reason) = e.budget.as_mut().and_then(|b| b.reason.as_mut()) {
            *reason = redactor.redact(reason);
        }
        e
    }
}

fn action_name(actions: Option<&Value>) -> String {
    let actions: Vec<&str> = actions
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    match actions.as_slice() {
        ["delete", "create"] | ["create", "delete"] => "replace".into(),
        [one] => (*one).into(),
        _ => actions.join("-"),
    }
}

/// A component's monthly cost for a resource's `values` (`unknown`: terraform's
/// `after_unknown`, what is known only after apply).
fn monthly(
    c: &Component,
    values: &Value,
    unknown: &Value,
    sensitive: &Value,
) -> Result<f64, String> {
    // A value terraform marks sensitive is used, never quoted.
    let quote = |path: &str, value: &str| {
        if is_sensitive(sensitive, path) {
            "(a sensitive value)".to_owned()
        } else {
            let short: String = value.chars().take(64).collect();
            format!("{short:?}")
        }
    };
    let price = match &c.price {
        Price::Fixed(p) => *p,
        Price::By { by, values: prices } => {
            let key = match attribute(values, unknown, by)? {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => return Err(format!("{by} is not set")),
                Some(other) => other.to_string(),
            };
            *prices
                .get(&key)
                .ok_or_else(|| format!("no price for {by} = {}", quote(by, &key)))?
        }
    };
    let quantity = match &c.quantity {
        Quantity::Fixed(q) => *q,
        Quantity::Attribute {
            attribute: name,
            default,
        } => match (attribute(values, unknown, name)?, default) {
            (Some(Value::Number(n)), _) => n.as_f64().unwrap_or(0.0),
            (Some(Value::Null) | None, Some(d)) => *d,
            (Some(Value::Null) | None, None) => return Err(format!("{name} is not set")),
            (Some(other), _) => {
                return Err(format!(
                    "{name} is {}, not a number",
                    quote(name, &other.to_string())
                ));
            }
        },
    };
    let hours = match c.per {
        Per::Hour => HOURS_PER_MONTH,
        Per::Month => 1.0,
    };
    Ok(price * quantity * hours)
}

/// The value under one step of a dotted path: a key of an object, an index of a list.
fn child<'a>(v: &'a Value, part: &str) -> Option<&'a Value> {
    match v {
        Value::Object(m) => m.get(part),
        Value::Array(a) => part.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => None,
    }
}

/// Whether one of terraform's marks (`after_unknown`, `*_sensitive`) is `true` at a dotted
/// path, or at a block or list above it (a whole value marked).
fn marked(marks: &Value, path: &str) -> bool {
    let mut at = Some(marks);
    for part in path.split('.') {
        if at == Some(&Value::Bool(true)) {
            return true;
        }
        at = at.and_then(|m| child(m, part));
    }
    at == Some(&Value::Bool(true))
}

/// Whether terraform marks the value at a dotted path sensitive.
fn is_sensitive(sensitive: &Value, path: &str) -> bool {
    marked(sensitive, path)
}

/// The value at a dotted path (`settings.0.tier`); an error when terraform knows it only
/// after apply.
fn attribute<'v>(
    values: &'v Value,
    unknown: &Value,
    path: &str,
) -> Result<Option<&'v Value>, String> {
    if marked(unknown, path) {
        return Err(format!("{path} is known only after apply"));
    }
    Ok(path.split('.').try_fold(values, |v, part| child(v, part)))
}

#[cfg(test)]
mod tests;
