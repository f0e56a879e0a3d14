//! `terrace-aws`: the AWS function's process (see the `aws` library for what it does).

use std::process::ExitCode;

use aws::app::App;
use aws::{broker, config, events};
use lambda_runtime::{LambdaEvent, service_fn};
use serde_json::Value;

fn main() -> ExitCode {
    shared::host::process::function_main(serve)
}

async fn serve() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some("credentials") {
        return broker::print().await;
    }
    shared::host::process::init_json_logs();
    shared::host::process::harden();
    let config = match config::Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("terrace-aws: {e}");
            return ExitCode::from(78);
        }
    };
    // Terraform's version is read while the first message is fetched.
    config.runtime.warm_client();
    let app = match App::new(config).await {
        Ok(app) => app,
        Err(e) => {
            tracing::error!("terrace-aws: {e}");
            return ExitCode::from(78);
        }
    };
    if std::env::args().nth(1).as_deref() == Some("task") {
        return events::task(&app).await;
    }
    let served = lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| {
        let app = app.clone();
        async move { events::handle(&app, event).await }
    }))
    .await;
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("terrace-aws: {e}");
            ExitCode::FAILURE
        }
    }
}
