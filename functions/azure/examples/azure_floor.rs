//! The cold-start floor of the Container Apps job for `benches/cold-start.sh`: the least a job
//! on this stack does, one receive from the Storage Queue at `TERRACE_QUEUE_URL` (a SAS in the
//! URL), built like `terrace-azure`. Its time to that first request is what any Rust job with
//! the Azure SDK pays.

use azure_storage_queue::QueueClient;

#[tokio::main]
async fn main() {
    let url = std::env::var("TERRACE_QUEUE_URL").expect("TERRACE_QUEUE_URL is set");
    let url = azure_core::http::Url::parse(&url).expect("TERRACE_QUEUE_URL is a URL");
    let client = QueueClient::new(url, None, None).expect("a queue client");
    // The bench stops the process once this request arrives; its answer does not matter.
    let _ = client.receive_messages(None).await;
}
