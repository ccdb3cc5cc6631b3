//! OpenTelemetry traces over OTLP/gRPC (`turnstile run --otlp-endpoint`): the claims' wait and
//! hold spans (`turnstile_controller::traces`) and the controller's own `tracing` spans (a
//! pass per lock, with its namespace and name) through the `tracing` ecosystem's
//! OpenTelemetry layer.

use opentelemetry::trace::TracerProvider;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;

/// A tracer provider exporting in batches to the OTLP/gRPC endpoint `endpoint`
/// (`http://collector:4317`). Must be called within a tokio runtime (the exporter's client
/// runs on it); [`shutdown`] it to send what is left.
pub fn tracer_provider(endpoint: &str) -> anyhow::Result<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name("turnstile").build())
        .build())
}

/// The `tracing` layer that exports the controller's spans through `provider`.
pub fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    tracing_opentelemetry::layer().with_tracer(provider.tracer("turnstile"))
}

/// Sends the spans still buffered and stops the exporter (off the async workers: it blocks).
pub async fn shutdown(provider: SdkTracerProvider) {
    let flushed = tokio::task::spawn_blocking(move || provider.shutdown()).await;
    match flushed {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            tracing::warn!(%error, "OpenTelemetry exporter did not shut down cleanly")
        }
        Err(error) => tracing::warn!(%error, "OpenTelemetry shutdown task failed"),
    }
}
