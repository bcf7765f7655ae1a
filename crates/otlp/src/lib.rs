//! Exporting the ledger's spans and metrics, for the toolledger command and its Python
//! package (`docs/observability.md`, "Exporting from the command line"): each off
//! unless the standard OpenTelemetry variables ask for it,
//! then OTLP over HTTP with protobuf bodies to the collector they name, through the
//! SDK's batch processor and periodic reader. An export that fails (the collector down)
//! drops what it carried and never changes an answer; a configuration this command
//! cannot honour is refused before anything is done.

use std::{collections::HashMap, time::Duration};

use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::{
    Resource,
    metrics::{PeriodicReader, SdkMeterProvider},
    trace::SdkTracerProvider,
};

/// The service name when `OTEL_SERVICE_NAME` (or `service.name` in
/// `OTEL_RESOURCE_ATTRIBUTES`) gives none.
const SERVICE: &str = "toolledger";

/// How long one export may take, connection included, when `OTEL_EXPORTER_OTLP_TIMEOUT`
/// does not say (the specification's default).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The providers this process installed, flushed and shut down when dropped: the spans
/// and figures of a command's last call are exported before it exits.
#[derive(Debug)]
pub struct Exporting {
    traces: Option<SdkTracerProvider>,
    metrics: Option<SdkMeterProvider>,
}

impl Drop for Exporting {
    fn drop(&mut self) {
        if let Some(provider) = self.traces.take() {
            let _ = provider.shutdown();
        }
        if let Some(provider) = self.metrics.take() {
            let _ = provider.shutdown();
        }
    }
}

/// Installs the exporters the environment asks for, each signal on its own: spans when
/// `OTEL_TRACES_EXPORTER` is `otlp` or an endpoint is set (`OTEL_EXPORTER_OTLP_ENDPOINT`,
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), metrics likewise (`OTEL_METRICS_EXPORTER`,
/// `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`); neither when `OTEL_SDK_DISABLED` is `true`,
/// and a signal's exporter `none` turns it off. The exporter itself reads the endpoint,
/// headers and timeout variables; the SDK reads `OTEL_SERVICE_NAME`,
/// `OTEL_RESOURCE_ATTRIBUTES`, the batch processor's `OTEL_BSP_*` and the metric
/// reader's `OTEL_METRIC_EXPORT_INTERVAL`.
///
/// ```
/// // Nothing set: nothing exported.
/// let exporting = toolledger_otlp::start(&Default::default()).unwrap();
/// assert!(!exporting.traces() && !exporting.metrics());
/// ```
///
/// # Errors
///
/// A sentence for `USAGE_ERROR` when the variables ask for what this process cannot do:
/// another exporter or protocol than OTLP over HTTP with protobuf, or an endpoint that
/// is not an `http://` URL.
pub fn start(env: &HashMap<String, String>) -> Result<Exporting, String> {
    let var = |name: &str| env.get(name).map(|value| value.trim()).filter(|v| !v.is_empty());
    if var("OTEL_SDK_DISABLED").is_some_and(|value| value.eq_ignore_ascii_case("true")) {
        return Ok(Exporting { traces: None, metrics: None });
    }
    let traces = wanted(&var, "TRACES")?;
    let metrics = wanted(&var, "METRICS")?;
    let resource = || {
        let mut resource = Resource::builder();
        if var("OTEL_SERVICE_NAME").is_none()
            && !var("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|given| given.contains("service.name="))
        {
            resource = resource.with_service_name(SERVICE);
        }
        resource.build()
    };
    let unusable = |signal: &str| {
        format!("the OTLP {signal} exporter could not be configured from OTEL_EXPORTER_OTLP_*")
    };
    let traces = if traces {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_http_client(client())
            .build()
            .map_err(|_| unusable("span"))?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource())
            .build();
        opentelemetry::global::set_tracer_provider(provider.clone());
        Some(provider)
    } else {
        None
    };
    let metrics = if metrics {
        let exporter = opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_http_client(client())
            .build()
            .map_err(|_| unusable("metric"))?;
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(exporter).build())
            .with_resource(resource())
            .build();
        opentelemetry::global::set_meter_provider(provider.clone());
        Some(provider)
    } else {
        None
    };
    Ok(Exporting { traces, metrics })
}

/// Whether `signal` (`TRACES`, `METRICS`) is to be exported, or why its configuration
/// cannot be honoured.
fn wanted<'a>(var: &impl Fn(&str) -> Option<&'a str>, signal: &str) -> Result<bool, String> {
    let exporter = var(&format!("OTEL_{signal}_EXPORTER"));
    let endpoint = var(&format!("OTEL_EXPORTER_OTLP_{signal}_ENDPOINT"))
        .or(var("OTEL_EXPORTER_OTLP_ENDPOINT"));
    match exporter {
        Some("none") => return Ok(false),
        Some("otlp") => {}
        Some(other) => {
            return Err(format!(
                "OTEL_{signal}_EXPORTER={other} is not supported: toolledger exports otlp, or none"
            ));
        }
        None if endpoint.is_none() => return Ok(false),
        None => {}
    }
    let protocol = var(&format!("OTEL_EXPORTER_OTLP_{signal}_PROTOCOL"))
        .or(var("OTEL_EXPORTER_OTLP_PROTOCOL"));
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
    Ok(true)
}

impl Exporting {
    /// Whether this process exports metrics: a long-running command then registers the
    /// ledger's figures (`toolledger::observe_figures`).
    ///
    /// ```
    /// let exporting = toolledger_otlp::start(&Default::default()).unwrap();
    /// assert!(!exporting.metrics());
    /// ```
    pub fn metrics(&self) -> bool {
        self.metrics.is_some()
    }

    /// Whether this process exports spans.
    ///
    /// ```
    /// let exporting = toolledger_otlp::start(&Default::default()).unwrap();
    /// assert!(!exporting.traces());
    /// ```
    pub fn traces(&self) -> bool {
        self.traces.is_some()
    }

    /// Exports what the processors hold now, without stopping: what a process that
    /// cannot be sure to drop this (an interpreter's exit) does at its end.
    ///
    /// ```
    /// let exporting = toolledger_otlp::start(&Default::default()).unwrap();
    /// exporting.flush();
    /// ```
    pub fn flush(&self) {
        if let Some(provider) = &self.traces {
            let _ = provider.force_flush();
        }
        if let Some(provider) = &self.metrics {
            let _ = provider.force_flush();
        }
    }
}

/// A client for one exporter.
fn client() -> Ureq {
    Ureq(
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(EXPORT_TIMEOUT))
            .max_redirects(0)
            .build()
            .into(),
    )
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
