//! `xpuctl ask "QUESTION" --data FILE …`: the assistant loop run locally, and `:ask` in the
//! REPL. The data files' schemas come from the table engine's own reader; each program the
//! model writes is checked and dry-run on a sample of the data ([`judge`]). With `--run`
//! the accepted program runs on the real data — unless it writes files, which takes
//! `--allow-writes` (the dry run wrote only into its scratch directory).

mod judge;
pub mod remote;
mod report;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use xpu_assistant::{AskError, AssistantConfig, DataFile, GrammarMode, Outcome};

use crate::{Format, Reported, UsageError};
use judge::DryRun;

/// What `xpuctl ask` was given.
#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct AskArgs {
    #[command(subcommand)]
    pub command: Option<AskCommand>,
    #[arg(required_unless_present = "accept")]
    pub question: Option<String>,
    /// Ask xpud (--server / $XPU_SERVER) instead: the model its [assistant] names, the data
    /// files under its data roots; the ask is stored there (`xpuctl explain ASK_ID`).
    #[arg(long)]
    pub from_server: bool,
    /// Keep the ask in this store directory (created if missing; xpud must not hold it):
    /// its accepted asks are the prompt's examples, and `--accept`, `ask stats` and
    /// `explain ASK_ID --store DIR` read it.
    #[arg(long, value_name = "DIR", conflicts_with = "from_server")]
    pub store: Option<PathBuf>,
    /// Make a stored ask (by its id, or the id of the run it started) an example that later
    /// prompts may show (xpud's, or with --store a local store's).
    #[arg(long, value_name = "ID", conflicts_with_all = ["question", "data", "run", "policy", "from_server"])]
    pub accept: Option<String>,
    /// A data file the question is about (CSV, XLSX, Parquet; inside the working
    /// directory, or with --from-server under the daemon's data roots): its columns and
    /// first rows go into the prompt.
    #[arg(long = "data", short = 'd')]
    pub data: Vec<PathBuf>,
    /// The policy the dry run and `--run` use.
    #[arg(long)]
    pub policy: Option<String>,
    /// Run the accepted program on the full data.
    #[arg(long)]
    pub run: bool,
    /// With --run, let the program write files (write_csv, write_parquet, write_npy, plot)
    /// into the working directory.
    #[arg(long, requires = "run")]
    pub allow_writes: bool,
    /// With --run, where the run's outputs go (as `xpuctl run --out`); by default a
    /// temporary directory, removed afterwards.
    #[arg(long, requires = "run")]
    pub out: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// A TOML file with an [assistant] table.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The chat-completions API base, e.g. http://127.0.0.1:8080/v1 ($XPU_ASK_ENDPOINT).
    #[arg(long)]
    pub endpoint: Option<String>,
    /// The model name ($XPU_ASK_MODEL).
    #[arg(long)]
    pub model: Option<String>,
    #[arg(long)]
    pub max_attempts: Option<u32>,
    /// Send MiniLang's grammar: auto (unless the endpoint refuses it), always, never.
    #[arg(long)]
    pub grammar: Option<GrammarMode>,
    /// Also write the whole answer (every attempt) as JSON to this file.
    #[arg(long)]
    pub save: Option<PathBuf>,
}

/// The configuration: `--config`'s `[assistant]`, then `XPU_ASK_*`, then flags. Every
/// problem with it is a usage error (exit 2).
fn config(args: &AskArgs) -> Result<AssistantConfig> {
    let usage = |e: AskError| anyhow!(UsageError(e.to_string()));
    let mut cfg = match &args.config {
        Some(p) => AssistantConfig::from_toml_file(p).map_err(usage)?,
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
    cfg.target().map_err(usage)?;
    Ok(cfg)
}

/// What an ask is given: the data files as the model sees them (one table engine reads
/// every schema) and the judge of its programs, with the policy's path resolved once.
fn prepare(
    cfg: &AssistantConfig,
    cwd: PathBuf,
    data: Vec<PathBuf>,
    policy: Option<String>,
) -> Result<(Vec<DataFile>, DryRun)> {
    let engine = xpu_engine_table::TableEngine::new(vec![cwd.clone()]);
    let files = data
        .iter()
        .map(|p| xpu_ask_data::describe(&engine, &cwd, p, cfg.send_rows))
        .collect::<Result<_, String>>()
        .map_err(|m| anyhow!("--data {m}"))?;
    let judge = DryRun {
        exe: std::env::current_exe().context("finding xpuctl itself")?,
        policy: policy.map(|p| judge::policy_path(&cwd, &p)),
        cwd,
        data,
        rows: cfg.dry_run_rows,
        limit: Duration::from_secs_f64(cfg.dry_run_s),
        pristine: Default::default(),
        checked_writes: Default::default(),
    };
    // Written now: a file that cannot be sampled is the user's to fix, not the model's.
    judge.pristine().map_err(|e| anyhow!(UsageError(format!("--data: {e:#}"))))?;
    Ok((files, judge))
}

/// `xpuctl ask stats`.
#[derive(clap::Subcommand)]
pub enum AskCommand {
    /// The loop's figures from xpud's store, per model and day: first replies that parsed,
    /// checked and ran, answers after feedback, attempts and tokens per answer.
    Stats {
        /// Read this store directory instead of asking xpud.
        #[arg(long, value_name = "DIR")]
        store: Option<PathBuf>,
        /// Only the last N days (1–36500).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=36_500))]
        days: Option<u32>,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
}

pub fn ask(args: AskArgs, server: Option<&str>) -> Result<()> {
    let connect = || -> Result<crate::client::Client> {
        Ok(crate::client::Client::new(crate::client::server_url(server)?))
    };
    let open = |dir: &Path| xpu_store::Store::open(dir).map_err(anyhow::Error::from);
    if let Some(AskCommand::Stats { store, days, format }) = &args.command {
        return match store {
            Some(dir) => remote::stats(remote::Keeper::Store(&open(dir)?), *days, *format),
            None => remote::stats(remote::Keeper::Server(&connect()?), *days, *format),
        };
    }
    if let Some(id) = &args.accept {
        return match &args.store {
            Some(dir) => remote::accept(remote::Keeper::Store(&open(dir)?), id, args.format),
            None => remote::accept(remote::Keeper::Server(&connect()?), id, args.format),
        };
    }
    let question = args.question.clone().unwrap_or_default();
    if args.from_server {
        return remote::ask(&connect()?, &args, &question);
    }
    let cfg = config(&args)?;
    let store = args.store.as_deref().map(open).transpose()?;
    let cwd = std::env::current_dir().context("the working directory")?;
    let data = args.data.iter().map(|p| data_path(&cwd, p)).collect::<Result<Vec<_>>>()?;
    let (files, judge) = prepare(&cfg, cwd, data.clone(), args.policy.clone())?;
    let (examples, example_ids) = match &store {
        Some(s) => examples(s, &question, &files, cfg.examples)?,
        None => (Vec::new(), Vec::new()),
    };
    let started_us = xpu_ask_data::record::now_us();
    let request = xpu_assistant::Request { question: &question, data: &files, examples: &examples };
    let answer = xpu_assistant::ask(&cfg, &request, &judge).map_err(|e| match e {
        AskError::NotConfigured(_) | AskError::Config(_) => anyhow!(UsageError(e.to_string())),
        other => anyhow!(other),
    })?;
    let run = match (&answer.program, args.run) {
        (Some(program), true) => Some(run_answer(&judge, program, &args)?),
        _ => None,
    };
    let mut record = serde_json::to_value(&answer)?;
    if let Some(r) = &run {
        record["run"] = r.clone();
    }
    if let Some(store) = &store {
        let meta = xpu_ask_data::record::AskMeta {
            ask_id: xpu_ask_data::record::new_ask_id(),
            tenant: None,
            question: question.clone(),
            data: data.iter().map(|p| p.to_string_lossy().into_owned()).collect(),
            policy: args.policy.clone(),
            model: answer.model.clone(),
            endpoint: answer.endpoint.clone(),
            created_us: started_us,
        };
        let refused = run.as_ref().and_then(|r| r["refused"].as_str()).map(str::to_string);
        let kept =
            xpu_ask_data::record::answered(&meta, &answer, &files, &example_ids, None, refused);
        store.record_ask(&kept)?;
        record["ask_id"] = serde_json::json!(meta.ask_id);
        record["examples"] = serde_json::json!(example_ids);
    }
    if let Some(path) = &args.save {
        std::fs::write(path, serde_json::to_vec_pretty(&record)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    match args.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&record)?),
        Format::Text => {
            report::print_answer(&answer, run.as_ref());
            if let Some(id) = record["ask_id"].as_str() {
                println!("\nstored as {id} (xpuctl explain {id} --store DIR)");
            }
        }
    }
    let ran = run.as_ref().is_none_or(|r| r["exit_code"] == 0);
    if answer.outcome == Outcome::Accepted && ran { Ok(()) } else { Err(Reported.into()) }
}

/// The accepted asks of `store` most like this question over these files, as the prompt's
/// examples, and their ids.
fn examples(
    store: &xpu_store::Store,
    question: &str,
    files: &[DataFile],
    n: usize,
) -> Result<(Vec<xpu_assistant::Example>, Vec<String>)> {
    let topic = format!("{question}\n{}", xpu_ask_data::schema_text(files));
    let found = store.ask_examples(&topic, xpu_store::Scope::All, n)?;
    let ids = found.iter().map(|e| e.ask_id.clone()).collect();
    let examples = found
        .into_iter()
        .map(|e| xpu_assistant::Example { question: e.question, program: e.program })
        .collect();
    Ok((examples, ids))
}

/// A `--data` path as the program must name it: inside the working directory (the data
/// root), relative to it, without `..` — so the dry run's sample lands inside its scratch
/// directory and the model is told the path that resolves there.
fn data_path(cwd: &Path, path: &Path) -> Result<PathBuf> {
    // An absolute path through a symlinked working directory names the same file as its
    // canonical form; `resolve_read` checks containment again either way.
    let canonical = path.is_absolute().then(|| path.canonicalize().ok()).flatten();
    let path = canonical.as_deref().unwrap_or(path);
    let text = path.to_str().ok_or_else(|| anyhow!("{}: not UTF-8", path.display()))?;
    let roots = xpu_minilang::paths::DataRoots::new([cwd.to_path_buf()]);
    let resolved =
        roots.resolve_read(text).map_err(|m| anyhow!(UsageError(format!("--data {text}: {m}"))))?;
    let root = cwd.canonicalize().context("the working directory")?;
    let rel = resolved.strip_prefix(&root).map_err(|_| {
        anyhow!(UsageError(format!("--data {text}: not inside {}", root.display())))
    })?;
    anyhow::ensure!(resolved.is_file(), UsageError(format!("--data {text}: not a file")));
    Ok(rel.to_path_buf())
}

/// Runs the accepted program on the real data: what it prints goes to the terminal (text)
/// or into the answer (`run`: exit code, stdout, stderr), its output files into `--out`.
/// A program that writes files runs only with `--allow-writes`.
fn run_answer(judge: &DryRun, program: &str, args: &AskArgs) -> Result<serde_json::Value> {
    // What `check` lowered: an accepted program checked clean on the sample.
    let Some(writes) = judge.writes_of(program) else {
        let why = "what the program writes is unknown (it was not checked)".to_string();
        return Ok(serde_json::json!({ "exit_code": null, "refused": why }));
    };
    if !writes.is_empty() && !args.allow_writes {
        let why = format!(
            "the program writes files ({}); --allow-writes lets it write into {}",
            writes.join(", "),
            judge.cwd.display()
        );
        return Ok(serde_json::json!({ "exit_code": null, "refused": why }));
    }
    let dir = tempfile::tempdir()?;
    let prog = dir.path().join("answer.ml");
    std::fs::write(&prog, program)?;
    // The run's outputs go where --out says, else into the scratch directory: `run`'s
    // default `out/` would write into the working directory.
    let out_dir = args.out.clone().unwrap_or_else(|| dir.path().join("out"));
    let mut cmd = Command::new(&judge.exe);
    cmd.current_dir(&judge.cwd).arg("run").arg(&prog).arg("--out").arg(&out_dir);
    if let Some(p) = &judge.policy {
        cmd.arg("--policy").arg(p);
    }
    if args.format == Format::Json {
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

/// `:ask QUESTION` in the REPL: the table files the session's program names (inside the
/// working directory) go into the prompt; the endpoint comes from `XPU_ASK_*`. Writes the
/// attempts to `out` and answers the accepted program with the files it writes (as
/// lowering found them: unknown is `None`), which the REPL then runs as input — unless it
/// writes.
pub fn ask_in_repl(
    question: &str,
    session: &str,
    out: &mut impl std::io::Write,
) -> Result<Option<(String, Option<Vec<String>>)>> {
    let cfg = AssistantConfig::default().with_env();
    if let Err(e) = cfg.validate().map_err(AskError::Config).and_then(|()| cfg.target().map(drop)) {
        writeln!(out, "{e}")?;
        return Ok(None);
    }
    let cwd = std::env::current_dir().context("the working directory")?;
    let data: Vec<PathBuf> =
        files_named(session).iter().filter_map(|p| data_path(&cwd, p).ok()).collect();
    let (files, judge) = prepare(&cfg, cwd, data, None)?;
    let request = xpu_assistant::Request { question, data: &files, examples: &[] };
    let answer = xpu_assistant::ask(&cfg, &request, &judge)?;
    for line in report::attempt_lines(&answer) {
        writeln!(out, "{line}")?;
    }
    if answer.program.is_none() {
        writeln!(out, "no program: {}", answer.error.as_deref().unwrap_or(""))?;
    }
    Ok(answer.program.map(|p| {
        let writes = judge.writes_of(&p);
        (p, writes)
    }))
}

/// The string literals of a program that name table files, in order, each once.
fn files_named(src: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for (tok, _) in xpu_minilang::lexer::lex(src) {
        let xpu_minilang::lexer::Tok::Str(raw) = tok else { continue };
        let p = PathBuf::from(raw.trim_matches('"'));
        if xpu_ask_data::table_op(&p).is_some() && !out.contains(&p) {
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
