//! The module library: terraform modules a template pins by exact version and digest, kept in
//! `<templates>/_modules/<name>/<version>/` and copied into each job's workdir as
//! `modules/<name>/`, where the template's `source = "./modules/<name>"` finds them.
//!
//! ```yaml
//! # template.yaml
//! modules:
//!   network: { version: 1.2.0, sha256: 3b0c… }   # `terrace module digest` prints it
//! ```
//!
//! A digest is the SHA-256 of the module's listing in `sha256sum` form (`<hex>  <path>\n` per
//! regular file, sorted by path, `/`-separated, `.terraform/` left out): any change to any file
//! changes it. It is checked when the template loads and again on the copy in the workdir, so
//! what terraform runs is exactly what the template pinned.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::TemplateError;

/// The library's folder inside the templates root (names starting with `_` are not templates).
pub const LIBRARY: &str = "_modules";

/// Where pinned modules are put in a workdir.
pub const WORKDIR_FOLDER: &str = "modules";

/// A module as `template.yaml` pins it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pin {
    /// An exact version: `1.2.0`, never a range.
    pub version: String,
    /// The module folder's digest (hex SHA-256, see the module's documentation).
    pub sha256: String,
}

/// A pinned module found in the library with the digest it was pinned at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Module {
    pub name: String,
    pub version: String,
    pub sha256: String,
    pub dir: PathBuf,
}

/// The digest of a module folder: the SHA-256 of its [`listing`].
///
/// # Errors
/// A folder that cannot be read, or holds a link or a special file (a module is plain files).
pub fn digest(dir: &Path) -> std::io::Result<String> {
    Ok(state_backends::sha256_hex(listing(dir)?.as_bytes()))
}

/// A folder's files in `sha256sum` form (`<hex>  <path>\n`, sorted by path, `/`-separated,
/// `.terraform/` left out): what a published version's `SHA256SUMS` holds.
///
/// # Errors
/// A folder that cannot be read, or holds a link, a special file or a name that is not plain
/// text.
pub fn listing(dir: &Path) -> std::io::Result<String> {
    let mut files = Vec::new();
    list(dir, dir, &mut files)?;
    files.sort();
    let mut out = String::new();
    for relative in &files {
        let content = std::fs::read(dir.join(relative))?;
        out.push_str(&format!(
            "{}  {relative}\n",
            state_backends::sha256_hex(&content)
        ));
    }
    Ok(out)
}

fn list(root: &Path, dir: &Path, out: &mut Vec<String>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let path = entry.path();
        // A name that is not plain text could make two listings read alike.
        if entry
            .file_name()
            .to_str()
            .is_none_or(|n| n.chars().any(char::is_control))
        {
            return Err(std::io::Error::other(format!(
                "{} has a name that is not plain UTF-8 text: rename it",
                path.display()
            )));
        }
        if kind.is_dir() {
            if entry.file_name() != ".terraform" {
                list(root, &path, out)?;
            }
        } else if kind.is_file() {
            let relative = path
                .strip_prefix(root)
                .map_err(std::io::Error::other)?
                .components()
                .map(|c| c.as_os_str().to_string_lossy())
                .collect::<Vec<_>>()
                .join("/");
            out.push(relative);
        } else {
            return Err(std::io::Error::other(format!(
                "{} is a link or a special file: a module holds plain files only",
                path.display()
            )));
        }
    }
    Ok(())
}

/// Whether `version` is exact (`1.2.0`, `1.2.0-rc.1`), not a range or a branch.
pub fn is_exact(version: &str) -> bool {
    let (core, extra) = match version.split_once(['-', '+']) {
        Some((core, extra)) => (core, Some(extra)),
        None => (version, None),
    };
    let numbers: Vec<&str> = core.split('.').collect();
    numbers.len() == 3
        && numbers
            .iter()
            .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        && extra.is_none_or(|e| {
            !e.is_empty()
                && e.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'+'))
        })
}

/// Finds each pinned module in the library under `root` and checks its digest.
///
/// # Errors
/// The `template.yaml` at `spec_path`, naming the module and the fix: a version that is not
/// exact, a module or version not in the library, a digest that differs, a template that has a
/// `modules/<name>` of its own.
pub fn resolve(
    root: &Path,
    template_dir: &Path,
    spec_path: &Path,
    pins: &std::collections::BTreeMap<String, Pin>,
) -> Result<Vec<Module>, TemplateError> {
    let invalid = |message: String| TemplateError::Invalid {
        path: spec_path.to_owned(),
        message,
    };
    let mut out = Vec::new();
    for (name, pin) in pins {
        let field = format!("modules.{name}");
        if !crate::job::validate::is_path_segment(name) {
            return Err(invalid(format!(
                "{field}: {name:?} is not a module name (letters, digits, '-', '_', '.')"
            )));
        }
        if !is_exact(&pin.version) {
            return Err(invalid(format!(
                "{field}.version: {:?} is not an exact version: pin one, as 1.2.0",
                pin.version
            )));
        }
        if template_dir.join(WORKDIR_FOLDER).join(name).exists() {
            return Err(invalid(format!(
                "{field}: the template has a {WORKDIR_FOLDER}/{name} of its own: remove it, or the pin"
            )));
        }
        let dir = super::pinned(root.join(LIBRARY).join(name).join(&pin.version));
        if !dir.is_dir() {
            return Err(invalid(format!(
                "{field}: {name} {} is not in the module library ({}): add it there, or pin a version that is",
                pin.version,
                dir.display()
            )));
        }
        let found = digest(&dir).map_err(|e| {
            invalid(format!(
                "{field}: {name} {} cannot be read: {e}",
                pin.version
            ))
        })?;
        if !found.eq_ignore_ascii_case(&pin.sha256) {
            return Err(invalid(format!(
                "{field}.sha256: {name} {} in the library has the digest {found}, not the pinned {}: the module changed since it was pinned; publish the change as a new module version and pin it in a new template version",
                pin.version, pin.sha256
            )));
        }
        out.push(Module {
            name: name.clone(),
            version: pin.version.clone(),
            sha256: found,
            dir,
        });
    }
    Ok(out)
}

/// Copies the pinned modules into `workdir/modules/<name>` and checks each copy's digest, so
/// a library changed since the template loaded is caught before terraform runs.
///
/// # Errors
/// A copy that fails, or differs from its pin.
pub fn install(modules: &[Module], workdir: &Path) -> std::io::Result<()> {
    for m in modules {
        let target = workdir.join(WORKDIR_FOLDER).join(&m.name);
        std::fs::create_dir_all(&target)?;
        copy_tree(&m.dir, &target, &|_| false)?;
        let copied = digest(&target)?;
        if copied != m.sha256 {
            return Err(std::io::Error::other(format!(
                "module {} {} changed in the library while the job started (digest {copied}, pinned {})",
                m.name, m.version, m.sha256
            )));
        }
    }
    Ok(())
}

/// Copies the folder `from` into `to`, at every depth leaving out `.terraform` folders, the
/// names `skip` picks and special files (a FIFO could hang the copy); a link is copied as
/// what it points to (a module holds none: its digest refuses them).
pub(crate) fn copy_tree(
    from: &Path,
    to: &Path,
    skip: &dyn Fn(&std::ffi::OsStr) -> bool,
) -> std::io::Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let name = entry.file_name();
        let kind = entry.file_type()?;
        if skip(&name) {
            continue;
        }
        let target = to.join(&name);
        if kind.is_dir() {
            if name != ".terraform" {
                std::fs::create_dir_all(&target)?;
                copy_tree(&entry.path(), &target, skip)?;
            }
        } else if kind.is_file() || kind.is_symlink() {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_changes_with_any_file_and_ignores_terraforms_folder() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("main.tf"), "a").unwrap();
        std::fs::create_dir_all(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/x.tf"), "b").unwrap();
        let first = digest(dir.path()).unwrap();
        assert_eq!(first.len(), 64);
        std::fs::create_dir_all(dir.path().join(".terraform")).unwrap();
        std::fs::write(dir.path().join(".terraform/junk"), "c").unwrap();
        assert_eq!(digest(dir.path()).unwrap(), first);
        std::fs::write(dir.path().join("sub/x.tf"), "B").unwrap();
        assert_ne!(digest(dir.path()).unwrap(), first);
        std::fs::write(dir.path().join("sub/x.tf"), "b").unwrap();
        std::fs::rename(dir.path().join("sub/x.tf"), dir.path().join("sub/y.tf")).unwrap();
        assert_ne!(digest(dir.path()).unwrap(), first, "a renamed file");
        std::fs::write(dir.path().join("a.tf\nx"), "c").unwrap();
        assert!(
            digest(dir.path())
                .unwrap_err()
                .to_string()
                .contains("not plain UTF-8 text")
        );
        std::fs::remove_file(dir.path().join("a.tf\nx")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("link")).unwrap();
        assert!(digest(dir.path()).is_err());
    }

    #[test]
    fn a_module_changed_in_the_library_after_the_template_loaded_is_not_installed() {
        let dir = tempfile::tempdir().unwrap();
        let library = dir.path().join("lib");
        std::fs::create_dir_all(&library).unwrap();
        std::fs::write(library.join("main.tf"), "a").unwrap();
        let module = Module {
            name: "net".into(),
            version: "1.0.0".into(),
            sha256: digest(&library).unwrap(),
            dir: library.clone(),
        };
        let ok = dir.path().join("ok");
        install(std::slice::from_ref(&module), &ok).unwrap();
        assert_eq!(
            std::fs::read_to_string(ok.join("modules/net/main.tf")).unwrap(),
            "a"
        );
        // Changed between the load (which checked it) and the copy.
        std::fs::write(library.join("main.tf"), "b").unwrap();
        let e = install(&[module], &dir.path().join("late")).unwrap_err();
        assert!(
            e.to_string()
                .contains("module net 1.0.0 changed in the library while the job started"),
            "{e}"
        );
    }

    #[test]
    fn only_exact_versions_are_pins() {
        for v in ["1.2.0", "0.0.1", "10.20.30", "1.2.0-rc.1", "1.0.0+build.5"] {
            assert!(is_exact(v), "{v}");
        }
        for v in [
            "1.2", "~> 1.2", ">=1.0.0", "1.x.0", "main", "", "1.2.0-", "v1.2.0",
        ] {
            assert!(!is_exact(v), "{v}");
        }
    }
}
