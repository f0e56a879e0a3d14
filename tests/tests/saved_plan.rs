//! Saved plans with the machine's terraform, through the runner's own commands and state
//! server: the apply carries out exactly the plan that was shown (even when the cloud changed
//! since), and a plan made stale by another write is refused with nothing written.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use shared::job::redact::Redactor;
use shared::run::classify::classify;
use shared::run::logs;
use shared::run::result::Category;
use shared::run::state_server::StateServer;
use shared::run::terraform::{self, Command, Outcome, PlanMode, TerraformConfig};
use state_backends::fs::FsStore;
use state_backends::{StateStore, WorkspaceId};
use tokio_util::sync::CancellationToken;

const MAIN: &str = r#"
terraform {
  backend "http" {}
}
variable "names" {
  type = list(string)
}
resource "terraform_data" "item" {
  for_each = toset(var.names)
  input    = each.key
}
"#;

/// Networks of the test cloud, one per name.
const NETWORKS: &str = r#"
terraform {
  backend "http" {}
  required_providers {
    testcloud = {
      source  = "terrace/testcloud"
      version = "0.1.0"
    }
  }
}
variable "names" {
  type = list(string)
}
resource "testcloud_network" "n" {
  for_each = toset(var.names)
  name     = each.key
  cidr     = "10.0.0.0/16"
}
"#;

struct Bench {
    _dir: tempfile::TempDir,
    work: std::path::PathBuf,
    store: Arc<dyn StateStore>,
    ws: WorkspaceId,
    server: StateServer,
    config: TerraformConfig,
    logger: logs::Logger,
    _pump: logs::Pump,
}

impl Bench {
    async fn new() -> Self {
        Self::with(MAIN).await
    }

    /// A workspace whose configuration is `main`, with the test cloud's provider at hand
    /// (its resources under `<dir>/cloud`).
    async fn with(main: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn StateStore> = Arc::new(FsStore::new(dir.path().join("store")));
        let ws = WorkspaceId::new("acme", "saved").unwrap();
        let server = tests::leased_state_server(store.clone(), &ws, "job-saved").await;
        let work = dir.path().join("work");
        std::fs::create_dir_all(work.join(".home")).unwrap();
        std::fs::write(work.join("main.tf"), main).unwrap();
        let (logger, pump) = logs::start(Redactor::default(), Vec::new());
        let cli_config = dir.path().join("terraformrc");
        std::fs::write(
            &cli_config,
            format!(
                "provider_installation {{\n  filesystem_mirror {{\n    path = {:?}\n  }}\n}}\n",
                tests::plugin_mirror().display().to_string()
            ),
        )
        .unwrap();
        let config = TerraformConfig {
            binary: tests::terraform(),
            cli_config: Some(cli_config),
            env: vec![(
                "TESTCLOUD_ROOT".into(),
                dir.path().join("cloud").display().to_string(),
            )],
            backend: server.endpoint().backend_env(),
            ..TerraformConfig::default()
        };
        let bench = Self {
            _dir: dir,
            work,
            store,
            ws,
            server,
            config,
            logger,
            _pump: pump,
        };
        let init = bench.run(&Command::Init).await;
        assert!(init.success(), "init: {:?}", init.errors);
        bench
    }

    fn names(&self, names: &[&str]) {
        std::fs::write(
            self.work.join("terraform.tfvars.json"),
            serde_json::json!({ "names": names }).to_string(),
        )
        .unwrap();
    }

    async fn run(&self, command: &Command) -> Outcome {
        terraform::run(
            &self.config,
            &self.work,
            command,
            &self.logger,
            &CancellationToken::new(),
        )
        .await
        .unwrap()
    }

    async fn plan(&self, mode: PlanMode) -> Outcome {
        let plan = self
            .run(&Command::Plan {
                mode,
                detailed_exitcode: false,
                targets: Vec::new(),
            })
            .await;
        assert!(plan.success(), "plan: {:?}", plan.errors);
        plan
    }

    async fn versions(&self) -> usize {
        self.store.versions(&self.ws).await.unwrap().len()
    }

    fn addresses(outcome: &Outcome) -> Vec<String> {
        let mut addresses: Vec<String> = outcome
            .events
            .changes()
            .unwrap()
            .resources
            .into_iter()
            .map(|r| r.address)
            .collect();
        addresses.sort();
        addresses
    }
}

fn in_state(state: &[u8]) -> Vec<String> {
    state_backends::tfstate::resource_addresses(state)
        .unwrap()
        .into_iter()
        .collect()
}

// terraform runs as a child while the state server answers on the runtime's other thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_plan_is_applied_exactly_and_a_destroy_plan_destroys_what_it_showed() {
    let b = Bench::new().await;
    b.names(&["a", "b", "c"]);
    let plan = b.plan(PlanMode::Normal).await;
    assert_eq!(
        Bench::addresses(&plan),
        [
            "terraform_data.item[\"a\"]",
            "terraform_data.item[\"b\"]",
            "terraform_data.item[\"c\"]"
        ]
    );
    // The configuration changes after the plan was shown: the saved plan is what is applied.
    b.names(&["a", "b", "c", "d", "e"]);
    let applied = b.run(&Command::Apply).await;
    assert!(applied.success(), "apply: {:?}", applied.errors);
    let summary = applied.events.summary.unwrap();
    assert_eq!((summary.add, summary.change, summary.remove), (3, 0, 0));
    let current = b.store.current(&b.ws).await.unwrap().unwrap();
    assert_eq!(
        in_state(&current.data),
        [
            "terraform_data.item[\"a\"]",
            "terraform_data.item[\"b\"]",
            "terraform_data.item[\"c\"]"
        ]
    );

    // A destroy plan limited to one resource destroys exactly that one.
    let destroy = b
        .run(&Command::Plan {
            mode: PlanMode::Destroy,
            detailed_exitcode: false,
            targets: vec!["terraform_data.item[\"b\"]".into()],
        })
        .await;
    assert!(destroy.success(), "{:?}", destroy.errors);
    assert_eq!(Bench::addresses(&destroy), ["terraform_data.item[\"b\"]"]);
    let applied = b.run(&Command::Apply).await;
    assert!(applied.success(), "{:?}", applied.errors);
    assert_eq!(applied.events.summary.unwrap().remove, 1);
    let current = b.store.current(&b.ws).await.unwrap().unwrap();
    assert_eq!(
        in_state(&current.data),
        ["terraform_data.item[\"a\"]", "terraform_data.item[\"c\"]"]
    );

    // A plan with no changes: its apply changes nothing and writes no version.
    b.names(&["a", "c"]);
    let before = b.versions().await;
    let plan = b.plan(PlanMode::Normal).await;
    assert!(plan.events.changes().unwrap().is_empty());
    let applied = b.run(&Command::Apply).await;
    assert!(applied.success(), "{:?}", applied.errors);
    assert_eq!(b.versions().await, before, "an empty apply wrote a version");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_made_stale_by_another_write_is_refused_and_nothing_is_written() {
    let b = Bench::new().await;
    b.names(&["a"]);
    b.plan(PlanMode::Normal).await;
    let first = b.run(&Command::Apply).await;
    assert!(first.success(), "{:?}", first.errors);

    b.names(&["a", "b"]);
    b.plan(PlanMode::Normal).await;
    // Another write lands between the plan and its apply (the state rolled forward).
    let current = b.store.current(&b.ws).await.unwrap().unwrap();
    let mut state: serde_json::Value = serde_json::from_slice(&current.data).unwrap();
    state["serial"] = (state["serial"].as_u64().unwrap() + 1).into();
    b.server
        .push(Bytes::from(serde_json::to_vec(&state).unwrap()))
        .await
        .unwrap();
    let versions = b.versions().await;

    let applied = b.run(&Command::Apply).await;
    assert!(!applied.success(), "a stale plan was applied");
    let error = classify("apply", &applied);
    assert!(error.message.contains("Saved plan is stale"), "{error:?}");
    assert_eq!(error.category, Category::StateConflict, "{error:?}");
    assert!(error.retryable, "{error:?}");
    assert!(error.hint.contains("plan again"), "{error:?}");
    assert_eq!(b.versions().await, versions, "the stale apply wrote state");
    let now = b.store.current(&b.ws).await.unwrap().unwrap();
    assert_eq!(in_state(&now.data), ["terraform_data.item[\"a\"]"]);
    assert!(Path::new(&b.work).join("terrace.tfplan").exists());
}

/// The test cloud's networks by name: (file, cidr).
fn networks(cloud: &Path) -> std::collections::BTreeMap<String, (std::path::PathBuf, String)> {
    let Ok(entries) = std::fs::read_dir(cloud.join("network")) else {
        return Default::default();
    };
    entries
        .map(|e| {
            let path = e.unwrap().path();
            let record: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            let name = record["name"].as_str().unwrap().to_owned();
            (name, (path, record["cidr"].as_str().unwrap().to_owned()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cloud_changing_between_plan_and_apply_changes_nothing_but_what_was_planned() {
    let b = Bench::with(NETWORKS).await;
    let cloud = b._dir.path().join("cloud");
    b.names(&["a", "b"]);
    b.plan(PlanMode::Normal).await;
    let first = b.run(&Command::Apply).await;
    assert!(first.success(), "{:?}", first.errors);
    assert_eq!(networks(&cloud).len(), 2);

    // The plan shown: create "c", nothing else.
    b.names(&["a", "b", "c"]);
    let plan = b.plan(PlanMode::Normal).await;
    assert_eq!(Bench::addresses(&plan), ["testcloud_network.n[\"c\"]"]);

    // Then, out of band: "b" is deleted and "a" gets another range.
    let before = networks(&cloud);
    std::fs::remove_file(&before["b"].0).unwrap();
    let a_file = &before["a"].0;
    let mut a: serde_json::Value = serde_json::from_slice(&std::fs::read(a_file).unwrap()).unwrap();
    a["cidr"] = "192.168.0.0/24".into();
    std::fs::write(a_file, serde_json::to_vec(&a).unwrap()).unwrap();

    // The saved plan is applied as shown: "c" is created; "b" is not recreated and "a" is not
    // put back, because neither was in the plan.
    let applied = b.run(&Command::Apply).await;
    assert!(applied.success(), "apply: {:?}", applied.errors);
    let summary = applied.events.summary.unwrap();
    assert_eq!((summary.add, summary.change, summary.remove), (1, 0, 0));
    let after = networks(&cloud);
    assert_eq!(after.keys().collect::<Vec<_>>(), ["a", "c"]);
    assert_eq!(after["a"].1, "192.168.0.0/24");
    // The state is the plan's view plus what was applied; the next plan will see the drift.
    let current = b.store.current(&b.ws).await.unwrap().unwrap();
    assert_eq!(
        in_state(&current.data),
        [
            "testcloud_network.n[\"a\"]",
            "testcloud_network.n[\"b\"]",
            "testcloud_network.n[\"c\"]"
        ]
    );
    let next = b.plan(PlanMode::Normal).await;
    let changes = next.events.changes().unwrap();
    let mut actions: Vec<(String, Vec<String>)> = changes
        .resources
        .into_iter()
        .map(|r| (r.address, r.actions))
        .collect();
    actions.sort();
    assert_eq!(
        actions,
        [
            (
                "testcloud_network.n[\"a\"]".to_owned(),
                vec!["update".to_owned()]
            ),
            (
                "testcloud_network.n[\"b\"]".to_owned(),
                vec!["create".to_owned()]
            ),
        ]
    );
}
