//! Calls to Google APIs with this service's own credentials: starting a Cloud Run Job
//! execution, publishing to Pub/Sub.

use base64::Engine;
use google_cloud_auth::credentials::{self, CacheableResource, Credentials};
use serde_json::{Value, json};

/// This service's own credentials (none against an emulator).
#[derive(Clone, Debug)]
pub struct Own {
    credentials: Option<Credentials>,
    http: reqwest::Client,
}

impl Own {
    /// # Errors
    /// When the service has no credentials (outside an emulator).
    pub fn new(anonymous: bool) -> Result<Self, String> {
        let credentials = if anonymous {
            None
        } else {
            Some(
                credentials::Builder::default()
                    .build()
                    .map_err(|e| format!("this service has no credentials of its own: {e}"))?,
            )
        };
        // A call that hangs must not hold a request (or a sweep) past its deadline.
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            .timeout(std::time::Duration::from_secs(60))
            .build()
            .map_err(|e| format!("cannot make an HTTP client: {e}"))?;
        Ok(Self { credentials, http })
    }

    /// POSTs `body` to `url` and returns the answer's JSON.
    ///
    /// # Errors
    /// The call's failure, as a sentence naming `what`.
    pub async fn post(&self, what: &str, url: &str, body: &Value) -> Result<Value, String> {
        let mut request = self.http.post(url).json(body);
        if let Some(credentials) = &self.credentials {
            match credentials.headers(http::Extensions::new()).await {
                Ok(CacheableResource::New { data, .. }) => request = request.headers(data),
                Ok(CacheableResource::NotModified) => {}
                Err(e) => return Err(format!("{what}: no token: {e}")),
            }
        }
        let response = request
            .send()
            .await
            .map_err(|e| format!("{what}: cannot reach {url}: {e}"))?;
        let status = response.status();
        let answer: Value = response.json().await.unwrap_or(Value::Null);
        if status.is_success() {
            Ok(answer)
        } else {
            Err(format!(
                "{what}: {status}: {}",
                answer["error"]["message"]
                    .as_str()
                    .unwrap_or("no reason given")
            ))
        }
    }
}

/// Pub/Sub's `topics.publish` body for these messages (each a JSON document).
pub fn publish_body(messages: &[Value]) -> Value {
    let encoded: Vec<Value> = messages
        .iter()
        .map(|m| json!({ "data": base64::engine::general_purpose::STANDARD.encode(m.to_string()) }))
        .collect();
    json!({ "messages": encoded })
}

/// Publishes `messages` to `topic` (`projects/P/topics/T`), at most 1000 per call.
///
/// # Errors
/// The first call that failed; the messages before it were published.
pub async fn publish(
    own: &Own,
    endpoint: &str,
    topic: &str,
    messages: &[Value],
) -> Result<usize, (usize, String)> {
    let url = format!("{}/v1/{topic}:publish", endpoint.trim_end_matches('/'));
    let mut published = 0;
    for chunk in messages.chunks(1000) {
        own.post(
            &format!("publishing to {topic}"),
            &url,
            &publish_body(chunk),
        )
        .await
        .map_err(|why| (published, why))?;
        published += chunk.len();
    }
    Ok(published)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_message_is_one_base64_json_document() {
        let body = publish_body(&[json!({ "job": { "id": "j1" } }), json!({ "n": 2 })]);
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 2);
        let first = base64::engine::general_purpose::STANDARD
            .decode(messages[0]["data"].as_str().unwrap())
            .unwrap();
        assert_eq!(
            serde_json::from_slice::<Value>(&first).unwrap(),
            json!({ "job": { "id": "j1" } })
        );
    }
}
