//! Where templates come from: a folder (baked into the image, or mounted), or a bucket the
//! runner reads at run time, so a new template version needs no new image.
//!
//! A bucket holds what `terrace template publish` put there, under its prefix:
//!
//! ```text
//! <name>/<version>/…                    the template's files
//! <name>/<version>.SHA256SUMS           its listing: `<sha256>  <path>` per file
//! _modules/<name>/<version>/…           a module's files
//! _modules/<name>/<version>.SHA256SUMS  its listing, whose SHA-256 is the module's digest
//! ```
//!
//! The listing is written last and only if absent, so it is the publication: a version without
//! one is not published (or not yet), and a published version never changes. Before each job
//! the runner reads the listing of the job's template and of each module it pins (one small
//! read each), and fetches files only when its copy (in the cache folder) differs. Every file
//! is checked against its line, a module's listing against the template's pin before any of
//! its files is read, and the copy is swapped in whole, so a job never sees half a version.
//! From there the template loads as from a folder ([`super::Template::load`] with the cache as
//! the root).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use state_backends::StoreError;
use state_backends::objects::{Bucket, Condition};

use super::modules::{self, LIBRARY};
use super::{SPEC_FILE, TemplateSpec};

mod location;
pub use location::{Location, azure_container};

/// What follows a version's folder name in the name of its listing.
pub const SUMS: &str = ".SHA256SUMS";

/// Where the cache keeps each fetched copy, in a folder of its own that never changes once
/// `<name>/<version>` links to it (names starting with `_` are not templates).
const COPIES: &str = "_copies";

/// The object metadata that marks a published file executable (a script a provisioner runs).
const MODE: &str = "terrace-mode";

/// Where a runner's templates are: a folder, or a bucket copied into a cache folder.
#[derive(Clone, Debug)]
pub struct Templates {
    root: PathBuf,
    published: Option<Arc<Published>>,
}

impl Templates {
    /// Templates in a folder, read as they are.
    pub fn folder(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            published: None,
        }
    }

    /// Templates published in a bucket, copied into its cache as jobs need them.
    pub fn published(published: Published) -> Self {
        Self {
            root: published.cache.clone(),
            published: Some(Arc::new(published)),
        }
    }

    /// The folder templates load from ([`super::Template::load`]'s root): the cache when
    /// they come from a bucket.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The bucket they come from, if they do.
    pub fn bucket(&self) -> Option<&Published> {
        self.published.as_deref()
    }

    /// Makes template `name` `version` (and its modules) ready to load from [`Self::root`]:
    /// nothing to do for a folder.
    ///
    /// # Errors
    /// See [`Published::fetch`].
    pub async fn fetch(&self, name: &str, version: &str) -> Result<(), SourceError> {
        match &self.published {
            Some(p) => p.fetch(name, version).await,
            None => Ok(()),
        }
    }

    /// [`Self::fetch`] for the template a job's document names, if it names one (if not, its
    /// validation says so).
    ///
    /// # Errors
    /// See [`Published::fetch`].
    pub async fn fetch_for(
        &self,
        job: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), SourceError> {
        let template = job.get("template");
        let field = |f: &str| template.and_then(|t| t.get(f)).and_then(|v| v.as_str());
        match (field("name"), field("version")) {
            (Some(name), Some(version)) => self.fetch(name, version).await,
            _ => Ok(()),
        }
    }
}

/// Why templates could not be had from their bucket.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// No listing: never published, or not finished.
    #[error(
        "{what} is not published in {location}{}",
        if *nothing_there { " (nothing is: is that the bucket and prefix they are published to?)" } else { "" }
    )]
    NotPublished {
        what: String,
        location: String,
        /// Nothing at all is published there (a misspelt bucket or prefix, say).
        nothing_there: bool,
    },
    /// Published, but not what was pinned, or not whole: its publisher's to fix.
    #[error("{0}")]
    Invalid(String),
    /// The bucket could not be read: may pass.
    #[error("{location} cannot be read: {source}")]
    Unavailable {
        location: String,
        #[source]
        source: Box<StoreError>,
    },
    /// The local copy could not be made.
    #[error("the cache {path} cannot be written: {source}")]
    Cache {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The folder being published cannot be read.
    #[error("{path} cannot be read: {source}")]
    Folder {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl SourceError {
    /// Whether trying again later may succeed: the bucket throttled, timed out or failed.
    /// Access denied, a bucket that does not exist, a cache that cannot be written do not pass
    /// by waiting: the job is refused, saying so.
    pub fn passes(&self) -> bool {
        matches!(self, Self::Unavailable { source, .. } if source.is_retryable())
    }

    /// What a person does about it.
    pub fn fix(&self) -> String {
        match self {
            Self::NotPublished { location, .. } => format!(
                "name a published version (`terrace template list --templates {location}`), or publish it with `terrace template publish NAME VERSION --to {location}`"
            ),
            Self::Invalid(_) => {
                "publish the template or module again as a new version, and pin that".into()
            }
            Self::Unavailable { .. } => {
                "check TERRACE_TEMPLATES and the runner's read access to that bucket, then send the job again".into()
            }
            Self::Cache { .. } => "give the runner a writable TERRACE_TEMPLATE_CACHE".into(),
            Self::Folder { .. } => "make the folder readable (plain files only)".into(),
        }
    }
}

/// What [`Published::publish`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Publication {
    /// The version is now published.
    New,
    /// The same files were already published under it.
    Same,
}

/// Templates in a bucket, copied into a cache folder as jobs need them.
#[derive(Debug)]
pub struct Published {
    bucket: Arc<dyn Bucket>,
    prefix: String,
    cache: PathBuf,
    location: String,
    /// One fetch at a time: two jobs of one version fetch it once.
    fetching: tokio::sync::Mutex<()>,
}

impl Published {
    /// The templates under `prefix` in `bucket` (called `location` in messages), copied into
    /// `cache`.
    pub fn new(
        bucket: Arc<dyn Bucket>,
        prefix: &str,
        cache: PathBuf,
        location: impl Into<String>,
    ) -> Self {
        Self {
            bucket,
            prefix: prefix.trim_matches('/').to_owned(),
            // Links into the cache are absolute: a job's checked copy is found wherever it runs.
            cache: std::path::absolute(&cache).unwrap_or(cache),
            location: location.into(),
            fetching: tokio::sync::Mutex::new(()),
        }
    }

    /// The cache folder: the templates root once [`Self::fetch`] has run.
    pub fn cache(&self) -> &Path {
        &self.cache
    }

    fn key(&self, path: &str) -> String {
        if self.prefix.is_empty() {
            path.to_owned()
        } else {
            format!("{}/{path}", self.prefix)
        }
    }

    fn unavailable(&self) -> impl Fn(StoreError) -> SourceError + '_ {
        |source| SourceError::Unavailable {
            location: self.location.clone(),
            source: Box::new(source),
        }
    }

    /// Makes the cache's copy of template `name` `version`, and of every module it pins, what
    /// is published. Names that are not path segments, and a `template.yaml` that cannot be
    /// read, are left for the template's validation to report.
    ///
    /// # Errors
    /// See [`SourceError`]: a version not published, a module published with a digest other
    /// than its pin, files that differ from their listing, a bucket that cannot be read.
    pub async fn fetch(&self, name: &str, version: &str) -> Result<(), SourceError> {
        if !is_template_name(name) || !crate::job::validate::is_path_segment(version) {
            return Ok(());
        }
        let _one = self.fetching.lock().await;
        self.sync(
            &format!("{name}/{version}"),
            &format!("template {name} {version}"),
            None,
        )
        .await?;
        let spec = self.cache.join(name).join(version).join(SPEC_FILE);
        let Some(spec) = std::fs::read_to_string(&spec)
            .ok()
            .and_then(|text| serde_norway::from_str::<TemplateSpec>(&text).ok())
        else {
            return Ok(());
        };
        for (module, pin) in &spec.modules {
            if !crate::job::validate::is_path_segment(module) || !modules::is_exact(&pin.version) {
                continue;
            }
            let what = format!(
                "module {module} {} (pinned by {name} {version})",
                pin.version
            );
            self.sync(
                &format!("{LIBRARY}/{module}/{}", pin.version),
                &what,
                Some((module, &pin.sha256)),
            )
            .await?;
        }
        Ok(())
    }

    /// Makes the cache's copy of `<prefix>/<path>` what is published, checked file by file
    /// against its listing; `what` names it in errors (a policy set's `name/version`).
    ///
    /// # Errors
    /// As [`Self::fetch`].
    pub async fn fetch_path(&self, path: &str, what: &str) -> Result<(), SourceError> {
        let _one = self.fetching.lock().await;
        self.sync(path, what, None).await
    }

    /// Brings `<cache>/<path>` to what `<prefix>/<path>` holds; with `pin`, the listing's
    /// digest must be the pinned one before any file is read.
    async fn sync(
        &self,
        path: &str,
        what: &str,
        pin: Option<(&str, &str)>,
    ) -> Result<(), SourceError> {
        let local = self.cache.join(path);
        let sums_key = self.key(&format!("{path}{SUMS}"));
        let Some(sums) = self
            .bucket
            .get(&sums_key)
            .await
            .map_err(self.unavailable())?
        else {
            // Withdrawn: the cache must not keep serving it (jobs holding its copy keep it).
            let _ = std::fs::remove_file(&local).or_else(|_| std::fs::remove_dir_all(&local));
            let _ = std::fs::remove_file(fetched_marker(&local));
            // A missing bucket answers 404 too: say so rather than "not published".
            let published = self
                .bucket
                .folders(&self.key(""))
                .await
                .map_err(self.unavailable())?;
            return Err(SourceError::NotPublished {
                what: what.to_owned(),
                location: self.location.clone(),
                nothing_there: published.is_empty(),
            });
        };
        let invalid =
            |why: String| SourceError::Invalid(format!("{what} in {}: {why}", self.location));
        let text = String::from_utf8(sums.data.to_vec())
            .map_err(|_| invalid(format!("{sums_key} is not text")))?;
        if let Some((module, pinned)) = pin {
            let digest = state_backends::sha256_hex(text.as_bytes());
            if !digest.eq_ignore_ascii_case(pinned) {
                return Err(invalid(format!(
                    "modules.{module}.sha256: it is published with the digest {digest}, not the pinned {pinned}"
                )));
            }
        }
        let files = parse_sums(&text).map_err(|e| invalid(format!("{sums_key}: {e}")))?;
        // A published version never changes: a listing other than the one this cache fetched
        // for it before is refused, not followed (whoever can write the bucket went around
        // `publish`). Withdrawing a version (its listing deleted) forgets it.
        let digest = state_backends::sha256_hex(text.as_bytes());
        let fetched = fetched_marker(&local);
        if let Ok(before) = std::fs::read_to_string(&fetched)
            && before.trim() != digest
        {
            return Err(invalid(format!(
                "its listing changed after it was published (this runner fetched the digest {}, the bucket now has {digest}): a published version never changes, so publish the change as a new version",
                before.trim()
            )));
        }
        if local.is_dir() && modules::listing(&local).ok().as_deref() == Some(text.as_str()) {
            return Ok(());
        }
        let cache_error = |source: std::io::Error| SourceError::Cache {
            path: self.cache.clone(),
            source,
        };
        let copies = self.cache.join(COPIES);
        std::fs::create_dir_all(&copies).map_err(cache_error)?;
        // Dropped (and removed) unless every file arrives whole.
        let staged = tempfile::tempdir_in(&copies).map_err(cache_error)?;
        for (sha, relative) in &files {
            let key = self.key(&format!("{path}/{relative}"));
            let object = self
                .bucket
                .get(&key)
                .await
                .map_err(self.unavailable())?
                .ok_or_else(|| invalid(format!("{relative} is listed but not there")))?;
            if state_backends::sha256_hex(&object.data) != *sha {
                return Err(invalid(format!(
                    "{relative} differs from its line in the listing"
                )));
            }
            let executable = object.metadata.get(MODE).is_some_and(|m| m == "755");
            write(staged.path(), relative, &object.data, executable).map_err(cache_error)?;
        }
        // The link moves to the new copy in one rename; the old copy stays for any job that
        // checked it (a published version changes only if someone went around `publish`).
        let copy = staged.keep();
        let parent = local.parent().unwrap_or(&self.cache);
        std::fs::create_dir_all(parent).map_err(cache_error)?;
        if local.symlink_metadata().is_ok_and(|m| m.is_dir()) {
            std::fs::remove_dir_all(&local).map_err(cache_error)?;
        }
        let link = tempfile::Builder::new()
            .prefix(".link")
            .make_in(parent, |at| std::os::unix::fs::symlink(&copy, at))
            .map_err(cache_error)?;
        link.into_temp_path()
            .persist(&local)
            .map_err(|e| cache_error(e.error))?;
        std::fs::write(&fetched, &digest).map_err(cache_error)?;
        tracing::info!(what, location = %self.location, files = files.len(), "fetched");
        Ok(())
    }

    /// Publishes the folder `dir` as `path` (`<name>/<version>` or
    /// `_modules/<name>/<version>`): every file, then the listing, only if none is there.
    ///
    /// # Errors
    /// A version already published with other files ([`SourceError::Invalid`]), a folder that
    /// cannot be read, a bucket that cannot be written.
    pub async fn publish(&self, dir: &Path, path: &str) -> Result<Publication, SourceError> {
        let text = modules::listing(dir).map_err(|source| SourceError::Folder {
            path: dir.to_owned(),
            source,
        })?;
        let sums_key = self.key(&format!("{path}{SUMS}"));
        let same = |existing: &Bytes| -> Result<Publication, SourceError> {
            if existing.as_ref() == text.as_bytes() {
                Ok(Publication::Same)
            } else {
                Err(SourceError::Invalid(format!(
                    "{path} is already published in {} with other files (digest {}; this folder's is {}): a published version never changes, so publish this as a new version",
                    self.location,
                    state_backends::sha256_hex(existing),
                    state_backends::sha256_hex(text.as_bytes())
                )))
            }
        };
        if let Some(existing) = self
            .bucket
            .get(&sums_key)
            .await
            .map_err(self.unavailable())?
        {
            return same(&existing.data);
        }
        // Files first (a publish that failed half-way left some: they are written again), the
        // listing last. Two publishes of one version with other files at once can leave files
        // that differ from the listing that won: runners then refuse that version, never run it.
        for (_, relative) in parse_sums(&text).map_err(SourceError::Invalid)? {
            let file = dir.join(&relative);
            let folder_error = |source| SourceError::Folder {
                path: file.clone(),
                source,
            };
            let data = std::fs::read(&file).map_err(folder_error)?;
            let executable = {
                use std::os::unix::fs::PermissionsExt;
                std::fs::metadata(&file)
                    .map_err(folder_error)?
                    .permissions()
                    .mode()
                    & 0o111
                    != 0
            };
            let metadata = if executable {
                [(MODE.to_owned(), "755".to_owned())].into()
            } else {
                Default::default()
            };
            self.bucket
                .put(
                    &self.key(&format!("{path}/{relative}")),
                    Bytes::from(data),
                    metadata,
                    Condition::None,
                )
                .await
                .map_err(self.unavailable())?;
        }
        let created = self
            .bucket
            .put(
                &sums_key,
                Bytes::from(text.clone()),
                Default::default(),
                Condition::Absent,
            )
            .await
            .map_err(self.unavailable())?;
        if created {
            return Ok(Publication::New);
        }
        // Someone published it meanwhile.
        match self
            .bucket
            .get(&sums_key)
            .await
            .map_err(self.unavailable())?
        {
            Some(existing) => same(&existing.data),
            None => Err(SourceError::Invalid(format!(
                "{path}'s listing could not be written in {}: publish again",
                self.location
            ))),
        }
    }

    /// Every published template version, as `(name, version)`, sorted.
    ///
    /// # Errors
    /// A bucket that cannot be listed.
    pub async fn versions(&self) -> Result<Vec<(String, String)>, SourceError> {
        let root = self.key("");
        let listed = self.bucket.list(&root).await.map_err(self.unavailable())?;
        let mut out: Vec<(String, String)> = listed
            .iter()
            .filter_map(|l| {
                let rest = l.key.strip_prefix(&root)?.strip_suffix(SUMS)?;
                let (name, version) = rest.split_once('/')?;
                (is_template_name(name) && crate::job::validate::is_path_segment(version))
                    .then(|| (name.to_owned(), version.to_owned()))
            })
            .collect();
        out.sort();
        Ok(out)
    }
}

/// A name a template may have (`_` starts the library's and the cache's own folders).
fn is_template_name(name: &str) -> bool {
    crate::job::validate::is_path_segment(name) && !name.starts_with('_')
}

/// Where the cache notes the digest of the listing it fetched for `local` (`<path>.fetched`,
/// beside the link, so a job's copy is untouched).
pub(crate) fn fetched_marker(local: &Path) -> PathBuf {
    let mut name = local.as_os_str().to_owned();
    name.push(".fetched");
    PathBuf::from(name)
}

/// A listing's lines as `(sha256, path)`, checked: lowercase hex, relative paths of plain
/// segments, sorted without repeats (as [`modules::listing`] writes them).
fn parse_sums(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out: Vec<(String, String)> = Vec::new();
    if !text.is_empty() && !text.ends_with('\n') {
        return Err("the last line is cut short".into());
    }
    for (n, line) in text.lines().enumerate() {
        let bad = |why: &str| format!("line {}: {why}", n + 1);
        let (sha, path) = line
            .split_once("  ")
            .ok_or_else(|| bad("not `<sha256>  <path>`"))?;
        if sha.len() != 64 || !sha.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(bad("not a SHA-256 in lowercase hex"));
        }
        if path.split('/').any(|s| {
            s.is_empty()
                || s == "."
                || s == ".."
                || s == ".terraform"
                || s.chars().any(char::is_control)
        }) {
            return Err(bad("not a relative path of plain names"));
        }
        if out.last().is_some_and(|(_, last)| last.as_str() >= path) {
            return Err(bad("out of order, or listed twice"));
        }
        out.push((sha.to_owned(), path.to_owned()));
    }
    if out.is_empty() {
        return Err("lists no files".into());
    }
    Ok(out)
}

fn write(root: &Path, relative: &str, data: &[u8], executable: bool) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let target = root.join(relative);
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&target, data)?;
    let mode = if executable { 0o755 } else { 0o644 };
    std::fs::set_permissions(target, std::fs::Permissions::from_mode(mode))
}

#[cfg(test)]
mod tests;
