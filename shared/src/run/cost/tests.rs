use super::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;

const BOOK: &str = r"
price_book: 1
name: test
currency: USD
as_of: 2026-11-01
resources:
  testcloud_cluster:
    components:
      - name: nodes
        per: hour
        quantity: { attribute: node_count }
        price: { by: instance_type, values: { small: 0.02, large: 0.08 } }
        source: https://example.com/prices
      - { name: control plane, per: month, price: 10, source: https://example.com/prices }
  testcloud_network: { free: true, usage_based: [traffic] }
  testcloud_disk:
    components:
      - { name: storage, per: month, quantity: { attribute: spec.0.size, default: 8 }, price: 0.1, source: https://example.com/prices }
";

fn books() -> PriceBooks {
    PriceBooks::from_books(vec![("test.yaml".into(), PriceBook::parse(BOOK).unwrap())]).unwrap()
}

fn change(address: &str, ty: &str, actions: &[&str], before: Value, after: Value) -> Value {
    json!({
        "address": address, "mode": "managed", "type": ty, "name": "x",
        "change": { "actions": actions, "before": before, "after": after, "after_unknown": {} }
    })
}

fn plan(changes: Vec<Value>) -> Vec<u8> {
    serde_json::to_vec(&json!({ "format_version": "1.2", "resource_changes": changes })).unwrap()
}

#[test]
fn an_update_is_priced_before_and_after_with_the_largest_change_first() {
    let p = plan(vec![
        change(
            "testcloud_cluster.main",
            "testcloud_cluster",
            &["update"],
            json!({ "node_count": 1, "instance_type": "small" }),
            json!({ "node_count": 3, "instance_type": "large" }),
        ),
        change(
            "testcloud_network.main",
            "testcloud_network",
            &["no-op"],
            json!({}),
            json!({}),
        ),
        change(
            "testcloud_disk.d",
            "testcloud_disk",
            &["create"],
            Value::Null,
            json!({ "spec": [{ "size": 100 }] }),
        ),
        change(
            "data.x.y",
            "testcloud_cluster",
            &["read"],
            Value::Null,
            json!({}),
        ),
    ]);
    let mut p: Value = serde_json::from_slice(&p).unwrap();
    p["resource_changes"][3]["mode"] = json!("data");
    let e = estimate(&serde_json::to_vec(&p).unwrap(), &books()).unwrap();
    // 1 small node: 0.02 × 730 = 14.60, + 10; 3 large: 0.08 × 3 × 730 = 175.20, + 10.
    let cluster = &e.resources[0];
    assert_eq!(cluster.monthly_before, Some(24.6));
    assert_eq!(cluster.monthly_after, Some(185.2));
    assert_eq!(cluster.monthly_delta, 160.6);
    let disk = &e.resources[1];
    assert_eq!(
        (disk.monthly_before, disk.monthly_after),
        (None, Some(10.0))
    );
    assert_eq!(
        (e.monthly_before, e.monthly_after, e.monthly_delta),
        (24.6, 195.2, 170.6)
    );
    assert_eq!(e.top[0].address, "testcloud_cluster.main");
    assert_eq!(e.top[1].address, "testcloud_disk.d");
    assert_eq!(e.free, 1);
    assert_eq!(
        e.resources.len(),
        2,
        "free and data resources are not listed"
    );
    assert_eq!(e.not_priced.len(), 1);
    assert_eq!(e.not_priced[0].reason, "usage-based: traffic");
    assert_eq!(e.headline(), "24.60 → 195.20 USD a month (+170.60)");
}

#[test]
fn what_cannot_be_priced_is_named_with_the_reason_and_left_out() {
    let mut unknown = change(
        "testcloud_cluster.u",
        "testcloud_cluster",
        &["create"],
        Value::Null,
        json!({ "instance_type": "small", "node_count": null }),
    );
    unknown["change"]["after_unknown"] = json!({ "node_count": true });
    let p = plan(vec![
        unknown,
        change(
            "testcloud_cluster.x",
            "testcloud_cluster",
            &["create"],
            Value::Null,
            json!({ "instance_type": "huge", "node_count": 2 }),
        ),
        change(
            "aws_instance.web",
            "aws_instance",
            &["create"],
            Value::Null,
            json!({}),
        ),
        change(
            "testcloud_disk.whole",
            "testcloud_disk",
            &["create"],
            Value::Null,
            json!({ "spec": null }),
        ),
    ]);
    let mut p: Value = serde_json::from_slice(&p).unwrap();
    p["resource_changes"][3]["change"]["after_unknown"] = json!({ "spec": true });
    let e = estimate(&serde_json::to_vec(&p).unwrap(), &books()).unwrap();
    let reasons: BTreeMap<&str, &str> = e
        .not_priced
        .iter()
        .map(|u| (u.address.as_str(), u.reason.as_str()))
        .collect();
    assert_eq!(
        reasons["testcloud_cluster.u"],
        "nodes: node_count is known only after apply"
    );
    assert_eq!(
        reasons["testcloud_cluster.x"],
        "nodes: no price for instance_type = \"huge\""
    );
    assert_eq!(reasons["aws_instance.web"], "its type is in no price book");
    assert_eq!(
        reasons["testcloud_disk.whole"],
        "storage: spec.0.size is known only after apply"
    );
    // What could be priced still is: the control planes.
    assert_eq!(e.monthly_after, 20.0);
}

#[test]
fn a_null_quantity_takes_the_books_default() {
    let p = plan(vec![change(
        "testcloud_disk.d",
        "testcloud_disk",
        &["create"],
        Value::Null,
        json!({ "spec": [] }),
    )]);
    let e = estimate(&p, &books()).unwrap();
    assert_eq!(e.monthly_after, 0.8, "8 GB × 0.10");
}

#[test]
fn a_budget_is_exceeded_by_the_increase_not_the_total_and_names_the_largest() {
    let p = plan(vec![
        change(
            "testcloud_cluster.a",
            "testcloud_cluster",
            &["update"],
            json!({ "node_count": 1, "instance_type": "small" }),
            json!({ "node_count": 2, "instance_type": "small" }),
        ),
        change(
            "testcloud_cluster.b",
            "testcloud_cluster",
            &["create"],
            Value::Null,
            json!({ "node_count": 1, "instance_type": "large" }),
        ),
    ]);
    let mut e = estimate(&p, &books()).unwrap();
    // +14.60 (a) and +68.40 (b).
    assert_eq!(e.monthly_delta, 83.0);
    let mut budget = Budget {
        max_monthly_increase: 83.0,
        currency: Some("USD".into()),
        on_unpriced: OnUnpriced::Allow,
    };
    assert!(
        !e.check(&budget).unwrap().exceeded,
        "equal to the limit is within it"
    );
    budget.max_monthly_increase = 50.0;
    let check = e.check(&budget).unwrap().clone();
    assert!(check.exceeded);
    let reason = check.reason.unwrap();
    assert!(
        reason.contains("by 83.00 USD")
            && reason.contains("of 50.00")
            && reason.find("testcloud_cluster.b +68.40")
                < reason.find("testcloud_cluster.a +14.60"),
        "{reason}"
    );
    budget.currency = Some("EUR".into());
    assert!(
        e.check(&budget)
            .unwrap_err()
            .contains("budget.currency is EUR")
    );
}

#[test]
fn on_unpriced_stop_refuses_a_change_that_cannot_be_priced_but_not_usage_or_deletes() {
    let p = plan(vec![
        change(
            "aws_instance.web",
            "aws_instance",
            &["create"],
            Value::Null,
            json!({}),
        ),
        change(
            "aws_instance.old",
            "aws_instance",
            &["delete"],
            json!({}),
            Value::Null,
        ),
        change(
            "testcloud_network.n",
            "testcloud_network",
            &["create"],
            Value::Null,
            json!({}),
        ),
    ]);
    let mut e = estimate(&p, &books()).unwrap();
    let mut budget = Budget {
        max_monthly_increase: 100.0,
        currency: None,
        on_unpriced: OnUnpriced::Allow,
    };
    assert!(!e.check(&budget).unwrap().exceeded);
    budget.on_unpriced = OnUnpriced::Stop;
    let reason = e.check(&budget).unwrap().reason.clone().unwrap();
    assert!(reason.contains("aws_instance.web"), "{reason}");
    assert!(
        !reason.contains("aws_instance.old") && !reason.contains("testcloud_network"),
        "{reason}"
    );
}

#[test]
fn a_bad_book_is_refused_naming_the_field() {
    let bad = |from: &str, to: &str| PriceBook::parse(&BOOK.replace(from, to)).unwrap_err();
    assert!(bad("price_book: 1", "price_book: 2").contains("price_book: format 2"));
    assert!(bad("currency: USD", "currency: dollars").contains("currency"));
    assert!(bad("as_of: 2026-11-01", "as_of: 2026-13-01").contains("as_of"));
    assert!(
        bad(
            "source: https://example.com/prices\n      - { name: control",
            "source: my head\n      - { name: control"
        )
        .contains("resources.testcloud_cluster.components[0].source")
    );
    assert!(bad("small: 0.02", "small: -1").contains("components[0].price"));
    assert!(
        bad(
            "  testcloud_network: { free: true, usage_based: [traffic] }",
            "  testcloud_network: {}"
        )
        .contains("testcloud_network: has no components")
    );
    assert!(bad("name: test\n", "name: test\nregion: x\ncolour: red\n").contains("colour"));
}

#[test]
fn books_of_a_folder_are_merged_and_conflicts_refused() {
    let dir = tempfile::tempdir().unwrap();
    assert!(
        PriceBooks::load(&dir.path().join("none"))
            .unwrap()
            .is_none()
    );
    std::fs::write(dir.path().join("a.yaml"), BOOK).unwrap();
    std::fs::write(
        dir.path().join("b.yml"),
        "price_book: 1\nname: other\ncurrency: USD\nas_of: 2026-01-01\nresources:\n  aws_vpc: { free: true }\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("README.md"), "not a book").unwrap();
    let books = PriceBooks::load(dir.path()).unwrap().unwrap();
    assert!(books.pricing("aws_vpc").is_some() && books.pricing("testcloud_disk").is_some());
    assert_eq!(books.books.len(), 2);
    std::fs::write(
        dir.path().join("c.yaml"),
        "price_book: 1\nname: eu\ncurrency: EUR\nas_of: 2026-01-01\nresources:\n  aws_subnet: { free: true }\n",
    )
    .unwrap();
    let err = PriceBooks::load(dir.path()).unwrap_err();
    assert!(
        matches!(&err, PriceBookError::Currencies { currency, others, .. } if currency == "EUR" && others == "USD"),
        "{err}"
    );
    assert!(err.to_string().contains("c.yaml is in EUR"), "{err}");
    std::fs::write(
        dir.path().join("c.yaml"),
        "price_book: 1\nname: dup\ncurrency: USD\nas_of: 2026-01-01\nresources:\n  aws_vpc: { free: true }\n",
    )
    .unwrap();
    let err = PriceBooks::load(dir.path()).unwrap_err();
    assert!(
        matches!(&err, PriceBookError::PricedTwice { resource_type, .. } if resource_type == "aws_vpc"),
        "{err}"
    );
    let err = err.to_string();
    assert!(
        err.contains("aws_vpc is priced in both") && err.contains("b.yml"),
        "{err}"
    );
}

#[test]
fn the_shipped_price_books_load_together() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../price-books");
    let books = PriceBooks::load(&dir).unwrap().unwrap();
    assert_eq!(books.currency, "USD");
    let names: Vec<&str> = books.books.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "aws-us-east-1",
            "azure-eastus",
            "gcp-us-central1",
            "testcloud"
        ]
    );
    for ty in [
        "aws_instance",
        "google_compute_instance",
        "azurerm_linux_virtual_machine",
        "testcloud_cluster",
    ] {
        assert!(books.pricing(ty).is_some(), "{ty}");
    }
}

#[test]
fn a_value_terraform_marks_sensitive_prices_but_is_never_quoted() {
    let mut secret = change(
        "testcloud_cluster.s",
        "testcloud_cluster",
        &["create"],
        Value::Null,
        json!({ "instance_type": "hunter2-type", "node_count": 1 }),
    );
    secret["change"]["after_sensitive"] = json!({ "instance_type": true });
    let e = estimate(&plan(vec![secret]), &books()).unwrap();
    let reason = &e.not_priced[0].reason;
    assert!(!reason.contains("hunter2"), "{reason}");
    assert!(
        reason.contains("no price for instance_type = (a sensitive value)"),
        "{reason}"
    );
}
