//! Private networks (Warren's own API, under `/v1/networks`): create, list, inspect and
//! delete networks, and put sandboxes in and out of them. Handlers only translate; the
//! rules are `warren_control::networks`'.

use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use warren_control::{Member, NetworkView, PrivateNetwork};

use crate::error::ApiError;
use crate::extract::{ApiJson, Authed};
use crate::types::{rfc3339, ErrorBody};

type ApiResult<T> = Result<T, ApiError>;

/// Body of `POST /v1/networks`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewNetwork {
    /// A DNS label (lowercase letters, digits, hyphens), unique in the team: members are
    /// named `<sandboxID>.<name>.internal`.
    pub name: String,
    /// TCP and UDP ports members reach each other on; absent or empty: every port.
    #[serde(default)]
    pub ports: Vec<u16>,
}

/// Body of `POST /v1/networks/{network}/members`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewMember {
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// Another name for the sandbox in this network: `<alias>.<network>.internal`.
    pub alias: Option<String>,
}

/// A member of a network.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberInfo {
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// Where the other members reach it, whatever slot it runs in.
    pub address: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    /// Names that resolve to `address` inside the network.
    pub names: Vec<String>,
    pub joined_at: String,
}

/// A network and its members.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkDetail {
    #[serde(rename = "networkID")]
    pub network_id: String,
    pub name: String,
    /// The addresses its members get.
    pub cidr: String,
    /// Ports members reach each other on; empty: every port.
    pub ports: Vec<u16>,
    pub created_at: String,
    pub members: Vec<MemberInfo>,
}

impl MemberInfo {
    fn new(m: &Member, network: &str) -> Self {
        MemberInfo {
            sandbox_id: m.sandbox_id.clone(),
            address: m.address.to_string(),
            alias: m.alias.clone(),
            names: m.names(network),
            joined_at: rfc3339(m.joined_at),
        }
    }
}

impl NetworkDetail {
    fn new(n: &PrivateNetwork, members: &[Member]) -> Self {
        NetworkDetail {
            network_id: n.id.clone(),
            name: n.name.clone(),
            cidr: n.cidr.to_string(),
            ports: n.ports.clone(),
            created_at: rfc3339(n.created_at),
            members: members
                .iter()
                .map(|m| MemberInfo::new(m, &n.name))
                .collect(),
        }
    }

    fn of(v: &NetworkView) -> Self {
        Self::new(&v.network, &v.members)
    }
}

/// Creates a private network.
#[utoipa::path(
    post, path = "/v1/networks", request_body = NewNetwork,
    responses((status = 201, body = NetworkDetail), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 409, description = "Name taken", body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn create_network(
    Authed(me): Authed,
    ApiJson(body): ApiJson<NewNetwork>,
) -> ApiResult<impl IntoResponse> {
    let n = me.create_network(&body.name, body.ports).await?;
    Ok((StatusCode::CREATED, Json(NetworkDetail::new(&n, &[]))))
}

/// The caller's networks, by name.
#[utoipa::path(
    get, path = "/v1/networks",
    responses((status = 200, body = Vec<NetworkDetail>), (status = 401, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn list_networks(Authed(me): Authed) -> Json<Vec<NetworkDetail>> {
    Json(me.networks().iter().map(NetworkDetail::of).collect())
}

/// One network, by id or name.
#[utoipa::path(
    get, path = "/v1/networks/{network}", params(("network" = String, Path, description = "Id or name")),
    responses((status = 200, body = NetworkDetail), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn get_network(
    Authed(me): Authed,
    Path(network): Path<String>,
) -> ApiResult<Json<NetworkDetail>> {
    Ok(Json(NetworkDetail::of(&me.network(&network)?)))
}

/// Deletes a network without members.
#[utoipa::path(
    delete, path = "/v1/networks/{network}", params(("network" = String, Path, description = "Id or name")),
    responses((status = 204, description = "Deleted"), (status = 401, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, description = "It has members", body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn delete_network(
    Authed(me): Authed,
    Path(network): Path<String>,
) -> ApiResult<StatusCode> {
    me.delete_network(&network).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Puts a running or paused sandbox into a network; returns once every running member
/// reaches it.
#[utoipa::path(
    post, path = "/v1/networks/{network}/members", params(("network" = String, Path, description = "Id or name")),
    request_body = NewMember,
    responses((status = 201, body = MemberInfo), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn join_network(
    Authed(me): Authed,
    Path(network): Path<String>,
    ApiJson(body): ApiJson<NewMember>,
) -> ApiResult<impl IntoResponse> {
    let m = me
        .join_network(&network, &body.sandbox_id, body.alias)
        .await?;
    let name = me.network(&network)?.network.name;
    Ok((StatusCode::CREATED, Json(MemberInfo::new(&m, &name))))
}

/// Takes a sandbox out of a network; its connections to the members end.
#[utoipa::path(
    delete, path = "/v1/networks/{network}/members/{sandboxID}",
    params(("network" = String, Path, description = "Id or name"), ("sandboxID" = String, Path)),
    responses((status = 204, description = "Left"), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = []))
)]
pub(crate) async fn leave_network(
    Authed(me): Authed,
    Path((network, sandbox_id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    me.leave_network(&network, &sandbox_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A create's `networks` entry: `"name"`, `"name:alias"` or `{"network", "alias"}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum JoinSpec {
    Short(String),
    Full {
        network: String,
        alias: Option<String>,
    },
}

impl JoinSpec {
    pub(crate) fn into_join(self) -> Result<warren_control::Join, ApiError> {
        Ok(match self {
            JoinSpec::Short(s) => {
                let md = std::collections::BTreeMap::from([(
                    warren_control::METADATA_KEY.to_string(),
                    s,
                )]);
                let mut joins = warren_control::joins_from_metadata(&md)?;
                if joins.len() != 1 {
                    return Err(ApiError::bad_request(
                        "networks: one network per entry (name or name:alias)",
                    ));
                }
                joins.remove(0)
            }
            JoinSpec::Full { network, alias } => warren_control::Join { network, alias },
        })
    }
}
