//! Azurite, the Azure Storage emulator the Azure tests run against: its Blob endpoint and
//! account (started by `scripts/with-emulators.sh` with an account key it makes at start), an
//! account SAS signed with that key, and containers.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: run the tests with Azurite, e.g. \
             `scripts/with-emulators.sh cargo test --workspace` or `make test`"
        )
    })
}

/// Azurite's Blob endpoint for the test account (`http://127.0.0.1:P/ACCOUNT`). Fails (never
/// skips) when it is not running.
pub fn blob_endpoint() -> String {
    env("TERRACE_TEST_AZURE_BLOB")
}

/// Azurite's Queue endpoint for the test account.
pub fn queue_endpoint() -> String {
    env("TERRACE_TEST_AZURE_QUEUE")
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An account SAS for Blob and Queue, every permission, for a day: what a test's clients put
/// in their URLs (signed as the service's `2025-11-05` version specifies).
pub fn sas() -> String {
    const VERSION: &str = "2025-11-05";
    const SERVICES: &str = "bq";
    const TYPES: &str = "sco";
    const PERMISSIONS: &str = "rwdxlacuptfiy";
    const PROTOCOLS: &str = "https,http";
    let account = env("TERRACE_TEST_AZURE_ACCOUNT");
    let key = STANDARD
        .decode(env("TERRACE_TEST_AZURE_KEY"))
        .expect("TERRACE_TEST_AZURE_KEY is base64");
    let expiry = (time::OffsetDateTime::now_utc() + time::Duration::days(1))
        .replace_nanosecond(0)
        .expect("0 ns")
        .format(&time::format_description::well_known::Rfc3339)
        .expect("a time formats");
    let to_sign = format!(
        "{account}\n{PERMISSIONS}\n{SERVICES}\n{TYPES}\n\n{expiry}\n\n{PROTOCOLS}\n{VERSION}\n\n"
    );
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&key).expect("any key length");
    mac.update(to_sign.as_bytes());
    let signature = STANDARD.encode(mac.finalize().into_bytes());
    format!(
        "sv={VERSION}&ss={SERVICES}&srt={TYPES}&sp={PERMISSIONS}&se={}&spr={}&sig={}",
        encode(&expiry),
        encode(PROTOCOLS),
        encode(&signature)
    )
}

/// A new, empty container; its URL with the SAS.
pub async fn container() -> String {
    let name = crate::aws::unique("terrace");
    let url = format!("{}/{name}?{}", blob_endpoint(), sas());
    let client = azure_storage_blob::BlobContainerClient::new(
        azure_core::http::Url::parse(&url).expect("a URL"),
        None,
        None,
    )
    .expect("a container client");
    client
        .create(None)
        .await
        .unwrap_or_else(|e| panic!("creating container {name}: {e}"));
    url
}

/// An Azure store on the container at `url` (with its SAS).
pub fn store(url: &str, prefix: &str) -> state_backends::azure::AzureStore {
    state_backends::azure::AzureStore::new(
        &state_backends::azure::AzureConfig {
            container_url: url.to_owned(),
            prefix: prefix.to_owned(),
        },
        None,
    )
    .expect("an Azure store")
}
