//! The built function images (`make images`), run with podman in place of the binaries: a
//! test sets up a function's command as it would for the binary, and [`Container::run`] runs
//! the same program, arguments and settings in the image instead, on the host's network.
//!
//! What the image brings itself is not passed in: terraform (`TERRACE_TERRAFORM`, and its
//! recorded version, `TERRACE_TERRAFORM_VERSION_FILE`), the templates (`TERRACE_TEMPLATES`) and the provider mirror (`TERRACE_TF_CLI_CONFIG`), so a job
//! that applies proves what was baked in works.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use crate::repo_root;

/// The settings the image sets itself, which a test's command must not override.
const THE_IMAGES_OWN: [&str; 5] = [
    "PATH",
    "TERRACE_TERRAFORM",
    "TERRACE_TERRAFORM_VERSION_FILE",
    "TERRACE_TEMPLATES",
    "TERRACE_TF_CLI_CONFIG",
];

/// `localhost/terrace-CLOUD:dev`, as `make images` tags it; fails the test when it is missing.
pub fn image(cloud: &str) -> String {
    let name = format!("localhost/terrace-{cloud}:dev");
    let there = podman()
        .args(["image", "exists", &name])
        .status()
        .expect("podman runs (scripts/install-podman.sh)");
    assert!(
        there.success(),
        "{name} is not built: run `make images` (or `make test-images`)"
    );
    name
}

/// podman, with the configuration scripts/install-podman.sh wrote for these machines.
pub fn podman() -> Command {
    let mut cmd = Command::new("podman");
    cmd.env(
        "CONTAINERS_CONF",
        repo_root().join(".cache/podman/containers.conf"),
    );
    cmd
}

/// A running container; removed (killed first) when dropped.
pub struct Container {
    pub child: Child,
    pub name: String,
}

impl Container {
    /// Runs `image` with the environment `function` sets (but the image's own settings),
    /// `container_args` after the image name, and `podman_args` (e.g. `--user`) before it.
    /// Folders the test cloud lives in (`TESTCLOUD_ROOT`) are mounted at the same path.
    pub fn run(
        function: &Command,
        image: &str,
        podman_args: &[&str],
        container_args: &[&str],
    ) -> Self {
        let name = format!(
            "terrace-test-{}-{}",
            std::process::id(),
            crate::aws::unique("c")
        );
        let mut cmd = podman();
        cmd.args(["run", "--rm", "--network=host", "--name", &name]);
        for (key, value) in function.get_envs() {
            let (Some(key), Some(value)) = (key.to_str(), value.and_then(OsStr::to_str)) else {
                continue;
            };
            if THE_IMAGES_OWN.contains(&key) {
                continue;
            }
            if key == "TESTCLOUD_ROOT" {
                let dir = PathBuf::from(value);
                cmd.arg("--volume")
                    .arg(format!("{}:{}", dir.display(), dir.display()));
            }
            // By name: the value reaches the container from podman's own environment, never
            // its command line (which any process on the machine can read).
            cmd.env(key, value).arg("--env").arg(key);
        }
        // A runner that is root in the container takes job users (uid 61000 and up) with lock
        // files in its temp folder, and kills what runs as the one it takes. With `--pid=host`
        // that reaches this machine's processes too: the container shares the host's lock
        // folder, so it never takes a uid a runner of the tests holds.
        if !podman_args.iter().any(|a| a.starts_with("--user")) {
            use std::os::unix::fs::DirBuilderExt;
            let locks = std::env::temp_dir().join("terrace-job-users");
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&locks)
                .expect("the job users' lock folder");
            cmd.arg("--volume")
                .arg(format!("{}:/tmp/terrace-job-users", locks.display()));
        }
        cmd.args(podman_args).arg(image).args(container_args);
        let verbose = std::env::var_os("TERRACE_TEST_VERBOSE").is_some();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(if verbose {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .stderr(if verbose {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .spawn()
            .expect("podman runs (scripts/install-podman.sh)");
        Self { child, name }
    }

    /// Waits for the container to end; its exit code.
    pub fn wait(&mut self) -> Option<i32> {
        self.child.wait().expect("podman ends").code()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman()
            .args(["rm", "--force", "--time", "0", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
