//! `terrace policy …`: policy sets (docs/policy.md), and reading the one `--policies` names.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Subcommand;
use shared::job::template::source::Publication;
use shared::run::policy::source::{self, SetRef};
use shared::run::policy::{Bounds, Policies, PolicyError, PolicySet};

use crate::cli::{Global, default_cache_dir};
use crate::exit;
use crate::store::{self, StoreUrl};

#[derive(Subcommand, Debug)]
pub(crate) enum PolicyCmd {
    /// Parse a folder of policies and print its digest; nothing is published.
    Check {
        /// The folder of `.rego` files.
        dir: PathBuf,
    },
    /// Publish a folder of policies to a bucket as NAME VERSION, for runners to read with
    /// TERRACE_POLICIES=URL/NAME/VERSION. It must parse; a published version never changes.
    Publish {
        /// The folder of `.rego` files.
        dir: PathBuf,
        name: String,
        version: String,
        /// The bucket: s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or az://ACCOUNT/CONTAINER/PREFIX.
        #[arg(long)]
        to: String,
    },
}

pub(crate) async fn run(cmd: PolicyCmd) -> anyhow::Result<u8> {
    match cmd {
        PolicyCmd::Check { dir } => Ok(match PolicySet::load(&dir) {
            Ok(set) => {
                outln!(
                    "{}: {} files parse ({})",
                    dir.display(),
                    set.files.len(),
                    set.digest
                );
                exit::OK
            }
            Err(e) => {
                eprintln!("error: {e}");
                exit::CONFIG
            }
        }),
        PolicyCmd::Publish {
            dir,
            name,
            version,
            to,
        } => publish(&dir, &name, &version, &to).await,
    }
}

async fn publish(dir: &Path, name: &str, version: &str, to: &str) -> anyhow::Result<u8> {
    let url = match store::publish_target(to) {
        Ok(url) => url,
        Err(code) => return Ok(code),
    };
    let (bucket, prefix) = store::open_bucket(&url).await?;
    let base = url.to_string();
    match source::publish(bucket, &prefix, &base, dir, (name, version)).await {
        Ok((set, publication)) => {
            let what = match publication {
                Publication::New => "published",
                Publication::Same => "already published, the same files",
            };
            outln!(
                "{name} {version}: {what} ({} files, {})",
                set.files.len(),
                set.digest
            );
            outln!(
                "runners read it with TERRACE_POLICIES={}/{name}/{version}",
                base.trim_end_matches('/')
            );
            Ok(exit::OK)
        }
        Err(e @ (PolicyError::Parse { .. } | PolicyError::Read { .. })) => {
            eprintln!("error: nothing was published: {e}");
            Ok(exit::CONFIG)
        }
        Err(e) => Err(e.into()),
    }
}

/// The set `--policies` names (a folder, or a published set fetched into the cache), with its
/// bounds.
///
/// # Errors
/// The set cannot be read, fetched or parsed; or its bucket cannot be opened.
pub(crate) async fn load(g: &Global, text: &str) -> Result<Arc<Policies>, String> {
    let set = match SetRef::parse(text)? {
        SetRef::Folder(path) => PolicySet::load(&path).map_err(|e| e.to_string())?,
        SetRef::Published {
            base,
            name,
            version,
            ..
        } => {
            let url: StoreUrl = base.parse().map_err(|e| format!("{base}: {e}"))?;
            let (bucket, prefix) = store::open_bucket(&url)
                .await
                .map_err(|e| format!("{base}: {e}"))?;
            let cache = g
                .cache_dir
                .clone()
                .or_else(default_cache_dir)
                .map(|d| d.join("policies"))
                .unwrap_or_else(|| std::env::temp_dir().join("terrace-policies"));
            source::fetch(bucket, &prefix, &base, (&name, &version), &cache)
                .await
                .map_err(|e| e.to_string())?
        }
    };
    Ok(Arc::new(Policies {
        set,
        bounds: Bounds {
            time: Duration::from_secs(g.policy_timeout),
            memory_bytes: g.policy_memory_mb << 20,
        },
        evaluator: Some(std::env::current_exe().map_err(|e| e.to_string())?),
    }))
}
