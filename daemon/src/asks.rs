//! Asks in xpud (`POST /v1/asks`, docs/ask.md): a question and data files under the data
//! roots become a MiniLang program through the model `[assistant]` names. The loop is the
//! one `xpuctl ask` runs (xpu-assistant); the judge here is in-process, as xpud compiles
//! every submitted program: each program is lowered against a sample of the data (the
//! first `dry_run_rows` records of each CSV file, in a scratch directory that is the dry
//! run's only data root) and run there under the ask's policy, stopped at `dry_run_s`.
//! Accepted asks most like the question are the prompt's examples. An ask runs on the
//! blocking pool (at most `limits.asks_at_once` at a time), is held in memory only while
//! it runs, and is stored whole when it ends.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use xpu_api::{
    AcceptedDto, AskAttemptDto, AskDto, AskRequest, AskRunDto, AskStatsDto, AskStatsQuery,
    FindingDto, ProgramSpec, SubmitJob,
};
use xpu_ask_data::record::{self, AskMeta};
use xpu_assistant::session::{Finding, Stage, Verdict, finding};
use xpu_assistant::{Answer, AssistantConfig, DataFile, Example};
use xpu_minilang::paths::DataRoots;
use xpu_policy::Policy;
use xpu_store::{AskRecord, StoredAsk};

use crate::App;
use crate::api::{
    ApiJson, ApiQuery, ApiResult, Caller, off_async, prepare_compiled, run_dto, visible,
};
use crate::auth::Scope;
use crate::error::{ApiError, ErrorBody};
use crate::jobs::{Phase, now_us};

/// Most data files one ask may name.
const MAX_DATA_FILES: usize = 16;
/// Longest question, in characters.
const MAX_QUESTION_CHARS: usize = 4000;

/// The asks running now, by id.
#[derive(Default)]
pub struct Asks {
    live: Mutex<HashMap<String, Live>>,
}

/// A running ask: what `GET /v1/asks/{id}` shows until it is stored.
type Live = AskMeta;

impl Asks {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Live>> {
        // Plain entries: consistent after a panic elsewhere.
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn running(&self) -> usize {
        self.lock().len()
    }
}

/// A data file of the ask: the root it is under and its path relative to that root.
struct DataPath {
    root: PathBuf,
    rel: PathBuf,
}

#[utoipa::path(post, path = "/v1/asks", tag = "asks", request_body = AskRequest,
    responses(
        (status = 202, description = "Asking; poll `GET /v1/asks/{id}`", body = AskDto),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, description = "Unknown policy", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 429, description = "`limits.asks_at_once` asks are running; see Retry-After", body = ErrorBody),
        (status = 503, description = "No `[assistant]` endpoint, model or readable key; or xpud is stopping", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn post_ask(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiJson(req): ApiJson<AskRequest>,
) -> ApiResult<Response> {
    caller.require(&app, Scope::Submit)?;
    if app.draining.load(std::sync::atomic::Ordering::Acquire) {
        let e = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "draining", "xpud is stopping");
        return Ok(with_retry_after(e.into_response(), 5));
    }
    let cfg = configured(&app)?;
    let cfg = limited(cfg, &req)?;
    let question = req.question.trim();
    if question.is_empty() || question.chars().count() > MAX_QUESTION_CHARS {
        return Err(ApiError::bad_request(
            "invalid_question",
            format!("question: 1 to {MAX_QUESTION_CHARS} characters"),
        ));
    }
    if req.data.len() > MAX_DATA_FILES {
        return Err(ApiError::bad_request(
            "invalid_data",
            format!("data: at most {MAX_DATA_FILES} files, found {}", req.data.len()),
        ));
    }
    let data = req
        .data
        .iter()
        .map(|p| data_path(&app.jobs.data_roots, p))
        .collect::<Result<Vec<_>, _>>()?;
    let policy = ask_policy(&app, req.policy.as_deref())?;
    let (endpoint, model) = match cfg.target() {
        Ok((e, m)) => {
            (xpu_assistant::client::redact(&format!("{e}/chat/completions")), m.to_string())
        }
        Err(_) => return Err(not_configured()),
    };
    let id = xpu_ask_data::record::new_ask_id();
    let live = Live {
        ask_id: id.clone(),
        tenant: caller.0.tenant.clone(),
        question: question.to_string(),
        data: data.iter().map(|d| d.rel.to_string_lossy().into_owned()).collect(),
        policy: req.policy.clone(),
        model,
        endpoint,
        created_us: now_us(),
    };
    {
        let mut asks = app.asks.lock();
        if asks.len() >= app.config.limits.asks_at_once {
            let e = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_asks",
                format!("{} asks are running (limits.asks_at_once); try again later", asks.len()),
            );
            return Ok(with_retry_after(e.into_response(), 5));
        }
        asks.insert(id.clone(), live.clone());
    }
    app.metrics.asks.with_label_values(&["started"]).inc();
    let dto = live_dto(&id, &live);
    let app2 = app.clone();
    tokio::task::spawn_blocking(move || {
        let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_ask(&app2, &caller, &id, &live, &cfg, &req, &data, &policy)
        }));
        let outcome = ended.unwrap_or_else(|_| {
            tracing::error!("ask {id}: the ask panicked");
            store_ask(&app2, &record::failed(&live, "the ask broke (logged)".into()))
        });
        app2.metrics.asks.with_label_values(&[&outcome]).inc();
        app2.asks.lock().remove(&id);
    });
    Ok((StatusCode::ACCEPTED, Json(dto)).into_response())
}

fn with_retry_after(mut r: Response, seconds: u32) -> Response {
    r.headers_mut().insert("retry-after", axum::http::HeaderValue::from(seconds));
    r
}

fn not_configured() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "assistant_not_configured",
        "this xpud has no model to ask: set `endpoint` (an OpenAI-compatible API, \
         e.g. http://127.0.0.1:8080/v1) and `model` in the [assistant] table of its \
         configuration (or XPU_ASSISTANT__ENDPOINT and XPU_ASSISTANT__MODEL), and \
         `api_key_env` or `api_key_file` if the endpoint needs a key (docs/ask.md)",
    )
}

/// The server's `[assistant]`, if it names an endpoint and a model.
fn configured(app: &App) -> ApiResult<AssistantConfig> {
    let cfg = app.config.assistant.clone();
    cfg.target().map_err(|_| not_configured())?;
    // A key that cannot be read fails every ask: say so now, not in each stored ask.
    cfg.check_key().map_err(|e| {
        // Which variable or file is the operator's business: logged, not answered.
        tracing::warn!("asks refused: {e}");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "assistant_not_configured",
            "this xpud cannot read the API key its [assistant] table names (logged)",
        )
    })?;
    Ok(cfg)
}

/// The configuration one ask runs under: the request may lower `max_attempts`.
fn limited(mut cfg: AssistantConfig, req: &AskRequest) -> ApiResult<AssistantConfig> {
    if let Some(n) = req.max_attempts {
        if n == 0 || n > cfg.max_attempts {
            return Err(ApiError::bad_request(
                "invalid_max_attempts",
                format!(
                    "max_attempts: 1 to {} (the server's [assistant] max_attempts)",
                    cfg.max_attempts
                ),
            ));
        }
        cfg.max_attempts = n;
    }
    Ok(cfg)
}

/// A data file named by the request: inside a data root, a file.
fn data_path(roots: &DataRoots, given: &str) -> ApiResult<DataPath> {
    let bad = |m: String| ApiError::bad_request("invalid_data", format!("data {given:?}: {m}"));
    let resolved = roots.resolve_read(given).map_err(bad)?;
    if !resolved.is_file() {
        return Err(bad("not a file".into()));
    }
    for root in roots.roots() {
        let Ok(root) = root.canonicalize() else { continue };
        if let Ok(rel) = resolved.strip_prefix(&root) {
            return Ok(DataPath { rel: rel.to_path_buf(), root });
        }
    }
    Err(bad("not inside a data root".into()))
}

fn ask_policy(app: &App, name: Option<&str>) -> ApiResult<Arc<Policy>> {
    let policies = app.jobs.policies();
    match name {
        None => Ok(policies.default.clone()),
        Some(n) => policies.get(n).cloned().ok_or_else(|| {
            ApiError::not_found(format!("no policy named `{n}`"))
                .details(serde_json::json!({"code": "unknown_policy"}))
        }),
    }
}

/// What the loop left: the answer, the data as the model saw it, the files the accepted
/// program writes (an error when lowering it again failed), the examples shown.
struct Asked {
    answer: Answer,
    files: Vec<DataFile>,
    writes: Result<Vec<String>, String>,
    examples: Vec<String>,
}

/// Runs one ask to its end and stores it — also when it ends before the model answered
/// (unreadable data, a missing key), as `failed` with the reason; answers its outcome
/// (for the metric).
#[allow(clippy::too_many_arguments)]
fn run_ask(
    app: &Arc<App>,
    caller: &Caller,
    id: &str,
    live: &Live,
    cfg: &AssistantConfig,
    req: &AskRequest,
    data: &[DataPath],
    policy: &Arc<Policy>,
) -> String {
    let record = match ask_model(app, caller, id, live, cfg, data, policy) {
        Ok(asked) => {
            let run = match (&asked.answer.program, req.run) {
                (Some(program), true) => {
                    Some(run_program(app, caller, id, program, req, &asked.writes))
                }
                _ => None,
            };
            let run_id = run.as_ref().and_then(|r| r.run_id.clone());
            let refused = run.and_then(|r| r.refused);
            let Asked { answer, files, examples, .. } = asked;
            record::answered(live, &answer, &files, &examples, run_id, refused)
        }
        Err(e) => record::failed(live, e),
    };
    store_ask(app, &record)
}

/// Stores an ended ask; its outcome, or `not_stored`.
fn store_ask(app: &App, record: &AskRecord) -> String {
    match app.jobs.store.record_ask(record) {
        Ok(_) => record.outcome.clone(),
        Err(e) => {
            tracing::warn!("ask {}: not stored: {e}", record.ask_id);
            "not_stored".into()
        }
    }
}

/// The loop itself: the data described, the examples found, the model asked, every
/// program judged on the sample.
fn ask_model(
    app: &App,
    caller: &Caller,
    id: &str,
    live: &Live,
    cfg: &AssistantConfig,
    data: &[DataPath],
    policy: &Arc<Policy>,
) -> Result<Asked, String> {
    let files = describe(data, cfg.send_rows).map_err(|e| format!("reading the data: {e}"))?;
    let topic = format!("{}\n{}", live.question, xpu_ask_data::schema_text(&files));
    let scope = caller.0.visibility();
    let found = app.jobs.store.ask_examples(&topic, scope, cfg.examples).unwrap_or_else(|e| {
        tracing::warn!("ask {id}: no examples: {e}");
        Vec::new()
    });
    let examples: Vec<Example> = found
        .iter()
        .map(|e| Example { question: e.question.clone(), program: e.program.clone() })
        .collect();
    let judge = InProcess::new(app, data, policy.clone(), cfg)?;
    let request =
        xpu_assistant::Request { question: &live.question, data: &files, examples: &examples };
    let answer = xpu_assistant::ask(cfg, &request, &judge).map_err(|e| e.to_string())?;
    let writes = match answer.program.as_deref() {
        Some(p) => judge.writes(p),
        None => Ok(Vec::new()),
    };
    Ok(Asked { answer, files, writes, examples: found.into_iter().map(|e| e.ask_id).collect() })
}

fn describe(data: &[DataPath], rows: usize) -> Result<Vec<DataFile>, String> {
    let mut out = Vec::with_capacity(data.len());
    for d in data {
        let engine = xpu_engine_table::TableEngine::new(vec![d.root.clone()]);
        out.push(xpu_ask_data::describe(&engine, &d.root, &d.rel, rows)?);
    }
    Ok(out)
}

/// Runs the accepted program as a job of the caller (labelled with the ask), waiting for
/// it up to the server's wait limit.
fn run_program(
    app: &Arc<App>,
    caller: &Caller,
    id: &str,
    program: &str,
    req: &AskRequest,
    writes: &Result<Vec<String>, String>,
) -> AskRunDto {
    let refused = |why: String| AskRunDto {
        run_id: None,
        status: None,
        error: None,
        outputs: vec![],
        refused: Some(why),
    };
    match writes {
        Err(e) => return refused(format!("what the program writes is unknown: {e}")),
        Ok(w) if !w.is_empty() && !req.allow_writes => {
            return refused(format!(
                "the program writes files ({}); `allow_writes` lets it write into the data roots",
                w.join(", ")
            ));
        }
        Ok(_) => {}
    }
    let mut labels = req.labels.clone();
    labels.insert("ask".into(), id.to_string());
    let submit = SubmitJob {
        program: ProgramSpec {
            name: Some(format!("{id}.ml")),
            source: Some(program.to_string()),
            source_base64: None,
            path: None,
        },
        inputs: BTreeMap::new(),
        policy: req.policy.clone(),
        policy_toml: None,
        labels,
        wait: false,
    };
    let job = prepare_compiled(app, caller, &submit)
        .and_then(|spec| app.jobs.submit(spec).map_err(|e| ApiError::internal(e.to_string())));
    let job = match job {
        Ok(job) => job,
        Err(e) => return refused(format!("the run was not started: {}", e.message)),
    };
    let mut rx = job.subscribe();
    let limit = Instant::now() + Duration::from_secs(app.config.limits.wait_timeout_s);
    while !matches!(*rx.borrow_and_update(), Phase::Done(_)) && Instant::now() < limit {
        // The job's phase changes from a worker thread; this is a blocking-pool thread.
        std::thread::sleep(Duration::from_millis(20));
    }
    let run_id = job.run_id.clone();
    let summary = match &*rx.borrow() {
        Phase::Done(s) => Some(run_dto(s)),
        _ => None,
    };
    AskRunDto {
        run_id: Some(run_id),
        status: Some(summary.as_ref().map_or("running".into(), |s| s.status.clone())),
        error: summary.as_ref().and_then(|s| s.error.clone()),
        outputs: summary.map(|s| s.outputs).unwrap_or_default(),
        refused: None,
    }
}

/// The judge of xpud's asks: lowering against a sample of the data, then a run of the
/// lowered graph on it under the ask's policy, stopped at `dry_run_s`.
struct InProcess<'a> {
    app: &'a App,
    /// The sample as written once: each attempt runs on a copy of it, so a program that
    /// overwrites a file it reads cannot change what the next attempt sees. Removed on drop.
    pristine: tempfile::TempDir,
    scratch: PathBuf,
    policy: Arc<Policy>,
    limit: Duration,
    /// The files the last program that lowered writes, relative to the data root: what
    /// `--run` asks about the accepted program, without lowering it again.
    lowered_writes: std::cell::RefCell<Option<(String, Vec<String>)>>,
}

/// One attempt's copy of the sample: its only data root. Removed on drop.
struct Attempt {
    dir: tempfile::TempDir,
    roots: DataRoots,
}

impl<'a> InProcess<'a> {
    fn new(
        app: &'a App,
        data: &[DataPath],
        policy: Arc<Policy>,
        cfg: &AssistantConfig,
    ) -> Result<InProcess<'a>, String> {
        let scratch = app.config.data_dir.join("asks-scratch");
        std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
        let pristine =
            tempfile::tempdir_in(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
        for d in data {
            let rel = [d.rel.as_path()];
            xpu_ask_data::write_sample(&d.root, &rel, pristine.path(), cfg.dry_run_rows)?;
        }
        let limit = Duration::from_secs_f64(cfg.dry_run_s);
        let lowered_writes = Default::default();
        Ok(InProcess { app, pristine, scratch, policy, limit, lowered_writes })
    }

    fn attempt(&self) -> Result<Attempt, String> {
        let dir = tempfile::tempdir_in(&self.scratch)
            .map_err(|e| format!("{}: {e}", self.scratch.display()))?;
        xpu_ask_data::copy_tree(self.pristine.path(), dir.path())?;
        let roots = DataRoots::new([dir.path().to_path_buf()]);
        Ok(Attempt { dir, roots })
    }

    fn lower(
        &self,
        program: &str,
        roots: &DataRoots,
    ) -> Result<xpu_minilang::lower::Lowered, Vec<xpu_minilang::Diagnostic>> {
        let (parsed, diags) = xpu_minilang::analyze(program);
        if diags.iter().any(|d| d.is_error()) {
            return Err(diags);
        }
        let inputs = xpu_minilang::lower::Inputs {
            models: Some(xpu_runtime::program::model_loader()),
            tables: Some(xpu_runtime::program::table_loader(roots.roots())),
            ..Default::default()
        };
        xpu_minilang::lower::lower_with(&parsed, "answer", Some(roots), &inputs)
    }

    /// The files the program writes (tables, plots, `.npy`), relative to the data root, as
    /// its judging lowered it.
    fn writes(&self, program: &str) -> Result<Vec<String>, String> {
        let last = self.lowered_writes.borrow();
        match last.as_ref() {
            Some((p, writes)) if p == program => Ok(writes.clone()),
            _ => Err("it was not lowered".into()),
        }
    }

    /// Keeps what `lowered` (of `program`, in `attempt`) writes, for [`Self::writes`].
    fn keep_writes(
        &self,
        program: &str,
        lowered: &xpu_minilang::lower::Lowered,
        attempt: &Attempt,
    ) {
        let root = attempt.dir.path().canonicalize().unwrap_or_else(|_| attempt.dir.path().into());
        let writes = lowered
            .written_files()
            .iter()
            .map(|p| p.strip_prefix(&root).unwrap_or(p).to_string_lossy().into_owned())
            .collect();
        *self.lowered_writes.borrow_mut() = Some((program.to_string(), writes));
    }

    fn dry_run(
        &self,
        lowered: xpu_minilang::lower::Lowered,
        roots: &DataRoots,
        deadline: Instant,
    ) -> Verdict {
        let graph = Arc::new(lowered.graph);
        if let Err(errs) = xpu_ir::verify(&graph) {
            return failed(format!("the lowered graph is invalid: {}", errs[0]), "dry_run");
        }
        let jobs = &self.app.jobs;
        let planned =
            match xpu_runtime::plan_job(&graph, &[], &self.policy, jobs.inventory(), None, None) {
                Ok(p) => p,
                Err(e) => return failed(format!("no plan under the policy: {e}"), "no_plan"),
            };
        let registry = jobs.registry_in(roots);
        let stop = xpu_engine::StopToken::new();
        let (done, watch) = std::sync::mpsc::channel::<()>();
        let watchdog = {
            let stop = stop.clone();
            let wait = deadline.saturating_duration_since(Instant::now());
            std::thread::spawn(move || {
                if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = watch.recv_timeout(wait) {
                    stop.cancel();
                }
            })
        };
        let ran = jobs.in_slot(deadline, || {
            xpu_runtime::run_planned(&graph, planned, &[], &registry, &stop, None)
        });
        drop(done);
        let Some(ran) = ran else {
            return failed("no execution slot came free in time (xpud is busy)".into(), "busy");
        };
        let _ = watchdog.join();
        match ran {
            Ok(_) if stop.is_cancelled() => timed_out(self.limit),
            Ok(ran) => Verdict {
                dry_run: Some(printed(&lowered.prints, &ran.outputs)),
                ..Verdict::default()
            },
            Err(_) if stop.is_cancelled() => timed_out(self.limit),
            Err(e) => failed(e.to_string(), "run_failed"),
        }
    }
}

impl xpu_assistant::Judge for InProcess<'_> {
    fn judge(&self, program: &str, deadline: Instant) -> Verdict {
        let deadline = deadline.min(Instant::now() + self.limit);
        let attempt = match self.attempt() {
            Ok(a) => a,
            Err(e) => return failed(format!("copying the sample: {e}"), "dry_run"),
        };
        match self.lower(program, &attempt.roots) {
            Err(diags) => {
                let errors: Vec<_> = diags.iter().filter(|d| d.is_error()).collect();
                Verdict {
                    findings: errors.iter().map(|d| finding(program, d)).collect(),
                    feedback: xpu_minilang::render("answer.ml", program, &diags),
                    dry_run: None,
                }
            }
            Ok(lowered) => {
                self.keep_writes(program, &lowered, &attempt);
                self.dry_run(lowered, &attempt.roots, deadline)
            }
        }
    }
}

/// What the program's `print` statements showed on the sample, in order.
fn printed(
    prints: &[xpu_minilang::lower::PrintItem],
    outputs: &[(String, xpu_ir::Tensor)],
) -> String {
    use xpu_minilang::lower::PrintItem;
    let mut out = String::new();
    for item in prints {
        match item {
            PrintItem::Text(t) => out.push_str(t),
            PrintItem::Output(name) => {
                if let Some((_, t)) = outputs.iter().find(|(n, _)| n == name) {
                    out.push_str(&xpu_runtime::tensors::pretty(t));
                }
            }
        }
        out.push('\n');
    }
    out
}

fn timed_out(limit: Duration) -> Verdict {
    failed(format!("the dry run did not finish in {:.1} s", limit.as_secs_f64()), "timeout")
}

fn failed(message: String, code: &str) -> Verdict {
    let feedback = format!("The dry run on the first rows of the data failed:\n{message}");
    Verdict { findings: vec![Finding::new(Stage::DryRun, code, message)], feedback, dry_run: None }
}

fn live_dto(id: &str, l: &Live) -> AskDto {
    AskDto {
        ask_id: id.to_string(),
        status: "running".into(),
        question: l.question.clone(),
        data: l.data.clone(),
        policy: l.policy.clone(),
        model: l.model.clone(),
        endpoint: l.endpoint.clone(),
        program: None,
        error: None,
        notes: vec![],
        attempts: vec![],
        examples: vec![],
        tokens: 0,
        elapsed_ms: 0,
        grammar_used: false,
        run: None,
        accepted: false,
        created_us: l.created_us,
        finished_us: None,
    }
}

/// A stored ask as the API shows it; the run it started as it stands now.
fn stored_dto(app: &App, s: StoredAsk, scope: xpu_store::Scope<'_>) -> AskDto {
    let r = s.record;
    let stored = &r.answer;
    let answer: Option<Answer> = serde_json::from_value(stored["answer"].clone()).ok();
    let examples: Vec<String> =
        serde_json::from_value(stored["examples"].clone()).unwrap_or_default();
    let refused = stored["refused"].as_str().map(str::to_string);
    let run = match (&r.run_id, refused) {
        (Some(run_id), _) => {
            // Still queued or running (past the ask's wait): as the job stands now.
            let summary = match app.jobs.live(run_id) {
                Some(job) => Some(crate::api::live_dto(&job)),
                None => app.jobs.store.run(run_id, scope).ok().flatten().map(|s| run_dto(&s)),
            };
            Some(AskRunDto {
                run_id: Some(run_id.clone()),
                status: summary.as_ref().map(|s| s.status.clone()),
                error: summary.as_ref().and_then(|s| s.error.clone()),
                outputs: summary.map(|s| s.outputs).unwrap_or_default(),
                refused: None,
            })
        }
        (None, Some(why)) => Some(AskRunDto {
            run_id: None,
            status: None,
            error: None,
            outputs: vec![],
            refused: Some(why),
        }),
        (None, None) => None,
    };
    let attempts = answer.as_ref().map(attempt_dtos).unwrap_or_default();
    AskDto {
        ask_id: r.ask_id,
        status: r.outcome,
        question: r.question,
        data: r.data,
        policy: r.policy_name,
        model: r.model,
        endpoint: r.endpoint,
        program: r.program,
        error: r.error,
        notes: answer.as_ref().map(|a| a.notes.clone()).unwrap_or_default(),
        attempts,
        examples,
        tokens: answer.as_ref().map_or(0, |a| a.tokens),
        elapsed_ms: r.elapsed_ms,
        grammar_used: answer.as_ref().is_some_and(|a| a.grammar_used),
        run,
        accepted: s.accepted,
        created_us: r.created_us,
        finished_us: Some(r.finished_us),
    }
}

fn attempt_dtos(a: &Answer) -> Vec<AskAttemptDto> {
    a.attempts
        .iter()
        .map(|t| AskAttemptDto {
            n: t.n,
            asked: t.asked.clone(),
            reply: t.reply.clone(),
            program: t.program.clone(),
            failed_at: record::failed_at(&t.verdict).map(str::to_string),
            findings: t
                .verdict
                .findings
                .iter()
                .map(|f| FindingDto {
                    stage: record::stage_name(f.stage).into(),
                    code: f.code.clone(),
                    message: f.message.clone(),
                    line: f.line,
                    col: f.col,
                    help: f.help.clone(),
                })
                .collect(),
            dry_run: t.verdict.dry_run.clone(),
            prompt_tokens: t.prompt_tokens,
            completion_tokens: t.completion_tokens,
            latency_ms: t.latency_ms,
            finish_reason: t.finish_reason.clone(),
            grammar_sent: t.grammar_sent,
        })
        .collect()
}

#[utoipa::path(get, path = "/v1/asks/{id}", tag = "asks", params(("id" = String, Path)),
    responses((status = 200, body = AskDto), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get_ask(
    State(app): State<Arc<App>>,
    caller: Caller,
    UrlPath(id): UrlPath<String>,
) -> ApiResult<Json<AskDto>> {
    caller.require(&app, Scope::Read)?;
    let live = app.asks.lock().get(&id).cloned();
    if let Some(l) = live.filter(|l| visible(&caller.0, l.tenant.as_deref())) {
        return Ok(Json(live_dto(&id, &l)));
    }
    off_async(&app, &caller, move |app, scope| match app.jobs.store.ask(&id, scope) {
        Ok(Some(s)) => Ok(Json(stored_dto(app, s, scope))),
        Ok(None) => Err(ApiError::not_found(format!("no ask {id}"))),
        Err(e) => Err(ApiError::internal(e)),
    })
    .await
}

#[utoipa::path(post, path = "/v1/asks/{id}/accept", tag = "asks",
    params(("id" = String, Path, description = "An ask's id, or the id of the run it started")),
    responses((status = 200, body = AcceptedDto), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "The ask ended without a program", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn accept_ask(
    State(app): State<Arc<App>>,
    caller: Caller,
    UrlPath(id): UrlPath<String>,
) -> ApiResult<Json<AcceptedDto>> {
    caller.require(&app, Scope::Submit)?;
    off_async(&app, &caller, move |app, scope| {
        use xpu_store::Accepted;
        match app.jobs.store.accept_ask(&id, scope).map_err(ApiError::internal)? {
            Accepted::Now { ask_id, newly } => Ok(Json(AcceptedDto { ask_id, newly })),
            Accepted::NotFound => {
                Err(ApiError::not_found(format!("no ask (or run of an ask) {id}")))
            }
            Accepted::NoProgram { ask_id, outcome } => Err(ApiError::new(
                StatusCode::CONFLICT,
                "no_program",
                format!("ask {ask_id} ended without a program ({outcome}): nothing to accept"),
            )),
        }
    })
    .await
}

#[utoipa::path(get, path = "/v1/asks/stats", tag = "asks", params(AskStatsQuery),
    responses((status = 200, body = Vec<AskStatsDto>), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn ask_stats(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<AskStatsQuery>,
) -> ApiResult<Json<Vec<AskStatsDto>>> {
    caller.require(&app, Scope::Read)?;
    off_async(&app, &caller, move |app, scope| {
        let rows = app.jobs.store.ask_stats(scope, q.since_us).map_err(ApiError::internal)?;
        Ok(Json(
            rows.into_iter()
                .map(|r| AskStatsDto {
                    model: r.model,
                    day: r.day,
                    asks: r.asks,
                    first_parse: r.first_parse,
                    first_check: r.first_check,
                    first_run: r.first_run,
                    answered: r.answered,
                    attempts_per_answer: r.attempts_per_answer,
                    tokens_per_answer: r.tokens_per_answer,
                })
                .collect(),
        ))
    })
    .await
}

/// Removes scratch directories an earlier process left (it stopped during an ask).
pub fn clear_scratch(data_dir: &Path) {
    let _ = std::fs::remove_dir_all(data_dir.join("asks-scratch"));
}
