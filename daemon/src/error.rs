//! The one error format of the API: every 4xx and 5xx body is
//! `{"code": "...", "message": "...", "details": ...}` with `application/json`, whether a
//! handler, an extractor (malformed JSON, wrong content type, oversized body) or the router
//! (unknown route, wrong method) produced it. Internal errors are logged, never echoed.

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// A stable, machine-readable code (`queue_full`, `invalid_program`, `not_found`, …).
    pub code: String,
    /// What went wrong, for a person.
    pub message: String,
    /// Structured context (diagnostics, limits); absent when there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub details: Option<serde_json::Value>,
}

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub details: serde_json::Value,
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            details: serde_json::Value::Null,
            retry_after: None,
        }
    }

    pub fn details(mut self, details: serde_json::Value) -> ApiError {
        self.details = details;
        self
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub fn unprocessable(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, code, message)
    }

    pub fn not_found(what: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", what)
    }

    /// A failure of ours: logged with its cause, answered without it.
    pub fn internal(cause: impl std::fmt::Display) -> ApiError {
        tracing::error!("internal error: {cause}");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal error (logged)")
    }

    /// The code for a status when only the status is known (router and layer errors).
    pub fn code_for(status: StatusCode) -> &'static str {
        match status.as_u16() {
            400 => "bad_request",
            401 => "unauthorized",
            403 => "forbidden",
            404 => "not_found",
            405 => "method_not_allowed",
            408 => "timeout",
            413 => "too_large",
            415 => "unsupported_media_type",
            422 => "invalid",
            429 => "queue_full",
            503 => "unavailable",
            s if s >= 500 => "internal",
            _ => "error",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let details = (!self.details.is_null()).then_some(self.details);
        let body = ErrorBody { code: self.code.to_string(), message: self.message, details };
        let mut r = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        let status = r.status();
        let code = match &r {
            JsonRejection::JsonDataError(_) => "invalid_json",
            JsonRejection::JsonSyntaxError(_) => "malformed_json",
            JsonRejection::MissingJsonContentType(_) => "unsupported_media_type",
            _ => ApiError::code_for(status),
        };
        ApiError::new(status, code, r.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        ApiError::bad_request("invalid_query", r.body_text())
    }
}

/// Rewrites error responses that are not JSON (from the router: 404, 405; from layers:
/// 413) into the one error format.
pub async fn json_errors(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let r = next.run(req).await;
    let status = r.status();
    let is_json = r
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return r;
    }
    let message = match status.as_u16() {
        404 => "no such route (the API is under /v1; see /openapi.json)".to_string(),
        405 => "this route does not take that method".to_string(),
        413 => "the request body is larger than limits.max_body_bytes: send a large model by \
                path (`program.path`, a file under one of the server's model_roots; \
                `xpuctl submit --on-server PATH`) or raise the limit"
            .to_string(),
        _ => status.canonical_reason().unwrap_or("error").to_string(),
    };
    let allow = r.headers().get(header::ALLOW).cloned();
    let mut out = ApiError::new(status, ApiError::code_for(status), message).into_response();
    if let Some(a) = allow {
        out.headers_mut().insert(header::ALLOW, a);
    }
    out
}
