//! Lifecycle events (E2B's `GET /events/sandboxes[/{id}]`): translation only.

use axum::extract::{Path, RawQuery};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use warren_control::{EventKind, EventQuery, SandboxEvent};

use crate::error::ApiError;
use crate::extract::Authed;
use crate::types::{rfc3339, ErrorBody};

type ApiResult<T> = Result<T, ApiError>;

/// One lifecycle event as E2B's events API shows it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventBody {
    /// Always `v1`.
    pub version: String,
    pub id: String,
    /// `sandbox.lifecycle.created|paused|resumed|checkpointed|updated|killed`.
    #[serde(rename = "type")]
    pub kind: String,
    /// What else there is to say: `set_timeout` (the new end), `execution` (a kill's run
    /// time and size), `reason` (why it ended on its own), `snapshot_id`, `memory`.
    #[schema(value_type = Object)]
    pub event_data: Option<serde_json::Value>,
    pub sandbox_id: String,
    pub sandbox_team_id: String,
    pub sandbox_template_id: String,
    /// The sandbox's id (Warren runs a sandbox as one execution across pauses).
    pub sandbox_execution_id: String,
    /// Warren does not record which build a sandbox started from.
    pub sandbox_build_id: Option<String>,
    /// RFC 3339.
    pub timestamp: String,
}

impl From<SandboxEvent> for EventBody {
    fn from(e: SandboxEvent) -> Self {
        EventBody {
            version: "v1".into(),
            id: e.id,
            kind: e.kind.type_name().into(),
            event_data: e.data,
            sandbox_execution_id: e.sandbox_id.clone(),
            sandbox_id: e.sandbox_id,
            sandbox_team_id: e.team,
            sandbox_template_id: e.template,
            sandbox_build_id: None,
            timestamp: rfc3339(e.at),
        }
    }
}

/// An event's JSON as the events API shows it: the body of its webhook deliveries (what
/// `warren serve` hands `warren_adapters::HttpWebhookSender`).
pub fn event_payload(e: &SandboxEvent) -> serde_json::Result<Vec<u8>> {
    serde_json::to_vec(&EventBody::from(e.clone()))
}

/// `offset`, `limit` (1..=100, default 10), `orderAsc` and repeatable `types`.
fn query_of(raw: Option<&str>, sandbox_id: Option<String>) -> Result<EventQuery, ApiError> {
    let mut q = EventQuery {
        sandbox_id,
        ..EventQuery::default()
    };
    for (k, v) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        let number = |what: &str| {
            v.trim().parse::<usize>().map_err(|_| {
                ApiError::bad_request(format!("{what} must be a whole number, not {v:?}"))
            })
        };
        match k.as_ref() {
            "offset" => q.offset = number("offset")?,
            "limit" => q.limit = number("limit")?,
            "orderAsc" => {
                q.ascending = match v.as_ref() {
                    "true" | "1" => true,
                    "false" | "0" => false,
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "orderAsc must be true or false, not {other:?}"
                        )))
                    }
                }
            }
            "types" => {
                for name in v.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                    let kind = EventKind::from_type_name(name).ok_or_else(|| {
                        let known: Vec<&str> =
                            EventKind::ALL.iter().map(|k| k.type_name()).collect();
                        ApiError::bad_request(format!(
                            "unknown event type {name:?}; known: {}",
                            known.join(", ")
                        ))
                    })?;
                    if !q.kinds.contains(&kind) {
                        q.kinds.push(kind);
                    }
                }
            }
            // Unknown parameters are ignored, as E2B's API does.
            _ => {}
        }
    }
    Ok(q)
}

/// Lifecycle events of the key's team, newest first (kept 7 days).
#[utoipa::path(
    get, path = "/events/sandboxes",
    params(("offset" = Option<u32>, Query), ("limit" = Option<u32>, Query),
           ("orderAsc" = Option<bool>, Query), ("types" = Option<Vec<String>>, Query)),
    responses((status = 200, body = Vec<EventBody>), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn team_events(
    Authed(me): Authed,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<Vec<EventBody>>> {
    let q = query_of(raw.as_deref(), None)?;
    let events = me.events(q).await?;
    Ok(Json(events.into_iter().map(EventBody::from).collect()))
}

/// One sandbox's lifecycle events, newest first (also after it ended, while kept).
#[utoipa::path(
    get, path = "/events/sandboxes/{sandboxID}",
    params(("sandboxID" = String, Path), ("offset" = Option<u32>, Query),
           ("limit" = Option<u32>, Query), ("orderAsc" = Option<bool>, Query),
           ("types" = Option<Vec<String>>, Query)),
    responses((status = 200, body = Vec<EventBody>), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn sandbox_events(
    Authed(me): Authed,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<Vec<EventBody>>> {
    let q = query_of(raw.as_deref(), Some(id))?;
    let events = me.events(q).await?;
    Ok(Json(events.into_iter().map(EventBody::from).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_reads_e2bs_parameters() {
        let q = query_of(
            Some("offset=2&limit=50&orderAsc=true&types=sandbox.lifecycle.killed&types=sandbox.lifecycle.paused"),
            None,
        )
        .unwrap();
        assert_eq!((q.offset, q.limit, q.ascending), (2, 50, true));
        assert_eq!(q.kinds, vec![EventKind::Killed, EventKind::Paused]);
        let d = query_of(None, Some("x".into())).unwrap();
        assert_eq!(
            (d.offset, d.limit, d.ascending, d.sandbox_id),
            (0, 10, false, Some("x".into()))
        );
        assert!(query_of(Some("types=sandbox.lifecycle.nope"), None).is_err());
        assert!(query_of(Some("limit=ten"), None).is_err());
        assert!(query_of(Some("orderAsc=maybe"), None).is_err());
    }
}

/// The live stream of lifecycle events (`text/event-stream`): every event this key may see
/// as it is recorded, each an SSE message whose `id` is the event's, `event` its type and
/// `data` E2B's event JSON. `sandboxID` keeps one sandbox's, `types` (repeatable) some types;
/// `since` (RFC 3339 or Unix milliseconds) first replays what was kept from then on, so a
/// reader that reconnects loses nothing. A reader more than 1,024 events behind loses the
/// oldest of them; a comment every 15 s keeps idle connections open.
#[utoipa::path(
    get, path = "/events/sandboxes/stream",
    params(("sandboxID" = Option<String>, Query), ("types" = Option<Vec<String>>, Query),
           ("since" = Option<String>, Query)),
    responses((status = 200, description = "text/event-stream of EventBody"),
              (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn stream(
    Authed(me): Authed,
    RawQuery(raw): RawQuery,
) -> ApiResult<
    axum::response::Sse<
        impl futures::Stream<Item = Result<axum::response::sse::Event, std::convert::Infallible>>,
    >,
> {
    use axum::response::sse::{Event, KeepAlive, Sse};
    use futures::StreamExt;

    let mut q = query_of(raw.as_deref(), None)?;
    let mut since = None;
    for (k, v) in form_urlencoded::parse(raw.as_deref().unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "sandboxID" | "sandbox_id" => q.sandbox_id = Some(v.into_owned()),
            "since" => since = Some(crate::audit::time_of("since", &v)?),
            _ => {}
        }
    }
    // Subscribed before the replay is read, so nothing recorded in between is missed; an
    // event both replayed and received live is sent once.
    let live = me.subscribe_events();
    let mut replay = Vec::new();
    if let Some(since) = since {
        let mut page = EventQuery {
            since: Some(since),
            ascending: true,
            limit: warren_control::MAX_EVENT_PAGE,
            ..q.clone()
        };
        loop {
            let got = me.events(page.clone()).await?;
            let done = got.len() < page.limit;
            page.offset += got.len();
            replay.extend(got);
            if done {
                break;
            }
        }
    }
    let replayed: std::collections::HashSet<String> = replay.iter().map(|e| e.id.clone()).collect();
    let wanted = move |e: &SandboxEvent| {
        me.sees_team(&e.team)
            && q.sandbox_id.as_ref().is_none_or(|id| *id == e.sandbox_id)
            && (q.kinds.is_empty() || q.kinds.contains(&e.kind))
            && !replayed.contains(&e.id)
    };
    let live = futures::stream::unfold(live, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(e) => return Some((e, rx)),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    tracing::debug!(lost = n, "an event stream's reader fell behind");
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
    .filter(move |e| std::future::ready(wanted(e)));
    let events = futures::stream::iter(replay).chain(live).map(|e| {
        let id = e.id.clone();
        let kind = e.kind.type_name();
        let body = serde_json::to_string(&EventBody::from(e)).unwrap_or_default();
        Ok(Event::default().id(id).event(kind).data(body))
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(std::time::Duration::from_secs(15))))
}
