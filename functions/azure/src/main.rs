//! `terrace-azure`: the Azure function's process (see the `azure` library for what it does).

use std::process::ExitCode;

use tokio_util::sync::CancellationToken;

use azure::app::App;
use azure::{access, config};

fn main() -> ExitCode {
    shared::host::process::function_main(serve)
}

async fn serve() -> ExitCode {
    shared::host::process::init_json_logs();
    shared::host::process::harden();
    let mut config = match config::Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("terrace-azure: {e}");
            return ExitCode::from(78);
        }
    };
    // Terraform's version is read while the first message is fetched.
    config.runtime.warm_client();
    let own = if config.sas.is_some() {
        None
    } else {
        match access::own(config.managed_identity.as_deref()) {
            Ok(own) => Some(own),
            Err(e) => {
                tracing::error!("terrace-azure: {e}");
                return ExitCode::from(78);
            }
        }
    };
    let (settings, credential) = (config.clone(), own.clone());
    let tenant_sets = config.tenants.policy_sets().clone();
    let opened = config
        .runtime
        .open_buckets(&tenant_sets, |location| {
            let (settings, credential) = (settings.clone(), credential.clone());
            async move { azure::app::templates_bucket(&location, &settings, credential) }
        })
        .await;
    if let Err(e) = opened {
        tracing::error!("terrace-azure: {e}");
        return ExitCode::from(78);
    }
    let shutdown = CancellationToken::new();
    shared::host::process::cancel_on_sigterm(&shutdown, "interrupting the job");
    let app = App {
        config,
        own,
        shutdown,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] | ["run"] => match app.run_one().await {
            Ok(outcome) => {
                tracing::info!(?outcome, "execution ends");
                ExitCode::SUCCESS
            }
            Err(e) => {
                tracing::error!("terrace-azure: {e}");
                ExitCode::from(75)
            }
        },
        ["sweep", kind @ ("backup" | "drift")] => azure::sweep(&app, kind).await,
        _ => {
            tracing::error!("usage: terrace-azure [run] | terrace-azure sweep backup|drift");
            ExitCode::from(64)
        }
    }
}
