//! The HTTP half of a Streamable HTTP upstream: rmcp's transport speaks the protocol
//! (sessions, streams, resumption), and this client carries each of its requests over
//! hyper's own HTTP/1.1 connection, one TCP connection per request. `http://` only: no
//! TLS is compiled in (`docs/mcp.md`, "Upstreams over HTTP").

use std::{borrow::Cow, collections::HashMap, sync::Arc};

use bytes::Bytes;
use futures_core::stream::BoxStream;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{
    Method, Request, Response, StatusCode,
    body::Incoming,
    header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST, HeaderName, HeaderValue},
};
use hyper_util::rt::TokioIo;
use rmcp::{
    model::{ClientJsonRpcMessage, ClientRequest, ErrorData, ServerJsonRpcMessage},
    transport::{
        common::http_header::{
            EVENT_STREAM_MIME_TYPE, HEADER_LAST_EVENT_ID, HEADER_SESSION_ID, JSON_MIME_TYPE,
        },
        streamable_http_client::{
            SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
        },
    },
};
use sse_stream::{Sse, SseStream};

/// The largest JSON answer read (an SSE event is bounded by the transport's parser).
const JSON_BYTES_MAX: usize = 16 << 20;
/// The most of an error answer kept, to say what went wrong.
const ERROR_BYTES_MAX: usize = 4 << 10;

/// Why an exchange with the upstream failed below the protocol.
#[derive(Debug)]
pub(crate) enum HttpError {
    /// The connection could not be made (nothing was sent).
    Connect(std::io::Error),
    /// The exchange failed once the connection was made.
    Exchange(String),
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpError::Connect(err) => write!(f, "could not connect: {}", err.kind()),
            HttpError::Exchange(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for HttpError {}

type Failed = StreamableHttpError<HttpError>;

fn exchange(why: impl std::fmt::Display) -> Failed {
    StreamableHttpError::Client(HttpError::Exchange(why.to_string()))
}

/// An `http://HOST:PORT/PATH` upstream's address, checked.
#[derive(Debug, Clone)]
pub(crate) struct HttpClient {
    /// `HOST:PORT`, as connected to and sent in `Host`.
    authority: Arc<str>,
}

impl HttpClient {
    /// The client of `url`, or why it cannot be one.
    pub(crate) fn new(url: &str) -> Result<HttpClient, String> {
        let uri: hyper::Uri = url.parse().map_err(|_| "is not a URL".to_owned())?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err("is https://, and TLS is not built in: put a local TLS-terminating \
                     proxy in front of it"
                    .to_owned());
            }
            _ => return Err("must be an http:// URL".to_owned()),
        }
        let authority = uri.authority().ok_or_else(|| "names no host".to_owned())?;
        let port = authority.port_u16().unwrap_or(80);
        Ok(HttpClient { authority: format!("{}:{port}", authority.host()).into() })
    }

    /// Sends `request` on a new connection; the response, its body still streaming.
    async fn send(&self, request: Request<Full<Bytes>>) -> Result<Response<Incoming>, Failed> {
        let stream = tokio::net::TcpStream::connect(self.authority.as_ref())
            .await
            .map_err(|err| StreamableHttpError::Client(HttpError::Connect(err)))?;
        let _ = stream.set_nodelay(true);
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(exchange)?;
        // The connection lives as long as its response's body is read.
        tokio::spawn(connection);
        sender.send_request(request).await.map_err(exchange)
    }

    fn request(
        &self,
        method: Method,
        uri: &str,
        session_id: Option<&str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> hyper::http::request::Builder {
        // The origin form (`/path?query`) in the request line, as servers expect of a
        // client that is not a proxy.
        let target = uri
            .parse::<hyper::Uri>()
            .ok()
            .and_then(|uri| uri.path_and_query().map(|target| target.as_str().to_owned()))
            .unwrap_or_else(|| "/".to_owned());
        let mut builder = Request::builder().method(method).uri(target);
        builder = builder.header(HOST, self.authority.as_ref());
        if let Some(token) = auth_header {
            builder = builder.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        for (name, value) in custom_headers {
            builder = builder.header(name, value);
        }
        if let Some(session_id) = session_id {
            builder = builder.header(HEADER_SESSION_ID, session_id);
        }
        builder
    }
}

/// The body of `response`, at most `limit` bytes.
async fn body_of(response: Response<Incoming>, limit: usize) -> Result<Bytes, Failed> {
    Limited::new(response.into_body(), limit)
        .collect()
        .await
        .map(http_body_util::Collected::to_bytes)
        .map_err(|_| StreamableHttpError::ResponseBodyTooLarge { max_size: limit })
}

fn media_type(response: &Response<Incoming>) -> Option<String> {
    response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map(|value| value.split(';').next().unwrap_or_default().trim().to_ascii_lowercase())
}

/// A server of the older protocol refuses `server/discover` with an HTTP client error
/// (it knows no such method): answered as the JSON-RPC error it means, so the
/// transport falls back to `initialize`.
fn discover_refused(
    message: &ClientJsonRpcMessage,
    attached: bool,
    status: StatusCode,
    body: &[u8],
) -> Option<StreamableHttpPostResponse> {
    let ClientJsonRpcMessage::Request(request) = message else { return None };
    let refusal = status.is_client_error()
        && !matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN)
        && !attached;
    if !refusal || !matches!(request.request, ClientRequest::DiscoverRequest(_)) {
        return None;
    }
    let error = match serde_json::from_slice::<ServerJsonRpcMessage>(body) {
        Ok(ServerJsonRpcMessage::Error(error)) => error.error,
        _ => {
            ErrorData::invalid_request(format!("server/discover refused with HTTP {status}"), None)
        }
    };
    Some(StreamableHttpPostResponse::Json(
        ServerJsonRpcMessage::error(error, Some(request.id.clone())),
        None,
    ))
}

impl StreamableHttpClient for HttpClient {
    type Error = HttpError;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, Failed> {
        let body = serde_json::to_vec(&message)?;
        let attached = session_id.is_some();
        let request = self
            .request(Method::POST, &uri, session_id.as_deref(), auth_header, custom_headers)
            .header(CONTENT_TYPE, JSON_MIME_TYPE)
            .header(ACCEPT, format!("{EVENT_STREAM_MIME_TYPE}, {JSON_MIME_TYPE}"))
            .body(Full::new(Bytes::from(body)))
            .map_err(exchange)?;
        let response = self.send(request).await?;
        let status = response.status();
        if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT) {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        if status == StatusCode::NOT_FOUND && attached {
            return Err(StreamableHttpError::SessionExpired);
        }
        let session = response
            .headers()
            .get(HEADER_SESSION_ID)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let media = media_type(&response);
        if !status.is_success() {
            let body = body_of(response, ERROR_BYTES_MAX).await.unwrap_or_default();
            if let Some(answer) = discover_refused(&message, attached, status, &body) {
                return Ok(answer);
            }
            if let Ok(error @ ServerJsonRpcMessage::Error(_)) =
                serde_json::from_slice::<ServerJsonRpcMessage>(&body)
            {
                return Ok(StreamableHttpPostResponse::Json(error, session));
            }
            return Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(format!(
                "HTTP {status}"
            ))));
        }
        let answers = matches!(message, ClientJsonRpcMessage::Request(_));
        match media.as_deref() {
            Some(EVENT_STREAM_MIME_TYPE) => {
                let events: BoxStream<'static, Result<Sse, SseError>> =
                    Box::pin(SseStream::new(response.into_body()));
                Ok(StreamableHttpPostResponse::Sse(events, session))
            }
            Some(JSON_MIME_TYPE) => {
                let body = body_of(response, JSON_BYTES_MAX).await?;
                match serde_json::from_slice::<ServerJsonRpcMessage>(&body) {
                    Ok(answer) => Ok(StreamableHttpPostResponse::Json(answer, session)),
                    Err(_) if !answers => Ok(StreamableHttpPostResponse::Accepted),
                    Err(err) => Err(StreamableHttpError::Deserialize(err)),
                }
            }
            // A notification or a response needs nothing from the body.
            _ if !answers => Ok(StreamableHttpPostResponse::Accepted),
            other => Err(StreamableHttpError::UnexpectedContentType(other.map(str::to_owned))),
        }
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), Failed> {
        let request = self
            .request(Method::DELETE, &uri, Some(&session_id), auth_header, custom_headers)
            .body(Full::new(Bytes::new()))
            .map_err(exchange)?;
        let status = self.send(request).await?.status();
        if status == StatusCode::METHOD_NOT_ALLOWED {
            return Err(StreamableHttpError::ServerDoesNotSupportDeleteSession);
        }
        if !status.is_success() {
            return Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(format!(
                "HTTP {status}"
            ))));
        }
        Ok(())
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, Failed> {
        let mut builder = self
            .request(Method::GET, &uri, session_id.as_deref(), auth_header, custom_headers)
            .header(ACCEPT, EVENT_STREAM_MIME_TYPE);
        if let Some(last_event_id) = last_event_id {
            builder = builder.header(HEADER_LAST_EVENT_ID, last_event_id);
        }
        let request = builder.body(Full::new(Bytes::new())).map_err(exchange)?;
        let response = self.send(request).await?;
        let status = response.status();
        if status == StatusCode::METHOD_NOT_ALLOWED {
            return Err(StreamableHttpError::ServerDoesNotSupportSse);
        }
        if !status.is_success() {
            return Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(format!(
                "HTTP {status}"
            ))));
        }
        if media_type(&response).as_deref() != Some(EVENT_STREAM_MIME_TYPE) {
            return Err(StreamableHttpError::UnexpectedContentType(media_type(&response)));
        }
        Ok(Box::pin(SseStream::new(response.into_body())))
    }
}

#[cfg(test)]
mod tests {
    use super::HttpClient;

    #[test]
    fn only_an_http_url_with_a_host_is_an_upstream() {
        assert_eq!(
            &*HttpClient::new("http://127.0.0.1:8000/mcp").unwrap().authority,
            "127.0.0.1:8000"
        );
        assert_eq!(
            &*HttpClient::new("http://mcp.internal/mcp").unwrap().authority,
            "mcp.internal:80"
        );
        assert!(HttpClient::new("https://mcp.example/mcp").unwrap_err().contains("TLS"));
        for bad in ["ftp://x/", "/mcp", "not a url", "http:///mcp"] {
            assert!(HttpClient::new(bad).is_err(), "{bad}");
        }
    }
}
