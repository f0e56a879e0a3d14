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

/// Starts `script` detached, as `user`, as a provisioner would leave it: the pid.
fn leave_running(user: RunAs, script: &str) -> i32 {
    use std::os::unix::process::CommandExt;
    let out = std::process::Command::new("/bin/sh")
        .args([
            "-c",
            &format!("setsid sh -c '{script}' </dev/null >/dev/null 2>&1 & echo $!"),
        ])
        .uid(user.uid)
        .gid(user.gid)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// Whether `pid` runs (a killed one may stay a zombie until its parent reaps it).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            Some(!matches!(
                stat.rsplit_once(") ")?.1.chars().next()?,
                'Z' | 'X'
            ))
        })
        .unwrap_or(false)
}

/// Waits a moment for `pid` to be gone: a SIGKILL takes effect when it is next scheduled.
fn gone(pid: i32) -> bool {
    (0..50).any(|_| {
        let alive = alive(pid);
        if alive {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        !alive
    })
}

/// Switching users takes root (as the cloud functions run in their images); CI runs as root.
fn root() -> bool {
    let root = nix::unistd::geteuid().is_root();
    assert!(
        root || std::env::var_os("CI").is_none(),
        "CI runs as root, which switching users takes"
    );
    root
}

#[test]
fn each_job_gets_a_user_of_its_own_and_what_it_leaves_running_dies_with_it() {
    if !root() {
        return;
    }
    let one = JobUser::claim().unwrap().expect("a free user");
    let two = JobUser::claim().unwrap().expect("another");
    assert_ne!(one.run_as, two.run_as, "taken machine-wide, never twice");
    for user in [&one, &two] {
        let uid = user.run_as.expect("a user of its own").uid;
        assert!((FIRST_JOB_UID..FIRST_JOB_UID + 64).contains(&uid));
    }
    let left = leave_running(one.run_as.unwrap(), "sleep 600");
    let other = leave_running(two.run_as.unwrap(), "sleep 600");
    assert!(alive(left) && alive(other));
    drop(one);
    assert!(gone(left), "killed when its job's user was given back");
    assert!(alive(other), "another job's process lives on");
    drop(two);
    assert!(gone(other));
}

/// What a job leaves may fight back: here a process that stops every other process of its
/// user, over and over, and one that forks without end. The runner (root) kills them from
/// outside that user, within the bounded wait, and hangs on nothing.
#[test]
fn a_leftover_that_stops_its_killer_and_forks_without_end_is_killed_within_the_wait() {
    if !root() {
        return;
    }
    let user = JobUser::claim().unwrap().expect("a free user");
    let run_as = user.run_as.unwrap();
    let forker = leave_running(run_as, "while :; do sleep 600 & done");
    // `kill -STOP -1`: every process this user may signal but itself, a killer forked as the
    // user among them (started last, and after a moment: it stops whatever else runs as the
    // user, its own launcher included).
    let stopper = leave_running(
        run_as,
        "sleep 0.2; while :; do kill -STOP -1 2>/dev/null; done",
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    drop(user);
    assert!(
        gone(stopper) && gone(forker),
        "killed when its job's user was given back"
    );
    assert!(
        crate::run::leftovers::kill_all(
            crate::run::leftovers::Leftovers::User(run_as.uid),
            std::time::Duration::ZERO
        )
        .is_ok(),
        "nothing of the user is left"
    );
}

/// Keeps every line it is given.
struct Kept(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

#[async_trait::async_trait]
impl crate::run::logs::LogSink for Kept {
    async fn write(&mut self, line: &crate::run::logs::LogLine) {
        self.0.lock().unwrap().push(line.text.clone());
    }
    async fn flush(&mut self) {}
}

/// Whatever terraform prints, memory stays bounded: a line past `MAX_LINE` is cut and says so,
/// the lines after it are whole, and a capture past `MAX_CAPTURE` keeps that much and says so.
#[tokio::test]
async fn a_line_or_a_capture_too_long_is_cut_and_says_so() {
    let kept = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (logger, pump_task) = crate::run::logs::start(
        crate::job::redact::Redactor::new(Vec::<String>::new()),
        vec![Box::new(Kept(kept.clone()))],
    );
    let long = "x".repeat(MAX_LINE + 1000);
    let exact = "y".repeat(MAX_LINE);
    let text = format!("{long}\n{exact}\nafter\n");
    let pumped = pump(
        text.as_bytes(),
        logger.clone(),
        Stream::Stdout,
        "apply",
        Read::Log,
    )
    .await;
    assert!(pumped.captured.is_empty());
    drop(logger);
    pump_task.finish().await;
    let lines = kept.lock().unwrap().clone();
    assert_eq!(
        lines.len(),
        3,
        "{:?}",
        lines.iter().map(String::len).collect::<Vec<_>>()
    );
    assert!(lines[0].starts_with(&"x".repeat(MAX_LINE)));
    assert!(
        lines[0].ends_with("… [1000 more bytes of this line not kept]"),
        "{}",
        &lines[0][MAX_LINE..]
    );
    assert_eq!(lines[1], exact, "a line of exactly the bound is whole");
    assert_eq!(lines[2], "after");
}
