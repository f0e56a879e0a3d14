use super::*;
use state_backends::memory::MemoryBucket;
use state_backends::objects::{Listed, Object};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A bucket that counts the objects read from it.
#[derive(Debug, Default)]
struct Counted {
    inner: MemoryBucket,
    gets: AtomicUsize,
}

#[async_trait::async_trait]
impl Bucket for Counted {
    fn backend(&self) -> &'static str {
        "counted"
    }
    async fn get(&self, key: &str) -> state_backends::Result<Option<Object>> {
        self.gets.fetch_add(1, Ordering::Relaxed);
        self.inner.get(key).await
    }
    async fn head(&self, key: &str) -> state_backends::Result<Option<HashMap<String, String>>> {
        self.inner.head(key).await
    }
    async fn put_tagged(
        &self,
        key: &str,
        data: Bytes,
        metadata: HashMap<String, String>,
        condition: Condition<'_>,
    ) -> state_backends::Result<Option<Option<String>>> {
        self.inner.put_tagged(key, data, metadata, condition).await
    }
    async fn copy(
        &self,
        from: &str,
        to: &str,
        metadata: Option<HashMap<String, String>>,
    ) -> state_backends::Result<()> {
        self.inner.copy(from, to, metadata).await
    }
    async fn delete(&self, key: &str) -> state_backends::Result<()> {
        self.inner.delete(key).await
    }
    async fn clear_if(&self, key: &str, tag: &str) -> state_backends::Result<()> {
        self.inner.clear_if(key, tag).await
    }
    async fn list(&self, prefix: &str) -> state_backends::Result<Vec<Listed>> {
        self.inner.list(prefix).await
    }
    async fn folders(&self, prefix: &str) -> state_backends::Result<Vec<String>> {
        self.inner.folders(prefix).await
    }
}

fn tree(root: &Path, files: &[(&str, &str)]) {
    for (path, text) in files {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
}

struct Fixture {
    bucket: MemoryBucket,
    authored: tempfile::TempDir,
    cache: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Self {
        Self {
            bucket: MemoryBucket::new(),
            authored: tempfile::tempdir().unwrap(),
            cache: tempfile::tempdir().unwrap(),
        }
    }

    fn published(&self) -> Published {
        Published::new(
            Arc::new(self.bucket.clone()),
            "/lib/templates/",
            self.cache.path().to_owned(),
            "mem://lib/templates",
        )
    }

    /// A module `net` 1.0.0 and a template `app` 1.0.0 pinning it, in the authored folder.
    fn author(&self) -> String {
        let root = self.authored.path();
        tree(
            root,
            &[
                (
                    "_modules/net/1.0.0/main.tf",
                    "output \"cidr\" { value = \"10.0.0.0/16\" }\n",
                ),
                ("_modules/net/1.0.0/sub/x.tf", "# nested\n"),
            ],
        );
        let digest = modules::digest(&root.join("_modules/net/1.0.0")).unwrap();
        tree(
            root,
            &[
                (
                    "app/1.0.0/template.yaml",
                    &format!(
                        "variables: {{}}\nmodules:\n  net: {{ version: 1.0.0, sha256: {digest} }}\n"
                    ),
                ),
                (
                    "app/1.0.0/main.tf",
                    "module \"net\" { source = \"./modules/net\" }\n",
                ),
            ],
        );
        digest
    }

    async fn publish_all(&self, p: &Published) {
        let root = self.authored.path();
        assert_eq!(
            p.publish(&root.join("_modules/net/1.0.0"), "_modules/net/1.0.0")
                .await
                .unwrap(),
            Publication::New
        );
        assert_eq!(
            p.publish(&root.join("app/1.0.0"), "app/1.0.0")
                .await
                .unwrap(),
            Publication::New
        );
    }
}

#[tokio::test]
async fn a_published_template_and_its_modules_load_from_the_cache() {
    let f = Fixture::new();
    let digest = f.author();
    let p = f.published();
    f.publish_all(&p).await;
    assert!(
        f.bucket
            .get("lib/templates/app/1.0.0.SHA256SUMS")
            .await
            .unwrap()
            .is_some(),
        "the listing beside the version, under the prefix"
    );
    p.fetch("app", "1.0.0").await.unwrap();
    let t = crate::job::template::Template::load(f.cache.path(), "app", "1.0.0").unwrap();
    assert_eq!(t.modules.len(), 1);
    assert_eq!(t.modules[0].sha256, digest);
    assert_eq!(
        std::fs::read_to_string(f.cache.path().join("_modules/net/1.0.0/sub/x.tf")).unwrap(),
        "# nested\n"
    );
    assert_eq!(
        p.versions().await.unwrap(),
        vec![("app".to_owned(), "1.0.0".to_owned())]
    );
    // Publishing the same files again changes nothing; other files under the version are refused.
    assert_eq!(
        p.publish(&f.authored.path().join("app/1.0.0"), "app/1.0.0")
            .await
            .unwrap(),
        Publication::Same
    );
    std::fs::write(f.authored.path().join("app/1.0.0/main.tf"), "# changed\n").unwrap();
    let refused = p
        .publish(&f.authored.path().join("app/1.0.0"), "app/1.0.0")
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("already published"), "{refused}");
    assert!(refused.contains("new version"), "{refused}");
}

#[tokio::test]
async fn a_file_changed_behind_the_listing_is_refused_and_the_cache_keeps_its_copy() {
    let f = Fixture::new();
    f.author();
    let p = f.published();
    f.publish_all(&p).await;
    p.fetch("app", "1.0.0").await.unwrap();
    // Written around `publish`: the cache's copy no longer matches, and the new file does not
    // match its line.
    f.bucket
        .put(
            "lib/templates/app/1.0.0/main.tf",
            Bytes::from_static(b"# tampered\n"),
            Default::default(),
            Condition::None,
        )
        .await
        .unwrap();
    std::fs::write(f.cache.path().join("app/1.0.0/main.tf"), "# stale\n").unwrap();
    let e = p.fetch("app", "1.0.0").await.unwrap_err();
    assert!(!e.passes());
    assert!(
        e.to_string()
            .contains("main.tf differs from its line in the listing"),
        "{e}"
    );
    assert_eq!(
        std::fs::read_to_string(f.cache.path().join("app/1.0.0/main.tf")).unwrap(),
        "# stale\n",
        "nothing half-fetched was swapped in"
    );
    assert_eq!(
        std::fs::read_dir(f.cache.path().join(COPIES))
            .unwrap()
            .count(),
        2,
        "the template's and the module's copies; the refused one is gone"
    );
}

#[tokio::test]
async fn a_stale_cache_is_replaced_whole_and_a_withdrawn_version_is_dropped() {
    let f = Fixture::new();
    f.author();
    let p = f.published();
    f.publish_all(&p).await;
    std::fs::create_dir_all(f.cache.path().join("app/1.0.0")).unwrap();
    std::fs::write(f.cache.path().join("app/1.0.0/left-over.tf"), "x").unwrap();
    p.fetch("app", "1.0.0").await.unwrap();
    assert!(!f.cache.path().join("app/1.0.0/left-over.tf").exists());
    assert!(f.cache.path().join("app/1.0.0/main.tf").exists());
    f.bucket
        .delete("lib/templates/app/1.0.0.SHA256SUMS")
        .await
        .unwrap();
    let e = p.fetch("app", "1.0.0").await.unwrap_err();
    assert!(matches!(e, SourceError::NotPublished { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "template app 1.0.0 is not published in mem://lib/templates"
    );
    assert!(e.fix().contains("terrace template publish"));
    assert!(!f.cache.path().join("app/1.0.0").exists());
}

#[tokio::test]
async fn a_module_published_with_another_digest_is_refused_before_its_files_are_read() {
    let f = Fixture::new();
    f.author();
    let p = f.published();
    // The module is published with other files than the template pinned.
    std::fs::write(
        f.authored.path().join("_modules/net/1.0.0/main.tf"),
        "# other\n",
    )
    .unwrap();
    f.publish_all(&p).await;
    let e = p.fetch("app", "1.0.0").await.unwrap_err().to_string();
    assert!(e.starts_with("module net 1.0.0 (pinned by app 1.0.0) in mem://lib/templates: modules.net.sha256: it is published with the digest"), "{e}");
    assert!(!f.cache.path().join("_modules/net").exists());
}

#[tokio::test]
async fn a_listing_that_escapes_or_is_not_sorted_is_refused() {
    for (sums, why) in [
        (
            format!("{}  ../etc/passwd\n", "0".repeat(64)),
            "not a relative path",
        ),
        (format!("{}  /abs\n", "0".repeat(64)), "not a relative path"),
        (
            format!("{a}  b.tf\n{a}  a.tf\n", a = "0".repeat(64)),
            "out of order",
        ),
        (format!("{}  a.tf\n", "A".repeat(64)), "lowercase hex"),
        (format!("{}  a.tf", "0".repeat(64)), "cut short"),
        (String::new(), "lists no files"),
    ] {
        let e = parse_sums(&sums).unwrap_err();
        assert!(e.contains(why), "{sums:?}: {e}");
    }
    let f = Fixture::new();
    f.bucket
        .put(
            "lib/templates/app/1.0.0.SHA256SUMS",
            Bytes::from(format!("{}  ../../x\n", "0".repeat(64))),
            Default::default(),
            Condition::None,
        )
        .await
        .unwrap();
    let e = f.published().fetch("app", "1.0.0").await.unwrap_err();
    assert!(e.to_string().contains("not a relative path"), "{e}");
    assert!(!f.cache.path().join("x").exists());
}

#[test]
fn locations_are_folders_or_buckets() {
    let parse = |s: &str| Location::parse(s).unwrap();
    assert_eq!(
        parse("/opt/terrace/templates"),
        Location::Folder("/opt/terrace/templates".into())
    );
    assert_eq!(
        parse("s3://acme-templates/terrace/"),
        Location::S3 {
            bucket: "acme-templates".into(),
            prefix: "terrace".into()
        }
    );
    assert_eq!(parse("gs://b").to_string(), "gs://b");
    assert_eq!(
        parse("az://acct/templates/p/q").to_string(),
        "https://acct.blob.core.windows.net/templates/p/q"
    );
    assert_eq!(
        parse("http://127.0.0.1:10000/devstoreaccount1/templates/p"),
        Location::Azure {
            container_url: "http://127.0.0.1:10000/devstoreaccount1/templates".into(),
            prefix: "p".into()
        }
    );
    for (bad, why) in [
        ("s3://b/p?sig=x", "takes no query"),
        ("s3:///p", "names no bucket"),
        ("ftp://h/p", "is not a place for templates"),
        ("az://acct", "the container is missing"),
        ("az://acct:99/c", "not a name"),
        ("https://example.com/c", "is not an Azure Blob endpoint"),
    ] {
        let e = Location::parse(bad).unwrap_err();
        assert!(e.contains(why), "{bad}: {e}");
    }
}

#[tokio::test]
async fn a_version_changed_after_publication_is_refused_and_a_jobs_copy_is_untouched() {
    let f = Fixture::new();
    f.author();
    let p = f.published();
    f.publish_all(&p).await;
    p.fetch("app", "1.0.0").await.unwrap();
    let checked = crate::job::template::Template::load(f.cache.path(), "app", "1.0.0").unwrap();
    assert!(
        checked.dir.starts_with(f.cache.path().join(COPIES)),
        "{}",
        checked.dir.display()
    );
    // Republished around `publish` (files and listing replaced): refused, never followed.
    let root = f.authored.path().join("app/1.0.0");
    std::fs::write(root.join("main.tf"), "# second\n").unwrap();
    let listing = modules::listing(&root).unwrap();
    let republish = async || {
        for (key, data) in [
            ("lib/templates/app/1.0.0/main.tf", "# second\n".to_owned()),
            ("lib/templates/app/1.0.0.SHA256SUMS", listing.clone()),
        ] {
            f.bucket
                .put(key, Bytes::from(data), Default::default(), Condition::None)
                .await
                .unwrap();
        }
    };
    republish().await;
    let e = p.fetch("app", "1.0.0").await.unwrap_err();
    assert!(matches!(e, SourceError::Invalid(_)), "{e}");
    assert!(
        e.to_string().contains("changed after it was published"),
        "{e}"
    );
    let still = crate::job::template::Template::load(f.cache.path(), "app", "1.0.0").unwrap();
    assert_eq!(still.dir, checked.dir, "the cache keeps what was published");
    assert!(
        std::fs::read_to_string(checked.dir.join("main.tf"))
            .unwrap()
            .starts_with("module \"net\""),
        "the first job's copy is untouched"
    );
    // Withdrawn, then published anew: the new version is taken.
    f.bucket
        .delete("lib/templates/app/1.0.0.SHA256SUMS")
        .await
        .unwrap();
    assert!(p.fetch("app", "1.0.0").await.is_err());
    republish().await;
    p.fetch("app", "1.0.0").await.unwrap();
    let now = crate::job::template::Template::load(f.cache.path(), "app", "1.0.0").unwrap();
    assert_ne!(now.dir, checked.dir);
    assert_eq!(
        std::fs::read_to_string(now.dir.join("main.tf")).unwrap(),
        "# second\n"
    );
}

#[tokio::test]
async fn a_copy_that_matches_its_listing_costs_one_read_per_template_and_module() {
    let f = Fixture::new();
    f.author();
    let counted = Arc::new(Counted::default());
    let p = Published::new(
        counted.clone(),
        "lib/templates",
        f.cache.path().to_owned(),
        "mem://lib/templates",
    );
    f.publish_all(&p).await;
    counted.gets.store(0, Ordering::Relaxed);
    p.fetch("app", "1.0.0").await.unwrap();
    // Two listings, then the template's 2 files and the module's 2.
    assert_eq!(counted.gets.swap(0, Ordering::Relaxed), 6);
    p.fetch("app", "1.0.0").await.unwrap();
    assert_eq!(
        counted.gets.load(Ordering::Relaxed),
        2,
        "the two listings only"
    );
}

#[tokio::test]
async fn executable_files_stay_executable_and_only_bucket_trouble_that_may_pass_is_retried() {
    use std::os::unix::fs::PermissionsExt;
    let f = Fixture::new();
    f.author();
    let script = f.authored.path().join("app/1.0.0/hook.sh");
    std::fs::write(&script, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let p = f.published();
    f.publish_all(&p).await;
    p.fetch("app", "1.0.0").await.unwrap();
    let mode = |rel: &str| {
        std::fs::metadata(f.cache.path().join(rel))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode("app/1.0.0/hook.sh"), 0o755);
    assert_eq!(mode("app/1.0.0/main.tf"), 0o644);

    let unavailable = |retryable| SourceError::Unavailable {
        location: "mem://x".into(),
        source: Box::new(StoreError::Backend {
            backend: "memory",
            message: "no".into(),
            retryable,
            source: None,
        }),
    };
    assert!(unavailable(true).passes(), "throttled, timed out, 5xx");
    assert!(
        !unavailable(false).passes(),
        "access denied, no such bucket"
    );
    assert!(!SourceError::Invalid("x".into()).passes());
}

#[tokio::test]
async fn a_bucket_with_nothing_published_says_so() {
    let f = Fixture::new();
    let e = f.published().fetch("app", "1.0.0").await.unwrap_err();
    assert!(
        e.to_string().starts_with(
            "template app 1.0.0 is not published in mem://lib/templates (nothing is: is that the bucket"
        ),
        "{e}"
    );
}

#[tokio::test]
async fn a_job_naming_an_unpublished_version_gets_the_buckets_words_and_its_other_problems() {
    let f = Fixture::new();
    f.author();
    let p = f.published();
    f.publish_all(&p).await;
    let templates = Templates::published(p);
    let raw = crate::job::RawJob::parse(
        "id: j1\ntenant: acme\nworkspace: w\noperation: aply\ntemplate: { name: app, version: 2.0.0 }\n",
    )
    .unwrap();
    let errors = crate::job::validate::fetch_and_validate(&raw, &templates, None)
        .await
        .unwrap()
        .unwrap_err();
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields.iter().filter(|f| **f == "template").count(),
        1,
        "{errors:?}"
    );
    assert!(fields.contains(&"operation"), "{errors:?}");
    let template = errors.iter().find(|e| e.field == "template").unwrap();
    assert_eq!(
        template.problem,
        "template app 2.0.0 is not published in mem://lib/templates"
    );
    let raw = crate::job::RawJob::parse(
        "id: j2\ntenant: acme\nworkspace: w\noperation: plan\ntemplate: { name: app, version: 1.0.0 }\n",
    )
    .unwrap();
    let job = crate::job::validate::fetch_and_validate(&raw, &templates, None)
        .await
        .unwrap()
        .unwrap();
    assert!(job.template.dir.starts_with(templates.root().join(COPIES)));
}
