//! `xpuctl ask "QUESTION" --data FILE …`: the assistant loop run locally. The data files'
//! schemas come from the table engine's own reader; each program the model writes is
//! lowered against a sample of the data (the first `dry_run_rows` rows, in a scratch
//! directory that is the dry run's only data root) and dry-run there by this same binary
//! (`xpuctl run`, killed past `dry_run_s`), under the job's policy. With `--run` the
//! accepted program runs on the real data.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use xpu_assistant::session::{Finding, Stage, Verdict, finding};
use xpu_assistant::{Answer, AskError, AssistantConfig, DataFile, GrammarMode, Judge, Outcome};

use crate::{Format, Reported, UsageError};

/// What `xpuctl ask` was given.
pub struct AskArgs {
    pub question: String,
    pub data: Vec<PathBuf>,
    pub policy: Option<String>,
    pub run: bool,
    pub format: Format,
    pub config: Option<PathBuf>,
    pub endpoint: Option<String>,
    pub model: Option<String>,
    pub max_attempts: Option<u32>,
    pub grammar: Option<GrammarMode>,
    pub save: Option<PathBuf>,
}

/// The configuration: `--config`'s `[assistant]`, then `XPU_ASK_*`, then flags.
fn config(args: &AskArgs) -> Result<AssistantConfig> {
    let mut cfg = match &args.config {
        Some(p) => AssistantConfig::from_toml_file(p)?,
        None => AssistantConfig::default(),
    }
    .with_env();
    if let Some(e) = &args.endpoint {
        cfg.endpoint = Some(e.clone());
    }
    if let Some(m) = &args.model {
        cfg.model = Some(m.clone());
    }
    if let Some(n) = args.max_attempts {
        cfg.max_attempts = n;
    }
    if let Some(g) = args.grammar {
        cfg.grammar = g;
    }
    cfg.validate().map_err(|e| anyhow!(UsageError(e)))?;
    cfg.target().map_err(|e| anyhow!(UsageError(e.to_string())))?;
    Ok(cfg)
}

pub fn ask(args: AskArgs) -> Result<()> {
    let cfg = config(&args)?;
    let cwd = std::env::current_dir().context("the working directory")?;
    let files =
        args.data.iter().map(|p| describe(&cwd, p, cfg.send_rows)).collect::<Result<Vec<_>>>()?;
    let judge = DryRun {
        exe: std::env::current_exe().context("finding xpuctl itself")?,
        cwd: cwd.clone(),
        data: args.data.clone(),
        policy: args.policy.clone(),
        rows: cfg.dry_run_rows,
        limit: Duration::from_secs_f64(cfg.dry_run_s),
    };
    let request = xpu_assistant::Request { question: &args.question, data: &files, examples: &[] };
    let answer = xpu_assistant::ask(&cfg, &request, &judge).map_err(|e| match e {
        AskError::NotConfigured(m) => anyhow!(UsageError(m)),
        other => anyhow!(other),
    })?;
    let run = match (&answer.program, args.run) {
        (Some(program), true) => Some(run_answer(&judge, program, args.format)?),
        _ => None,
    };
    let mut record = serde_json::to_value(&answer)?;
    if let Some(r) = &run {
        record["run"] = r.clone();
    }
    if let Some(path) = &args.save {
        std::fs::write(path, serde_json::to_vec_pretty(&record)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    match args.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&record)?),
        Format::Text => print_answer(&answer, run.as_ref()),
    }
    if answer.outcome == Outcome::Accepted { Ok(()) } else { Err(Reported.into()) }
}

/// A data file as the model sees it: its path as given, the table engine's schema, and the
/// first `rows` rows of a CSV file.
fn describe(cwd: &Path, path: &Path, rows: usize) -> Result<DataFile> {
    let text = path.to_str().ok_or_else(|| anyhow!("{}: not UTF-8", path.display()))?;
    let roots = xpu_minilang::paths::DataRoots::new([cwd.to_path_buf()]);
    let resolved =
        roots.resolve_read(text).map_err(|m| anyhow!(UsageError(format!("--data {text}: {m}"))))?;
    let ext = resolved.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    let op = match ext.as_str() {
        "csv" | "tsv" | "txt" => xpu_ir::Op::ReadCsv,
        "xlsx" => xpu_ir::Op::ReadXlsx,
        "parquet" => xpu_ir::Op::ReadParquet,
        _ => {
            return Ok(DataFile {
                path: text.into(),
                kind: "file".into(),
                columns: vec![],
                rows: vec![],
            });
        }
    };
    let abs = resolved.to_string_lossy().into_owned();
    let attrs = xpu_ir::Attrs::new().with("path", xpu_ir::Attr::Str(abs));
    let engine = xpu_engine_table::TableEngine::new(vec![cwd.to_path_buf()]);
    let columns = engine
        .source_schema(op, &attrs)
        .map_err(|m| anyhow!("--data {text}: {m}"))?
        .into_iter()
        .map(|(n, d)| (n, d.name().to_string()))
        .collect();
    let rows = if op == xpu_ir::Op::ReadCsv { first_rows(&resolved, rows)? } else { vec![] };
    Ok(DataFile { path: text.into(), kind: "table".into(), columns, rows })
}

fn first_rows(path: &Path, n: usize) -> Result<Vec<Vec<String>>> {
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .from_path(path)
        .with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for record in reader.records().take(n) {
        let record = record.with_context(|| format!("reading {}", path.display()))?;
        out.push(record.iter().map(|c| c.chars().take(80).collect()).collect());
    }
    Ok(out)
}

/// Lowers and dry-runs programs on a sample of the data.
struct DryRun {
    exe: PathBuf,
    cwd: PathBuf,
    data: Vec<PathBuf>,
    policy: Option<String>,
    rows: usize,
    limit: Duration,
}

impl DryRun {
    /// A scratch directory holding the sample: each data file at its relative path, CSV
    /// files cut to their header and first rows, others copied whole.
    fn sample(&self) -> Result<tempfile::TempDir> {
        let dir = tempfile::tempdir().context("a scratch directory for the dry run")?;
        for rel in &self.data {
            let to = dir.path().join(rel);
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent)?;
            }
            let from = self.cwd.join(rel);
            let is_csv = rel.extension().is_some_and(|e| e.eq_ignore_ascii_case("csv"));
            if is_csv {
                let text = std::fs::read(&from)?;
                let keep = text
                    .split_inclusive(|&b| b == b'\n')
                    .take(self.rows + 1)
                    .flatten()
                    .copied()
                    .collect::<Vec<u8>>();
                std::fs::write(&to, keep)?;
            } else {
                std::fs::copy(&from, &to)?;
            }
        }
        Ok(dir)
    }

    fn lower(&self, program: &str, dir: &Path) -> Verdict {
        let (tree, _) = xpu_minilang::analyze(program);
        let roots = xpu_minilang::paths::DataRoots::new([dir.to_path_buf()]);
        let inputs = xpu_minilang::lower::Inputs {
            allow_undeclared: true,
            models: Some(xpu_runtime::program::model_loader()),
            tables: Some(xpu_runtime::program::table_loader(roots.roots())),
            ..Default::default()
        };
        match xpu_minilang::lower::lower_with(&tree, "answer", Some(&roots), &inputs) {
            Ok(_) => Verdict::default(),
            Err(diags) => Verdict {
                findings: diags
                    .iter()
                    .filter(|d| d.is_error())
                    .map(|d| finding(program, d))
                    .collect(),
                feedback: xpu_minilang::render("answer.ml", program, &diags),
                dry_run: None,
            },
        }
    }

    fn dry_run(&self, program: &str, dir: &Path, deadline: Instant) -> Result<Verdict> {
        let prog = dir.join("answer.ml");
        std::fs::write(&prog, program)?;
        let (stdout, stderr) = (dir.join(".stdout"), dir.join(".stderr"));
        let mut cmd = Command::new(&self.exe);
        cmd.current_dir(dir).arg("run").arg("answer.ml").args(["--out", ".out"]);
        if let Some(p) = &self.policy {
            cmd.arg("--policy").arg(policy_path(&self.cwd, p));
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout)?)
            .stderr(std::fs::File::create(&stderr)?)
            .spawn()
            .context("starting the dry run")?;
        let limit = self.limit.min(deadline.saturating_duration_since(Instant::now()));
        let status = wait_until(&mut child, Instant::now() + limit)?;
        let out = read_capped(&stdout);
        let err = read_capped(&stderr);
        let Some(status) = status else {
            return Ok(failed(
                format!("the dry run did not finish in {:.0} s", limit.as_secs_f64()),
                "timeout",
            ));
        };
        if status.success() {
            return Ok(Verdict { dry_run: Some(out), ..Verdict::default() });
        }
        let message = err.trim().trim_start_matches("error: ").to_string();
        Ok(failed(message, "run_failed"))
    }
}

/// A policy named by path is relative to where `ask` runs, not to the scratch directory.
fn policy_path(cwd: &Path, p: &str) -> String {
    let candidate = cwd.join(p);
    if candidate.exists() { candidate.to_string_lossy().into_owned() } else { p.to_string() }
}

fn failed(message: String, code: &str) -> Verdict {
    Verdict {
        findings: vec![Finding {
            stage: Stage::DryRun,
            code: code.into(),
            message: message.clone(),
            line: None,
            col: None,
            help: None,
        }],
        feedback: format!("The dry run on the first rows of the data failed:\n{message}"),
        dry_run: None,
    }
}

/// Waits for the child until `deadline`; past it, kills it and answers `None`.
fn wait_until(
    child: &mut std::process::Child,
    deadline: Instant,
) -> Result<Option<std::process::ExitStatus>> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn read_capped(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    String::from_utf8_lossy(&bytes[..bytes.len().min(8192)]).into_owned()
}

impl Judge for DryRun {
    fn judge(&self, program: &str, deadline: Instant) -> Verdict {
        let dir = match self.sample() {
            Ok(d) => d,
            Err(e) => return failed(format!("preparing the sample: {e:#}"), "sample"),
        };
        let lowered = self.lower(program, dir.path());
        if !lowered.ok() {
            return lowered;
        }
        self.dry_run(program, dir.path(), deadline)
            .unwrap_or_else(|e| failed(format!("{e:#}"), "dry_run"))
    }
}

/// Runs the accepted program on the real data: its outputs go to the terminal (text) or
/// into the answer (`run`: exit code, stdout, stderr).
fn run_answer(judge: &DryRun, program: &str, format: Format) -> Result<serde_json::Value> {
    let dir = tempfile::tempdir()?;
    let prog = dir.path().join("answer.ml");
    std::fs::write(&prog, program)?;
    let mut cmd = Command::new(&judge.exe);
    cmd.current_dir(&judge.cwd).arg("run").arg(&prog);
    if let Some(p) = &judge.policy {
        cmd.arg("--policy").arg(p);
    }
    if format == Format::Json {
        cmd.args(["--format", "json"]);
    }
    let out = cmd.stdin(Stdio::null()).output().context("running the answer")?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let parsed: serde_json::Value =
        serde_json::from_str(&stdout).unwrap_or(serde_json::Value::String(stdout));
    Ok(serde_json::json!({
        "exit_code": out.status.code(),
        "stdout": parsed,
        "stderr": String::from_utf8_lossy(&out.stderr),
    }))
}

/// One line per attempt: what became of it and what it cost.
fn attempt_lines(answer: &Answer) -> Vec<String> {
    answer
        .attempts
        .iter()
        .map(|a| {
            let what = match a.verdict.findings.first() {
                None => "passed (parse, check, dry run)".to_string(),
                Some(f) => format!(
                    "{} failed: {} {}{}",
                    stage_name(f.stage),
                    f.code,
                    f.message.lines().next().unwrap_or(""),
                    f.line.map(|l| format!(" (line {l})")).unwrap_or_default()
                ),
            };
            format!(
                "attempt {}: {what} — {} tokens, {:.1} s{}",
                a.n,
                a.prompt_tokens + a.completion_tokens,
                a.latency_ms as f64 / 1e3,
                if a.grammar_sent { ", grammar" } else { "" }
            )
        })
        .collect()
}

fn print_answer(answer: &Answer, run: Option<&serde_json::Value>) {
    for line in attempt_lines(answer) {
        println!("{line}");
    }
    match &answer.program {
        Some(p) => println!("\n{}", p.trim_end()),
        None => println!(
            "\nno program: {}",
            answer.error.as_deref().unwrap_or("the limits were reached")
        ),
    }
    println!(
        "\n{}: {} attempt(s), {} tokens, {:.1} s, model {} (prompt {})",
        outcome_name(answer.outcome),
        answer.attempts.len(),
        answer.tokens,
        answer.elapsed_ms as f64 / 1e3,
        answer.model,
        answer.prompt_digest
    );
    if let Some(r) = run {
        println!("\nrun:");
        if let Some(s) = r["stdout"].as_str() {
            print!("{s}");
        }
        if let Some(s) = r["stderr"].as_str().filter(|s| !s.is_empty()) {
            eprint!("{s}");
        }
    }
}

fn stage_name(s: Stage) -> &'static str {
    match s {
        Stage::Parse => "parse",
        Stage::Check => "check",
        Stage::DryRun => "dry run",
    }
}

fn outcome_name(o: Outcome) -> &'static str {
    match o {
        Outcome::Accepted => "accepted",
        Outcome::OutOfAttempts => "out of attempts",
        Outcome::OutOfTokens => "out of tokens",
        Outcome::OutOfTime => "out of time",
        Outcome::EndpointFailed => "endpoint failed",
    }
}

/// `:ask QUESTION` in the REPL: the data files the session's program names (inside the
/// working directory) go into the prompt; the endpoint comes from `XPU_ASK_*`. Writes the
/// attempts to `out` and answers the accepted program, which the REPL then runs as input.
pub fn ask_in_repl(
    question: &str,
    session: &str,
    out: &mut impl std::io::Write,
) -> Result<Option<String>> {
    let cfg = AssistantConfig::default().with_env();
    if let Err(e) = cfg.target() {
        writeln!(out, "{e}")?;
        return Ok(None);
    }
    let cwd = std::env::current_dir().context("the working directory")?;
    let data: Vec<PathBuf> = files_named(session)
        .into_iter()
        .filter(|p| describe(&cwd, p, 0).is_ok_and(|d| d.kind == "table"))
        .collect();
    let files =
        data.iter().map(|p| describe(&cwd, p, cfg.send_rows)).collect::<Result<Vec<_>>>()?;
    let judge = DryRun {
        exe: std::env::current_exe().context("finding xpuctl itself")?,
        cwd,
        data,
        policy: None,
        rows: cfg.dry_run_rows,
        limit: Duration::from_secs_f64(cfg.dry_run_s),
    };
    let request = xpu_assistant::Request { question, data: &files, examples: &[] };
    let answer = xpu_assistant::ask(&cfg, &request, &judge)?;
    for line in attempt_lines(&answer) {
        writeln!(out, "{line}")?;
    }
    if answer.program.is_none() {
        writeln!(
            out,
            "no program: {}",
            answer.error.as_deref().unwrap_or("the limits were reached")
        )?;
    }
    Ok(answer.program)
}

/// The string literals of a program that look like table files (`.csv`, `.xlsx`,
/// `.parquet`), in order, each once.
fn files_named(src: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for (tok, _) in xpu_minilang::lexer::lex(src) {
        let xpu_minilang::lexer::Tok::Str(raw) = tok else { continue };
        let text = raw.trim_matches('"');
        let p = PathBuf::from(text);
        let is_table = p
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| ["csv", "xlsx", "parquet"].contains(&e.to_ascii_lowercase().as_str()));
        if is_table && !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// `xpuctl minilang grammar|reference`.
pub fn minilang(cmd: MinilangCommand) -> Result<()> {
    match cmd {
        MinilangCommand::Grammar { format } => {
            let dialect = match format {
                GrammarFormat::Gbnf => xpu_minilang::grammar::Dialect::Gbnf,
                GrammarFormat::Lark => xpu_minilang::grammar::Dialect::Lark,
            };
            print!("{}", xpu_minilang::grammar::write(dialect));
        }
        MinilangCommand::Reference => println!("{}", xpu_assistant::prompt::language_reference()),
    }
    Ok(())
}

#[derive(clap::Subcommand)]
pub enum MinilangCommand {
    /// MiniLang's grammar for constrained decoding: GBNF (llama.cpp's `grammar`) or Lark
    /// (Outlines, llguidance, Python's lark; start rule `program`).
    Grammar {
        #[arg(long, value_enum, default_value_t = GrammarFormat::Gbnf)]
        format: GrammarFormat,
    },
    /// The language reference `ask` gives a model, rendered from the builtin table.
    Reference,
}

#[derive(Copy, Clone, Debug, clap::ValueEnum)]
pub enum GrammarFormat {
    Gbnf,
    Lark,
}

/// Parses `--grammar auto|always|never`.
pub fn parse_grammar_mode(s: &str) -> Result<GrammarMode, String> {
    match s {
        "auto" => Ok(GrammarMode::Auto),
        "always" => Ok(GrammarMode::Always),
        "never" => Ok(GrammarMode::Never),
        other => Err(format!("expected auto, always or never, found {other:?}")),
    }
}
