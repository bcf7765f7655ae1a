//! Streamable HTTP toward the host: rmcp's service on hyper's HTTP/1.1, behind a
//! bearer token that names the caller's principal (`docs/mcp.md`, "Over HTTP").

use std::{convert::Infallible, net::SocketAddr, sync::Arc};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::{Request, Response, StatusCode, body::Incoming, header};
use hyper_util::rt::TokioIo;
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_service::Service as _;

use crate::{config::TokenDecl, gateway::Gateway};

/// Who an HTTP request is from, as its bearer token says; the gateway reads it from
/// the request's parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TokenHolder {
    pub(crate) tenant: String,
    pub(crate) subject: String,
    /// The approver the token stands for, when it may present approvals.
    pub(crate) approver: Option<String>,
}

/// Whether `presented` is `expected`, in time that does not depend on where they differ.
fn same(presented: &[u8], expected: &[u8]) -> bool {
    presented.len() == expected.len()
        && presented.iter().zip(expected).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// The principal of the token a request presents, if it presents one configured.
fn authorized(request: &Request<Incoming>, tokens: &[TokenDecl]) -> Option<TokenHolder> {
    let value = request.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let presented = value.strip_prefix("Bearer ")?.trim();
    tokens.iter().find(|token| same(presented.as_bytes(), token.token.as_bytes())).map(|token| {
        TokenHolder {
            tenant: token.tenant.clone(),
            subject: token.subject.clone(),
            approver: token.approver.clone(),
        }
    })
}

fn unauthorized() -> Response<BoxBody<Bytes, Infallible>> {
    let body = r#"{"error":{"code":"UNAUTHORIZED","message":"present a bearer token the gateway's configuration maps to a principal"}}"#;
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())).boxed());
    *response.status_mut() = StatusCode::UNAUTHORIZED;
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
    response
}

/// Serves MCP over Streamable HTTP on `listener` until `stop` is cancelled. With tokens,
/// every request must present one; without, the listener is loopback (the caller
/// checked) and every request is the configuration's principal.
pub(crate) async fn serve(
    listener: TcpListener,
    gateway: Gateway,
    tokens: Arc<Vec<TokenDecl>>,
    remote: bool,
    stop: CancellationToken,
) {
    let mut config = StreamableHttpServerConfig::default();
    config.cancellation_token = stop.clone();
    if remote {
        // Host validation guards a loopback server against DNS rebinding; a remote
        // listener is guarded by its tokens instead.
        config = config.disable_allowed_hosts();
    }
    let service = StreamableHttpService::new(
        move || Ok(gateway.session()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => return,
        };
        let Ok((stream, _peer)) = accepted else { continue };
        let (service, tokens) = (service.clone(), Arc::clone(&tokens));
        tokio::spawn(async move {
            let handler = hyper::service::service_fn(move |mut request: Request<Incoming>| {
                let mut service = service.clone();
                let principal = if tokens.is_empty() {
                    Ok(None)
                } else {
                    authorized(&request, &tokens).map(Some).ok_or(())
                };
                async move {
                    match principal {
                        Err(()) => Ok::<_, Infallible>(unauthorized()),
                        Ok(principal) => {
                            if let Some(principal) = principal {
                                request.extensions_mut().insert(principal);
                            }
                            service.call(request).await
                        }
                    }
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), handler)
                .await;
        });
    }
}

/// Whether `address` is a loopback address.
pub(crate) fn is_loopback(address: &SocketAddr) -> bool {
    address.ip().is_loopback()
}
