//! How a job's result reads on a terminal: its summary, its cost, and its exit code.

use shared::run::cost;
use shared::run::result::{JobResult, Status};

use crate::exit;

/// The exit code of a finished job: 0 succeeded, 2 succeeded and found drift, 1 failed.
pub(crate) fn exit_code(result: &JobResult) -> u8 {
    match (result.status, result.drift) {
        (Status::Succeeded, Some(true)) => exit::DRIFT,
        (Status::Succeeded, _) => exit::OK,
        _ => exit::FAILED,
    }
}

pub(crate) fn print_summary(r: &JobResult) {
    outln!();
    outln!(
        "job:        {} ({} {} in {}/{})",
        r.job_id,
        r.operation,
        r.template,
        r.tenant,
        r.workspace
    );
    outln!(
        "status:     {} in {:.1}s",
        r.status.as_str(),
        r.duration_ms as f64 / 1000.0
    );
    let steps: Vec<String> = r
        .steps
        .iter()
        .map(|s| format!("{} {}ms", s.step, s.duration_ms))
        .collect();
    if !steps.is_empty() {
        outln!("steps:      {}", steps.join(", "));
    }
    if let Some(c) = &r.changes {
        outln!(
            "changes:    {} to add, {} to change, {} to destroy",
            c.add,
            c.change,
            c.destroy
        );
    }
    if let Some(t) = &r.terraform {
        outln!("terraform:  {} {}", t.flavour.name(), t.version);
    }
    print_cost(r);
    print_policy(r);
    if let Some(drift) = r.drift {
        let what = match (drift, r.drifted.is_empty()) {
            (false, _) => "none",
            (true, false) => "yes: changed outside terraform since its last run",
            (true, true) => "yes: the infrastructure differs from the template",
        };
        outln!("drift:      {what}");
        let redactor = shared::job::redact::Redactor::default();
        for resource in &r.drifted {
            outln!("  {}", resource.describe(&redactor));
        }
    }
    if !r.state_versions.is_empty() {
        let v: Vec<String> = r.state_versions.iter().map(u64::to_string).collect();
        outln!("state:      wrote version(s) {}", v.join(", "));
    }
    if !r.outputs.is_empty() {
        outln!("outputs:");
        for (name, out) in &r.outputs {
            outln!("  {name} = {}", out.value);
        }
    }
    if let Some(sealed) = &r.sealed_outputs {
        outln!(
            "sealed:     {} sealed to {} (open: terrace result {} --identity KEY_FILE)",
            sealed.names.join(", "),
            sealed.recipient,
            r.job_id
        );
    }
    if r.attempts.len() > 1 {
        outln!("attempts:   {}", r.attempts.len());
        for a in &r.attempts {
            match (&a.error, a.retry_after_ms) {
                (Some(e), Some(wait)) => outln!(
                    "  {}: {:?} at {}: {} (retried after {wait} ms)",
                    a.attempt,
                    e.category,
                    e.step,
                    e.message
                ),
                (Some(e), None) => outln!(
                    "  {}: {:?} at {}: {}",
                    a.attempt,
                    e.category,
                    e.step,
                    e.message
                ),
                (None, _) => outln!("  {}: succeeded", a.attempt),
            }
        }
    }
    for rec in &r.recovered {
        outln!(
            "recovered:  {} {} as {} (it existed in the cloud but not in the state)",
            rec.action,
            rec.address,
            rec.id
        );
    }
    if let Some(u) = &r.unsaved_state {
        match (u.pushed_as, &u.error) {
            (Some(v), _) => outln!(
                "unsaved:    terraform could not save its state; the runner saved it as version {v} (kept as {})",
                u.artifact
            ),
            (None, Some(e)) => outln!("unsaved:    kept as {}; {e}", u.artifact),
            (None, None) => outln!("unsaved:    kept as {}", u.artifact),
        }
    }
    if let Some(c) = &r.cleanup
        && (!c.created.is_empty() || c.rolled_back_to.is_some())
    {
        outln!(
            "cleanup:    policy {}; created {}",
            c.policy,
            if c.created.is_empty() {
                "nothing".to_owned()
            } else {
                c.created.join(", ")
            }
        );
        if let Some(to) = &c.rolled_back_to {
            outln!("            rolled back to the configuration of {to}");
        }
        if !c.reverted.is_empty() {
            outln!("            reverted {}", c.reverted.join(", "));
        }
        if !c.destroyed.is_empty() {
            outln!("            destroyed {}", c.destroyed.join(", "));
        }
        if !c.left.is_empty() {
            outln!("            left in place {}", c.left.join(", "));
        }
        if let Some(e) = &c.error {
            outln!("            {e}");
        }
    }
    if let Some(p) = &r.plan {
        let what = if p.destroy { "destroy plan" } else { "plan" };
        outln!(
            "approval:   {what} {} kept until {}; to apply it send {} job with `plan: {}`",
            p.id,
            state_backends::display_time(p.expires_at),
            if p.destroy { "a destroy" } else { "an apply" },
            p.id
        );
        if let Some(key) = &p.key {
            outln!("            and `plan_key: {key}` (its own key: shown once, stored nowhere)");
        }
    }
    if let Some(plan) = &r.approved_plan {
        outln!("approved:   plan {plan}");
    }
    if let Some(t) = &r.lifecycle {
        outln!("workspace:  {} → {}", t.from_name(), t.to.as_str());
    }
    for a in &r.attention {
        outln!("attention:  [{}] {}", a.kind, a.message);
    }
    if let Some(e) = &r.error {
        outln!(
            "error:      [{:?}] at step {}: {}",
            e.category,
            e.step,
            e.message
        );
        outln!("hint:       {}", e.hint);
        outln!("retryable:  {}", e.retryable);
    }
}

/// The policies' verdicts on the plan: how many denied and warned, then each message.
pub(crate) fn print_policy(r: &JobResult) {
    let Some(v) = &r.policy else {
        return;
    };
    outln!(
        "policy:     {} denied, {} warned (policies {})",
        v.deny.len(),
        v.warn.len(),
        v.policies.get(..19).unwrap_or(&v.policies)
    );
    for (kind, list) in [("deny", &v.deny), ("warn", &v.warn)] {
        for verdict in list {
            outln!("            {kind}: {}", verdict.describe());
        }
    }
}

/// The estimate of a result: the totals, the largest changes, what is not priced, the budget.
pub(crate) fn print_cost(r: &JobResult) {
    let Some(c) = &r.cost else {
        return;
    };
    let books: Vec<String> = c
        .price_books
        .iter()
        .map(|b| format!("{} {}", b.name, b.as_of))
        .collect();
    if books.is_empty() {
        outln!("cost:       {}", c.headline());
    } else {
        outln!(
            "cost:       {} (prices: {})",
            c.headline(),
            books.join(", ")
        );
    }
    for t in &c.top {
        outln!(
            "            {} {}",
            t.address,
            cost::show_delta(t.monthly_delta)
        );
    }
    for u in &c.not_priced {
        outln!("            not priced: {} ({})", u.address, u.reason);
    }
    if let Some(b) = &c.budget {
        match &b.reason {
            Some(why) if b.exceeded => outln!("budget:     exceeded: {why}"),
            _ => outln!(
                "budget:     within: at most {} {} more a month",
                cost::show(b.max_monthly_increase),
                c.currency
            ),
        }
    }
}
