//! `terrace template list|show` and `terrace module digest`: what the templates root holds, as
//! a runner would load it (modules found and their digests checked).

use crate::output::{ModuleUse, TemplateItem, TemplateList, TemplateShown};
use std::path::Path;

use clap::Subcommand;
use shared::job::template::{Template, TemplateError, modules};

use crate::Global;
use crate::cli::exit;
use crate::ops::{JSON_SCHEMA, Output, print_json};
use crate::store::{self, StoreUrl};
use shared::job::template::source::{Publication, Published, SourceError};

#[derive(Subcommand, Debug)]
pub enum TemplateCmd {
    /// List every template version under the templates root, checked as a runner loads it.
    List {
        #[command(flatten)]
        out: Output,
    },
    /// Show one template version: its variables, rules, pinned modules and tags.
    Show {
        name: String,
        version: String,
        #[command(flatten)]
        out: Output,
    },
    /// Publish a template version from the `--templates` folder, with the modules it pins, to
    /// a bucket runners read templates from. A published version never changes: publishing
    /// other files under it is refused.
    Publish {
        name: String,
        version: String,
        /// The bucket: s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, az://ACCOUNT/CONTAINER/PREFIX.
        #[arg(long)]
        to: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum ModuleCmd {
    /// Print the digest of a module folder, to pin in a template.yaml's `modules`.
    Digest { dir: std::path::PathBuf },
}

/// Every `<name>/<version>/` under `root` (names starting with `_` or `.` are not templates).
fn versions(root: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    let read = |dir: &Path| -> anyhow::Result<Vec<String>> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", dir.display()))?
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('_') && !n.starts_with('.'))
            .collect();
        names.sort();
        Ok(names)
    };
    for name in read(root)? {
        for version in read(&root.join(&name))? {
            out.push((name.clone(), version));
        }
    }
    Ok(out)
}

fn modules_json(t: &Template) -> Vec<ModuleUse> {
    t.modules
        .iter()
        .map(|m| ModuleUse {
            name: m.name.clone(),
            version: m.version.clone(),
            sha256: m.sha256.clone(),
        })
        .collect()
}

pub async fn run(g: &Global, cmd: TemplateCmd) -> anyhow::Result<u8> {
    if let TemplateCmd::Publish { name, version, to } = cmd {
        return publish(g, &name, &version, &to).await;
    }
    let source = g.open_templates().await?;
    let templates = source.root();
    match cmd {
        TemplateCmd::Publish { .. } => unreachable!("handled above"),
        TemplateCmd::List { out } => {
            let mut listed = Vec::new();
            let mut invalid = 0;
            let found = match source.bucket() {
                Some(bucket) => bucket.versions().await?,
                None => versions(templates)?,
            };
            for (name, version) in found {
                let loaded = match source.fetch(&name, &version).await {
                    Ok(()) => Template::load(templates, &name, &version).map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                invalid += usize::from(loaded.is_err());
                listed.push((name, version, loaded));
            }
            if out.json {
                let templates = listed
                    .iter()
                    .map(|(name, version, loaded)| TemplateItem {
                        name: name.clone(),
                        version: version.clone(),
                        valid: loaded.is_ok(),
                        description: loaded
                            .as_ref()
                            .ok()
                            .and_then(|t| t.spec.description.clone()),
                        modules: loaded.as_ref().ok().map(modules_json),
                        error: loaded.as_ref().err().cloned(),
                    })
                    .collect();
                print_json(&TemplateList {
                    schema: JSON_SCHEMA,
                    templates,
                });
            } else if listed.is_empty() {
                outln!("no templates in {}", g.templates);
            } else {
                for (name, version, loaded) in &listed {
                    match loaded {
                        Ok(t) => outln!(
                            "{name:<20} {version:<10} {}",
                            t.spec.description.as_deref().unwrap_or("")
                        ),
                        Err(e) => outln!("{name:<20} {version:<10} INVALID: {e}"),
                    }
                }
            }
            Ok(if invalid == 0 { exit::OK } else { exit::FAILED })
        }
        TemplateCmd::Show { name, version, out } => {
            match source.fetch(&name, &version).await {
                Ok(()) => {}
                Err(e @ SourceError::NotPublished { .. }) => {
                    eprintln!("error: {e}: `terrace template list` shows what there is");
                    return Ok(exit::NOT_FOUND);
                }
                Err(e) if e.passes() => return Err(e.into()),
                Err(e) => {
                    eprintln!("error: {e}");
                    return Ok(exit::INVALID);
                }
            }
            let t = match Template::load(templates, &name, &version) {
                Ok(t) => t,
                Err(e @ TemplateError::Missing(_)) => {
                    eprintln!("error: {e}: `terrace template list` shows what there is");
                    return Ok(exit::NOT_FOUND);
                }
                Err(e) => {
                    eprintln!("error: {name} {version} is invalid: {e}");
                    return Ok(exit::INVALID);
                }
            };
            let tags = t
                .spec
                .variables
                .contains_key(shared::job::template::TAGS_VARIABLE);
            if out.json {
                print_json(&TemplateShown {
                    schema: JSON_SCHEMA,
                    name: name.clone(),
                    version: version.clone(),
                    description: t.spec.description.clone(),
                    variables: serde_json::to_value(&t.spec.variables)?,
                    rules: serde_json::to_value(&t.spec.rules)?,
                    modules: modules_json(&t),
                    tagged: tags,
                });
                return Ok(exit::OK);
            }
            outln!("{name} {version}");
            if let Some(d) = &t.spec.description {
                outln!("  {d}");
            }
            outln!("variables:");
            for (var, v) in &t.spec.variables {
                if var == shared::job::template::TAGS_VARIABLE {
                    continue;
                }
                let mut facts = vec![v.var_type.name().to_owned()];
                if v.required {
                    facts.push("required".into());
                }
                if let Some(d) = &v.default {
                    facts.push(format!("default {d}"));
                }
                if let Some(one_of) = &v.constraint.one_of {
                    let values: Vec<String> = one_of.iter().map(ToString::to_string).collect();
                    facts.push(format!("one of {}", values.join(", ")));
                }
                if let Some(min) = v.constraint.min {
                    facts.push(format!("min {min}"));
                }
                if let Some(max) = v.constraint.max {
                    facts.push(format!("max {max}"));
                }
                if let Some(p) = &v.constraint.pattern {
                    facts.push(format!("pattern {p}"));
                }
                if v.sensitive {
                    facts.push("sensitive".into());
                }
                outln!("  {var:<20} {}", facts.join(", "));
                if let Some(d) = &v.description {
                    outln!("  {:<20} {d}", "");
                }
            }
            for rule in &t.spec.rules {
                if let Some(m) = &rule.message {
                    outln!("rule:        {m}");
                }
            }
            for m in &t.modules {
                outln!(
                    "module:      {} {} (sha256 {}, verified)",
                    m.name,
                    m.version,
                    m.sha256
                );
            }
            if tags {
                outln!("tags:        terrace_tags (filled by the runner)");
            }
            Ok(exit::OK)
        }
    }
}

pub fn module(cmd: ModuleCmd) -> u8 {
    match cmd {
        ModuleCmd::Digest { dir } => match modules::digest(&dir) {
            Ok(d) => {
                outln!("{d}");
                exit::OK
            }
            Err(e) => {
                eprintln!("error: {}: {e}", dir.display());
                exit::FAILED
            }
        },
    }
}

/// `terrace template publish`: the template as a runner would load it from the folder, its
/// pinned modules first (each once: one already published with the same files is left), then
/// the template.
async fn publish(g: &Global, name: &str, version: &str, to: &str) -> anyhow::Result<u8> {
    let StoreUrl::Fs(root) = g
        .templates
        .parse::<StoreUrl>()
        .map_err(|e| anyhow::anyhow!("--templates: {e}"))?
    else {
        eprintln!("error: --templates must be the folder to publish from, not a bucket");
        return Ok(exit::USAGE);
    };
    let url = match store::publish_target(to) {
        Ok(url) => url,
        Err(code) => return Ok(code),
    };
    let template = match Template::load(&root, name, version) {
        Ok(t) => t,
        Err(e @ TemplateError::Missing(_)) => {
            eprintln!("error: {e}: `terrace template list` shows what there is");
            return Ok(exit::NOT_FOUND);
        }
        Err(e) => {
            eprintln!("error: {name} {version} is invalid, nothing was published: {e}");
            return Ok(exit::INVALID);
        }
    };
    let (bucket, prefix) = store::open_bucket(&url).await?;
    // Publishing reads nothing back into a cache.
    let target = Published::new(bucket, &prefix, std::env::temp_dir(), url.to_string());
    let mut parts: Vec<(String, &Path)> = template
        .modules
        .iter()
        .map(|m| {
            (
                format!("{}/{}/{}", modules::LIBRARY, m.name, m.version),
                m.dir.as_path(),
            )
        })
        .collect();
    parts.push((format!("{name}/{version}"), template.dir.as_path()));
    for (path, dir) in parts {
        match target.publish(dir, &path).await {
            Ok(Publication::New) => outln!("published {path} to {url}"),
            Ok(Publication::Same) => outln!("{path}: already published with the same files"),
            Err(e) if e.passes() => return Err(e.into()),
            Err(e) => {
                eprintln!("error: {e}");
                return Ok(exit::FAILED);
            }
        }
    }
    Ok(exit::OK)
}
