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
            call_timeout: state_backends::CALL_TIMEOUT,
        },
        None,
    )
    .expect("an Azure store")
}

/// A queue in Azurite, by name; its URL is `url()` (with the SAS) or `plain()`.
pub struct TestQueue {
    pub name: String,
    client: azure_storage_queue::QueueClient,
}

impl TestQueue {
    /// A new, empty queue.
    pub async fn new(prefix: &str) -> Self {
        let q = Self::named(&crate::aws::unique(prefix));
        q.client
            .create(None)
            .await
            .unwrap_or_else(|e| panic!("creating queue {}: {e}", q.name));
        q
    }

    /// A queue that may not exist yet (one the job creates, say).
    pub fn named(name: &str) -> Self {
        let url = format!("{}/{name}?{}", queue_endpoint(), sas());
        let client = azure_storage_queue::QueueClient::new(
            azure_core::http::Url::parse(&url).expect("a URL"),
            None,
            None,
        )
        .expect("a queue client");
        Self {
            name: name.to_owned(),
            client,
        }
    }

    /// Its URL without a SAS (the job appends its own).
    pub fn plain(&self) -> String {
        format!("{}/{}", queue_endpoint(), self.name)
    }

    // `QueueMessage` is non-exhaustive: it cannot be built with a struct literal.
    #[allow(clippy::field_reassign_with_default)]
    pub async fn send(&self, text: &str) {
        let mut message = azure_storage_queue::models::QueueMessage::default();
        message.message_text = Some(text.to_owned());
        self.client
            .send_message(message.try_into().expect("XML"), None)
            .await
            .expect("sent");
    }

    /// How many messages it holds, visible or not (0 for a queue that does not exist).
    pub async fn count(&self) -> i64 {
        use azure_storage_queue::models::QueueClientGetPropertiesResultHeaders;
        match self.client.get_properties(None).await {
            Ok(p) => p.approximate_messages_count().unwrap().unwrap_or(0),
            Err(e) if e.http_status().map(u16::from) == Some(404) => 0,
            Err(e) => panic!("queue {}: {e}", self.name),
        }
    }

    /// The texts of the visible messages (up to 32), left where they are.
    pub async fn peek(&self) -> Vec<String> {
        let options = azure_storage_queue::models::QueueClientPeekMessagesOptions {
            number_of_messages: Some(32),
            ..Default::default()
        };
        match self.client.peek_messages(Some(options)).await {
            Ok(r) => r
                .into_model()
                .unwrap()
                .items
                .unwrap_or_default()
                .into_iter()
                .filter_map(|m| m.message_text)
                .collect(),
            Err(e) if e.http_status().map(u16::from) == Some(404) => Vec::new(),
            Err(e) => panic!("queue {}: {e}", self.name),
        }
    }

    /// Receives the next message as a worker would (counting a dequeue), invisible for
    /// `seconds`; its dequeue count.
    pub async fn receive(&self, seconds: i32) -> Option<i64> {
        let options = azure_storage_queue::models::QueueClientReceiveMessagesOptions {
            number_of_messages: Some(1),
            visibility_timeout: Some(seconds),
            ..Default::default()
        };
        let got = self
            .client
            .receive_messages(Some(options))
            .await
            .expect("received")
            .into_model()
            .unwrap();
        got.items
            .unwrap_or_default()
            .into_iter()
            .next()
            .map(|m| m.dequeue_count.unwrap_or(0))
    }
}
