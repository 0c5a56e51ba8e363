//! The web dashboard (`docs/dashboard.md`): static assets built from `dashboard/` (Vite) and
//! embedded in the binary, served under `/dashboard/` on the API listener.
//!
//! These routes serve files only, never data: the page itself calls the API with the key the
//! user types (sent as `X-API-KEY`), so nothing here needs or weakens authentication. Every
//! answer carries a strict Content-Security-Policy (scripts from this origin only, no inline
//! scripts, no framing) and `nosniff`.

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use rust_embed::RustEmbed;

#[derive(RustEmbed)]
#[folder = "../../dashboard/dist"]
#[allow_missing = true]
struct Assets;

/// Scripts, styles, fonts, images and API calls from this origin only. `style-src` allows
/// inline styles because xterm.js and uPlot set element styles and xterm.js adds its theme as a
/// `<style>` element; scripts stay strictly `'self'`.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
     img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// Shown at `/dashboard/` by a binary built before the dashboard's assets were.
const NOT_BUILT: &str = "<!doctype html><html><head><meta charset=\"utf-8\">\
<title>Warren dashboard not built</title></head><body>\
<h1>The dashboard is not built into this binary</h1>\
<p>Build its assets with <code>cd dashboard &amp;&amp; npm ci &amp;&amp; npm run build</code> \
(<code>scripts/setup.sh</code> does this), then build Warren again \
(<code>cargo build --release</code>).</p></body></html>";

pub(crate) fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            "/dashboard",
            get(|| async { Redirect::permanent("/dashboard/") }),
        )
        .route("/dashboard/", get(|| asset(String::new())))
        .route(
            "/dashboard/{*path}",
            get(|Path(path): Path<String>| asset(path)),
        )
}

/// A built file by path; any other path (the page's own routes) gets `index.html`.
async fn asset(path: String) -> Response {
    let path = path.trim_start_matches('/');
    if let Some(file) = (!path.is_empty()).then(|| Assets::get(path)).flatten() {
        let mime = file.metadata.mimetype().to_string();
        // Vite names built files by content hash under assets/: they never change.
        let cache = if path.starts_with("assets/") {
            "public, max-age=31536000, immutable"
        } else {
            "no-cache"
        };
        return respond(StatusCode::OK, &mime, cache, file.data.into_owned());
    }
    // A missing file under assets/ is a stale or wrong link, not a page route.
    if path.starts_with("assets/") {
        return respond(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "no-cache",
            b"no such file".to_vec(),
        );
    }
    match Assets::get("index.html") {
        Some(index) => respond(
            StatusCode::OK,
            "text/html; charset=utf-8",
            "no-cache",
            index.data.into_owned(),
        ),
        None => respond(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/html; charset=utf-8",
            "no-cache",
            NOT_BUILT.as_bytes().to_vec(),
        ),
    }
}

fn respond(status: StatusCode, mime: &str, cache: &'static str, body: Vec<u8>) -> Response {
    let mut resp = (status, body).into_response();
    let headers = resp.headers_mut();
    if let Ok(value) = HeaderValue::from_str(mime) {
        headers.insert(header::CONTENT_TYPE, value);
    }
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body(resp: Response) -> String {
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn header(resp: &Response, name: header::HeaderName) -> String {
        resp.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    }

    #[tokio::test]
    async fn every_answer_has_the_policy_and_a_missing_asset_is_a_404() {
        let resp = asset("assets/no-such-file.js".into()).await;
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        assert_eq!(header(&resp, header::CONTENT_SECURITY_POLICY), CSP);
        assert_eq!(header(&resp, header::X_CONTENT_TYPE_OPTIONS), "nosniff");
        assert!(CSP.contains("script-src 'self';") && CSP.contains("frame-ancestors 'none'"));
    }

    #[tokio::test]
    async fn page_routes_get_the_page_or_the_command_that_builds_it() {
        let resp = asset("sandboxes/abc".into()).await;
        assert_eq!(header(&resp, header::CONTENT_SECURITY_POLICY), CSP);
        assert!(header(&resp, header::CONTENT_TYPE).starts_with("text/html"));
        let status = resp.status();
        let text = body(resp).await;
        if Assets::get("index.html").is_some() {
            assert_eq!(status, StatusCode::OK);
            let js = text
                .split('"')
                .find(|s| s.starts_with("/dashboard/assets/") && s.ends_with(".js"))
                .expect("index.html loads a script from assets/");
            let script = asset(js.trim_start_matches("/dashboard/").into()).await;
            assert_eq!(script.status(), StatusCode::OK);
            assert!(header(&script, header::CONTENT_TYPE).contains("javascript"));
            assert!(header(&script, header::CACHE_CONTROL).contains("immutable"));
        } else {
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
            assert!(text.contains("npm ci &amp;&amp; npm run build"), "{text}");
        }
    }
}
