//! Terraform's credentials for the customer account, fresh for as long as the job runs.
//!
//! A role that assumes a role gets sessions of at most one hour, and a job on ECS may run for
//! longer. So terraform does not get static keys: it gets an AWS config file whose
//! `credential_process` is `terrace-aws credentials`, which asks this job's broker, on
//! loopback with a per-job token, for the current session. The broker assumes the customer's
//! role (session `<job>-tf`, never the function's own credentials), keeps the session while it
//! has more than `TERRACE_REFRESH_CREDENTIALS_BEFORE` (10 min) left, and assumes the role
//! again after that. The AWS SDKs
//! in terraform's providers call the process again when the `Expiration` it reported passes.

use std::sync::Arc;
use std::time::Duration;

use aws_config::SdkConfig;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use shared::host::broker::{Keys, Loopback};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio::sync::Mutex;

use crate::access::{AccessError, Target, session_name};

/// The path the broker serves.
const PATH: &str = "/aws-credentials";
/// Names of the variables `terrace-aws credentials` reads.
pub const URL_VAR: &str = "TERRACE_CREDENTIALS_URL";
pub const TOKEN_VAR: &str = "TERRACE_CREDENTIALS_TOKEN";

/// One session, as the `credential_process` document.
#[derive(Clone)]
struct Issued {
    document: String,
    expires_at: OffsetDateTime,
}

struct Broker {
    base: SdkConfig,
    target: Target,
    job_id: String,
    deadline: OffsetDateTime,
    refresh_before: Duration,
    current: Mutex<Option<Issued>>,
    /// The job's token, and every session's secrets for the job's redactor.
    keys: Keys,
}

/// How long a new session should last: until the job's deadline plus 5 minutes, within what
/// STS allows a chained role (15 min to 1 h).
fn session_seconds(deadline: OffsetDateTime, now: OffsetDateTime) -> i32 {
    let left = (deadline - now).whole_seconds().max(0);
    i32::try_from((left + 300).clamp(900, 3600)).unwrap_or(3600)
}

/// Whether a session that ends at `expires_at` may still be handed out at `now`.
fn still_fresh(expires_at: OffsetDateTime, now: OffsetDateTime, refresh_before: Duration) -> bool {
    expires_at - now > refresh_before
}

impl Broker {
    async fn credentials(&self) -> Result<Issued, AccessError> {
        let mut current = self.current.lock().await;
        let now = OffsetDateTime::now_utc();
        if let Some(issued) = current
            .as_ref()
            .filter(|i| still_fresh(i.expires_at, now, self.refresh_before))
        {
            return Ok(issued.clone());
        }
        let external_id = self.target.check()?;
        let sts_error = |message: String| AccessError::Sts {
            role: self.target.role_arn.clone(),
            message,
        };
        let out = aws_sdk_sts::Client::new(&self.base)
            .assume_role()
            .role_arn(&self.target.role_arn)
            .external_id(external_id)
            .role_session_name(session_name(&self.job_id, "-tf"))
            .duration_seconds(session_seconds(self.deadline, now))
            .send()
            .await
            .map_err(|e| sts_error(state_backends::s3::brief(&e)))?;
        let creds = out
            .credentials()
            .ok_or_else(|| sts_error("STS returned no credentials".into()))?;
        self.keys.handed_out.add(creds.secret_access_key());
        self.keys.handed_out.add(creds.session_token());
        let expires_at = OffsetDateTime::from_unix_timestamp(creds.expiration().secs())
            .map_err(|e| sts_error(format!("STS returned an odd expiration: {e}")))?;
        let document = serde_json::json!({
            "Version": 1,
            "AccessKeyId": creds.access_key_id(),
            "SecretAccessKey": creds.secret_access_key(),
            "SessionToken": creds.session_token(),
            "Expiration": expires_at.format(&Rfc3339).unwrap_or_default(),
        })
        .to_string();
        tracing::info!(job_id = %self.job_id, expires_at = %expires_at, "terraform's session for the customer account");
        let issued = Issued {
            document,
            expires_at,
        };
        *current = Some(issued.clone());
        Ok(issued)
    }
}

async fn serve(State(broker): State<Arc<Broker>>, headers: HeaderMap) -> (StatusCode, String) {
    let authorized = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|token| broker.keys.admits(token));
    if !authorized {
        return (StatusCode::UNAUTHORIZED, "wrong or missing token\n".into());
    }
    match broker.credentials().await {
        Ok(issued) => (StatusCode::OK, issued.document),
        Err(e) => (StatusCode::BAD_GATEWAY, format!("{e}\n")),
    }
}

/// The credentials of one job's terraform: the broker serving them and the environment that
/// points terraform at it. Dropping it stops the broker and removes the config file.
pub struct ForTerraform {
    /// Secret: the broker's address and token.
    pub env: Vec<(String, String)>,
    /// Not secret: the config file's path, the region.
    pub settings: Vec<(String, String)>,
    /// The sessions' secrets, as the broker hands them out, for the job's redactor.
    pub late: shared::job::redact::LateSecrets,
    _broker: Loopback,
    dir: tempfile::TempDir,
}

impl ForTerraform {
    /// The folder of terraform's AWS config file (the runner's own, 0700, until given to
    /// terraform's user).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

/// Starts the broker for a job that may run for `timeout`, with its first session already
/// taken, so that a refused role fails the job before terraform starts.
///
/// # Errors
/// [`AccessError`] when the target is refused or STS fails; the broker's socket or config file
/// cannot be made (as [`AccessError::Local`]).
pub async fn for_terraform(
    base: &SdkConfig,
    target: &Target,
    job_id: &str,
    timeout: Duration,
    refresh_before: Duration,
) -> Result<ForTerraform, AccessError> {
    target.check()?;
    let broker = Arc::new(Broker {
        base: base.clone(),
        target: target.clone(),
        job_id: job_id.to_owned(),
        deadline: OffsetDateTime::now_utc() + timeout,
        refresh_before,
        current: Mutex::new(None),
        keys: Keys::new(),
    });
    broker.credentials().await?;

    let local = |what: &str, e: std::io::Error| AccessError::Local(format!("{what}: {e}"));
    let app = axum::Router::new()
        .route(PATH, get(serve))
        .with_state(broker.clone());
    let served = Loopback::serve("the credentials broker", app)
        .await
        .map_err(|e| local("cannot open the credentials broker's socket", e))?;
    let address = served.address;

    let dir = tempfile::Builder::new()
        .prefix("terrace-aws-")
        .tempdir()
        .map_err(|e| local("cannot make the AWS config folder", e))?;
    let exe = std::env::current_exe().map_err(|e| local("cannot find terrace-aws itself", e))?;
    let region = target
        .region
        .clone()
        .or_else(|| base.region().map(ToString::to_string));
    let mut config = format!(
        "[default]\ncredential_process = {} credentials\n",
        shell_quote(&exe.display().to_string())
    );
    if let Some(region) = &region {
        config.push_str(&format!("region = {region}\n"));
    }
    let config_file = dir.path().join("config");
    let credentials_file = dir.path().join("credentials");
    std::fs::write(&config_file, config).map_err(|e| local("cannot write the AWS config", e))?;
    std::fs::write(&credentials_file, "")
        .map_err(|e| local("cannot write the AWS credentials file", e))?;

    let mut settings = vec![
        (
            "AWS_CONFIG_FILE".to_owned(),
            config_file.display().to_string(),
        ),
        // No other credentials: an empty shared file, and no instance metadata.
        (
            "AWS_SHARED_CREDENTIALS_FILE".to_owned(),
            credentials_file.display().to_string(),
        ),
        ("AWS_EC2_METADATA_DISABLED".to_owned(), "true".to_owned()),
        // Older providers (AWS SDK for Go v1) read the config file only when told to.
        ("AWS_SDK_LOAD_CONFIG".to_owned(), "1".to_owned()),
    ];
    if let Some(region) = region {
        settings.push(("AWS_REGION".to_owned(), region));
    }
    Ok(ForTerraform {
        env: vec![
            (URL_VAR.to_owned(), format!("http://{address}{PATH}")),
            (TOKEN_VAR.to_owned(), broker.keys.secret.clone()),
        ],
        settings,
        late: broker.keys.handed_out.clone(),
        _broker: served,
        dir,
    })
}

/// A word for `sh -c`, quoted when it needs to be.
fn shell_quote(word: &str) -> String {
    if word
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+".contains(c))
    {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// `terrace-aws credentials`: terraform's `credential_process`. Prints the broker's document.
pub async fn print() -> std::process::ExitCode {
    use http_body_util::BodyExt;
    use std::process::ExitCode;

    let (Ok(url), Ok(token)) = (std::env::var(URL_VAR), std::env::var(TOKEN_VAR)) else {
        eprintln!(
            "terrace-aws credentials: {URL_VAR} and {TOKEN_VAR} are not set; this command is the credential_process of a job's terraform, not for use by hand"
        );
        return ExitCode::from(64);
    };
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let request = match axum::http::Request::get(&url)
        .header(axum::http::header::AUTHORIZATION, format!("Bearer {token}"))
        .body(http_body_util::Empty::new())
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("terrace-aws credentials: bad {URL_VAR}: {e}");
            return ExitCode::from(64);
        }
    };
    let response = match client.request(request).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("terrace-aws credentials: the job's credentials broker did not answer: {e}");
            return ExitCode::FAILURE;
        }
    };
    let status = response.status();
    let body = match response.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            eprintln!("terrace-aws credentials: {e}");
            return ExitCode::FAILURE;
        }
    };
    let text = String::from_utf8_lossy(&body);
    if status.is_success() {
        println!("{text}");
        ExitCode::SUCCESS
    } else {
        eprintln!("terrace-aws credentials: {status}: {}", text.trim());
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_last_the_job_within_what_sts_allows() {
        let now = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let secs = |s: i64| now + time::Duration::seconds(s);
        assert_eq!(session_seconds(secs(60), now), 900, "15 min at least");
        assert_eq!(session_seconds(secs(1200), now), 1500, "the job plus 5 min");
        assert_eq!(session_seconds(secs(5 * 3600), now), 3600, "1 h at most");
        assert_eq!(session_seconds(secs(-10), now), 900, "past the deadline");
    }

    #[test]
    fn a_session_is_replaced_ten_minutes_before_it_ends() {
        let now = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let ten = Duration::from_secs(600);
        assert!(still_fresh(now + time::Duration::minutes(11), now, ten));
        assert!(!still_fresh(now + time::Duration::minutes(10), now, ten));
        assert!(!still_fresh(now - time::Duration::minutes(1), now, ten));
    }

    #[test]
    fn the_process_path_is_quoted_for_the_shell_only_when_needed() {
        assert_eq!(
            shell_quote("/var/task/terrace-aws"),
            "/var/task/terrace-aws"
        );
        assert_eq!(shell_quote("/opt/my dir/t"), "'/opt/my dir/t'");
        assert_eq!(shell_quote("/a'b"), r"'/a'\''b'");
    }
}
