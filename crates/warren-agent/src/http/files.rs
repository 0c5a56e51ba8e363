//! `GET /files` and `POST /files`: whole-file download and upload, as envd serves them.
//!
//! Both endpoints sit outside the token middleware because they also accept a URL signature
//! (`signing`). Data is streamed in both directions, chunk by chunk, so the agent's memory stays
//! bounded whatever the file size. Every error is a JSON `{"code", "message"}` body.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use async_compression::tokio::bufread::{GzipDecoder, GzipEncoder};
use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::BytesMut;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt, BufReader};
use tokio_util::io::{ReaderStream, StreamReader};

use super::headers::{
    content_disposition, http_date, if_range_holds, negotiate, parse_range, part_file_name,
    precondition, unix_secs, Coding, RangeOutcome,
};
use super::signing::{self, Operation, SignedRequest};
use super::xattrs::{self, Metadata};
use crate::auth::{http_error, lookup_user};
use crate::fs::identity;
use crate::paths;
use crate::state::AppState;
use crate::users::User;

/// The gzip coder's buffer size.
const CHUNK: usize = 64 * 1024;
/// Read and write granularity of plain transfers: each read or write of a `tokio::fs::File`
/// is a hand-off to a blocking thread, so larger pieces mean fewer of them (64 KiB pieces cost
/// a 256 MiB download or upload about 4,000 hand-offs; 1 MiB pieces, 256).
const STREAM_CHUNK: usize = 1024 * 1024;

/// Query parameters of both endpoints. Kept as strings so each can be validated with a proper
/// JSON error (and so `path`/`username` keep the exact spelling that was signed).
#[derive(Debug, Default, Deserialize)]
pub struct FilesQuery {
    pub path: Option<String>,
    pub username: Option<String>,
    pub signature: Option<String>,
    pub signature_expiration: Option<String>,
}

/// An error response in the making.
#[derive(Debug)]
struct Failure {
    status: StatusCode,
    message: String,
}

impl Failure {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// An I/O error while opening, creating or writing a file: full disks (ENOSPC, EDQUOT)
    /// are 507 so the SDKs raise `NotEnoughSpaceException`; a file where a directory is needed
    /// (or the reverse) is the caller's mistake, and so is a path the caller may not use
    /// (403); anything else is ours.
    fn io(context: &str, e: &io::Error) -> Self {
        use io::ErrorKind as K;
        let status = match e.kind() {
            K::StorageFull | K::QuotaExceeded => StatusCode::INSUFFICIENT_STORAGE,
            K::NotADirectory | K::IsADirectory | K::InvalidInput => StatusCode::BAD_REQUEST,
            K::PermissionDenied => StatusCode::FORBIDDEN,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, format!("{context}: {e}"))
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        http_error(self.status, self.message)
    }
}

type Result<T> = std::result::Result<T, Failure>;

/// What every `/files` request establishes first: parameters, access, and the acting user.
struct Caller {
    query: FilesQuery,
    user: User,
    default_workdir: Option<PathBuf>,
}

impl Caller {
    fn resolve(&self, raw: &str) -> PathBuf {
        paths::resolve(raw, &self.user, self.default_workdir.as_deref())
    }
}

fn authenticate(
    state: &AppState,
    query: std::result::Result<Query<FilesQuery>, QueryRejection>,
    headers: &HeaderMap,
    op: Operation,
) -> Result<Caller> {
    let Query(query) =
        query.map_err(|e| Failure::bad_request(format!("invalid query parameters: {e}")))?;
    let expiration =
        match query.signature_expiration.as_deref() {
            None => None,
            Some(raw) => Some(raw.trim().parse::<i64>().map_err(|_| {
                Failure::bad_request(format!("invalid signature_expiration '{raw}'"))
            })?),
        };
    let settings = state.settings();
    let signed = SignedRequest {
        path: query.path.as_deref().unwrap_or(""),
        username: query.username.as_deref().unwrap_or(""),
        signature: query.signature.as_deref(),
        expiration,
    };
    signing::authorize_with(
        settings.access_token.as_deref(),
        headers,
        &signed,
        op,
        signing_policy(&settings),
        signing::unix_now(),
    )
    .map_err(|e| Failure::new(StatusCode::UNAUTHORIZED, e.to_string()))?;
    let user = lookup_user(state, query.username.as_deref()).map_err(|_| {
        let name = query
            .username
            .as_deref()
            .filter(|n| !n.is_empty())
            .unwrap_or(&settings.default_user);
        Failure::new(
            StatusCode::UNAUTHORIZED,
            format!("error looking up user '{name}': unknown user {name}"),
        )
    })?;
    Ok(Caller {
        query,
        user,
        default_workdir: settings.default_workdir,
    })
}

/// Limits on signed URLs, as the control plane set them through `/init` (none by default).
fn signing_policy(settings: &crate::state::Settings) -> signing::SigningPolicy {
    signing::SigningPolicy {
        max_age_secs: settings.signed_url_max_age_secs,
    }
}

// ---------------------------------------------------------------------------------------------
// GET /files

/// `GET /files?path=&username=&signature=&signature_expiration=`: the file's bytes.
pub async fn download(
    State(state): State<AppState>,
    query: std::result::Result<Query<FilesQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Response {
    match serve_file(&state, query, &headers).await {
        Ok(resp) => resp,
        Err(f) => f.into_response(),
    }
}

async fn serve_file(
    state: &AppState,
    query: std::result::Result<Query<FilesQuery>, QueryRejection>,
    headers: &HeaderMap,
) -> Result<Response> {
    let caller = authenticate(state, query, headers, Operation::Read)?;
    let path = caller.resolve(caller.query.path.as_deref().unwrap_or(""));
    let (file, meta) = open_as(&caller.user, &path).await?;
    if meta.is_dir() {
        return Err(Failure::bad_request(format!(
            "path '{}' is a directory",
            path.display()
        )));
    }
    let coding = negotiate(headers).ok_or_else(|| {
        Failure::new(
            StatusCode::NOT_ACCEPTABLE,
            "no acceptable encoding found, supported: [gzip]",
        )
    })?;
    let mtime = meta.modified().ok().and_then(unix_secs);
    let builder = download_headers(&path, mtime);
    if let Some(status) = precondition(headers, mtime) {
        if status == StatusCode::NOT_MODIFIED {
            return builder.status(status).body(Body::empty()).map_err(internal);
        }
        return Err(Failure::new(status, "precondition failed"));
    }

    // Files of unknown length (pseudo-files in /proc report 0, devices and pipes have none)
    // are streamed to their end without a length, and so without ranges.
    let len = (meta.is_file() && meta.len() > 0).then_some(meta.len());
    let wants_range = headers.contains_key(header::RANGE);
    let range = requested_range(headers, len, mtime);
    if let (RangeOutcome::Unsatisfiable, Some(len)) = (range, len) {
        return Ok(range_not_satisfiable(len));
    }
    // Like upstream, a Range request is always answered in identity so byte offsets mean
    // something. Accept-Encoding is advisory: what would not shrink goes as it is, at disk
    // speed and with its length, instead of through one core's compressor.
    if coding == Coding::Gzip && !wants_range {
        let (file, worth) = tokio::task::spawn_blocking(move || {
            let worth = super::compressible::worth_compressing(&file, len);
            (file, worth)
        })
        .await
        .map_err(internal)?;
        let file = tokio::fs::File::from_std(file);
        if worth {
            return gzip_body(builder, file);
        }
        return match len {
            Some(len) => sized_body(builder, file, len, range).await,
            None => unsized_body(builder, file),
        };
    }
    let file = tokio::fs::File::from_std(file);
    match len {
        Some(len) => sized_body(builder, file, len, range).await,
        None => unsized_body(builder, file),
    }
}

/// A file of unknown length, streamed to its end.
fn unsized_body(builder: axum::http::response::Builder, file: tokio::fs::File) -> Result<Response> {
    builder
        .body(Body::from_stream(ReaderStream::with_capacity(
            file,
            STREAM_CHUNK,
        )))
        .map_err(internal)
}

/// Opens `path` with the caller's identity, so the kernel decides what the caller may read
/// (through symlinks too); the descriptor's metadata then describes exactly what is served.
async fn open_as(user: &User, path: &Path) -> Result<(std::fs::File, std::fs::Metadata)> {
    let opened = {
        let path = path.to_path_buf();
        identity::run_as(user, move || {
            let file = std::fs::File::open(&path)?;
            let meta = file.metadata()?;
            Ok::<_, io::Error>((file, meta))
        })
        .await
        .and_then(|r| r)
    };
    opened.map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => Failure::new(
            StatusCode::NOT_FOUND,
            format!("path '{}' does not exist", path.display()),
        ),
        _ => Failure::io(&format!("error opening file '{}'", path.display()), &e),
    })
}

/// The headers every download carries, whatever its body.
fn download_headers(path: &Path, mtime: Option<u64>) -> axum::http::response::Builder {
    let mut builder = Response::builder()
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_DISPOSITION, content_disposition(path))
        .header(header::VARY, "Accept-Encoding");
    if let Some(secs) = mtime {
        if let Ok(v) = HeaderValue::from_str(&http_date(secs)) {
            builder = builder.header(header::LAST_MODIFIED, v);
        }
    }
    builder
}

/// The part of a file of length `len` the request asks for (`Range`, unless `If-Range` says
/// the file changed); a file of unknown length is always served whole.
fn requested_range(headers: &HeaderMap, len: Option<u64>, mtime: Option<u64>) -> RangeOutcome {
    match len {
        Some(len) if headers.contains_key(header::RANGE) && if_range_holds(headers, mtime) => {
            match headers.get(header::RANGE).and_then(|v| v.to_str().ok()) {
                Some(spec) => parse_range(spec, len),
                None => RangeOutcome::Full,
            }
        }
        _ => RangeOutcome::Full,
    }
}

fn range_not_satisfiable(len: u64) -> Response {
    let mut resp = Failure::new(
        StatusCode::RANGE_NOT_SATISFIABLE,
        format!("requested range not satisfiable (file size {len})"),
    )
    .into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("bytes */{len}")) {
        resp.headers_mut().insert(header::CONTENT_RANGE, v);
    }
    resp
}

fn gzip_body(builder: axum::http::response::Builder, file: tokio::fs::File) -> Result<Response> {
    // The fastest level: inside a sandbox CPU is scarcer than bandwidth, and the default
    // level caps downloads at ~30 MiB/s.
    let encoder = GzipEncoder::with_quality(
        BufReader::with_capacity(CHUNK, file),
        async_compression::Level::Fastest,
    );
    builder
        .header(header::CONTENT_ENCODING, "gzip")
        .body(Body::from_stream(ReaderStream::with_capacity(
            encoder, CHUNK,
        )))
        .map_err(internal)
}

/// A file of known length `len`, whole or the one range asked for, with its length.
async fn sized_body(
    mut builder: axum::http::response::Builder,
    mut file: tokio::fs::File,
    len: u64,
    range: RangeOutcome,
) -> Result<Response> {
    builder = builder.header(header::ACCEPT_RANGES, "bytes");
    let count = match range {
        RangeOutcome::Partial(start, end) => {
            file.seek(io::SeekFrom::Start(start)).await.map_err(|e| {
                Failure::new(StatusCode::INTERNAL_SERVER_ERROR, format!("seek: {e}"))
            })?;
            builder = builder
                .status(StatusCode::PARTIAL_CONTENT)
                .header(header::CONTENT_RANGE, format!("bytes {start}-{end}/{len}"));
            end - start + 1
        }
        _ => len,
    };
    // `take` keeps the body consistent with Content-Length if the file grows meanwhile; if it
    // shrinks, the body ends short and hyper aborts the connection rather than lie.
    builder
        .header(header::CONTENT_LENGTH, count)
        .body(Body::from_stream(ReaderStream::with_capacity(
            file.take(count),
            STREAM_CHUNK,
        )))
        .map_err(internal)
}

fn internal(e: impl std::fmt::Display) -> Failure {
    Failure::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

// ---------------------------------------------------------------------------------------------
// POST /files

/// One uploaded file, as the SDKs expect it back.
#[derive(Debug, Serialize)]
struct EntryInfo {
    path: String,
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<Metadata>,
}

/// `POST /files?path=&username=&signature=&signature_expiration=`: multipart/form-data or
/// application/octet-stream body, optionally gzip-encoded.
pub async fn upload(
    State(state): State<AppState>,
    query: std::result::Result<Query<FilesQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let body = SharedBody::new(body);
    match receive(&state, query, &headers, body.clone()).await {
        Ok(entries) => (StatusCode::OK, Json(entries)).into_response(),
        Err(f) => {
            tracing::debug!(status = %f.status, message = %f.message, "upload failed");
            let mut resp = f.into_response();
            // Rejected before the whole body was read (a bad query, a part that cannot be
            // written, a full disk, a broken gzip stream): read the rest off (within limits),
            // so the client sees this answer instead of a broken pipe and its connection stays
            // usable; else tell it the connection closes.
            let rest = Body::from_stream(body);
            if !warren_proto::server::drain_up_to(rest, UPLOAD_DRAIN_LIMIT, UPLOAD_DRAIN_TIME).await
            {
                resp.headers_mut().insert(
                    header::CONNECTION,
                    axum::http::HeaderValue::from_static("close"),
                );
            }
            resp
        }
    }
}

/// Most of a refused upload's body read off so its client gets the answer, and for how long
/// (uploads come from clients far away, over links much slower than the host's).
const UPLOAD_DRAIN_LIMIT: usize = 256 << 20;
const UPLOAD_DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(30);

/// The request body as a stream that the handler can still read off after the form parser
/// or the gzip decoder (each holding a clone) stopped reading it at an error.
#[derive(Clone)]
struct SharedBody(Arc<std::sync::Mutex<BoxStream<'static, io::Result<Bytes>>>>);

impl SharedBody {
    fn new(body: Body) -> Self {
        Self(Arc::new(std::sync::Mutex::new(
            body.into_data_stream().map_err(io::Error::other).boxed(),
        )))
    }
}

impl Stream for SharedBody {
    type Item = io::Result<Bytes>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .poll_next_unpin(cx)
    }
}

async fn receive(
    state: &AppState,
    query: std::result::Result<Query<FilesQuery>, QueryRejection>,
    headers: &HeaderMap,
    body: SharedBody,
) -> Result<Vec<EntryInfo>> {
    let caller = authenticate(state, query, headers, Operation::Write)?;
    let gzip = request_is_gzip(headers)?;
    let metadata = xattrs::from_headers(headers)
        .map_err(|e| Failure::bad_request(format!("invalid metadata: {e}")))?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let media = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let sink = Sink {
        user: caller.user.clone(),
        metadata,
        gzip,
    };
    let source = body_stream(body, gzip);

    if media == "application/octet-stream" {
        let raw = caller.query.path.as_deref().ok_or_else(|| {
            Failure::bad_request("path query parameter is required for raw body upload")
        })?;
        let target = caller.resolve(raw);
        let entry = sink.store(target, source).await?;
        journal_write(state, &caller.user.name, &entry);
        return Ok(vec![entry]);
    }
    if !media.starts_with("multipart/") {
        return Err(Failure::bad_request(format!(
            "unsupported content type: {content_type}, expected multipart/form-data or \
             application/octet-stream"
        )));
    }
    let boundary = multer::parse_boundary(content_type)
        .map_err(|e| Failure::bad_request(format!("error parsing multipart form: {e}")))?;
    let mut form = multer::Multipart::new(source, boundary);
    let mut entries: Vec<EntryInfo> = Vec::new();
    loop {
        let field = form
            .next_field()
            .await
            .map_err(|e| Failure::bad_request(format!("error reading form: {e}")))?;
        let Some(field) = field else { break };
        // Other fields are skipped; multer discards their data on the next `next_field`.
        if field.name() != Some("file") {
            continue;
        }
        // For single-file writes the SDKs also put the path in the query, and it wins.
        let raw = match caller.query.path.as_deref() {
            Some(p) => p.to_string(),
            None => part_file_name(field.headers()).ok_or_else(|| {
                Failure::bad_request(
                    "error getting multipart part file name: filename not found in \
                     Content-Disposition header",
                )
            })?,
        };
        let target = caller.resolve(&raw);
        let shown = target.to_string_lossy();
        if entries.iter().any(|e| e.path == shown) {
            return Err(Failure::bad_request(format!(
                "you cannot upload multiple files to the same path '{shown}' in one upload \
                 request, only the first specified file was uploaded"
            )));
        }
        let entry = sink.store(target, field).await?;
        journal_write(state, &caller.user.name, &entry);
        entries.push(entry);
    }
    Ok(entries)
}

/// Journals a file written by an upload.
fn journal_write(state: &AppState, user: &str, entry: &EntryInfo) {
    let fields = crate::journal::fields([
        ("path", entry.path.clone()),
        ("user", user.to_string()),
        ("via", "upload".to_string()),
    ]);
    state.journal.record(
        warren_proto::journal::FILE_WRITE,
        warren_proto::journal::Level::Info,
        format!("wrote {}", entry.path),
        fields,
    );
}

/// The request's `Content-Encoding`: `gzip` bodies are inflated, identity passes, others 400.
fn request_is_gzip(headers: &HeaderMap) -> Result<bool> {
    let Some(value) = headers.get(header::CONTENT_ENCODING) else {
        return Ok(false);
    };
    let text = value.to_str().unwrap_or("");
    let coding = text
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match coding.as_str() {
        "" | "identity" => Ok(false),
        "gzip" | "x-gzip" => Ok(true),
        _ => Err(Failure::bad_request(format!(
            "unsupported Content-Encoding: {text}, supported: [gzip]"
        ))),
    }
}

/// The request body as a stream of chunks, inflated on the fly when gzip-encoded
/// (concatenated gzip members are accepted, as Go's reader does).
fn body_stream(raw: SharedBody, gzip: bool) -> BoxStream<'static, io::Result<Bytes>> {
    if !gzip {
        return raw.boxed();
    }
    let mut decoder = GzipDecoder::new(StreamReader::new(raw));
    decoder.multiple_members(true);
    ReaderStream::with_capacity(decoder, CHUNK).boxed()
}

/// Where uploaded files go and how they are finished.
struct Sink {
    user: User,
    metadata: Metadata,
    gzip: bool,
}

impl Sink {
    /// Streams `source` into `target`: parents created, file truncated and owned by the user,
    /// metadata replaced. The first chunk is read before touching the disk so that a body that
    /// is not gzip at all fails without creating or truncating anything.
    async fn store<S, E>(&self, target: PathBuf, source: S) -> Result<EntryInfo>
    where
        S: Stream<Item = std::result::Result<Bytes, E>>,
        E: std::fmt::Display,
    {
        let mut source = std::pin::pin!(source);
        let first = self.next_chunk(&mut source).await?;
        let (file, regular) = {
            let target = target.clone();
            identity::run_as(&self.user, move || open_target(&target))
                .await
                .map_err(internal)??
        };
        let mut file = tokio::fs::File::from_std(file);
        let written = async {
            // The body arrives in pieces of a few KiB; they are gathered into writes of
            // STREAM_CHUNK. tokio writes behind: the next piece is received while one is
            // written.
            let mut pending = BytesMut::new();
            let mut chunk = first;
            while let Some(bytes) = chunk {
                pending.extend_from_slice(&bytes);
                if pending.len() >= STREAM_CHUNK {
                    file.write_all(&pending)
                        .await
                        .map_err(|e| write_failure(&e))?;
                    pending.clear();
                }
                chunk = self.next_chunk(&mut source).await?;
            }
            file.write_all(&pending)
                .await
                .map_err(|e| write_failure(&e))?;
            // tokio writes in the background: errors of the last write only surface here.
            file.flush().await.map_err(|e| write_failure(&e))
        }
        .await;
        if let Err(f) = written {
            if f.status == StatusCode::INSUFFICIENT_STORAGE && regular {
                // The file was truncated when opened; what did fit of the upload would only
                // keep the disk full. Through the descriptor: the path may have changed.
                let _ = file.set_len(0).await;
            }
            return Err(f);
        }
        let file = file.into_std().await;

        let metadata = if regular {
            let wanted = self.metadata.clone();
            tokio::task::spawn_blocking(move || finish_metadata(&file, &wanted))
                .await
                .map_err(internal)??
        } else {
            Metadata::new()
        };
        Ok(EntryInfo {
            name: target
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            path: target.to_string_lossy().into_owned(),
            kind: "file",
            metadata: (!metadata.is_empty()).then_some(metadata),
        })
    }

    async fn next_chunk<S, E>(&self, source: &mut Pin<&mut S>) -> Result<Option<Bytes>>
    where
        S: Stream<Item = std::result::Result<Bytes, E>>,
        E: std::fmt::Display,
    {
        match source.next().await {
            None => Ok(None),
            Some(Ok(bytes)) => Ok(Some(bytes)),
            Some(Err(e)) if self.gzip => Err(Failure::bad_request(format!(
                "error decompressing request body: {e}"
            ))),
            Some(Err(e)) => Err(Failure::bad_request(format!(
                "error reading request body: {e}"
            ))),
        }
    }
}

fn write_failure(e: &io::Error) -> Failure {
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => Failure::new(
            StatusCode::INSUFFICIENT_STORAGE,
            format!("not enough disk space available: {e}"),
        ),
        _ => Failure::io("error writing file", e),
    }
}

/// Creates missing parents, refuses directories and opens the file truncated; to be run with
/// the caller's identity (`identity::run_as`), so whatever it creates is the caller's and
/// whatever it opens the caller could have opened. Returns the file and whether it is a
/// regular file (devices such as /dev/null are written to, but not tagged).
fn open_target(path: &Path) -> Result<(std::fs::File, bool)> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(Failure::bad_request(format!(
            "path is a directory: {}",
            path.display()
        )));
    };
    let dir =
        identity::open_dirs(parent).map_err(|e| Failure::io("error ensuring directories", &e))?;
    match nix::sys::stat::fstatat(&dir, name, nix::fcntl::AtFlags::empty()) {
        Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
            return Err(Failure::bad_request(format!(
                "path is a directory: {}",
                path.display()
            )))
        }
        Ok(_) | Err(nix::errno::Errno::ENOENT) => {}
        Err(e) => return Err(Failure::io("error getting file info", &io::Error::from(e))),
    }
    let file = identity::create_file(&dir, name).map_err(|e| match e.kind() {
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => Failure::new(
            StatusCode::INSUFFICIENT_STORAGE,
            format!("not enough inodes available: {e}"),
        ),
        _ => Failure::io("error opening file", &e),
    })?;
    let meta = file.metadata().ok();
    let regular = meta.as_ref().is_some_and(|m| m.is_file());
    if let Some(m) = meta.filter(|m| m.is_file()) {
        // Set the owner it has, as envd sets the caller's after opening: watchers see the
        // same CREATE, CHMOD, WRITE sequence for an upload (SDK tests count them). Refused
        // (another user's file the caller may write), it changes nothing.
        use std::os::unix::fs::MetadataExt;
        let _ = nix::unistd::fchown(
            &file,
            Some(nix::unistd::Uid::from_raw(m.uid())),
            Some(nix::unistd::Gid::from_raw(m.gid())),
        );
    }
    Ok((file, regular))
}

/// Replaces the file's metadata and reads it back for the response, through the descriptor
/// the upload wrote (never by path, which could have been swapped meanwhile). Filesystems
/// without xattrs (some virtual ones) keep the upload and just report no metadata.
fn finish_metadata(file: &std::fs::File, wanted: &Metadata) -> Result<Metadata> {
    match crate::fs::metadata::replace_fd(file, wanted) {
        Ok(()) => {}
        Err(e) if crate::fs::metadata::unsupported(&e) => {
            tracing::warn!("filesystem has no xattrs; metadata dropped");
            return Ok(Metadata::new());
        }
        Err(e) => return Err(Failure::io("error writing file metadata", &e)),
    }
    crate::fs::metadata::read_fd(file).map_err(|e| Failure::io("error reading file metadata", &e))
}
