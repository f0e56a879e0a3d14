//! moto, the AWS emulator the AWS tests run against: its endpoint (started by
//! `scripts/with-emulators.sh`, which `make test` and CI use) and clients for it.

use aws_sdk_s3::config::{Credentials, Region};

/// moto's endpoint. Fails (never skips) when it is not running.
pub fn moto() -> String {
    std::env::var("TERRACE_TEST_MOTO").unwrap_or_else(|_| {
        panic!(
            "TERRACE_TEST_MOTO is not set: run the tests with moto, e.g. \
             `scripts/with-emulators.sh cargo test --workspace` or `make test`"
        )
    })
}

/// An AWS configuration for moto: its endpoint, a region and static test credentials.
pub async fn sdk_config() -> aws_config::SdkConfig {
    sdk_config_at(&moto()).await
}

/// An AWS configuration for the moto at `endpoint`.
pub async fn sdk_config_at(endpoint: &str) -> aws_config::SdkConfig {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("testing", "testing", None, None, "moto"))
        .load()
        .await
}

pub async fn s3() -> aws_sdk_s3::Client {
    let config = aws_sdk_s3::config::Builder::from(&sdk_config().await)
        .force_path_style(true)
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

pub async fn dynamodb() -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::new(&sdk_config().await)
}

/// A name no other test uses (moto is shared by every test of a run).
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!(
        "{prefix}-{:x}-{}",
        nanos % 0xffff_ffff_ffff,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// What `terrace` (the CLI) needs in its environment to reach moto as a machine reaches AWS.
pub fn cli_env() -> Vec<(String, String)> {
    [
        ("AWS_ENDPOINT_URL", moto()),
        ("AWS_ACCESS_KEY_ID", "testing".into()),
        ("AWS_SECRET_ACCESS_KEY", "testing".into()),
        ("AWS_CONFIG_FILE", "/nonexistent".into()),
        ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent".into()),
        ("AWS_REGION", "us-east-1".into()),
        ("TERRACE_S3_FORCE_PATH_STYLE", "1".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// A new bucket.
pub async fn bucket() -> String {
    let name = unique("terrace");
    s3().await
        .create_bucket()
        .bucket(&name)
        .send()
        .await
        .expect("create bucket in moto");
    name
}

/// A new lease table (partition key `pk`, on demand).
pub async fn lease_table() -> String {
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    };
    let name = unique("terrace-leases");
    dynamodb()
        .await
        .create_table()
        .table_name(&name)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("pk")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .expect("attribute"),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("pk")
                .key_type(KeyType::Hash)
                .build()
                .expect("key"),
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .expect("create table in moto");
    name
}

/// A moto server of one test's own, which the test may stop and start again (SIGSTOP: every
/// request hangs, as a store that stops answering). Killed when dropped.
pub struct PrivateMoto {
    pub endpoint: String,
    child: std::process::Child,
}

impl PrivateMoto {
    /// Starts one on a free port (moto installed by `scripts/install-moto.sh`), and waits until
    /// it answers.
    pub async fn start() -> Self {
        let repo = crate::repo_root();
        let out = std::process::Command::new(repo.join("scripts/install-moto.sh"))
            .output()
            .expect("scripts/install-moto.sh runs");
        let server = String::from_utf8(out.stdout).expect("a path");
        let python = std::path::Path::new(server.trim())
            .parent()
            .expect("moto's virtualenv")
            .join("python");
        let port = crate::gcp::free_port();
        let child = std::process::Command::new(python)
            .arg(repo.join("scripts/moto-server.py"))
            .args(["127.0.0.1", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("moto starts");
        // Dropped (killed and waited for) on every path out of here.
        let moto = Self {
            endpoint: format!("http://127.0.0.1:{port}"),
            child,
        };
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return moto;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!("the private moto did not start on port {port}");
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).expect("a pid"));
        nix::sys::signal::kill(pid, signal).expect("signal moto");
    }

    /// Stops answering: every request hangs until [`PrivateMoto::resume`].
    pub fn freeze(&self) {
        self.signal(nix::sys::signal::Signal::SIGSTOP);
    }

    pub fn resume(&self) {
        self.signal(nix::sys::signal::Signal::SIGCONT);
    }
}

impl Drop for PrivateMoto {
    fn drop(&mut self) {
        self.resume();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Counts the HTTP requests a client sends (retries included).
#[derive(Clone, Debug, Default)]
pub struct CallCounter(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl CallCounter {
    pub fn get(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
    pub fn reset(&self) {
        self.0.store(0, std::sync::atomic::Ordering::SeqCst);
    }
}

impl aws_sdk_s3::config::Intercept for CallCounter {
    fn name(&self) -> &'static str {
        "CallCounter"
    }

    fn read_before_transmit(
        &self,
        _context: &aws_sdk_s3::config::interceptors::BeforeTransmitInterceptorContextRef<'_>,
        _components: &aws_sdk_s3::config::RuntimeComponents,
        _cfg: &mut aws_sdk_s3::config::ConfigBag,
    ) -> Result<(), aws_sdk_s3::error::BoxError> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

/// An S3 client for moto whose requests `counter` counts.
pub async fn s3_counted(counter: &CallCounter) -> aws_sdk_s3::Client {
    let config = aws_sdk_s3::config::Builder::from(&sdk_config().await)
        .force_path_style(true)
        .interceptor(counter.clone())
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

/// One raw call to moto, for the services whose SDK crates are too big to build for a lookup
/// or two (EC2, KMS). moto reads the service from the credential scope; it checks no signature.
fn moto_call(service: &str, headers: &str, body: &str) -> String {
    use std::io::{Read, Write};
    let endpoint = moto();
    let host = endpoint.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(host).expect("moto reachable");
    write!(
        stream,
        "POST / HTTP/1.1\r\nHost: {host}\r\n{headers}\
         Authorization: AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/{service}/aws4_request, SignedHeaders=host, Signature=0\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("request sent");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response read");
    response
}

fn ec2_query(action: &str) -> String {
    moto_call(
        "ec2",
        "Content-Type: application/x-www-form-urlencoded\r\n",
        &format!("Action={action}&Version=2016-11-15"),
    )
}

/// A new KMS key in moto; its ARN.
pub fn kms_key() -> String {
    let response = moto_call(
        "kms",
        "Content-Type: application/x-amz-json-1.1\r\nX-Amz-Target: TrentService.CreateKey\r\n",
        "{}",
    );
    first_between(&response, "\"Arn\": \"", "\"")
        .expect("moto created a key")
        .to_owned()
}

fn first_between<'a>(text: &'a str, open: &str, close: &str) -> Option<&'a str> {
    let start = text.find(open)? + open.len();
    let end = text[start..].find(close)? + start;
    Some(&text[start..end])
}

/// A subnet and a security group of moto's default VPC, for ECS tasks.
pub fn default_network() -> (String, String) {
    let subnets = ec2_query("DescribeSubnets");
    let groups = ec2_query("DescribeSecurityGroups");
    (
        first_between(&subnets, "<subnetId>", "</subnetId>")
            .expect("moto has default subnets")
            .to_owned(),
        first_between(&groups, "<groupId>", "</groupId>")
            .expect("moto has a default security group")
            .to_owned(),
    )
}
