//! Where templates are published: a folder or a bucket (`s3://`, `gs://`, `az://`), as an
//! operator writes it and as the runner reaches it.

use std::fmt;
use std::path::PathBuf;

/// Where `TERRACE_TEMPLATES` says templates are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    Folder(PathBuf),
    S3 {
        bucket: String,
        prefix: String,
    },
    Gcs {
        bucket: String,
        prefix: String,
    },
    /// `container_url`: `https://ACCOUNT.blob.core.windows.net/CONTAINER`, or an emulator's
    /// `http://HOST:PORT/ACCOUNT/CONTAINER`.
    Azure {
        container_url: String,
        prefix: String,
    },
}

const FORMS: &str = "a folder, s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, az://ACCOUNT/CONTAINER/PREFIX or https://ACCOUNT.blob.core.windows.net/CONTAINER/PREFIX";

impl Location {
    /// Reads a folder or a bucket URL.
    ///
    /// # Errors
    /// A URL that names no bucket, or carries a query (a SAS belongs in the runner's settings,
    /// never in a URL that is logged).
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let Some((scheme, rest)) = text.split_once("://") else {
            return Ok(Self::Folder(PathBuf::from(text)));
        };
        if scheme == "file" {
            return Ok(Self::Folder(PathBuf::from(rest)));
        }
        if rest.contains(['?', '#']) {
            return Err(format!(
                "a templates URL takes no query: give {FORMS}, with credentials in the runner's settings"
            ));
        }
        let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
        let path: Vec<String> = path
            .split('/')
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
            .collect();
        if host.is_empty() {
            return Err(format!("{scheme}:// names no bucket: give {FORMS}"));
        }
        match scheme {
            "s3" => Ok(Self::S3 {
                bucket: host.to_owned(),
                prefix: path.join("/"),
            }),
            "gs" => Ok(Self::Gcs {
                bucket: host.to_owned(),
                prefix: path.join("/"),
            }),
            "az" | "http" | "https" => {
                let (container_url, prefix) = azure_container(scheme, host, &path)?;
                Ok(Self::Azure {
                    container_url,
                    prefix,
                })
            }
            other => Err(format!(
                "{other}:// is not a place for templates: give {FORMS}"
            )),
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let joined = |base: String, prefix: &str| {
            if prefix.is_empty() {
                base
            } else {
                format!("{base}/{prefix}")
            }
        };
        match self {
            Self::Folder(path) => write!(f, "{}", path.display()),
            Self::S3 { bucket, prefix } => f.write_str(&joined(format!("s3://{bucket}"), prefix)),
            Self::Gcs { bucket, prefix } => f.write_str(&joined(format!("gs://{bucket}"), prefix)),
            Self::Azure {
                container_url,
                prefix,
            } => f.write_str(&joined(container_url.clone(), prefix)),
        }
    }
}

/// An Azure Blob container's URL and the prefix under it, from `az://ACCOUNT/CONTAINER/…`,
/// `https://ACCOUNT.blob.core.windows.net/CONTAINER/…` (or a sovereign cloud's `.blob.` host),
/// or an emulator's path-style `http://HOST:PORT/ACCOUNT/CONTAINER/…`. `host` may carry its
/// port.
///
/// # Errors
/// What is missing, with the forms that work.
pub fn azure_container(
    scheme: &str,
    host: &str,
    path: &[String],
) -> Result<(String, String), String> {
    const FORM: &str = "az://ACCOUNT/CONTAINER/PREFIX";
    if host.is_empty() || (scheme == "az" && !host.bytes().all(|b| b.is_ascii_alphanumeric())) {
        return Err(format!(
            "the storage account is missing, or not a name: {FORM}"
        ));
    }
    let name = host.rsplit_once(':').map_or(host, |(name, _)| name);
    let (base, rest) = match scheme {
        "az" => (format!("https://{host}.blob.core.windows.net"), path),
        _ if host.contains(".blob.") => (format!("{scheme}://{host}"), path),
        // An emulator, path-style: `HOST:PORT/ACCOUNT/CONTAINER`.
        _ if host.contains(':')
            || name == "localhost"
            || name.parse::<std::net::IpAddr>().is_ok()
            || name.starts_with('[') =>
        {
            let Some((account, rest)) = path.split_first() else {
                return Err(format!(
                    "an emulator's URL names its storage account first: \
                     {scheme}://{host}/ACCOUNT/CONTAINER/PREFIX"
                ));
            };
            (format!("{scheme}://{host}/{account}"), rest)
        }
        _ => {
            return Err(format!(
                "{scheme}://{host} is not an Azure Blob endpoint: use {FORM}, \
                 https://ACCOUNT.blob.core.windows.net/CONTAINER/PREFIX, or an emulator's \
                 http://127.0.0.1:PORT/ACCOUNT/CONTAINER/PREFIX"
            ));
        }
    };
    let Some((container, prefix)) = rest.split_first() else {
        return Err(format!("the container is missing: {FORM}"));
    };
    Ok((format!("{base}/{container}"), prefix.join("/")))
}
