//! Cost estimates and budgets through real runs of `terrace` with the machine's terraform and
//! the shipped test cloud price book (`price-books/testcloud.yaml`: a node costs 0.02, 0.04 or
//! 0.08 an hour by instance type, a cluster's control plane 10 a month, a network nothing).

use serde_json::Value;
use tests::{Sandbox, repo_root};

/// A sandbox whose `terrace` prices plans with the repository's price books.
fn priced() -> Sandbox {
    let mut sb = Sandbox::new();
    sb.env.push((
        "TERRACE_PRICE_BOOKS".into(),
        repo_root().join("price-books").display().to_string(),
    ));
    sb
}

fn job(id: &str, operation: &str, nodes: u32, instance: &str, budget: &str) -> String {
    format!(
        "id: {id}\ntenant: acme\nworkspace: cost\noperation: {operation}\n\
         template: {{ name: demo, version: 1.0.0 }}\n\
         variables:\n  cluster_name: costly\n  region: eu-west-1\n  node_count: {nodes}\n  \
         instance_type: {instance}\n  admin_password: correct-horse-battery-staple\n\
         timeout: 5m\n{budget}"
    )
}

/// Runs the job with `terrace run`, checks the exit code, returns stdout and the result.
async fn run(sb: &Sandbox, id: &str, text: &str, code: i32) -> (String, Value) {
    let path = sb.job(&format!("{id}.yaml"), text);
    let out = sb.run(&["run", "-q", path.to_str().unwrap()]);
    out.expect_code(code);
    let result = sb.artifact_json("acme/cost", id, "result.json").await;
    (out.stdout(), result)
}

fn cluster_nodes(sb: &Sandbox) -> Vec<u64> {
    sb.cloud_files()
        .iter()
        .filter(|(k, _)| k.starts_with("cluster/"))
        .map(|(_, v)| {
            serde_json::from_str::<Value>(v).unwrap()["node_count"]
                .as_u64()
                .unwrap()
        })
        .collect()
}

#[tokio::test]
async fn applies_and_plans_carry_the_estimate_before_and_after_per_resource() {
    let sb = priced();
    // 2 small nodes: 2 × 0.02 × 730 = 29.20, + 10 for the control plane.
    let (out, r) = run(&sb, "c1", &job("c1", "apply", 2, "small", ""), 0).await;
    let c = &r["cost"];
    assert_eq!(
        (
            &c["monthly_before"],
            &c["monthly_after"],
            &c["monthly_delta"]
        ),
        (&Value::from(0.0), &Value::from(39.2), &Value::from(39.2)),
        "{r}"
    );
    assert_eq!(c["currency"], "USD");
    assert_eq!(c["price_books"][0]["name"], "testcloud");
    assert_eq!(c["free"], 1, "the network");
    assert_eq!(c["top"][0]["address"], "testcloud_cluster.main");
    let cluster = &c["resources"][0];
    assert_eq!(cluster["action"], "create");
    assert_eq!(cluster["monthly_before"], Value::Null);
    assert_eq!(cluster["components"][0]["name"], "nodes");
    assert_eq!(cluster["components"][0]["monthly_after"], 29.2);
    assert_eq!(c["not_priced"][0]["address"], "testcloud_network.main");
    assert_eq!(
        c["not_priced"][0]["reason"],
        "usage-based: traffic between regions"
    );
    assert!(
        out.contains(
            "cost:       0.00 → 39.20 USD a month (+39.20) (prices: testcloud 2026-11-01)"
        ) && out.contains("testcloud_cluster.main +39.20"),
        "{out}"
    );
    let steps = tests::step_names(&r);
    let show = steps.iter().position(|s| s == "show").expect("show ran");
    let apply = steps.iter().position(|s| s == "apply").expect("apply ran");
    assert!(show < apply, "priced before applying: {steps:?}");

    // An update, planned only: priced from the state before and the plan after.
    let (_, r) = run(&sb, "c2", &job("c2", "plan", 5, "large", ""), 0).await;
    let c = &r["cost"];
    // 5 large nodes: 5 × 0.08 × 730 = 292, + 10.
    assert_eq!(
        (
            &c["monthly_before"],
            &c["monthly_after"],
            &c["monthly_delta"]
        ),
        (&Value::from(39.2), &Value::from(302.0), &Value::from(262.8)),
        "{r}"
    );
    assert_eq!(c["resources"][0]["action"], "update");

    // A destroy's estimate is everything going away.
    let (_, r) = run(&sb, "c3", &job("c3", "destroy", 2, "small", ""), 0).await;
    assert_eq!(r["cost"]["monthly_delta"], -39.2, "{r}");
    assert_eq!(r["cost"]["monthly_after"], 0.0);
}

#[tokio::test]
async fn a_budget_stops_an_apply_before_anything_is_applied() {
    let sb = priced();
    let budget = "budget: { max_monthly_increase: 20, currency: USD }\n";
    let (out, r) = run(&sb, "b1", &job("b1", "apply", 2, "small", budget), 1).await;
    let e = &r["error"];
    assert_eq!(
        (e["category"].as_str(), e["step"].as_str()),
        (Some("budget"), Some("estimate")),
        "{r}"
    );
    let message = e["message"].as_str().unwrap();
    assert!(
        message.contains("by 39.20 USD")
            && message.contains("of 20.00")
            && message.contains("testcloud_cluster.main +39.20"),
        "{message}"
    );
    assert_eq!(e["retryable"], false);
    assert!(e["hint"].as_str().unwrap().contains("nothing was applied"));
    assert_eq!(r["cost"]["budget"]["exceeded"], true);
    assert!(!tests::step_names(&r).contains(&"apply".to_owned()), "{r}");
    assert!(sb.cloud_files().is_empty(), "nothing was made");
    assert!(
        sb.versions("acme/cost").await.is_empty(),
        "no state written"
    );
    assert!(
        out.contains("budget:     exceeded: the plan raises"),
        "{out}"
    );
    assert!(out.contains("[Budget] at step estimate"), "{out}");

    // Within the budget, it applies; then an update over it leaves everything as it was.
    let budget = "budget: { max_monthly_increase: 40 }\n";
    let (out, r) = run(&sb, "b2", &job("b2", "apply", 2, "small", budget), 0).await;
    assert_eq!(r["cost"]["budget"]["exceeded"], false, "{r}");
    assert!(
        out.contains("budget:     within: at most 40.00 USD more a month"),
        "{out}"
    );
    let versions = sb.versions("acme/cost").await.len();
    let (_, r) = run(&sb, "b3", &job("b3", "apply", 4, "medium", budget), 1).await;
    // 4 × 0.04 × 730 = 116.80, + 10: up 87.60 from 39.20.
    assert_eq!(r["cost"]["monthly_delta"], 87.6, "{r}");
    assert_eq!(r["error"]["category"], "budget");
    assert_eq!(cluster_nodes(&sb), [2], "the cluster is as it was");
    assert_eq!(
        sb.versions("acme/cost").await.len(),
        versions,
        "no state written"
    );
    assert!(
        r.get("cleanup")
            .is_none_or(|c| c["created"].as_array().is_none_or(Vec::is_empty))
    );

    // A plan over the budget succeeds: it says so and applies nothing anyway. It is not kept
    // for approval (its apply would skip the budget); one within it is.
    let (_, r) = run(&sb, "b4", &job("b4", "plan", 4, "medium", budget), 0).await;
    assert_eq!(r["cost"]["budget"]["exceeded"], true, "{r}");
    assert!(r.get("plan").is_none(), "an over-budget plan was kept: {r}");
    let (_, r) = run(&sb, "b5", &job("b5", "plan", 2, "small", budget), 0).await;
    assert_eq!(r["cost"]["budget"]["exceeded"], false, "{r}");
    assert_eq!(r["plan"]["id"], "b5", "{r}");
}

#[tokio::test]
async fn a_budget_that_cannot_be_checked_stops_the_job_before_terraform_runs() {
    // No price books at all.
    let sb = Sandbox::new();
    let budget = "budget: { max_monthly_increase: 100 }\n";
    let (_, r) = run(&sb, "n1", &job("n1", "apply", 1, "small", budget), 1).await;
    assert_eq!(r["error"]["category"], "budget", "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no price books"),
        "{r}"
    );
    assert!(
        r["error"]["hint"]
            .as_str()
            .unwrap()
            .contains("TERRACE_PRICE_BOOKS")
    );
    assert!(tests::step_names(&r).is_empty(), "terraform never ran: {r}");
    // Without a budget the same job runs, unestimated.
    let (_, r) = run(&sb, "n2", &job("n2", "apply", 1, "small", ""), 0).await;
    assert!(r.get("cost").is_none(), "{r}");
    // A destroy only lowers the cost: its budget holds without books.
    let (_, r) = run(&sb, "n2d", &job("n2d", "destroy", 1, "small", budget), 0).await;
    assert_eq!(r["status"], "succeeded", "{r}");

    // A book of another currency.
    let sb = priced();
    let budget = "budget: { max_monthly_increase: 100, currency: EUR }\n";
    let (_, r) = run(&sb, "n3", &job("n3", "apply", 1, "small", budget), 1).await;
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("budget.currency is EUR"),
        "{r}"
    );
    assert!(tests::step_names(&r).is_empty(), "{r}");

    // A type the books cannot price, with `on_unpriced: stop`.
    let mut sb = Sandbox::new();
    let books = sb.dir.path().join("books");
    std::fs::create_dir_all(&books).unwrap();
    std::fs::write(
        books.join("partial.yaml"),
        "price_book: 1\nname: partial\ncurrency: USD\nas_of: 2026-11-01\nresources:\n  \
         testcloud_network: { free: true }\n",
    )
    .unwrap();
    sb.env
        .push(("TERRACE_PRICE_BOOKS".into(), books.display().to_string()));
    let budget = "budget: { max_monthly_increase: 1000, on_unpriced: stop }\n";
    let (_, r) = run(&sb, "n4", &job("n4", "apply", 1, "small", budget), 1).await;
    let message = r["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("testcloud_cluster.main (its type is in no price book)"),
        "{message}"
    );
    assert!(sb.cloud_files().is_empty());
    // The same, allowing it: counted as nothing, and said.
    let budget = "budget: { max_monthly_increase: 1000 }\n";
    let (_, r) = run(&sb, "n5", &job("n5", "apply", 1, "small", budget), 0).await;
    assert_eq!(
        r["cost"]["not_priced"][0]["address"], "testcloud_cluster.main",
        "{r}"
    );

    // A broken book: a job without a budget runs unestimated, one with a budget stops.
    std::fs::write(books.join("partial.yaml"), "price_book: 1\nname: x\n").unwrap();
    let (_, r) = run(&sb, "n6", &job("n6", "plan", 1, "small", ""), 0).await;
    assert!(r.get("cost").is_none(), "{r}");
    let budget = "budget: { max_monthly_increase: 1000 }\n";
    let (_, r) = run(&sb, "n7", &job("n7", "plan", 1, "small", budget), 1).await;
    let message = r["error"]["message"].as_str().unwrap();
    assert!(message.contains("partial.yaml is invalid"), "{message}");
}

#[tokio::test]
async fn terrace_estimate_prices_a_job_and_applies_nothing() {
    let sb = priced();
    let budget = "budget: { max_monthly_increase: 30 }\n";
    let path = sb.job("e1.yaml", &job("e1", "apply", 2, "small", budget));
    let out = sb.run(&["estimate", path.to_str().unwrap()]);
    out.expect_code(1);
    let text = out.stdout();
    assert!(
        text.contains("changes:    2 to add, 0 to change, 0 to destroy")
            && text.contains("cost:       0.00 → 39.20 USD a month (+39.20)")
            && text.contains("budget:     exceeded")
            && text.contains("nothing was applied"),
        "{text}"
    );
    assert!(sb.cloud_files().is_empty(), "nothing was made");
    assert!(sb.versions("acme/cost").await.is_empty());

    let path = sb.job("e2.yaml", &job("e2", "apply", 1, "small", ""));
    let out = sb.run(&["estimate", "--json", path.to_str().unwrap()]);
    out.expect_code(0);
    let json: Value = serde_json::from_str(&out.stdout()).unwrap();
    assert_eq!(json["schema"], 1);
    assert_eq!(json["cost"]["monthly_after"], 24.6, "{json}");
    let planned_as = json["job_id"].as_str().unwrap();
    assert!(planned_as.starts_with("e2.estimate-"), "{planned_as}");
    // The job itself was not spent on the estimate: it runs.
    let (_, r) = run(&sb, "e2", &job("e2", "apply", 1, "small", ""), 0).await;
    assert_eq!(r["status"], "succeeded");
    assert_eq!(cluster_nodes(&sb), [1]);

    let destroy = sb.job("e3.yaml", &job("e3", "destroy", 1, "small", ""));
    sb.run(&["estimate", destroy.to_str().unwrap()])
        .expect_code(64);
    let none = Sandbox::new();
    let path = none.job("e4.yaml", &job("e4", "apply", 1, "small", ""));
    let out = none.run(&["estimate", path.to_str().unwrap()]);
    out.expect_code(64);
    assert!(out.stderr().contains("no price books"), "{}", out.stderr());
}
