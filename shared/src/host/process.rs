//! What every cloud function's process sets up first: its log, and SIGTERM.

use std::process::ExitCode;

use tokio_util::sync::CancellationToken;

/// A cloud function's `main`: a policy evaluation (the runner's own child, see
/// [`crate::run::policy::child`]) is answered before anything else, with no runtime; otherwise
/// `serve` runs on a multi-threaded tokio runtime.
pub fn function_main<F: Future<Output = ExitCode>>(serve: impl FnOnce() -> F) -> ExitCode {
    if let Some(code) = crate::run::policy::child::answer_if_asked() {
        return code;
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("the runtime starts")
        .block_on(serve())
}

/// JSON log lines on stderr, filtered by `TERRACE_LOG` (default `info`): what the clouds'
/// log services parse. With the `otel` feature and `OTEL_EXPORTER_OTLP_ENDPOINT` (or
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) set, the same spans (a job, its steps) are exported
/// over OTLP/HTTP too, as `OTEL_SERVICE_NAME` (default: the binary's name).
pub fn init_json_logs() {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_env("TERRACE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let json = tracing_subscriber::fmt::layer()
        .json()
        .with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry().with(filter).with(json);
    #[cfg(feature = "otel")]
    {
        let (layer, problem) = otel::layer();
        registry.with(layer).init();
        if let Some(problem) = problem {
            tracing::warn!("spans are not exported: {problem}");
        }
    }
    #[cfg(not(feature = "otel"))]
    registry.init();
}

/// Sends the spans ended so far, when they are exported (a Lambda may be frozen, and any
/// container stopped, right after it answers).
pub async fn flush_telemetry() {
    #[cfg(feature = "otel")]
    otel::flush().await;
}

#[cfg(feature = "otel")]
mod otel {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::{SdkTracerProvider, Tracer};

    static PROVIDER: std::sync::OnceLock<SdkTracerProvider> = std::sync::OnceLock::new();

    type Layer<S> = tracing_opentelemetry::OpenTelemetryLayer<S, Tracer>;

    /// The exporting layer when an endpoint is set, and why there is none when it should be.
    pub(super) fn layer<S>() -> (Option<Layer<S>>, Option<String>)
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        use crate::host::settings::var;
        if var("OTEL_EXPORTER_OTLP_ENDPOINT").is_none()
            && var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_none()
        {
            return (None, None);
        }
        let exporter = match opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build()
        {
            Ok(exporter) => exporter,
            Err(e) => return (None, Some(e.to_string())),
        };
        let mut resource = opentelemetry_sdk::Resource::builder();
        if var("OTEL_SERVICE_NAME").is_none() {
            let name = std::env::args()
                .next()
                .and_then(|a| {
                    std::path::Path::new(&a)
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                })
                .unwrap_or_else(|| "terrace".into());
            resource = resource.with_service_name(name);
        }
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource.build())
            .build();
        let tracer = provider.tracer("terrace");
        let _ = PROVIDER.set(provider);
        (
            Some(tracing_opentelemetry::layer().with_tracer(tracer)),
            None,
        )
    }

    /// Waits (off the async threads) until the batch of ended spans is sent.
    pub(super) async fn flush() {
        let Some(provider) = PROVIDER.get().cloned() else {
            return;
        };
        match tokio::task::spawn_blocking(move || provider.force_flush()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "could not export the spans"),
            Err(e) => tracing::warn!(error = %e, "could not export the spans"),
        }
    }
}

/// Makes this process non-dumpable: its `/proc/<pid>` files (`environ`, `mem`, `maps`, …)
/// become root's, and no process without `CAP_SYS_PTRACE` can read them or attach to it. So
/// terraform, its providers and provisioners, running as children, cannot read the function's
/// environment, which holds or points to the function's own credentials. (Terraform itself is
/// dumpable again after its exec, which is harmless: it holds only this job's access.)
pub fn non_dumpable() {
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        tracing::error!(error = %e, "could not make the runner non-dumpable: terraform may read its environment");
    }
}

/// What every process that runs jobs sets up before its first: non-dumpable
/// ([`non_dumpable`]), and the adopter of every orphan its jobs leave
/// ([`crate::run::leftovers::adopt_orphans`]), so that the runner can find and kill them.
pub fn harden() {
    non_dumpable();
    crate::run::leftovers::adopt_orphans();
}

/// Cancels `token` when the process gets SIGTERM (how every platform stops a container before
/// it kills it), logging `what` happens then.
pub fn cancel_on_sigterm(token: &CancellationToken, what: &'static str) {
    let token = token.clone();
    tokio::spawn(async move {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            term.recv().await;
            tracing::warn!("SIGTERM: {what}");
            token.cancel();
        }
    });
}
