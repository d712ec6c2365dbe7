//! REST API v1: handlers, authentication, the router and its OpenAPI document.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use serde::de::DeserializeOwned;
use utoipa::OpenApi;
use xpu_ir::Tensor;
use xpu_store::{RunFilter, RunStatus, RunSummary};

use crate::App;
use crate::auth::{Principal, Scope};
use crate::dto::*;
use crate::error::{ApiError, ErrorBody};
use crate::jobs::{Here, Job, JobSpec, Phase, SubmitError};

pub(crate) type ApiResult<T> = Result<T, ApiError>;

/// JSON bodies with the API's error format for every way they can be wrong.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        Json::<T>::from_request(req, state).await.map(|Json(v)| ApiJson(v)).map_err(ApiError::from)
    }
}

/// Query strings likewise.
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(v)| ApiQuery(v))
            .map_err(ApiError::from)
    }
}

/// The authenticated caller (everyone is admin under `--dev`).
pub struct Caller(pub Principal);

impl FromRequestParts<Arc<App>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, ApiError> {
        let Some(tokens) = &app.tokens else { return Ok(Caller(Principal::dev())) };
        let unauthorized = |m: &str| {
            app.metrics.rejected.with_label_values(&["unauthorized"]).inc();
            ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", m)
        };
        let header = parts
            .headers
            .get(header::AUTHORIZATION)
            .ok_or_else(|| unauthorized("an `Authorization: Bearer TOKEN` header is required"))?
            .to_str()
            .map_err(|_| unauthorized("the Authorization header is not text"))?;
        tokens.check(header).cloned().map(Caller).ok_or_else(|| unauthorized("unknown token"))
    }
}

impl Caller {
    pub(crate) fn require(&self, app: &App, scope: Scope) -> ApiResult<()> {
        if self.0.has(scope) {
            Ok(())
        } else {
            app.metrics.rejected.with_label_values(&["forbidden"]).inc();
            Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!("token `{}` lacks the `{}` scope", self.0.name, scope.name()),
            ))
        }
    }
}

pub(crate) fn run_dto(s: &RunSummary) -> RunDto {
    RunDto {
        run_id: s.run_id.clone(),
        status: s.status.name().to_string(),
        seq: s.seq,
        program: s.program_name.clone(),
        program_kind: s.program_kind.clone(),
        policy: s.policy_name.clone(),
        policy_version: s.policy_version,
        labels: s.labels.clone(),
        tenant: s.tenant.clone(),
        submitted_us: s.submitted_us,
        finished_us: Some(s.finished_us),
        queue_us: Some(s.queue_us),
        run_us: Some(s.run_us),
        nodes: Some(s.nodes),
        fallbacks: Some(s.fallbacks),
        error: s.error.clone(),
        outputs: s
            .outputs
            .iter()
            .map(|o| OutputDto {
                name: o.name.clone(),
                dtype: o.dtype.clone(),
                shape: o.shape.clone(),
                sha256: o.sha256.clone(),
                bytes: o.bytes,
                url: format!("/v1/runs/{}/outputs/{}", s.run_id, o.name),
            })
            .collect(),
    }
}

pub(crate) fn live_dto(job: &Job) -> RunDto {
    match job.phase() {
        Phase::Done(s) => run_dto(&s),
        phase => RunDto {
            run_id: job.run_id.clone(),
            status: if phase == Phase::Queued { "queued" } else { "running" }.into(),
            seq: 0,
            program: job.spec.program_name.clone(),
            program_kind: job.spec.program_kind.to_string(),
            policy: job.spec.policy.name().to_string(),
            policy_version: job.spec.policy.spec.policy.version,
            labels: job.spec.labels.clone(),
            tenant: job.spec.tenant.clone(),
            submitted_us: job.submitted_us,
            finished_us: None,
            queue_us: None,
            run_us: None,
            nodes: None,
            fallbacks: None,
            error: None,
            outputs: Vec::new(),
        },
    }
}

pub(crate) fn visible(p: &Principal, tenant: Option<&str>) -> bool {
    p.tenant.is_none() || p.tenant.as_deref() == tenant
}

/// Runs store and disk work on tokio's blocking pool. DuckDB, tantivy and the disk can wait
/// (`Store::list` waits for the feeder, up to 30 s), and an async thread that waits stalls
/// every request it would serve next, `/healthz` and `/metrics` included. `f` gets the
/// app and the caller's store scope.
pub(crate) async fn off_async<T: Send + 'static>(
    app: &Arc<App>,
    caller: &Caller,
    f: impl FnOnce(&App, xpu_store::Scope<'_>) -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    let (app, who) = (app.clone(), caller.0.clone());
    tokio::task::spawn_blocking(move || f(&app, who.visibility()))
        .await
        .map_err(ApiError::internal)?
}

/// A run the caller may see: live (queued/running) or stored.
async fn find_run(app: &Arc<App>, caller: &Caller, run_id: &str) -> ApiResult<RunDto> {
    if let Some(job) = app.jobs.live(run_id)
        && visible(&caller.0, job.spec.tenant.as_deref())
    {
        return Ok(live_dto(&job));
    }
    let id = run_id.to_string();
    off_async(app, caller, move |app, scope| match app.jobs.store.run(&id, scope) {
        Ok(Some(s)) => Ok(run_dto(&s)),
        Ok(None) => Err(ApiError::not_found(format!("no run {id}"))),
        Err(e) => Err(ApiError::internal(e)),
    })
    .await
}

fn decode_b64(what: &str, s: &str) -> ApiResult<Vec<u8>> {
    base64::engine::general_purpose::STANDARD
        .decode(s.trim())
        .map_err(|e| ApiError::bad_request("invalid_base64", format!("{what}: not base64: {e}")))
}

fn input_tensor(name: &str, spec: &InputSpec) -> ApiResult<Tensor> {
    let bad = |m: String| ApiError::bad_request("invalid_input", format!("inputs.{name}: {m}"));
    let literal = spec.shape.is_some() || spec.data.is_some() || spec.dtype.is_some();
    let file = match (&spec.npy_base64, &spec.csv_base64, literal) {
        (Some(b64), None, false) => Some(("npy", b64)),
        (None, Some(b64), false) => Some(("csv", b64)),
        (None, None, true) => None,
        _ => {
            return Err(bad(
                "give one of npy_base64, csv_base64, or shape and data (and dtype, default f32)"
                    .into(),
            ));
        }
    };
    if let Some((ext, b64)) = file {
        let bytes = decode_b64(&format!("inputs.{name}.{ext}_base64"), b64)?;
        return xpu_runtime::tensors::read_bytes(&format!("inputs.{name}"), ext, &bytes)
            .map(|(_, t)| t)
            .map_err(|e| ApiError::bad_request("invalid_input", e.to_string()));
    }
    let (Some(shape), Some(data)) = (&spec.shape, &spec.data) else {
        return Err(bad("give shape and data (and dtype, default f32)".into()));
    };
    xpu_runtime::tensors::from_literal(spec.dtype.as_deref(), shape, data)
        .map_err(|e| bad(e.to_string()))
}

/// How [`prepare`] gets the program's graph.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Compile {
    /// From the compile cache, or compiled now.
    Always,
    /// From the compile cache only: no spec when the program is not compiled yet.
    CachedOnly,
}

/// Largest program, and largest inputs together, a request may have and still be prepared
/// and run on an HTTP thread (bytes as sent).
const INLINE_REQUEST_BYTES: usize = 64 << 10;

/// Whether preparing `req` is cheap enough for an HTTP thread: a small program (or a model
/// file compiled before) and small inputs (decoding them is the work).
fn light(req: &SubmitJob) -> bool {
    let p = &req.program;
    let program =
        p.source.as_ref().map_or(0, String::len) + p.source_base64.as_ref().map_or(0, String::len);
    let inputs: usize = req
        .inputs
        .values()
        .map(|i| {
            i.npy_base64.as_ref().map_or(0, String::len)
                + i.csv_base64.as_ref().map_or(0, String::len)
                + i.data.as_ref().map_or(0, |d| d.len() * 8)
        })
        .sum();
    // A program by path is light when its file is known and compiled (`prepare` with
    // `Compile::CachedOnly` gives up otherwise, before reading it).
    program <= INLINE_REQUEST_BYTES && inputs <= INLINE_REQUEST_BYTES
}

/// Turns a request into a job spec: program compiled, inputs read, policy resolved. With
/// [`Compile::CachedOnly`], `None` when the program would have to be compiled.
fn prepare(
    app: &App,
    caller: &Caller,
    req: &SubmitJob,
    compile: Compile,
) -> ApiResult<Option<JobSpec>> {
    let p = &req.program;
    let given = [p.source.is_some(), p.source_base64.is_some(), p.path.is_some()];
    if given.iter().filter(|g| **g).count() != 1 {
        return Err(ApiError::bad_request(
            "invalid_program",
            "program needs exactly one of source, source_base64 or path",
        ));
    }
    // The program's name and, for a model named by path, its file (inside the model roots).
    let (name, file) = match (&p.path, &p.name) {
        (Some(path), name) => {
            let file = app.jobs.model_roots.resolve_read(path).map_err(|e| {
                ApiError::new(
                    StatusCode::FORBIDDEN,
                    "path_outside_roots",
                    format!("program.path: {e}"),
                )
            })?;
            (name.clone().unwrap_or_else(|| path.clone()), Some(file))
        }
        (None, Some(name)) => (name.clone(), None),
        (None, None) => {
            return Err(ApiError::bad_request(
                "invalid_program",
                "program.name is required with source (its extension gives the language)",
            ));
        }
    };
    let kind = xpu_runtime::ProgramKind::of(&name).ok_or_else(|| {
        ApiError::bad_request(
            "invalid_program",
            format!("{name}: unknown program type (expected .ml, .onnx, .sgr or .json)"),
        )
    })?;
    // Only a model already hashed can be prepared from the caches: anything else would be
    // read, so the HTTP thread leaves it (and its inputs, undecoded) to the blocking pool.
    let known_sha = match &file {
        Some(f) if !kind.is_text() => app.jobs.file_digests.known(f),
        _ => None,
    };
    if compile == Compile::CachedOnly && file.is_some() && known_sha.is_none() {
        return Ok(None);
    }
    let mut inputs = Vec::new();
    let mut input_names = Vec::new();
    for (n, spec) in &req.inputs {
        inputs.push(input_tensor(n, spec)?);
        input_names.push(n.clone());
    }
    let lower_inputs =
        xpu_minilang::lower::Inputs::given(input_names.iter().map(String::as_str).zip(&inputs));
    // A model file unchanged since it was hashed and compiled for these inputs before is
    // neither read, hashed nor compiled again: one `stat` and two cache lookups.
    let known = known_sha.and_then(|sha| {
        app.jobs.compiled.get(&name, &sha, &lower_inputs).map(|graph| (sha, graph))
    });
    let (bytes, program_sha256, program_file, compiled) = match (known, &file) {
        (Some((sha, graph)), _) => (Vec::new(), sha, file.clone(), graph),
        (None, Some(_)) if compile == Compile::CachedOnly => return Ok(None),
        (None, file) => {
            let (bytes, sha) = match file {
                Some(f) => app.jobs.file_digests.read(f).map_err(|e| {
                    let path = p.path.as_deref().unwrap_or_default();
                    ApiError::bad_request("invalid_program", format!("program.path {path}: {e}"))
                })?,
                None => {
                    let bytes = match (&p.source, &p.source_base64) {
                        (Some(s), _) => s.clone().into_bytes(),
                        (_, Some(b)) => decode_b64("program.source_base64", b)?,
                        _ => Vec::new(),
                    };
                    let sha = crate::jobs::sha256_hex(&bytes);
                    (bytes, sha)
                }
            };
            let compiled = match compile {
                Compile::CachedOnly => match app.jobs.compiled.get(&name, &sha, &lower_inputs) {
                    Some(c) => c,
                    None => return Ok(None),
                },
                Compile::Always => {
                    app.jobs
                        .compiled
                        .get_or_compile(&name, &bytes, &sha, &app.jobs.data_roots, &lower_inputs)
                        .map_err(|e| {
                            ApiError::unprocessable(
                                "invalid_program",
                                "the program does not compile",
                            )
                            .details(serde_json::json!({ "diagnostics": e.to_string() }))
                        })?
                        .0
                }
            };
            (bytes, sha, None, compiled)
        }
    };
    let graph = compiled.graph;
    // Inputs in the graph's order, checked by name.
    let mut ordered = Vec::new();
    let mut ordered_names = Vec::new();
    for &v in &graph.inputs {
        let gname = graph.value(v).name.clone().unwrap_or_default();
        let Some(i) = input_names.iter().position(|n| *n == gname) else {
            return Err(ApiError::bad_request(
                "invalid_input",
                format!("the program needs input `{gname}`"),
            ));
        };
        ordered.push(inputs[i].clone());
        ordered_names.push(gname);
    }
    if let Some(extra) = input_names.iter().find(|n| !ordered_names.contains(n)) {
        return Err(ApiError::bad_request(
            "invalid_input",
            format!("the program has no input named `{extra}`"),
        ));
    }
    let policies = app.jobs.policies();
    let policy = match (&req.policy, &req.policy_toml) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request(
                "invalid_policy",
                "give policy (a name) or policy_toml (inline), not both",
            ));
        }
        (Some(n), None) => policies.get(n).cloned().ok_or_else(|| {
            ApiError::not_found(format!(
                "no policy named `{n}` (known: {})",
                policies.by_name.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
            .details(serde_json::json!({"code": "unknown_policy"}))
        })?,
        (None, Some(text)) => Arc::new(policies.inline(text).map_err(|d| {
            ApiError::unprocessable("invalid_policy", "the inline policy is invalid")
                .details(serde_json::json!({ "diagnostics": d }))
        })?),
        (None, None) => policies.select(&req.labels).unwrap_or_else(|| policies.default.clone()),
    };
    Ok(Some(JobSpec {
        program_name: name,
        program_kind: kind.name(),
        program_text: kind.is_text(),
        program_bytes: bytes,
        program_file,
        program_sha256,
        graph,
        graph_hash: compiled.hash,
        inputs: ordered,
        input_names: ordered_names,
        policy,
        labels: req.labels.clone(),
        tenant: caller.0.tenant.clone(),
        replay_of: None,
    }))
}

/// [`prepare`], compiling the program when it is not compiled yet.
pub(crate) fn prepare_compiled(app: &App, caller: &Caller, req: &SubmitJob) -> ApiResult<JobSpec> {
    prepare(app, caller, req, Compile::Always)?
        .ok_or_else(|| ApiError::internal("the program was not compiled"))
}

fn submit_error(app: &App, e: SubmitError) -> ApiError {
    match e {
        SubmitError::QueueFull(n) => {
            app.metrics.rejected.with_label_values(&["queue_full"]).inc();
            let mut err = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "queue_full",
                format!("the queue is full ({n} jobs waiting); retry later"),
            );
            err.retry_after = Some(1);
            err
        }
        SubmitError::Draining => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "the daemon is stopping")
        }
        SubmitError::Io(m) => ApiError::internal(m),
    }
}

/// Waits for a job to be committed, up to the server's wait limit.
async fn wait_for(app: &App, job: &Arc<Job>) -> RunDto {
    let mut rx = job.subscribe();
    let limit = Duration::from_secs(app.config.limits.wait_timeout_s);
    // The watch's borrow is turned into a bool at once (it must not live across an await).
    let _finished = tokio::time::timeout(limit, rx.wait_for(|p| matches!(p, Phase::Done(_))))
        .await
        .is_ok_and(|r| r.is_ok());
    live_dto(job)
}

#[utoipa::path(post, path = "/v1/jobs", tag = "jobs", request_body = SubmitJob,
    responses(
        (status = 200, description = "Finished (with `wait`)", body = RunDto),
        (status = 202, description = "Queued, or still running when the wait limit passed", body = RunDto),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, description = "Unknown policy", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 422, description = "The program or policy is invalid", body = ErrorBody),
        (status = 429, description = "Queue full; see Retry-After", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn submit(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiJson(req): ApiJson<SubmitJob>,
) -> ApiResult<Response> {
    let start = Instant::now();
    caller.require(&app, Scope::Submit)?;
    let wait = req.wait;
    // A small waited job whose program is compiled already and whose kind ran fast before
    // runs right here, on this HTTP thread (see `Jobs::runs_inline`).
    let mut spec = None;
    if wait && light(&req) {
        spec = prepare(&app, &caller, &req, Compile::CachedOnly)?;
        if let Some(s) = spec.take_if(|s| app.jobs.runs_inline(s)) {
            let prepared = start.elapsed().as_nanos() as u64;
            let mut accepted = None;
            app.jobs.submit_and_run_here(s, Here::Http, |r| accepted = Some(r));
            let job = accepted
                .ok_or_else(|| ApiError::internal("the job was neither run nor refused"))?
                .map_err(|e| submit_error(&app, e))?;
            return Ok(waited_response(&app, &job, start, prepared).await);
        }
    }
    let app2 = app.clone();
    // Compiling reads files and may take a while: off the async threads. A waited job that
    // finds a free slot and an empty queue also runs there, in place. The job comes back as
    // soon as it is accepted: one running in place goes on while `wait_for` bounds the wait
    // (the blocking task outlives a request answered at the wait limit).
    let (tx, rx) = tokio::sync::oneshot::channel::<ApiResult<(Arc<Job>, u64)>>();
    tokio::task::spawn_blocking(move || {
        let spec = match spec.map_or_else(|| prepare_compiled(&app2, &caller, &req), Ok) {
            Ok(spec) => spec,
            Err(e) => return drop(tx.send(Err(e))),
        };
        let prepared = start.elapsed().as_nanos() as u64;
        let answer = |r: Result<Arc<Job>, SubmitError>| {
            let _ = tx.send(r.map(|job| (job, prepared)).map_err(|e| submit_error(&app2, e)));
        };
        if wait {
            app2.jobs.submit_and_run_here(spec, Here::Request, answer);
        } else {
            answer(app2.jobs.submit(spec));
        }
    });
    let (job, prepared) =
        rx.await.map_err(|_| ApiError::internal("the submit task ended without an answer"))??;
    if !wait {
        return Ok((StatusCode::ACCEPTED, Json(live_dto(&job))).into_response());
    }
    Ok(waited_response(&app, &job, start, prepared).await)
}

/// The answer to a waited submit: the run once it is finished (200, with where the server's
/// time went), or as it stands at the wait limit (202).
async fn waited_response(app: &App, job: &Arc<Job>, start: Instant, prepared: u64) -> Response {
    let dto = wait_for(app, job).await;
    let finished = !matches!(dto.status.as_str(), "queued" | "running");
    let status = if finished { StatusCode::OK } else { StatusCode::ACCEPTED };
    let mut response = (status, Json(&dto)).into_response();
    if finished {
        let total = start.elapsed().as_nanos() as u64;
        let t = &job.timings;
        let run = t.run.load(Ordering::Acquire);
        let queue = dto.queue_us.unwrap_or(0) * 1000;
        app.metrics.server_overhead.observe(total.saturating_sub(run) as f64 * 1e-9);
        // Where the server's time went (W3C Server-Timing, milliseconds): load generators
        // and browsers read the overhead without the execution from it, and each step.
        let steps = [
            ("total", total),
            ("prepare", prepared),
            ("files", t.files.load(Ordering::Acquire)),
            ("queue", queue),
            ("plan", t.plan.load(Ordering::Acquire)),
            ("run", run),
            ("outputs", t.outputs.load(Ordering::Acquire)),
            ("store", t.store.load(Ordering::Acquire)),
        ];
        let timing = steps
            .iter()
            .map(|(name, n)| format!("{name};dur={:.3}", *n as f64 * 1e-6))
            .collect::<Vec<_>>()
            .join(", ");
        if let Ok(v) = axum::http::HeaderValue::from_str(&timing) {
            response.headers_mut().insert("server-timing", v);
        }
    }
    response
}

#[utoipa::path(get, path = "/v1/runs", tag = "runs", params(ListQuery),
    responses((status = 200, body = RunList), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_runs(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<RunList>> {
    caller.require(&app, Scope::Read)?;
    let status = match &q.status {
        Some(s) => Some(RunStatus::from_name(s).ok_or_else(|| {
            ApiError::bad_request(
                "invalid_query",
                format!("status `{s}` (use succeeded, failed, cancelled or timed_out)"),
            )
        })?),
        None => None,
    };
    let mut labels = Vec::new();
    for kv in q.label.iter().flat_map(|l| l.split(',')) {
        let (k, v) = kv.split_once('=').ok_or_else(|| {
            ApiError::bad_request("invalid_query", format!("label `{kv}`: use key=value"))
        })?;
        labels.push((k.to_string(), v.to_string()));
    }
    let before = match &q.cursor {
        Some(c) => Some(c.parse::<u64>().map_err(|_| {
            ApiError::bad_request(
                "invalid_query",
                format!("cursor `{c}` is not one this server gave"),
            )
        })?),
        None => None,
    };
    let limit = q.limit.unwrap_or(50).clamp(1, app.config.limits.max_page);
    let filter = RunFilter { status, policy: q.policy.clone(), labels, before, limit };
    let rows = off_async(&app, &caller, move |app, scope| {
        app.jobs.store.list(&filter, scope).map_err(ApiError::internal)
    })
    .await?;
    let next_cursor =
        (rows.len() == limit).then(|| rows.last().map(|r| r.seq.to_string())).flatten();
    Ok(Json(RunList { runs: rows.iter().map(run_dto).collect(), next_cursor }))
}

#[utoipa::path(get, path = "/v1/runs/{id}", tag = "runs", params(("id" = String, Path)),
    responses((status = 200, body = RunDto), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn get_run(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<RunDto>> {
    caller.require(&app, Scope::Read)?;
    Ok(Json(find_run(&app, &caller, &id).await?))
}

#[utoipa::path(get, path = "/v1/runs/{id}/explain", tag = "runs",
    params(("id" = String, Path), ExplainQuery),
    responses((status = 200, description = "The explanation (JSON) or the plan table (text)"),
        (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn explain(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<ExplainQuery>,
) -> ApiResult<Response> {
    caller.require(&app, Scope::Read)?;
    if app.jobs.live(&id).is_some_and(|j| visible(&caller.0, j.spec.tenant.as_deref())) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_finished",
            format!("run {id} has not finished; its explanation is stored when it does"),
        ));
    }
    let run_id = id.clone();
    let stored = off_async(&app, &caller, move |app, scope| {
        app.jobs.store.explanation(&run_id, scope).map_err(ApiError::internal)
    })
    .await?;
    let Some((ex, _)) = stored else {
        return Err(ApiError::not_found(format!("no run {id}")));
    };
    let Some(mut ex) = ex else {
        return Err(ApiError::not_found(format!("run {id} failed before it was planned")));
    };
    if let Some(node) = &q.node {
        let keep = |d: &xpu_plan::Decision| {
            d.node.to_string() == *node || d.name.as_deref() == Some(node.as_str())
        };
        if !ex.decisions.iter().any(keep) {
            return Err(ApiError::not_found(format!("run {id} has no node {node}")));
        }
        ex.decisions.retain(keep);
    }
    match q.format.as_deref().unwrap_or("json") {
        "json" => Ok(Json(ex).into_response()),
        "text" => Ok((
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            xpu_plan::render::explanation_text(&ex, true),
        )
            .into_response()),
        f => Err(ApiError::bad_request("invalid_query", format!("format `{f}` (json or text)"))),
    }
}

#[utoipa::path(get, path = "/v1/runs/{id}/outputs/{name}", tag = "runs",
    params(("id" = String, Path), ("name" = String, Path), OutputQuery),
    responses((status = 200, description = "The output as .npy, CSV or JSON"), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn output(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path((id, name)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<OutputQuery>,
) -> ApiResult<Response> {
    caller.require(&app, Scope::Read)?;
    let run = find_run(&app, &caller, &id).await?;
    let Some(out) = run.outputs.iter().find(|o| o.name == name) else {
        return Err(ApiError::not_found(format!("run {id} has no output `{name}`")));
    };
    let table = out.dtype == "table";
    let ext = if table { "csv" } else { "npy" };
    let sha = out.sha256.clone();
    let bytes = off_async(&app, &caller, move |app, _| {
        app.jobs.output_bytes(&sha, ext).map_err(ApiError::internal)
    })
    .await?;
    match (q.format.as_deref().unwrap_or(ext), table) {
        ("npy", false) => {
            Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
        }
        ("csv", true) => Ok(([(header::CONTENT_TYPE, "text/csv")], bytes).into_response()),
        ("json", false) => {
            let (_, t) = xpu_runtime::tensors::read_bytes(&name, "npy", &bytes)
                .map_err(ApiError::internal)?;
            let data: serde_json::Value = match t.data() {
                xpu_ir::TensorData::String(v) => serde_json::json!(v),
                xpu_ir::TensorData::Bool(v) => serde_json::json!(v),
                _ => serde_json::json!(t.to_f64_vec()),
            };
            Ok(Json(serde_json::json!({"name": name, "dtype": t.dtype().name(), "shape": t.shape(), "data": data}))
                .into_response())
        }
        ("json", true) => {
            let mut reader = csv_reader(&bytes);
            let columns: Vec<String> =
                reader.headers().map_err(ApiError::internal)?.iter().map(str::to_string).collect();
            let rows: Vec<Vec<String>> = reader
                .records()
                .map(|r| r.map(|r| r.iter().map(str::to_string).collect()))
                .collect::<Result<_, _>>()
                .map_err(ApiError::internal)?;
            Ok(Json(serde_json::json!({"name": name, "columns": columns, "rows": rows}))
                .into_response())
        }
        (f, _) => Err(ApiError::bad_request(
            "invalid_query",
            format!(
                "format `{f}`: a {} output comes as {ext} or json",
                if table { "table" } else { "tensor" }
            ),
        )),
    }
}

fn csv_reader(bytes: &[u8]) -> csv::Reader<&[u8]> {
    csv::ReaderBuilder::new().from_reader(bytes)
}

#[utoipa::path(post, path = "/v1/runs/{id}/cancel", tag = "runs", params(("id" = String, Path)),
    responses((status = 202, description = "Cancellation requested", body = RunDto),
        (status = 404, body = ErrorBody), (status = 409, description = "Already finished", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn cancel(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    caller.require(&app, Scope::Submit)?;
    if let Some(job) = app.jobs.live(&id)
        && visible(&caller.0, job.spec.tenant.as_deref())
    {
        let app2 = app.clone();
        let job2 = job.clone();
        // A job parked for its engine is stored cancelled at once (a journal write).
        tokio::task::spawn_blocking(move || app2.jobs.cancel(&job2))
            .await
            .map_err(ApiError::internal)?;
        return Ok((StatusCode::ACCEPTED, Json(live_dto(&job))).into_response());
    }
    let run = find_run(&app, &caller, &id).await?;
    Err(ApiError::new(
        StatusCode::CONFLICT,
        "finished",
        format!("run {id} already finished ({})", run.status),
    ))
}

/// What a replay resubmits: the finished run, its program bytes and its kept inputs (store
/// and disk reads: call off the async threads).
fn replay_sources(
    app: &App,
    id: &str,
    scope: xpu_store::Scope<'_>,
) -> ApiResult<(xpu_store::RunSummary, Vec<u8>, BTreeMap<String, InputSpec>)> {
    let original = match app.jobs.store.run(id, scope).map_err(ApiError::internal)? {
        Some(s) => s,
        None => return Err(ApiError::not_found(format!("no finished run {id}"))),
    };
    let dir = app.jobs.run_dir(id);
    // A run's inputs travel in its journal frame and reach `dir` in the background: wait for
    // the store to have written out what it holds (a replay is rare; this is milliseconds).
    app.jobs.store.settle().map_err(ApiError::internal)?;
    // A text program is in the record; a binary one in the blob store.
    let source = app.jobs.store.program_source(id, scope).map_err(ApiError::internal)?;
    let program = match source {
        Some(text) => text.into_bytes(),
        None => app
            .jobs
            .kept_program(id, &original.program_name, &original.program_sha256)
            .map_err(ApiError::internal)?,
    };
    let mut inputs = BTreeMap::new();
    let kept_inputs = match std::fs::read_dir(dir.join("inputs")) {
        Ok(entries) => entries.flatten().collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(ApiError::internal(e)),
    };
    for entry in kept_inputs {
        let p = entry.path();
        let Some(stem) = p.file_stem().and_then(|s| s.to_str()) else { continue };
        let bytes = std::fs::read(&p).map_err(ApiError::internal)?;
        let b64 = Some(base64::engine::general_purpose::STANDARD.encode(bytes));
        let spec = match p.extension().and_then(|e| e.to_str()) {
            Some("csv") => InputSpec { csv_base64: b64, ..Default::default() },
            _ => InputSpec { npy_base64: b64, ..Default::default() },
        };
        inputs.insert(stem.to_string(), spec);
    }
    Ok((original, program, inputs))
}

#[utoipa::path(post, path = "/v1/runs/{id}/replay", tag = "runs", params(("id" = String, Path)),
    request_body = ReplayRequest,
    responses((status = 200, body = ReplayResponse), (status = 202, body = ReplayResponse),
        (status = 404, body = ErrorBody), (status = 429, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn replay(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    caller.require(&app, Scope::Submit)?;
    // The body is optional: none means no verify, no wait.
    let req: ReplayRequest = if body.iter().all(u8::is_ascii_whitespace) {
        ReplayRequest::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::unprocessable("invalid_json", e.to_string()))?
    };
    let run_id = id.clone();
    let (original, program, inputs) =
        off_async(&app, &caller, move |app, scope| replay_sources(app, &run_id, scope)).await?;
    let submit = SubmitJob {
        program: ProgramSpec {
            name: Some(original.program_name.clone()),
            source: None,
            source_base64: Some(base64::engine::general_purpose::STANDARD.encode(&program)),
            path: None,
        },
        inputs,
        policy: Some(original.policy_name.clone()),
        policy_toml: None,
        labels: original.labels.clone(),
        wait: req.wait || req.verify,
    };
    let app2 = app.clone();
    let caller2 = Caller(caller.0.clone());
    let mut spec = tokio::task::spawn_blocking(move || prepare_compiled(&app2, &caller2, &submit))
        .await
        .map_err(ApiError::internal)??;
    spec.replay_of = Some(id.clone());
    let policy_changed = spec.policy.sha256 != original.policy_sha256;
    let job = app.jobs.submit(spec).map_err(|e| submit_error(&app, e))?;
    let run = if req.wait || req.verify { wait_for(&app, &job).await } else { live_dto(&job) };
    let finished = !matches!(run.status.as_str(), "queued" | "running");
    let mut outputs = Vec::new();
    let mut verified = None;
    if req.verify && finished {
        let mut all = true;
        for o in &original.outputs {
            let replay = run.outputs.iter().find(|r| r.name == o.name).map(|r| r.sha256.clone());
            let same = replay.as_deref() == Some(o.sha256.as_str());
            all &= same;
            outputs.push(OutputCheck {
                name: o.name.clone(),
                original: Some(o.sha256.clone()),
                replay,
                same,
            });
        }
        all &= run.outputs.len() == original.outputs.len();
        verified = Some(all);
    }
    let status = if finished { StatusCode::OK } else { StatusCode::ACCEPTED };
    Ok((status, Json(ReplayResponse { run, replay_of: id, policy_changed, verified, outputs }))
        .into_response())
}

#[utoipa::path(post, path = "/v1/plans", tag = "plans", request_body = SubmitJob,
    responses((status = 200, description = "The plan's explanation; nothing runs", body = PlanResponse),
        (status = 422, body = ErrorBody)), security(("bearer" = [])))]
pub async fn dry_run(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiJson(req): ApiJson<SubmitJob>,
) -> ApiResult<Json<PlanResponse>> {
    caller.require(&app, Scope::Read)?;
    let app2 = app.clone();
    tokio::task::spawn_blocking(move || {
        let spec = prepare_compiled(&app2, &caller, &req)?;
        let shapes: Vec<Vec<usize>> = spec.inputs.iter().map(|t| t.shape().to_vec()).collect();
        let policy = app2.jobs.showing_policy(&spec.policy);
        let (explanation, ok) = match app2.jobs.cache.get_or_plan_keyed(
            &spec.graph,
            &policy,
            app2.jobs.inventory(),
            &shapes,
            app2.jobs.plan_keys(&spec),
        ) {
            Ok((p, _)) => (p.1.clone(), true),
            Err(f) => (*f.explanation, false),
        };
        let text = xpu_plan::render::explanation_text(&explanation, true);
        if !ok {
            return Err(ApiError::unprocessable("no_plan", "no plan under the policy")
                .details(serde_json::json!({ "explanation": text })));
        }
        Ok(Json(PlanResponse {
            policy: spec.policy.name().to_string(),
            graph_hash: explanation.graph_hash.clone(),
            text,
            explanation: serde_json::to_value(&explanation).map_err(ApiError::internal)?,
        }))
    })
    .await
    .map_err(ApiError::internal)?
}

fn policy_dto(p: &xpu_policy::Policy) -> PolicyDto {
    PolicyDto {
        name: p.name().to_string(),
        version: p.spec.policy.version,
        description: p.spec.policy.description.clone(),
        file: p.files.first().map(|f| f.display().to_string()),
        sha256: p.sha256.clone(),
        match_labels: p.spec.policy.matches.labels.clone(),
        priority: p.spec.policy.priority,
    }
}

#[utoipa::path(get, path = "/v1/policies", tag = "policies",
    responses((status = 200, body = Vec<PolicyDto>)), security(("bearer" = [])))]
pub async fn list_policies(
    State(app): State<Arc<App>>,
    caller: Caller,
) -> ApiResult<Json<Vec<PolicyDto>>> {
    caller.require(&app, Scope::Read)?;
    let set = app.jobs.policies();
    Ok(Json(set.by_name.values().map(|p| policy_dto(p)).collect()))
}

#[utoipa::path(get, path = "/v1/policies/{name}", tag = "policies", params(("name" = String, Path)),
    responses((status = 200, body = PolicyDetail), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn get_policy(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Json<PolicyDetail>> {
    caller.require(&app, Scope::Read)?;
    let set = app.jobs.policies();
    let p =
        set.get(&name).ok_or_else(|| ApiError::not_found(format!("no policy named `{name}`")))?;
    let effective = serde_json::from_str(&p.to_json()).map_err(ApiError::internal)?;
    Ok(Json(PolicyDetail { summary: policy_dto(p), effective }))
}

#[utoipa::path(post, path = "/v1/policies/validate", tag = "policies", request_body = ValidateRequest,
    responses((status = 200, body = ValidateResponse)), security(("bearer" = [])))]
pub async fn validate_policy(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiJson(req): ApiJson<ValidateRequest>,
) -> ApiResult<Json<ValidateResponse>> {
    caller.require(&app, Scope::Read)?;
    let set = app.jobs.policies();
    Ok(Json(match set.inline(&req.toml) {
        Ok(p) => ValidateResponse {
            ok: true,
            name: Some(p.name().to_string()),
            diagnostics: p.warnings.iter().map(|w| w.to_string()).collect(),
        },
        Err(d) => ValidateResponse { ok: false, name: None, diagnostics: vec![d] },
    }))
}

#[utoipa::path(get, path = "/v1/engines", tag = "engines",
    responses((status = 200, description = "This daemon's inventory: engines, kernels, availability")),
    security(("bearer" = [])))]
pub async fn engines(State(app): State<Arc<App>>, caller: Caller) -> ApiResult<Response> {
    caller.require(&app, Scope::Read)?;
    Ok(Json(app.jobs.inventory().clone()).into_response())
}

#[utoipa::path(get, path = "/v1/search", tag = "runs", params(SearchQuery),
    responses((status = 200, body = Vec<SearchHitDto>), (status = 400, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn search(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<SearchQuery>,
) -> ApiResult<Json<Vec<SearchHitDto>>> {
    caller.require(&app, Scope::Read)?;
    let hits = off_async(&app, &caller, move |app, scope| {
        app.jobs.store.search(&q.q, scope, q.limit.unwrap_or(20)).map_err(|e| match e {
            xpu_store::StoreError::Query(m) => ApiError::bad_request("invalid_query", m),
            other => ApiError::internal(other),
        })
    })
    .await?;
    Ok(Json(
        hits.into_iter()
            .map(|h| SearchHitDto {
                kind: h.kind.name().into(),
                run_id: h.run_id,
                score: h.score,
                snippet: h.snippet,
            })
            .collect(),
    ))
}

/// Most signatures one evidence query names.
const MAX_EVIDENCE_SIGNATURES: usize = 2_000;

#[utoipa::path(get, path = "/v1/evidence", tag = "runs", params(EvidenceQuery),
    responses((status = 200, body = EvidenceDto), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn evidence(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<EvidenceQuery>,
) -> ApiResult<Json<EvidenceDto>> {
    caller.require(&app, Scope::Read)?;
    // The figures come from every tenant's runs: for callers who see every tenant.
    if caller.0.tenant.is_some() {
        app.metrics.rejected.with_label_values(&["forbidden"]).inc();
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "token `{}` is a tenant's; the store's evidence covers every tenant's runs",
                caller.0.name
            ),
        ));
    }
    let signatures = match q.signatures.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(list) => {
            let sigs: Vec<String> =
                list.split(',').map(|s| s.trim().to_ascii_lowercase()).collect();
            if sigs.len() > MAX_EVIDENCE_SIGNATURES {
                return Err(ApiError::bad_request(
                    "invalid_query",
                    format!("signatures: {} named, at most {MAX_EVIDENCE_SIGNATURES}", sigs.len()),
                ));
            }
            if let Some(bad) =
                sigs.iter().find(|s| s.len() != 16 || !s.bytes().all(|b| b.is_ascii_hexdigit()))
            {
                let shown: String = bad.chars().take(40).collect();
                return Err(ApiError::bad_request(
                    "invalid_query",
                    format!("signatures: {shown:?} is not 16 hex digits"),
                ));
            }
            Some(sigs)
        }
    };
    let machine = app.jobs.machine_fingerprint().to_string();
    let m = machine.clone();
    let app2 = app.clone();
    let rows =
        tokio::task::spawn_blocking(move || app2.jobs.store.evidence(&m, signatures.as_deref()))
            .await
            .map_err(ApiError::internal)?
            .map_err(ApiError::internal)?;
    let rows = rows
        .into_iter()
        .map(|r| EvidenceRowDto {
            signature: r.signature,
            engine: r.engine,
            kernel: r.kernel,
            samples: r.samples,
            median_us: r.median_us,
            p90_us: r.p90_us,
            last_seen_us: r.last_seen_us,
        })
        .collect();
    Ok(Json(EvidenceDto { machine, rows }))
}

#[utoipa::path(post, path = "/v1/sql", tag = "admin", request_body = SqlRequest,
    responses((status = 200, body = SqlResponse), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn sql(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiJson(req): ApiJson<SqlRequest>,
) -> ApiResult<Json<SqlResponse>> {
    caller.require(&app, Scope::Admin)?;
    let limit = req.limit.unwrap_or(1000).clamp(1, app.config.limits.max_sql_rows);
    let app2 = app.clone();
    let r = tokio::task::spawn_blocking(move || app2.jobs.store.sql(&req.query, limit))
        .await
        .map_err(ApiError::internal)?
        .map_err(|e| match e {
            xpu_store::StoreError::Query(m) => ApiError::bad_request("invalid_sql", m),
            xpu_store::StoreError::Db(d) => ApiError::bad_request("invalid_sql", d.to_string()),
            other => ApiError::internal(other),
        })?;
    Ok(Json(SqlResponse { columns: r.columns, rows: r.rows, truncated: r.truncated }))
}

#[utoipa::path(get, path = "/healthz", tag = "health", responses((status = 200, body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health { status: "ok".into() })
}

#[utoipa::path(get, path = "/readyz", tag = "health",
    responses((status = 200, body = Health), (status = 503, body = ErrorBody)))]
pub async fn readyz(State(app): State<Arc<App>>) -> ApiResult<Json<Health>> {
    if app.draining.load(Ordering::Acquire) {
        return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "draining"));
    }
    Ok(Json(Health { status: "ready".into() }))
}

#[utoipa::path(get, path = "/metrics", tag = "health",
    responses((status = 200, description = "Prometheus text exposition")))]
pub async fn metrics(State(app): State<Arc<App>>) -> Response {
    app.metrics.observe_prepared(app.jobs.prepared.stats());
    app.metrics.observe_workers();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], app.metrics.render())
        .into_response()
}

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// Documents on every operation the error answers that come from outside its handler, in
/// the one error format: 400 (a malformed path, query or body), 401/403 (authentication, on
/// operations that need a token), 404 (an unknown id in the path), 413/415/422 (a request
/// body too large, not JSON, or not the expected shape), 429 and 503 (a full queue or a
/// draining daemon, where jobs start). Written once here rather than on each handler, so a
/// new operation cannot forget them.
struct ErrorResponses;

impl utoipa::Modify for ErrorResponses {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
        let error = |what: &str| {
            ResponseBuilder::new()
                .description(what)
                .content(
                    "application/json",
                    ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build(),
                )
                .build()
        };
        for (path, item) in openapi.paths.paths.iter_mut() {
            let starts_jobs = path == "/v1/jobs" || path.ends_with("/replay");
            for op in [&mut item.get, &mut item.post].into_iter().flatten() {
                let mut add = |status: &str, what: &str| {
                    op.responses.responses.entry(status.to_string()).or_insert(error(what).into());
                };
                if path.starts_with("/v1/") {
                    add("400", "Malformed path, query or body");
                }
                if op.security.is_some() {
                    add("401", "Missing or unknown bearer token");
                    add("403", "The token lacks the scope");
                }
                if path.contains('{') {
                    add("404", "No such run, output or policy");
                }
                if op.request_body.is_some() {
                    add("413", "Body over limits.max_body_bytes");
                    add("415", "Body is not application/json");
                    add(
                        "422",
                        "Body is JSON of the wrong shape, or an invalid program, policy or input",
                    );
                }
                if starts_jobs {
                    add("429", "The job queue is full (Retry-After)");
                    add("503", "The daemon is draining");
                }
            }
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "xpud", description = "The xpu daemon: jobs planned under policies, run, stored and explained."),
    paths(submit, list_runs, get_run, explain, output, cancel, replay, dry_run, list_policies,
        get_policy, validate_policy, engines, search, evidence, sql, healthz, readyz, metrics,
        crate::asks::post_ask, crate::asks::get_ask, crate::asks::accept_ask, crate::asks::ask_stats),
    modifiers(&BearerAuth, &ErrorResponses),
    tags((name = "jobs"), (name = "runs"), (name = "plans"), (name = "policies"), (name = "engines"),
        (name = "asks"), (name = "admin"), (name = "health"))
)]
pub struct ApiDoc;

/// The OpenAPI document, as served at `/openapi.json` and committed as
/// `schemas/openapi.json`.
pub fn openapi_json() -> String {
    ApiDoc::openapi().to_pretty_json().unwrap_or_default()
}

pub fn router(app: Arc<App>) -> Router {
    let limit = app.config.limits.max_body_bytes;
    let api = Router::new()
        .route("/v1/jobs", post(submit))
        .route("/v1/runs", get(list_runs))
        .route("/v1/runs/{id}", get(get_run))
        .route("/v1/runs/{id}/explain", get(explain))
        .route("/v1/runs/{id}/outputs/{name}", get(output))
        .route("/v1/runs/{id}/cancel", post(cancel))
        .route("/v1/runs/{id}/replay", post(replay))
        .route("/v1/plans", post(dry_run))
        .route("/v1/policies", get(list_policies))
        .route("/v1/policies/validate", post(validate_policy))
        .route("/v1/policies/{name}", get(get_policy))
        .route("/v1/engines", get(engines))
        .route("/v1/search", get(search))
        .route("/v1/evidence", get(evidence))
        .route("/v1/sql", post(sql))
        .route("/v1/asks", post(crate::asks::post_ask))
        .route("/v1/asks/stats", get(crate::asks::ask_stats))
        .route("/v1/asks/{id}", get(crate::asks::get_ask))
        .route("/v1/asks/{id}/accept", post(crate::asks::accept_ask))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(app);
    Router::new()
        .merge(api)
        .merge(utoipa_swagger_ui::SwaggerUi::new("/docs").url("/openapi.json", ApiDoc::openapi()))
        // A declared length over the limit is refused before the body is read; a chunked
        // body is cut off at the limit.
        .layer(tower_http::limit::RequestBodyLimitLayer::new(limit))
        .layer(axum::extract::DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn(crate::error::json_errors))
}
