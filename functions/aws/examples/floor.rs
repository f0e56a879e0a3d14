//! The cold-start floor for `benches/cold-start.sh`: the least a `lambda_runtime` function
//! does, echoing its event, built like `terrace-aws`. Its time to the first Runtime API poll is
//! what any Rust function on this runtime pays.

use lambda_runtime::{Error, LambdaEvent, service_fn};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::run(service_fn(|event: LambdaEvent<Value>| async move {
        Ok::<Value, Error>(event.payload)
    }))
    .await
}
