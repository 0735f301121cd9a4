//! The web UI at `/`: one page, its script and its stylesheet, embedded in
//! the binary (no CDN, works offline). It only calls the query API.

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::app::SharedState;

const INDEX_HTML: &str = include_str!("index.html");
const APP_JS: &str = include_str!("app.js");
const STYLE_CSS: &str = include_str!("style.css");

/// Changes with every build's assets, so browsers revalidate cheaply.
const ETAG: &str = concat!("\"", env!("CARGO_PKG_VERSION"), "-ui\"");

pub fn routes() -> Router<SharedState> {
    Router::new()
        .route(
            "/",
            get(|h: HeaderMap| async move { asset(&h, "text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/ui/app.js",
            get(|h: HeaderMap| async move { asset(&h, "text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/ui/style.css",
            get(|h: HeaderMap| async move { asset(&h, "text/css; charset=utf-8", STYLE_CSS) }),
        )
}

fn asset(headers: &HeaderMap, content_type: &'static str, body: &'static str) -> Response {
    let etag = HeaderValue::from_static(ETAG);
    if headers.get(header::IF_NONE_MATCH) == Some(&etag) {
        return (StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response();
    }
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (header::ETAG, etag),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static("default-src 'self'; img-src 'self' data:"),
            ),
        ],
        body,
    )
        .into_response()
}
