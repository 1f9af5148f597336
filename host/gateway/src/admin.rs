//! The policy admin API: list, load and unload routing policies at runtime.
//!
//! Every call needs `Authorization: Bearer <policies.admin_token>`; without a configured token
//! the API refuses all calls. Loads compile and canary the component on a blocking thread, off
//! the request path; a failed load leaves the running policy in place and says why.

use crate::error::GatewayError;
use crate::policies::PolicyRuntime;
use crate::server::Shared;
use axum::Router as HttpRouter;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use std::sync::Arc;
use switchyard_policy_host::{PolicyRegistry, Role};

/// The admin routes.
pub(crate) fn routes() -> HttpRouter<Arc<Shared>> {
    HttpRouter::new()
        .route("/admin/policies", get(list))
        .route("/admin/policies/load", post(load))
        .route("/admin/policies/unload", post(unload))
        .route("/admin/policies/rollback", post(rollback))
}

/// `POST /admin/policies/load`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LoadRequest {
    /// A component file (`.wasm`, relative to the policy directory), a name in the directory,
    /// a built-in name, or `native:<name>`.
    path: String,
    /// Role to load it in. Default: router.
    #[serde(rename = "as", default = "router_role")]
    role: Role,
}

fn router_role() -> Role {
    Role::Router
}

/// `POST /admin/policies/unload`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UnloadRequest {
    /// Policy name (from its metadata) or source.
    name: String,
}

/// `POST /admin/policies/rollback`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RollbackRequest {
    /// Role whose previous version comes back. Default: router.
    #[serde(rename = "as", default = "router_role")]
    role: Role,
}

/// The registry, once the caller has shown the admin token.
fn authorized<'a>(
    shared: &'a Shared,
    headers: &HeaderMap,
) -> Result<&'a Arc<PolicyRegistry>, GatewayError> {
    let runtime: &PolicyRuntime = shared.policies.as_ref().ok_or_else(|| {
        GatewayError::NoSuchEndpoint("/admin/policies (no [policies] section)".into())
    })?;
    let expected = runtime
        .admin_token
        .as_deref()
        .ok_or(GatewayError::Unauthorized)?;
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or(GatewayError::Unauthorized)?;
    if !constant_time_eq(given.as_bytes(), expected.as_bytes()) {
        return Err(GatewayError::Unauthorized);
    }
    Ok(&runtime.registry)
}

/// Compare without an early exit, so response time does not reveal the matching prefix.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, GatewayError> {
    serde_json::from_slice(body).map_err(|e| GatewayError::BadRequest(e.to_string()))
}

async fn list(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    match authorized(&shared, &headers) {
        Ok(registry) => {
            axum::Json(serde_json::json!({ "policies": registry.list() })).into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// Run a registry operation on a blocking thread (loads compile Wasm).
async fn blocking<T: Send + 'static>(
    registry: Arc<PolicyRegistry>,
    op: impl FnOnce(&PolicyRegistry) -> Result<T, GatewayError> + Send + 'static,
) -> Result<T, GatewayError> {
    tokio::task::spawn_blocking(move || op(&registry))
        .await
        .map_err(|e| GatewayError::Internal(format!("policy operation panicked: {e}")))?
}

async fn load(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let result = async {
        let registry = authorized(&shared, &headers)?.clone();
        let request: LoadRequest = parse(&body)?;
        blocking(registry, move |registry| {
            registry
                .load_named(request.role, &request.path)
                .map_err(|e| GatewayError::BadRequest(format!("{}: {e}", request.path)))
        })
        .await
    }
    .await;
    match result {
        Ok(info) => axum::Json(info).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn unload(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let result = authorized(&shared, &headers).and_then(|registry| {
        let request: UnloadRequest = parse(&body)?;
        let role = registry
            .unload(&request.name)
            .map_err(|e| GatewayError::BadRequest(e.to_string()))?;
        Ok(serde_json::json!({ "unloaded": request.name, "role": role }))
    });
    match result {
        Ok(json) => axum::Json(json).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn rollback(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let result = authorized(&shared, &headers).and_then(|registry| {
        let request: RollbackRequest = parse(&body)?;
        registry
            .rollback(request.role)
            .map_err(|e| GatewayError::BadRequest(e.to_string()))
    });
    match result {
        Ok(info) => axum::Json(info).into_response(),
        Err(e) => e.into_response(),
    }
}
