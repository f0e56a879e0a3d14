//! The cold-start floor of the Cloud Run service for `benches/cold-start.sh`: the least an
//! axum service on tokio does, answering every request on `PORT`, built like `terrace-gcp`. Its
//! time to a first answer is what any Rust service on this stack pays.

#[tokio::main]
async fn main() {
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(8080);
    let listener = tokio::net::TcpListener::bind(("0.0.0.0", port))
        .await
        .expect("the port is free");
    let app = axum::Router::new().fallback(|| async { "ok" });
    axum::serve(listener, app).await.expect("serves");
}
