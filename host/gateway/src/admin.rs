//! The admin API: list, load and unload routing policies at runtime (`/admin/policies`), and
//! list, add, remove and drain workers ([`workers`], `/admin/workers`).
//!
//! Every call needs `Authorization: Bearer <token>` with one of the tokens of `[policies]`:
//! a `read` token (`admin_tokens`, `role = "read"`) may list, a `write` token (`role =
//! "write"`, or the older `admin_token`) may also change things. A missing or
//! unknown token is a 401, a read token on a change a 403, both in OpenAI's error shape; without
//! any configured token the API refuses all calls. Loads compile and canary the component on a
//! blocking thread, off the request path; a failed load leaves the running policy in place and
//! says why.

use crate::error::GatewayError;
use crate::policies::{AdminRole, AdminTokens, PolicyRuntime};
use crate::server::Shared;
use axum::Router as HttpRouter;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use std::sync::Arc;
use switchyard_policy_host::{PolicyRegistry, Role};

mod workers;

/// The admin routes.
pub(crate) fn routes() -> HttpRouter<Arc<Shared>> {
    HttpRouter::new()
        .route("/admin/policies", get(list))
        .route("/admin/policies/load", post(load))
        .route("/admin/policies/unload", post(unload))
        .route("/admin/policies/rollback", post(rollback))
        .route(
            "/admin/workers",
            get(workers::list)
                .post(workers::add)
                .delete(workers::remove),
        )
        .route(
            "/admin/workers/drain",
            post(workers::drain).delete(workers::undrain),
        )
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

/// The registry, once the caller has shown a token whose role may do `needed` (`what` names
/// the endpoint in a 403).
fn authorized<'a>(
    shared: &'a Shared,
    headers: &HeaderMap,
    needed: AdminRole,
    what: &str,
) -> Result<&'a Arc<PolicyRegistry>, GatewayError> {
    let runtime = runtime(shared, "/admin/policies")?;
    check(&runtime.admin_tokens, headers, needed, what)?;
    Ok(&runtime.registry)
}

/// The policy runtime, which holds the admin tokens; without `[policies]` there is no admin
/// API (`path` names it in the 404).
fn runtime<'a>(shared: &'a Shared, path: &str) -> Result<&'a PolicyRuntime, GatewayError> {
    shared.policies.as_ref().ok_or_else(|| {
        GatewayError::NoSuchEndpoint(format!(
            "{path} (no [policies] section, whose admin_tokens it needs)"
        ))
    })
}

/// 401 without a known bearer token, 403 when its role is below `needed`.
fn check(
    tokens: &AdminTokens,
    headers: &HeaderMap,
    needed: AdminRole,
    what: &str,
) -> Result<(), GatewayError> {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or(GatewayError::Unauthorized)?;
    match tokens.role_of(given.as_bytes()) {
        None => Err(GatewayError::Unauthorized),
        Some(role) if role < needed => Err(GatewayError::Forbidden(format!(
            "{what} needs an admin token with role `{}`; this one has `{}`",
            needed.as_str(),
            role.as_str()
        ))),
        Some(_) => Ok(()),
    }
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, GatewayError> {
    serde_json::from_slice(body).map_err(|e| GatewayError::BadRequest(e.to_string()))
}

async fn list(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    match authorized(&shared, &headers, AdminRole::Read, "GET /admin/policies") {
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
        let registry = authorized(
            &shared,
            &headers,
            AdminRole::Write,
            "POST /admin/policies/load",
        )?
        .clone();
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
    let result = authorized(
        &shared,
        &headers,
        AdminRole::Write,
        "POST /admin/policies/unload",
    )
    .and_then(|registry| {
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
    let result = authorized(
        &shared,
        &headers,
        AdminRole::Write,
        "POST /admin/policies/rollback",
    )
    .and_then(|registry| {
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

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderValue, StatusCode};

    fn bearer(token: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        let value = HeaderValue::from_str(&format!("Bearer {token}")).unwrap();
        headers.insert(header::AUTHORIZATION, value);
        headers
    }

    fn tokens() -> AdminTokens {
        AdminTokens::new(&[(AdminRole::Read, "reader"), (AdminRole::Write, "writer")])
    }

    async fn body(error: GatewayError) -> (StatusCode, serde_json::Value) {
        let response = error.into_response();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[test]
    fn a_read_token_lists_and_a_write_token_does_everything() {
        let tokens = tokens();
        for (token, needed, ok) in [
            ("reader", AdminRole::Read, true),
            ("reader", AdminRole::Write, false),
            ("writer", AdminRole::Read, true),
            ("writer", AdminRole::Write, true),
        ] {
            let result = check(&tokens, &bearer(token), needed, "x");
            assert_eq!(result.is_ok(), ok, "{token} {needed:?}: {result:?}");
        }
        let err = check(&tokens, &bearer("reader"), AdminRole::Write, "POST /x").unwrap_err();
        assert!(matches!(&err, GatewayError::Forbidden(m) if m.contains("POST /x")));
    }

    #[test]
    fn missing_wrong_or_near_tokens_are_unauthorized() {
        let tokens = tokens();
        let unauthorized = |headers: &HeaderMap| {
            matches!(
                check(&tokens, headers, AdminRole::Read, "x"),
                Err(GatewayError::Unauthorized)
            )
        };
        assert!(unauthorized(&HeaderMap::new()));
        for token in ["", "reade", "readers", "Reader", "writer ", "nope"] {
            assert!(unauthorized(&bearer(token)), "{token:?}");
        }
        let mut basic = HeaderMap::new();
        basic.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic reader"),
        );
        assert!(unauthorized(&basic));
        // No token configured: nothing gets in.
        let none = AdminTokens::default();
        assert!(matches!(
            check(&none, &bearer("writer"), AdminRole::Read, "x"),
            Err(GatewayError::Unauthorized)
        ));
    }

    #[tokio::test]
    async fn both_refusals_have_the_openai_error_shape() {
        let (status, json) = body(GatewayError::Unauthorized).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(json["error"]["type"], "invalid_request_error");
        assert_eq!(json["error"]["code"], "invalid_api_key");
        let tokens = tokens();
        let forbidden = check(
            &tokens,
            &bearer("reader"),
            AdminRole::Write,
            "POST /admin/policies/load",
        );
        let (status, json) = body(forbidden.unwrap_err()).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert_eq!(json["error"]["type"], "invalid_request_error");
        assert_eq!(json["error"]["code"], "insufficient_permissions");
        let message = json["error"]["message"].as_str().unwrap();
        assert!(message.contains("role `write`"), "{message}");
    }
}
