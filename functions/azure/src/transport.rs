//! The Storage Queue calls the job makes, over the official `azure_storage_queue` client.

use std::sync::Arc;

use azure_core::credentials::TokenCredential;
use azure_core::http::{RequestContent, Url, XmlFormat};
use azure_storage_queue::models::{
    QueueClientReceiveMessagesOptions, QueueClientSendMessageOptions, QueueMessage,
};
use azure_storage_queue::{QueueClient, QueueClientOptions};

/// One received message.
#[derive(Clone, Debug)]
pub struct Received {
    pub id: String,
    pub pop_receipt: String,
    pub text: String,
    pub dequeue_count: i64,
}

/// A queue, by URL (with its SAS against an emulator).
pub struct Queue {
    client: QueueClient,
    /// The URL without its query, for messages.
    pub name: String,
}

fn brief(what: &str, e: &azure_core::Error) -> String {
    match e.kind() {
        azure_core::error::ErrorKind::HttpResponse {
            status, error_code, ..
        } => format!(
            "{what}: {} {}",
            u16::from(*status),
            error_code.as_deref().unwrap_or("")
        ),
        _ => format!("{what}: {}", state_backends::azure::scrub(&e.to_string())),
    }
}

fn seconds(d: std::time::Duration) -> i32 {
    i32::try_from(d.as_secs()).unwrap_or(i32::MAX)
}

impl Queue {
    /// # Errors
    /// A malformed URL, or a credential over plain http.
    pub fn new(
        url: &str,
        credential: Option<Arc<dyn TokenCredential>>,
        call_timeout: std::time::Duration,
    ) -> Result<Self, String> {
        let parsed = Url::parse(url).map_err(|e| {
            format!(
                "queue URL {:?} is not a URL: {e}",
                state_backends::azure::scrub(url)
            )
        })?;
        let name = format!("{}{}", parsed.host_str().unwrap_or_default(), parsed.path());
        // A few quick retries: a call that outlasts a message's visibility (the SDK's default
        // retries for a minute) would let the message reappear while its job runs.
        let retry = azure_core::http::ExponentialRetryOptions {
            max_retries: 3,
            max_total_elapsed: azure_core::time::Duration::seconds(10),
            ..Default::default()
        };
        // A call that gets no answer is given up after the call timeout, as the store's.
        let http = state_backends::azure::http_client(call_timeout)
            .map_err(|e| format!("queue {name}: HTTP client: {e}"))?;
        let options = QueueClientOptions {
            client_options: azure_core::http::ClientOptions {
                retry: azure_core::http::RetryOptions::exponential(retry),
                transport: Some(azure_core::http::Transport::new(Arc::new(http))),
                ..Default::default()
            },
            ..Default::default()
        };
        let client = QueueClient::new(parsed, credential, Some(options)).map_err(|e| {
            format!(
                "queue {name}: {}",
                state_backends::azure::scrub(&e.to_string())
            )
        })?;
        Ok(Self { client, name })
    }

    /// Creates the queue if it is not there.
    async fn ensure(&self) -> Result<(), String> {
        self.client
            .create(None)
            .await
            .map(|_| ())
            .map_err(|e| brief(&format!("creating queue {}", self.name), &e))
    }

    /// The next message, invisible to others for `visibility`.
    ///
    /// # Errors
    /// Why none could be received, as a sentence.
    pub async fn receive(
        &self,
        visibility: std::time::Duration,
    ) -> Result<Option<Received>, String> {
        let what = format!("receiving from {}", self.name);
        let options = QueueClientReceiveMessagesOptions {
            number_of_messages: Some(1),
            visibility_timeout: Some(seconds(visibility)),
            ..Default::default()
        };
        let messages = self
            .client
            .receive_messages(Some(options))
            .await
            .map_err(|e| brief(&what, &e))?
            .into_model()
            .map_err(|e| brief(&what, &e))?;
        let Some(m) = messages.items.unwrap_or_default().into_iter().next() else {
            return Ok(None);
        };
        let (Some(id), Some(pop_receipt)) = (m.message_id, m.pop_receipt) else {
            return Err(format!("{what}: a message without its id or pop receipt"));
        };
        Ok(Some(Received {
            id,
            pop_receipt,
            text: m.message_text.unwrap_or_default(),
            dequeue_count: m.dequeue_count.unwrap_or(1),
        }))
    }

    /// Makes the message invisible for `visibility` from now (0: visible at once); returns its
    /// new pop receipt, which the next update or the deletion needs.
    ///
    /// # Errors
    /// Why not, as a sentence (the message was deleted, or received by another).
    pub async fn keep(
        &self,
        id: &str,
        pop_receipt: &str,
        visibility: std::time::Duration,
    ) -> Result<String, String> {
        let what = format!("changing the visibility of message {id}");
        let response = self
            .client
            .update_message(id, pop_receipt, seconds(visibility), None)
            .await
            .map_err(|e| brief(&what, &e))?;
        response
            .headers()
            .get_optional_string(&"x-ms-popreceipt".into())
            .ok_or_else(|| format!("{what}: no new pop receipt"))
    }

    /// # Errors
    /// Why not, as a sentence.
    /// Deletes the message; one already gone is not an error.
    ///
    /// # Errors
    /// Why not, as a sentence (a stale pop receipt: the message was received again).
    pub async fn delete(&self, id: &str, pop_receipt: &str) -> Result<(), String> {
        match self.client.delete_message(id, pop_receipt, None).await {
            Ok(_) => Ok(()),
            Err(e) if e.http_status().map(u16::from) == Some(404) => Ok(()),
            Err(e) => Err(brief(&format!("deleting message {id}"), &e)),
        }
    }

    /// Sends `text`, invisible for `delay`; a queue that does not exist is created first (the
    /// poison queue, say).
    ///
    /// # Errors
    /// Why not, as a sentence.
    pub async fn send(&self, text: &str, delay: std::time::Duration) -> Result<(), String> {
        let what = format!("sending to {}", self.name);
        let options = || QueueClientSendMessageOptions {
            visibility_timeout: (!delay.is_zero()).then(|| seconds(delay)),
            ..Default::default()
        };
        match self
            .client
            .send_message(message(text)?, Some(options()))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.http_status().map(u16::from) == Some(404) => {
                self.ensure().await?;
                self.client
                    .send_message(message(text)?, Some(options()))
                    .await
                    .map(|_| ())
                    .map_err(|e| brief(&what, &e))
            }
            Err(e) => Err(brief(&what, &e)),
        }
    }
}

// `QueueMessage` is non-exhaustive: it cannot be built with a struct literal.
#[allow(clippy::field_reassign_with_default)]
fn message(text: &str) -> Result<RequestContent<QueueMessage, XmlFormat>, String> {
    let mut message = QueueMessage::default();
    message.message_text = Some(text.to_owned());
    message.try_into().map_err(|e: azure_core::Error| {
        format!(
            "a message of {} bytes: {}",
            text.len(),
            state_backends::azure::scrub(&e.to_string())
        )
    })
}
