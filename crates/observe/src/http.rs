//! HTTP on a service's own port: `GET /metrics` for Prometheus, and whatever else the
//! service's [`Pages`] answer (management's cluster view and web page).
//!
//! `weft_net::serve` tells the two protocols apart by a connection's first four bytes: a Weft
//! frame starts with the magic `WEFT`, anything else is handed to hyper as HTTP/1.1.

use crate::metrics::Metrics;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, StatusCode};
use std::convert::Infallible;
use std::sync::Arc;
use tokio::net::TcpStream;

/// The content type of the OpenMetrics text format, which the metrics encoder writes.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// An answer to an HTTP GET.
#[derive(Clone, Debug)]
pub struct HttpReply {
    /// The status code.
    pub status: u16,
    /// The `Content-Type` header.
    pub content_type: &'static str,
    /// The body.
    pub body: Bytes,
}

impl HttpReply {
    /// A 200 answer.
    pub fn ok(content_type: &'static str, body: impl Into<Bytes>) -> HttpReply {
        HttpReply {
            status: 200,
            content_type,
            body: body.into(),
        }
    }

    /// A 200 answer with `value` as JSON.
    pub fn json(value: &impl serde::Serialize) -> HttpReply {
        match serde_json::to_vec_pretty(value) {
            Ok(body) => HttpReply::ok("application/json", body),
            Err(error) => HttpReply::error(500, format!("cannot encode the answer: {error}")),
        }
    }

    /// An error answer with a plain-text explanation.
    pub fn error(status: u16, message: impl Into<String>) -> HttpReply {
        let mut text: String = message.into();
        text.push('\n');
        HttpReply {
            status,
            content_type: "text/plain; charset=utf-8",
            body: Bytes::from(text),
        }
    }
}

/// What a service serves over HTTP besides `/metrics`.
pub trait Pages: Send + Sync + 'static {
    /// Answers a GET of `path` (with `query`, without the `?`); `None` is a 404.
    fn page(
        &self,
        path: &str,
        query: &str,
    ) -> impl std::future::Future<Output = Option<HttpReply>> + Send;
}

/// Serves HTTP/1.1 on `stream` until the peer closes it.
pub async fn serve_http<P: Pages>(stream: TcpStream, pages: Arc<P>, metrics: Metrics) {
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let pages = Arc::clone(&pages);
        let metrics = metrics.clone();
        async move {
            let reply = route(&*pages, &metrics, request.method(), request.uri()).await;
            let head = request.method() == Method::HEAD;
            Ok::<_, Infallible>(into_response(reply, head))
        }
    });
    let io = hyper_util::rt::TokioIo::new(stream);
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HTTP_HEADER_TIMEOUT)
        .serve_connection(io, service);
    // A peer that sends part of a request, or keeps a connection forever, gives it up after
    // these deadlines: a scraper simply connects again.
    match tokio::time::timeout(HTTP_CONNECTION_MAX, connection).await {
        Ok(Err(error)) => tracing::debug!(%error, "HTTP connection ended with an error"),
        Ok(Ok(())) => {}
        Err(_) => tracing::debug!("HTTP connection closed after {HTTP_CONNECTION_MAX:?}"),
    }
}

/// Longest wait for a request's head on an HTTP connection.
const HTTP_HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Longest an HTTP connection is kept open.
const HTTP_CONNECTION_MAX: std::time::Duration = std::time::Duration::from_secs(60);

async fn route<P: Pages>(
    pages: &P,
    metrics: &Metrics,
    method: &Method,
    uri: &hyper::Uri,
) -> HttpReply {
    if method != Method::GET && method != Method::HEAD {
        return HttpReply::error(405, "only GET and HEAD are served here");
    }
    let path = uri.path();
    if path == "/metrics" {
        return HttpReply::ok(METRICS_CONTENT_TYPE, metrics.encode());
    }
    match pages.page(path, uri.query().unwrap_or("")).await {
        Some(reply) => reply,
        None => HttpReply::error(404, format!("no page at {path}; metrics are at /metrics")),
    }
}

fn into_response(reply: HttpReply, head: bool) -> hyper::Response<Full<Bytes>> {
    let body = if head { Bytes::new() } else { reply.body };
    let mut response = hyper::Response::new(Full::new(body));
    *response.status_mut() =
        StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(value) = hyper::header::HeaderValue::from_str(reply.content_type) {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response.headers_mut().insert(
        hyper::header::CACHE_CONTROL,
        hyper::header::HeaderValue::from_static("no-store"),
    );
    response
}
