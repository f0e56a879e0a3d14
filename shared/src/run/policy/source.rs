//! Where a policy set comes from: a folder, or a bucket it was published to with
//! `terrace policy publish`. A published set is laid out as a template version is
//! ([`crate::job::template::source`]): `<prefix>/<name>/<version>/…` and its listing
//! `<prefix>/<name>/<version>.SHA256SUMS`, written last and only once. A runner fetches it into
//! a cache folder, checks every file against its line in the listing, refuses a listing that
//! changed after it first fetched it, and only then parses the set.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use state_backends::objects::Bucket;

use super::{PolicyError, PolicySet};
use crate::job::template::source::{Location, Publication, Published};

/// A policy set as a setting names it (`TERRACE_POLICIES`, a tenant's `policies`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetRef {
    Folder(PathBuf),
    /// `<bucket URL>/<name>/<version>`: `base` is the bucket URL, as written.
    Published {
        base: String,
        location: Location,
        name: String,
        version: String,
    },
}

impl SetRef {
    /// Reads a folder, or `s3://BUCKET/PREFIX/NAME/VERSION` (or `gs://`, `az://`).
    ///
    /// # Errors
    /// A bucket URL without a name and a version after its prefix, or not a bucket URL.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if let Location::Folder(path) = Location::parse(text)? {
            return Ok(Self::Folder(path));
        }
        let form = "a published policy set is BUCKET_URL/NAME/VERSION (as `terrace policy publish` prints it)";
        let mut parts = text.trim_end_matches('/').rsplitn(3, '/');
        let (version, name, base) = match (parts.next(), parts.next(), parts.next()) {
            (Some(v), Some(n), Some(b)) => (v, n, b),
            _ => return Err(format!("{text}: {form}")),
        };
        check_name(name, version).map_err(|why| format!("{text}: {why}: {form}"))?;
        let location = Location::parse(base)?;
        if matches!(location, Location::Folder(_)) {
            return Err(format!("{text}: {form}"));
        }
        Ok(Self::Published {
            base: base.to_owned(),
            location,
            name: name.to_owned(),
            version: version.to_owned(),
        })
    }

    /// How the set's files are named beside another set's: `name@version`, or the folder's
    /// own name.
    pub fn label(&self) -> String {
        match self {
            Self::Folder(path) => path
                .file_name()
                .map_or_else(|| "policies".into(), |n| n.to_string_lossy().into_owned()),
            Self::Published { name, version, .. } => format!("{name}@{version}"),
        }
    }
}

impl std::fmt::Display for SetRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Folder(path) => write!(f, "{}", path.display()),
            Self::Published {
                base,
                name,
                version,
                ..
            } => write!(f, "{}/{name}/{version}", base.trim_end_matches('/')),
        }
    }
}

/// The published set `name` `version` under `prefix` in `bucket` (`base` names it in
/// messages), fetched into `cache` and parsed.
///
/// # Errors
/// A set not published there, a file that differs from its listing, a listing that changed
/// since this cache fetched it, a bucket that cannot be read, a policy that does not parse.
pub async fn fetch(
    bucket: Arc<dyn Bucket>,
    prefix: &str,
    base: &str,
    (name, version): (&str, &str),
    cache: &Path,
) -> Result<PolicySet, PolicyError> {
    let origin = format!("{}/{name}/{version}", base.trim_end_matches('/'));
    check_name(name, version).map_err(|why| PolicyError::Read {
        origin: origin.clone(),
        why,
    })?;
    // One cache folder per bucket and prefix: two buckets' sets of one name never meet.
    let place = state_backends::sha256_hex(base.trim_end_matches('/').as_bytes());
    let published = Published::new(bucket, prefix, cache.join(&place[..16]), base);
    published
        .fetch_path(
            &format!("{name}/{version}"),
            &format!("policy set {name} {version}"),
        )
        .await
        .map_err(|e| PolicyError::Read {
            origin: origin.clone(),
            why: e.to_string(),
        })?;
    let mut set = PolicySet::load(&published.cache().join(name).join(version))?;
    set.origin = origin;
    Ok(set)
}

/// Publishes the set in `dir` as `name` `version` under `prefix` in `bucket`, once it parses:
/// every file, then the listing, only if none is there.
///
/// # Errors
/// A set that does not parse, a version already published with other files, a bucket that
/// cannot be written.
pub async fn publish(
    bucket: Arc<dyn Bucket>,
    prefix: &str,
    base: &str,
    dir: &Path,
    (name, version): (&str, &str),
) -> Result<(PolicySet, Publication), PolicyError> {
    let set = PolicySet::load(dir)?;
    check_name(name, version).map_err(|why| PolicyError::Read {
        origin: dir.display().to_string(),
        why,
    })?;
    // Only the files the set is made of: no dot-folder (`.git`), no test, no other file.
    let staged = tempfile::tempdir().map_err(|e| PolicyError::Read {
        origin: dir.display().to_string(),
        why: format!("a staging folder: {e}"),
    })?;
    for file in &set.files {
        let path = staged.path().join(&file.name);
        let written = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&path, &file.text));
        written.map_err(|e| PolicyError::Read {
            origin: dir.display().to_string(),
            why: format!("staging {}: {e}", file.name),
        })?;
    }
    // The cache is not used to publish.
    let published = Published::new(bucket, prefix, std::env::temp_dir(), base);
    let publication = published
        .publish(staged.path(), &format!("{name}/{version}"))
        .await
        .map_err(|e| PolicyError::Read {
            origin: format!("{}/{name}/{version}", base.trim_end_matches('/')),
            why: e.to_string(),
        })?;
    Ok((set, publication))
}

/// A set's name and version are path segments, neither starting with `_`.
fn check_name(name: &str, version: &str) -> Result<(), String> {
    for part in [name, version] {
        if !crate::job::validate::is_path_segment(part) || part.starts_with('_') {
            return Err(format!(
                "{part:?} is not a name or a version (letters, digits, `.`, `-`, `_`; not starting with `_`)"
            ));
        }
    }
    Ok(())
}
