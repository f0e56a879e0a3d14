//! The harness of Terrace's integration tests: a sandbox per test (store, test cloud folder,
//! templates, queue), the real `terrace` binary, the machine's terraform (called directly) and the
//! testcloud provider installed by `scripts/install-testcloud-provider.sh`.
//!
//! Nothing is skipped: a missing terraform, provider or binary fails the test with the command
//! that installs it.

pub mod amqp;
pub mod aws;
pub mod azure;
pub mod blackhole;
pub mod counted;
pub mod failing;
pub mod fault_proxy;
pub mod gcp;
pub mod gcs;
pub mod http;
pub mod image;
pub mod lambda;
pub mod policy;
pub mod pubsub;
pub mod schema;
pub mod start;
pub mod stores;
pub mod sweep;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use state_backends::fs::FsStore;
use state_backends::{StateStore, VersionInfo, WorkspaceId};

/// The repository's root folder.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the repository")
        .to_owned()
}

/// The terraform to test with, called directly: `TERRACE_TERRAFORM`, else `terraform` on `PATH`,
/// else `tofu` on `PATH` (what `scripts/install-terraform.sh` checks is a supported client).
pub fn terraform() -> PathBuf {
    if let Some(path) = std::env::var_os("TERRACE_TERRAFORM") {
        let path = PathBuf::from(path);
        assert!(
            path.exists(),
            "TERRACE_TERRAFORM={} does not exist: point it at Terraform >= 1.5 or OpenTofu >= 1.6",
            path.display()
        );
        return path;
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    ["terraform", "tofu"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
        .find(|candidate| candidate.is_file())
        .expect(
            "no terraform on PATH: install Terraform >= 1.5 or OpenTofu >= 1.6 (scripts/install-terraform.sh checks it), or set TERRACE_TERRAFORM",
        )
}

/// `dir/terraform-version.json`: [`terraform`]'s `version -json` answer, recorded by the
/// images' own script (`deploy/record-terraform-version.sh`) for `TERRACE_TERRAFORM_VERSION_FILE`.
pub fn record_terraform_version(dir: &Path) -> PathBuf {
    let out = dir.join("terraform-version.json");
    let status = Command::new(repo_root().join("deploy/record-terraform-version.sh"))
        .arg(terraform())
        .arg(&out)
        .status()
        .expect("deploy/record-terraform-version.sh runs");
    assert!(
        status.success(),
        "deploy/record-terraform-version.sh failed"
    );
    out
}

/// A state server for `ws` under a fresh lease held by `owner`, as a job's runner starts one.
pub async fn leased_state_server(
    store: std::sync::Arc<dyn StateStore>,
    ws: &WorkspaceId,
    owner: &str,
) -> shared::run::state_server::StateServer {
    let lease = store
        .acquire_lease(
            ws,
            &state_backends::LeaseRequest {
                owner: owner.into(),
                ttl: std::time::Duration::from_secs(300),
                info: serde_json::Value::Null,
            },
        )
        .await
        .expect("a free workspace's lease");
    shared::run::state_server::StateServer::start(shared::run::state_server::Config {
        store,
        ws: ws.clone(),
        fence: shared::run::vouched::Vouched::unvouched(
            lease.fence(),
            tokio_util::sync::CancellationToken::new(),
        ),
        password: shared::run::state_server::random_secret(),
        logger: None,
        max_body: shared::run::state_server::MAX_STATE_BYTES,
        header_read_timeout: shared::run::state_server::HEADER_READ_TIMEOUT,
    })
    .await
    .expect("the state server starts")
}

/// The filesystem mirror holding the testcloud provider.
pub fn plugin_mirror() -> PathBuf {
    let mirror = repo_root().join(".cache/plugins");
    assert!(
        mirror
            .join("registry.terraform.io/terrace/testcloud")
            .exists(),
        "the testcloud provider is not installed in {}: run scripts/install-testcloud-provider.sh (or `make tools`)",
        mirror.display()
    );
    mirror
}

/// The `terrace` binary built beside this test binary (`cargo build -p local`).
pub fn terrace_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>");
    let bin = dir.join("terrace");
    assert!(
        bin.exists(),
        "{} not found: run `cargo build -p local` before the tests (or `make test`)",
        bin.display()
    );
    bin
}

/// A binary of this workspace built beside this test binary (`cargo build -p local -p aws`).
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>");
    let bin = dir.join(name);
    assert!(
        bin.exists(),
        "{} not found: run `cargo build -p local -p aws -p gcp -p azure` before the tests (or `make test`)",
        bin.display()
    );
    bin
}

/// One test's world: a store, a test cloud, templates, a queue, all in a temporary folder.
pub struct Sandbox {
    pub dir: tempfile::TempDir,
    pub store: PathBuf,
    pub cloud: PathBuf,
    pub templates: PathBuf,
    pub queue: PathBuf,
    pub cli_config: PathBuf,
    /// Extra environment for terrace (and, where passed through, terraform).
    pub env: Vec<(String, String)>,
}

impl Default for Sandbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Sandbox {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("terrace-it-")
            .tempdir()
            .expect("tempdir");
        let root = dir.path().to_owned();
        let (store, cloud, templates, queue) = (
            root.join("store"),
            root.join("cloud"),
            root.join("templates"),
            root.join("queue"),
        );
        for d in [&cloud, &templates, &queue] {
            std::fs::create_dir_all(d).expect("sandbox folders");
        }
        // A cloud function running as root runs terraform as `nobody`: it reads the CLI
        // config and the test cloud, and the provider writes the test cloud.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755))
            .expect("sandbox permissions");
        std::fs::set_permissions(&cloud, std::fs::Permissions::from_mode(0o777))
            .expect("test cloud permissions");
        let repo = repo_root();
        std::os::unix::fs::symlink(repo.join("templates/demo"), templates.join("demo"))
            .expect("link demo");
        for name in [
            "leaky", "fleet", "tiers", "awscreds", "probe", "lurker", "hog", "tagged", "stack",
            "approval", "_modules",
        ] {
            std::os::unix::fs::symlink(
                repo.join("tests/templates").join(name),
                templates.join(name),
            )
            .expect("link template");
        }
        let cli_config = root.join("terraformrc");
        std::fs::write(
            &cli_config,
            format!(
                "provider_installation {{\n  filesystem_mirror {{\n    path = {:?}\n  }}\n}}\n",
                plugin_mirror().display().to_string()
            ),
        )
        .expect("cli config");
        Self {
            dir,
            store,
            cloud,
            templates,
            queue,
            cli_config,
            env: Vec::new(),
        }
    }

    /// A `terrace` command set up for this sandbox.
    pub fn terrace(&self) -> Command {
        let mut cmd = Command::new(terrace_bin());
        cmd.current_dir(self.dir.path())
            .env("TERRACE_STORE", &self.store)
            .env("TERRACE_TEMPLATES", &self.templates)
            .env("TERRACE_TERRAFORM", terraform())
            .env("TERRACE_TF_CLI_CONFIG", &self.cli_config)
            .env(
                "TERRACE_PASS_ENV",
                "TESTCLOUD_ROOT,TESTCLOUD_CREATE_DELAY_MS",
            )
            .env("TERRACE_GRACE", "5")
            .env("TERRACE_CACHE_DIR", self.dir.path().join("cache"))
            .env("TESTCLOUD_ROOT", &self.cloud)
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// Runs `terrace ARGS` to its end.
    pub fn run(&self, args: &[&str]) -> Run {
        let output = self.terrace().args(args).output().expect("terrace starts");
        schema::check_cli(args, &String::from_utf8_lossy(&output.stdout));
        Run(output)
    }

    /// Runs `terrace serve --once` over the sandbox's queue, `concurrency` jobs at once (2 is
    /// serve's own default).
    pub fn serve_once(&self, concurrency: usize) -> Run {
        let concurrency = concurrency.to_string();
        self.run(&[
            "serve",
            "-q",
            "--queue",
            self.queue.to_str().expect("a UTF-8 path"),
            "--concurrency",
            &concurrency,
            "--once",
            "--poll-ms",
            "50",
        ])
    }

    /// Starts `terrace ARGS` in the background, its output dropped (a test reads the store).
    pub fn start(&self, args: &[&str]) -> std::process::Child {
        self.terrace()
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("terrace starts")
    }

    /// Waits until the stored log of `job` (as `terrace logs` prints it) contains `text`,
    /// failing after `within`.
    pub async fn wait_for_log(&self, ws: &str, job: &str, text: &str, within: std::time::Duration) {
        let deadline = std::time::Instant::now() + within;
        loop {
            let log = self.run(&["logs", ws, job]);
            if log.stdout().contains(text) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{job}'s log never showed {text:?}: {}",
                log.stdout()
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    /// Writes a job file and returns its path.
    pub fn job(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).expect("job file");
        path
    }

    /// A runner in this process over `store`, set up like the sandbox's `terrace` (same
    /// terraform, provider mirror, test cloud and grace period).
    pub fn runner(&self, store: std::sync::Arc<dyn StateStore>) -> shared::run::runner::Runner {
        shared::run::runner::Runner::new(store, self.runner_config())
    }

    /// The settings of [`Sandbox::runner`], to change before making a runner.
    pub fn runner_config(&self) -> shared::run::runner::RunnerConfig {
        use shared::run::runner::RunnerConfig;
        use shared::run::terraform::TerraformConfig;
        let mut env = vec![(
            "TESTCLOUD_ROOT".to_owned(),
            self.cloud.display().to_string(),
        )];
        env.extend(self.env.iter().cloned());
        RunnerConfig {
            terraform: TerraformConfig {
                binary: terraform(),
                cli_config: Some(self.cli_config.clone()),
                env,
                grace: std::time::Duration::from_secs(5),
                ..TerraformConfig::default()
            },
            console: false,
            templates: Some(shared::job::template::source::Templates::folder(
                &self.templates,
            )),
            ..RunnerConfig::default()
        }
    }

    /// Validates a job text against the sandbox's templates.
    pub fn validated(&self, text: &str) -> shared::job::validate::ValidatedJob {
        let raw = shared::job::RawJob::parse(text).expect("job parses");
        shared::job::validate::validate(&raw, &self.templates).expect("job is valid")
    }

    pub fn fs_store(&self) -> FsStore {
        FsStore::new(&self.store)
    }

    /// Every state version of a workspace.
    pub async fn versions(&self, ws: &str) -> Vec<VersionInfo> {
        let ws: WorkspaceId = ws.parse().expect("tenant/workspace");
        self.fs_store().versions(&ws).await.expect("versions")
    }

    /// A run artifact as JSON.
    pub async fn artifact_json(&self, ws: &str, job: &str, name: &str) -> serde_json::Value {
        let ws: WorkspaceId = ws.parse().expect("tenant/workspace");
        let raw = self
            .fs_store()
            .artifact(&ws, job, name)
            .await
            .expect("artifact")
            .unwrap_or_else(|| panic!("no artifact {name} for job {job}"));
        let value = serde_json::from_slice(&raw).expect("artifact is JSON");
        if name == "result.json" {
            schema::check("result", &value);
        }
        value
    }

    /// Writes the demo job `id` (see [`demo_job`]), runs it with `terrace run -q`, asserts the
    /// exit code and returns the stored result.
    pub async fn run_demo(
        &self,
        id: &str,
        workspace: &str,
        operation: &str,
        cluster: &str,
        node_count: u32,
        code: i32,
    ) -> serde_json::Value {
        let job = self.job(
            &format!("{id}.yaml"),
            &demo_job(id, workspace, operation, cluster, node_count),
        );
        self.run(&["run", "-q", job.to_str().expect("utf-8 path")])
            .expect_code(code);
        self.artifact_json(&format!("acme/{workspace}"), id, "result.json")
            .await
    }

    /// The store's copy of a workspace's current state (`tenant/workspace`), as JSON.
    pub fn current_state(&self, ws: &str) -> serde_json::Value {
        let raw =
            std::fs::read(self.store.join(ws).join("terraform.tfstate")).expect("current state");
        serde_json::from_slice(&raw).expect("state is JSON")
    }

    /// One state version of a workspace (`tenant/workspace`), as JSON.
    pub fn version_state(&self, ws: &str, number: u64) -> serde_json::Value {
        let raw = std::fs::read(
            self.store
                .join(ws)
                .join(format!("versions/{number:010}.tfstate")),
        )
        .expect("version");
        serde_json::from_slice(&raw).expect("state is JSON")
    }

    /// Configures the test cloud's fault injection (`faults.json`, see the provider's `faults`).
    pub fn faults(&self, faults: serde_json::Value) {
        use std::os::unix::fs::PermissionsExt;
        let path = self.cloud.join("faults.json");
        std::fs::write(&path, faults.to_string()).expect("faults.json");
        // The provider counts the faults down, as terraform's user (see `Sandbox::new`).
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))
            .expect("faults.json permissions");
    }

    /// The test cloud's fault configuration as it stands (the counts go down as faults fire).
    pub fn faults_left(&self) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.cloud.join("faults.json")).expect("faults.json"))
            .expect("JSON")
    }

    /// The test cloud's resources: relative path → content.
    pub fn cloud_files(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for kind in ["network", "cluster"] {
            let Ok(entries) = std::fs::read_dir(self.cloud.join(kind)) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.ends_with(".json") {
                    out.insert(
                        format!("{kind}/{name}"),
                        std::fs::read_to_string(e.path()).expect("read"),
                    );
                }
            }
        }
        out
    }

    /// What the `probe` template's provisioner recorded for the network `name`: `uid`,
    /// `runner_environ` (`readable` or `denied`), `own_env` (its variables' names).
    pub fn probe(&self, name: &str) -> BTreeMap<String, String> {
        let path = self.cloud.join(format!("{name}-probe.txt"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("the probe left no record at {}: {e}", path.display()));
        text.lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    /// Asserts that the probe `name` (run by a cloud function) got nothing of the runner's:
    /// the runner's environment was unreadable; when the runner was root (`runner_root`),
    /// terraform ran as a user of the job's own and what it left running was killed when the
    /// job ended; terraform's own environment held none of `secrets` nor any variable that holds
    /// or leads to a function's credentials, but those of `customers` (what the runner sets
    /// itself for the customer's access, e.g. the AWS config file of its broker). The probe's
    /// uid.
    pub fn assert_probe_got_nothing(
        &self,
        name: &str,
        secrets: &[&str],
        customers: &[&str],
        runner_root: bool,
    ) -> u32 {
        let report = self.probe(name);
        let leftover: i32 = report["leftover"].parse().expect("a pid");
        // Killed, it may stay a zombie until whoever adopted it reaps it: not alive. A SIGKILL
        // takes effect when the process is next scheduled: given a moment on a busy machine.
        let running = || alive(leftover);
        let mut alive = running();
        for _ in 0..50 {
            // Only a root runner kills what a job leaves.
            if !alive || !runner_root {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
            alive = running();
        }
        // Not left to linger in the test's machine either way.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(leftover),
            nix::sys::signal::Signal::SIGKILL,
        );
        let uid: u32 = report["uid"].parse().expect("a uid");
        assert!(
            report["tmpdir"].ends_with("/.tmp") && report["tmpdir"].contains("terrace-"),
            "terraform's temp folder is its workdir's own: {report:?}"
        );
        assert_eq!(
            report.get("runner_environ").map(String::as_str),
            Some("denied"),
            "terraform read the runner's environment: {report:?}"
        );
        if runner_root {
            let first = shared::run::terraform::FIRST_JOB_UID;
            assert!(
                (first..first + 64).contains(&uid),
                "a runner running as root runs terraform as a user of the job's own: {report:?}"
            );
            assert!(
                !alive,
                "what the job left running (pid {leftover}) outlived it: {report:?}"
            );
        }
        let own: Vec<&str> = report
            .get("own_env")
            .map(|names| names.split(',').filter(|n| !n.is_empty()).collect())
            .unwrap_or_default();
        assert!(
            own.contains(&"PATH"),
            "the probe recorded its variables: {report:?}"
        );
        for name in shared::host::settings::RUNNER_CREDENTIALS
            .iter()
            .chain(secrets)
        {
            assert!(
                customers.contains(name) || !own.contains(name),
                "terraform's environment holds {name}: {own:?}"
            );
        }
        uid
    }

    /// The names of the test cloud's resources, sorted.
    pub fn cloud_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .cloud_files()
            .values()
            .map(|c| {
                let resource: serde_json::Value = serde_json::from_str(c).expect("resource JSON");
                resource["name"].as_str().expect("a name").to_owned()
            })
            .collect();
        names.sort();
        names
    }

    /// Every file under the store, with its content, for leak checks.
    pub fn store_files(&self) -> Vec<(PathBuf, Vec<u8>)> {
        let mut out = Vec::new();
        let mut stack = vec![self.store.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let path = e.path();
                if path.is_dir() {
                    stack.push(path);
                } else {
                    let data = std::fs::read(&path).expect("read");
                    out.push((path, data));
                }
            }
        }
        out
    }
}

/// A finished `terrace` process.
/// Whether process `pid` runs: one killed may stay a zombie until whoever adopted it reaps it,
/// and that is not running.
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat.rsplit_once(") ")?.1.chars().next()?;
            Some(state != 'Z' && state != 'X')
        })
        .unwrap_or(false)
}

pub struct Run(pub Output);

impl Run {
    pub fn code(&self) -> i32 {
        self.0.status.code().unwrap_or(-1)
    }

    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.0.stdout).into_owned()
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.0.stderr).into_owned()
    }

    /// Asserts the exit code, printing the output when it differs.
    #[track_caller]
    pub fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.code(),
            code,
            "terrace exited {}; stdout:\n{}\nstderr:\n{}",
            self.code(),
            self.stdout(),
            self.stderr()
        );
        self
    }
}

/// A platform's key pair for sealed outputs: its identity, and its recipient (`age1…`) to give
/// a runner.
pub fn outputs_key() -> (shared::run::sealed_outputs::Identity, String) {
    let identity = shared::run::sealed_outputs::Identity::generate();
    let recipient = identity.to_public().to_string();
    (identity, recipient)
}

/// Opens a result's `sealed_outputs` with `identity`, as a platform would: each sensitive
/// output's plain value by name.
pub fn open_sealed(
    result: &serde_json::Value,
    identity: &shared::run::sealed_outputs::Identity,
) -> std::collections::BTreeMap<String, serde_json::Value> {
    let sealed: shared::run::sealed_outputs::SealedOutputs =
        serde_json::from_value(result["sealed_outputs"].clone())
            .unwrap_or_else(|e| panic!("no sealed outputs ({e}) in {result}"));
    shared::run::sealed_outputs::open(&sealed, std::slice::from_ref(identity))
        .unwrap_or_else(|e| panic!("cannot open the sealed outputs: {e}"))
}

/// Secrets canary: the job message (`{"job": …}`) of an apply of the `leaky` template, whose
/// secret `canary` terraform prints in a resource, an output and its plan.
pub fn canary_message(id: &str, canary: &str, timeout: &str) -> serde_json::Value {
    serde_json::json!({
        "job": {
            "id": id, "tenant": "acme", "workspace": "canary", "operation": "apply",
            "template": { "name": "leaky", "version": "1.0.0" },
            "variables": { "name": "leaky", "token": canary },
            "timeout": timeout,
        },
    })
}

/// Secrets canary on process listings: reads every process's command line and environment (what
/// `ps` and `ps e` show) every 5 ms from [`ProcessListings::start`] until
/// [`ProcessListings::check`] (or until dropped).
pub struct ProcessListings {
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    sampler: Option<std::thread::JoinHandle<Sampled>>,
}

/// What the sampler saw: how many samples, whether this job's `terraform apply` was among
/// them, and where the secret was found (process and file, with the text).
type Sampled = (usize, bool, BTreeMap<String, String>);

impl ProcessListings {
    /// Starts sampling for `secret`. `cloud` is the test cloud folder of the job's sandbox: a
    /// `terraform apply` whose environment names it is this job's terraform.
    pub fn start(secret: &str, cloud: &Path) -> Self {
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Each variable ends with a NUL, read as a space: the whole value, not a prefix of a
        // longer path.
        let ours = format!("TESTCLOUD_ROOT={} ", cloud.display());
        let (secret, stop) = (secret.to_owned(), done.clone());
        let sampler = std::thread::spawn(move || {
            let (mut samples, mut terraform_seen) = (0, false);
            // One entry per process and file: where the secret was found.
            let mut leaks = BTreeMap::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                for entry in std::fs::read_dir("/proc").unwrap().flatten() {
                    let dir = entry.path();
                    let read = |what: &str| {
                        std::fs::read(dir.join(what))
                            .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
                            .ok()
                    };
                    // Each on its own: a process whose environment is not readable (another
                    // user's) still has its command line checked.
                    let (cmdline, environ) = (read("cmdline"), read("environ"));
                    terraform_seen |= cmdline
                        .as_deref()
                        .is_some_and(|c| c.contains("terraform apply"))
                        && environ.as_deref().is_some_and(|e| e.contains(&ours));
                    for (what, text) in [("cmdline", cmdline), ("environ", environ)] {
                        if let Some(text) = text.filter(|t| t.contains(&secret)) {
                            leaks
                                .entry(format!("{} {what}", dir.display()))
                                .or_insert(text);
                        }
                    }
                }
                samples += 1;
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            (samples, terraform_seen, leaks)
        });
        ProcessListings {
            done,
            sampler: Some(sampler),
        }
    }

    /// Stops sampling. Fails if the secret was in a listing, or if no sample caught the job's
    /// `terraform apply` running (then the listings proved nothing).
    pub fn check(mut self) {
        self.done.store(true, std::sync::atomic::Ordering::SeqCst);
        let sampler = self.sampler.take().expect("checked once");
        let (samples, terraform_seen, leaks) = sampler.join().unwrap();
        assert!(
            leaks.is_empty(),
            "the secret is in a process listing: {leaks:?}"
        );
        assert!(
            terraform_seen,
            "no sample of {samples} caught this job's terraform apply running (its command line and environment read), so the listings proved nothing"
        );
    }
}

impl Drop for ProcessListings {
    /// A test that fails before [`ProcessListings::check`] stops the sampler too.
    fn drop(&mut self) {
        self.done.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Secrets canary: fails when an object under `prefix` other than a state holds `canary`
/// (terraform's states hold the values they manage, by design; nothing else may). How many
/// states hold it: more than none shows the canary reached terraform. Also fails when no
/// `result.json` is there, or no stored log with terraform's lines about `resource` (the run
/// left nothing to search).
pub async fn canary_in_states(
    bucket: &dyn state_backends::objects::Bucket,
    prefix: &str,
    canary: &str,
    resource: &str,
) -> usize {
    let listed = bucket.list(prefix).await.unwrap();
    assert!(
        listed.iter().any(|l| l.key.ends_with("result.json")),
        "{listed:?}"
    );
    let mut states = 0;
    let mut logged = false;
    for l in &listed {
        let data = bucket.get(&l.key).await.unwrap().unwrap().data;
        let holds = data.windows(canary.len()).any(|w| w == canary.as_bytes());
        logged |= l.key.contains("/log")
            && data
                .windows(resource.len())
                .any(|w| w == resource.as_bytes());
        if l.key.ends_with(".tfstate") {
            states += usize::from(holds);
        } else {
            assert!(!holds, "{} holds the secret", l.key);
        }
    }
    assert!(
        logged,
        "no stored log with terraform's lines about {resource}: {listed:?}"
    );
    states
}

/// A demo job (the demo template) as YAML.
pub fn demo_job(
    id: &str,
    workspace: &str,
    operation: &str,
    cluster: &str,
    node_count: u32,
) -> String {
    format!(
        "id: {id}\ntenant: acme\nworkspace: {workspace}\noperation: {operation}\n\
         template: {{ name: demo, version: 1.0.0 }}\n\
         variables:\n  cluster_name: {cluster}\n  region: eu-west-1\n  node_count: {node_count}\n  \
         admin_password: correct-horse-battery-staple\ntimeout: 5m\n"
    )
}

/// A new key: its PEM file in the sandbox, and its public key as `terrace keygen` prints it.
pub fn keygen(sb: &Sandbox, name: &str) -> (std::path::PathBuf, String) {
    let path = sb.dir.path().join(name);
    let made = sb.run(&["keygen", "--out", path.to_str().unwrap()]);
    made.expect_code(0);
    let public = made.stdout().trim().to_owned();
    assert_eq!(public.len(), 44, "base64 of 32 bytes: {public}");
    let pem = std::fs::read_to_string(&path).unwrap();
    assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----"));
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    assert!(
        !made.stdout().contains(&body) && !made.stderr().contains(&body),
        "the private key was printed"
    );
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "readable by its owner only");
    (path, public)
}

/// Checks what `terrace submit --follow` printed for an apply that succeeded: exit 0, the
/// streamed log, then the result. Returns its stderr.
pub fn assert_followed_to_success(out: &std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("terraform apply"),
        "the log was streamed: {stdout}"
    );
    assert!(
        stdout.contains("status:     succeeded"),
        "then the result: {stdout}"
    );
    stderr
}

/// Waits until the stored log of `job` in `ws` (its chunks, read straight from `store`) holds
/// `text`, for at most `within`: how a test knows a job on a cloud function's path has reached
/// a step.
pub async fn wait_for_stored_log(
    store: &dyn StateStore,
    ws: &WorkspaceId,
    job: &str,
    text: &str,
    within: std::time::Duration,
) {
    let deadline = std::time::Instant::now() + within;
    loop {
        for name in store.artifacts(ws, job).await.unwrap_or_default() {
            if let Ok(Some(chunk)) = store.artifact(ws, job, &name).await
                && name.starts_with("log/")
                && String::from_utf8_lossy(&chunk).contains(text)
            {
                return;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{job}'s stored log never showed {text:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
}

/// The names of a result's steps, in order.
pub fn step_names(result: &serde_json::Value) -> Vec<String> {
    result["steps"]
        .as_array()
        .map(|steps| {
            steps
                .iter()
                .filter_map(|s| s["step"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// PIDs of the children of `pid`, from /proc.
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in entries.flatten() {
        let Some(child) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // pid (comm) state ppid …; comm may contain spaces, so split after the last ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        if rest
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok())
            == Some(pid)
        {
            out.push(child);
        }
    }
    out
}
