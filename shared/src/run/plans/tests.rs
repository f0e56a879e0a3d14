use super::*;

const WS: (&str, &str, &str) = ("acme", "web", "plan-1");

#[test]
fn a_sealed_plan_opens_with_its_key_only_and_only_as_its_own_workspaces_plan() {
    let key = new_key();
    let plan = b"PK\x03\x04 a plan with a secret: hunter2-hunter2";
    let sealed = seal(&key, plan, WS);
    assert!(
        !sealed.windows(7).any(|w| w == b"hunter2"),
        "no plain value in the stored plan"
    );
    let given = encode_key(&key);
    assert_eq!(given.len(), crate::job::validate::PLAN_KEY_CHARS);
    assert_eq!(open(Some(&given), &sealed, WS).unwrap(), plan);
    assert_eq!(open(None, &sealed, WS), Err(OpenError::NoKey));
    let other = encode_key(&new_key());
    assert_eq!(open(Some(&other), &sealed, WS), Err(OpenError::WrongKey));
    // Moved to another workspace or job, it does not open.
    assert_eq!(
        open(Some(&given), &sealed, ("acme", "other", "plan-1")),
        Err(OpenError::WrongKey)
    );
    assert_eq!(
        open(Some(&given), &sealed, ("acme", "web", "plan-2")),
        Err(OpenError::WrongKey)
    );
    // One bit changed, it does not open.
    let mut changed = sealed.to_vec();
    let last = changed.len() - 1;
    changed[last] ^= 1;
    assert_eq!(open(Some(&given), &changed, WS), Err(OpenError::WrongKey));
    assert_eq!(open(Some(&given), plan, WS), Err(OpenError::NotSealed));
}

fn record() -> PlanRecord {
    let now = OffsetDateTime::now_utc();
    PlanRecord {
        schema: PLAN_RECORD_SCHEMA,
        job_id: "plan-1".into(),
        tenant: "acme".into(),
        workspace: "web".into(),
        destroy: false,
        template: TemplateRef {
            name: "demo".into(),
            version: "1.0.0".into(),
        },
        template_digest: None,
        variables_sha256: "00".into(),
        state: Some(StateFacts {
            version: 3,
            serial: 7,
            lineage: "lin".into(),
        }),
        flavour: "terraform".into(),
        terraform_version: "1.11.4".into(),
        lock_sha256: None,
        plan_sha256: "11".into(),
        sealing: Sealing::PlanKey,
        changes: Changes::default(),
        policy: None,
        made_at: now,
        expires_at: now + time::Duration::hours(1),
    }
}

#[test]
fn an_approved_plan_is_refused_for_every_reason_it_no_longer_fits() {
    let record = record();
    let template = record.template.clone();
    let applied_by_other = Applied {
        job_id: "apply-0".into(),
        at: OffsetDateTime::now_utc(),
    };
    let applied_by_self = Applied {
        job_id: "apply-1".into(),
        at: OffsetDateTime::now_utc(),
    };
    let moved = StateFacts {
        version: 4,
        serial: 8,
        lineage: "lin".into(),
    };
    let other_template = TemplateRef {
        name: "demo".into(),
        version: "1.1.0".into(),
    };
    let fits = Applying {
        job_id: "apply-1",
        destroy: false,
        template: &template,
        flavour: "terraform",
        terraform_version: "1.11.4",
        state: record.state.as_ref(),
        now: OffsetDateTime::now_utc(),
        applied: None,
    };
    assert_eq!(check(&record, &fits), Ok(()));
    // The same job delivered again after it claimed the plan goes on (the state decides).
    let again = Applying {
        applied: Some(&applied_by_self),
        ..fits
    };
    assert_eq!(check(&record, &again), Ok(()));
    let cases: Vec<(&str, Applying<'_>, &str, bool)> = vec![
        (
            "applied",
            Applying {
                applied: Some(&applied_by_other),
                ..again
            },
            "already applied by job apply-0",
            false,
        ),
        (
            "expired",
            Applying {
                now: record.expires_at,
                ..again
            },
            "expired at",
            false,
        ),
        (
            "destroy",
            Applying {
                destroy: true,
                ..again
            },
            "is not a destroy plan",
            false,
        ),
        (
            "template",
            Applying {
                template: &other_template,
                ..again
            },
            "made with template demo@1.0.0, and this job names demo@1.1.0",
            false,
        ),
        (
            "version",
            Applying {
                terraform_version: "1.10.5",
                ..again
            },
            "made by terraform 1.11.4, and this runner has terraform 1.10.5",
            false,
        ),
        (
            "flavour",
            Applying {
                flavour: "tofu",
                ..again
            },
            "this runner has tofu 1.11.4",
            false,
        ),
        (
            "state",
            Applying {
                state: Some(&moved),
                ..again
            },
            "state moved since plan plan-1 was made (then version 3 (serial 7), now version 4 (serial 8))",
            true,
        ),
        (
            "state gone",
            Applying {
                state: None,
                ..again
            },
            "now no state",
            true,
        ),
    ];
    for (what, applying, says, superseded) in cases {
        let refusal = check(&record, &applying).unwrap_err();
        assert!(
            refusal.message.contains(says),
            "{what}: {}",
            refusal.message
        );
        assert_eq!(refusal.superseded, superseded, "{what}");
        assert!(!refusal.fix.is_empty(), "{what}");
    }
    let destroy = PlanRecord {
        destroy: true,
        ..record.clone()
    };
    let refusal = check(&destroy, &fits).unwrap_err();
    assert!(
        refusal.message.contains("is a destroy plan"),
        "{}",
        refusal.message
    );
    assert_eq!(refusal.fix, "apply it with operation destroy");
}

#[test]
fn a_plan_record_of_a_newer_schema_is_refused_by_name() {
    let mut value = serde_json::to_value(record()).unwrap();
    value["schema"] = 9.into();
    let e = PlanRecord::parse(value.to_string().as_bytes()).unwrap_err();
    assert!(e.to_string().contains("plan.json is of schema 9"), "{e}");
    let back = PlanRecord::parse(&record().to_bytes()).unwrap();
    assert_eq!(back.job_id, "plan-1");
}

#[test]
fn a_plan_bound_to_its_job_opens_as_that_jobs_only() {
    let bound = bind("plan-1", b"PK plan");
    assert_eq!(unbind("plan-1", &bound).unwrap(), b"PK plan");
    assert_eq!(unbind("plan-2", &bound), Err(OpenError::OtherPlan));
    assert_eq!(unbind("plan-1", b"PK plan"), Err(OpenError::OtherPlan));
    // A job id that is a prefix of another's does not pass for it.
    assert_eq!(unbind("plan", &bound), Err(OpenError::OtherPlan));
}
