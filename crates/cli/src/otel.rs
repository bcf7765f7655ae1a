//! Exporting the ledger's spans (`docs/observability.md`, "Exporting from the command
//! line"): off unless the standard OpenTelemetry variables ask for it, then OTLP over
//! HTTP with protobuf bodies to the collector they name, through the SDK's batch
//! processor. An export that fails (the collector down) drops its spans and never
//! changes an answer; a configuration this command cannot honour is refused before
//! anything is done.

use std::{collections::HashMap, time::Duration};

use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::{Resource, trace::SdkTracerProvider};

/// The service name when `OTEL_SERVICE_NAME` (or `service.name` in
/// `OTEL_RESOURCE_ATTRIBUTES`) gives none.
const SERVICE: &str = "toolledger";

/// How long one export may take, connection included, when `OTEL_EXPORTER_OTLP_TIMEOUT`
/// does not say (the specification's default).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The provider this process installed, flushed and shut down when dropped: the spans
/// of a command's last call are exported before it exits.
#[derive(Debug)]
pub(crate) struct Exporting(Option<SdkTracerProvider>);

impl Drop for Exporting {
    fn drop(&mut self) {
        if let Some(provider) = self.0.take() {
            let _ = provider.shutdown();
        }
    }
}

/// Installs the exporter the environment asks for: spans are exported when
/// `OTEL_TRACES_EXPORTER` is `otlp` or an endpoint is set (`OTEL_EXPORTER_OTLP_ENDPOINT`,
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), unless `OTEL_SDK_DISABLED` is `true` or
/// `OTEL_TRACES_EXPORTER` is `none`. The exporter itself reads the endpoint, headers and
/// timeout variables; the SDK reads `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES` and
/// the batch processor's `OTEL_BSP_*`.
///
/// # Errors
///
/// A sentence for `USAGE_ERROR` when the variables ask for what this command cannot do:
/// another exporter or protocol than OTLP over HTTP with protobuf, or an endpoint that
/// is not an `http://` URL.
pub(crate) fn start(env: &HashMap<String, String>) -> Result<Exporting, String> {
    let var = |name: &str| env.get(name).map(|value| value.trim()).filter(|v| !v.is_empty());
    let exporter = var("OTEL_TRACES_EXPORTER");
    let endpoint = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or(var("OTEL_EXPORTER_OTLP_ENDPOINT"));
    let disabled = var("OTEL_SDK_DISABLED").is_some_and(|value| value.eq_ignore_ascii_case("true"));
    match exporter {
        _ if disabled => return Ok(Exporting(None)),
        Some("none") => return Ok(Exporting(None)),
        Some("otlp") => {}
        Some(other) => {
            return Err(format!(
                "OTEL_TRACES_EXPORTER={other} is not supported: toolledger exports otlp, or none"
            ));
        }
        None if endpoint.is_none() => return Ok(Exporting(None)),
        None => {}
    }
    let protocol = var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or(var("OTEL_EXPORTER_OTLP_PROTOCOL"));
    if let Some(protocol) = protocol.filter(|protocol| *protocol != "http/protobuf") {
        return Err(format!(
            "OTEL_EXPORTER_OTLP_PROTOCOL={protocol} is not supported: toolledger exports http/protobuf"
        ));
    }
    if let Some(endpoint) = endpoint.filter(|endpoint| !endpoint.starts_with("http://")) {
        let shown: String = endpoint.chars().take(64).collect();
        return Err(format!(
            "the OTLP endpoint {shown:?} is not an http:// URL (no TLS stack is compiled in; \
             export to a local collector)"
        ));
    }
    let client = Ureq(
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(EXPORT_TIMEOUT))
            .max_redirects(0)
            .build()
            .into(),
    );
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_http_client(client)
        .build()
        .map_err(|_| {
            "the OTLP exporter could not be configured from OTEL_EXPORTER_OTLP_*".to_owned()
        })?;
    let mut resource = Resource::builder();
    if var("OTEL_SERVICE_NAME").is_none()
        && !var("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|given| given.contains("service.name="))
    {
        resource = resource.with_service_name(SERVICE);
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    Ok(Exporting(Some(provider)))
}

/// The exporter's HTTP client: the workspace's blocking ureq, called from the batch
/// processor's own thread (which blocks on each export), with statuses as answers so
/// the exporter reads a collector's refusal itself.
#[derive(Debug)]
struct Ureq(ureq::Agent);

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Ureq {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let response = self.0.run(request.map(|body| body.to_vec()))?;
        let (parts, mut body) = response.into_parts();
        let body = body.read_to_vec()?;
        Ok(http::Response::from_parts(parts, bytes::Bytes::from(body)))
    }
}
