//! fake-gcs-server, the GCS emulator the GCS tests run against: its endpoint (started by
//! `scripts/with-emulators.sh`, which `make test` and CI use) and its buckets.

/// fake-gcs-server's endpoint. Fails (never skips) when it is not running.
pub fn endpoint() -> String {
    std::env::var("TERRACE_TEST_GCS").unwrap_or_else(|_| {
        panic!(
            "TERRACE_TEST_GCS is not set: run the tests with fake-gcs-server, e.g. \
             `scripts/with-emulators.sh cargo test --workspace` or `make test`"
        )
    })
}

/// A new, empty bucket (made with the JSON API, as the client has no bucket calls).
pub async fn bucket() -> String {
    let name = crate::aws::unique("terrace");
    let answer = crate::http::post_json(
        &format!("{}/storage/v1/b?project=test", endpoint()),
        &[],
        &serde_json::json!({ "name": name }),
    )
    .await;
    assert_eq!(
        answer.status, 200,
        "creating bucket {name}: {}",
        answer.body
    );
    name
}

/// A GCS store on `bucket` in the emulator, with anonymous credentials.
pub async fn store(bucket: &str, prefix: &str) -> state_backends::gcs::GcsStore {
    let credentials = google_cloud_auth::credentials::anonymous::Builder::new().build();
    let storage = google_cloud_storage::client::Storage::builder()
        .with_endpoint(endpoint())
        .with_credentials(credentials.clone())
        .build()
        .await
        .expect("a client for the emulator");
    state_backends::gcs::GcsStore::new(
        storage,
        credentials,
        state_backends::gcs::GcsConfig {
            bucket: bucket.to_owned(),
            prefix: prefix.to_owned(),
            kms_key: None,
            endpoint: endpoint(),
            call_timeout: state_backends::CALL_TIMEOUT,
        },
    )
}
