//! Plain HTTP calls for tests: emulator set-up (a GCS bucket) and requests to the functions.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

/// An answer: its status and body.
pub struct Answer {
    pub status: u16,
    pub body: String,
}

/// Sends `method url` with `headers` and `body`, and reads the whole answer.
pub async fn call(method: &str, url: &str, headers: &[(&str, &str)], body: &str) -> Answer {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let mut request = axum::http::Request::builder().method(method).uri(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("a valid request");
    let response = client
        .request(request)
        .await
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("the body is read")
        .to_bytes();
    Answer {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// POSTs a JSON document.
pub async fn post_json(url: &str, headers: &[(&str, &str)], body: &serde_json::Value) -> Answer {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    call("POST", url, &all, &body.to_string()).await
}
