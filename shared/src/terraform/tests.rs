//! Unit tests of `terraform`.

use super::*;

#[test]
fn subcommands_always_disable_input_and_color() {
    let plan = Command::Plan {
        mode: PlanMode::Destroy,
        detailed_exitcode: true,
        targets: vec!["testcloud_network.n[\"a\"]".into()],
    };
    assert_eq!(
        plan.args(),
        [
            "plan",
            "-json",
            "-input=false",
            "-no-color",
            "-out=terrace.tfplan",
            "-target=testcloud_network.n[\"a\"]",
            "-destroy",
            "-detailed-exitcode",
        ]
    );
    assert!(plan.json_ui());
    assert!(Command::Output.captures_stdout());
}

#[test]
fn options_come_before_positional_arguments() {
    // Terraform 1.x reads options only up to the first positional argument:
    // `apply PLAN -input=false` fails with "Too many command line arguments".
    let cases = [
        (
            Command::Apply,
            vec![
                "apply",
                "-json",
                "-input=false",
                "-no-color",
                "terrace.tfplan",
            ],
        ),
        (
            Command::ShowPlan,
            vec!["show", "-json", "-no-color", "terrace.tfplan"],
        ),
        (
            Command::Import {
                address: "testcloud_network.n[\"a\"]".into(),
                id: "net-1".into(),
            },
            vec![
                "import",
                "-input=false",
                "-no-color",
                "testcloud_network.n[\"a\"]",
                "net-1",
            ],
        ),
        (
            Command::Plan {
                mode: PlanMode::RefreshOnly,
                detailed_exitcode: true,
                targets: vec![],
            },
            vec![
                "plan",
                "-json",
                "-input=false",
                "-no-color",
                "-out=terrace.tfplan",
                "-refresh-only",
                "-detailed-exitcode",
            ],
        ),
    ];
    for (command, expected) in cases {
        let args = command.args();
        assert_eq!(args, expected);
        let first_positional = args[1..].iter().position(|a| !a.starts_with('-'));
        if let Some(p) = first_positional {
            assert!(
                args[1 + p..].iter().all(|a| !a.starts_with('-')),
                "an option after a positional: {args:?}"
            );
        }
    }
}

#[test]
fn the_environment_is_an_allow_list() {
    let config = TerraformConfig {
        pass_env: vec!["TERRACE_TEST_PASSED".into()],
        env: vec![
            ("CLOUD_TOKEN".into(), "t0ken".into()),
            ("TF_LOG".into(), "TRACE".into()),
        ],
        settings: vec![
            ("CLOUD_REGION".into(), "eu-west-1".into()),
            ("TF_CLI_ARGS".into(), "-lock=false".into()),
        ],
        plugin_cache: Some("/cache".into()),
        ..TerraformConfig::default()
    };
    let env = environment(&config, Path::new("/w"));
    let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
    assert!(names.contains(&"TF_IN_AUTOMATION"));
    assert!(env.contains(&("CLOUD_TOKEN".to_owned(), "t0ken".to_owned())));
    assert!(env.contains(&("CLOUD_REGION".to_owned(), "eu-west-1".to_owned())));
    assert!(!names.contains(&"TF_LOG"), "set variables are filtered too");
    assert!(!names.contains(&"TF_CLI_ARGS"), "settings are filtered too");
    assert!(names.contains(&"TF_PLUGIN_CACHE_DIR"));
    assert!(env.contains(&("HOME".to_owned(), "/w/.home".to_owned())));
    assert!(
        !names.contains(&"CARGO"),
        "inherited variables must not leak: {names:?}"
    );
    assert!(!names.iter().any(|n| n.starts_with("TF_LOG")));
    assert!(may_pass("AWS_PROFILE") && may_pass("TESTCLOUD_ROOT"));
    for refused in [
        "TF_LOG",
        "TF_LOG_PATH",
        "TF_CLI_ARGS_plan",
        "TF_WORKSPACE",
        "HOME",
    ] {
        assert!(!may_pass(refused), "{refused} may be passed");
    }
}

#[test]
fn each_job_gets_a_user_of_its_own_and_what_it_leaves_running_dies_with_it() {
    use std::os::unix::process::CommandExt;
    // Switching users takes root (as the cloud functions run in their images).
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let one = JobUser::claim().unwrap().expect("a free user");
    let two = JobUser::claim().unwrap().expect("another");
    assert_ne!(one.run_as, two.run_as, "taken machine-wide, never twice");
    for user in [&one, &two] {
        assert!((FIRST_JOB_UID..FIRST_JOB_UID + 64).contains(&user.run_as.uid));
    }
    let sleeper = |user: &JobUser| {
        std::process::Command::new("sleep")
            .arg("600")
            .uid(user.run_as.uid)
            .gid(user.run_as.gid)
            .spawn()
            .unwrap()
    };
    let mut left = sleeper(&one);
    let mut other = sleeper(&two);
    drop(one);
    let status = left.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "killed when its job's user was given back"
    );
    assert!(
        other.try_wait().unwrap().is_none(),
        "another job's process lives on"
    );
    drop(two);
    other.wait().unwrap();
}
