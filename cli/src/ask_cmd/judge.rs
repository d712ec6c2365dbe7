//! The judge of `xpuctl ask`: every program the model writes is checked and dry-run in a
//! scratch directory holding a sample of the data — CSV files cut to their header and first
//! `dry_run_rows` records, other files copied — which is the program's only data root.
//! Both steps run as child processes of this same binary (`xpuctl check --format json`,
//! then `xpuctl run`), killed past `dry_run_s` or the ask's deadline: lowering evaluates
//! the program at compile time (loops unroll), so it is as untrusted as running it.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use xpu_assistant::session::{Finding, Stage, Verdict, stage_of};

/// Checks and dry-runs programs on a sample of the data.
pub(super) struct DryRun {
    pub exe: PathBuf,
    pub cwd: PathBuf,
    /// The data files, relative to `cwd` without `..` (see `super::data_path`).
    pub data: Vec<PathBuf>,
    /// The job's policy: a name, or a path resolved against `cwd` (`policy_path`).
    pub policy: Option<String>,
    pub rows: usize,
    pub limit: Duration,
    /// The sample as written once; each attempt runs on a copy of it (a program that
    /// overwrites a file it reads cannot change what the next attempt sees).
    pub pristine: std::cell::OnceCell<tempfile::TempDir>,
    /// The files the last program that checked clean writes, as `check` lowered it
    /// (`None`: check did not say, so what it writes is unknown).
    pub checked_writes: std::cell::RefCell<Option<(String, Option<Vec<String>>)>>,
}

/// What a finished child process left.
struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl DryRun {
    /// The sample, written once (on the first call): each file at its relative path.
    pub fn pristine(&self) -> Result<&tempfile::TempDir> {
        if let Some(p) = self.pristine.get() {
            return Ok(p);
        }
        let dir = tempfile::tempdir().context("a scratch directory for the sample")?;
        let rels: Vec<&Path> = self.data.iter().map(PathBuf::as_path).collect();
        xpu_ask_data::write_sample(&self.cwd, &rels, dir.path(), self.rows)
            .map_err(|m| anyhow::anyhow!(m))?;
        Ok(self.pristine.get_or_init(|| dir))
    }

    /// A scratch directory holding a copy of the sample, each file at its relative path.
    fn sample(&self) -> Result<tempfile::TempDir> {
        let pristine = self.pristine()?;
        let dir = tempfile::tempdir().context("a scratch directory for the dry run")?;
        xpu_ask_data::copy_tree(pristine.path(), dir.path()).map_err(|m| anyhow::anyhow!(m))?;
        Ok(dir)
    }

    /// The files `program` writes (relative to the data root), if it checked clean.
    pub fn writes_of(&self, program: &str) -> Option<Vec<String>> {
        let last = self.checked_writes.borrow();
        last.as_ref().filter(|(p, _)| p == program).and_then(|(_, w)| w.clone())
    }

    /// Runs `xpuctl ARGS` in `dir` until it ends or `deadline`; `None` when it was killed.
    fn child(&self, dir: &Path, args: &[&str], deadline: Instant) -> Result<Option<Finished>> {
        let (out, err) = (dir.join(".stdout"), dir.join(".stderr"));
        let mut cmd = Command::new(&self.exe);
        cmd.current_dir(dir).args(args);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out)?)
            .stderr(std::fs::File::create(&err)?)
            .spawn()
            .context("starting xpuctl for the dry run")?;
        let Some(status) = wait_until(&mut child, deadline)? else { return Ok(None) };
        // `check`'s report holds every diagnostic (a wide table's did-you-mean is long);
        // `run`'s output is only echoed.
        let cap = if args.first() == Some(&"check") { 1 << 20 } else { 8192 };
        Ok(Some(Finished {
            status,
            stdout: read_capped(&out, cap),
            stderr: read_capped(&err, 8192),
        }))
    }

    /// `xpuctl check --format json`: parse, names, and lowering against the sample.
    fn check(&self, program: &str, dir: &Path, deadline: Instant) -> Result<Verdict> {
        let Some(done) = self.child(dir, &["check", "answer.ml", "--format", "json"], deadline)?
        else {
            return Ok(timed_out("checking", self.limit));
        };
        let report: serde_json::Value = serde_json::from_str(&done.stdout)
            .with_context(|| format!("xpuctl check answered no report: {}", done.stderr.trim()))?;
        if done.status.success() {
            let root = dir.canonicalize()?;
            // `writes` is null when check did not lower the program: unknown, not none.
            let writes = report["writes"].as_array().map(|list| {
                list.iter()
                    .filter_map(|w| w.as_str())
                    .map(|w| {
                        let p = Path::new(w);
                        p.strip_prefix(&root).unwrap_or(p).display().to_string()
                    })
                    .collect()
            });
            *self.checked_writes.borrow_mut() = Some((program.to_string(), writes));
            return Ok(Verdict::default());
        }
        let diags = report["diagnostics"].as_array().cloned().unwrap_or_default();
        let errors: Vec<&serde_json::Value> =
            diags.iter().filter(|d| d["severity"] == "error").collect();
        if errors.is_empty() {
            // It failed without saying why in its report: not the program's diagnostics.
            let why = format!("xpuctl check failed: {}", done.stderr.trim());
            return Ok(failed(why, "check_failed"));
        }
        let findings = errors.iter().map(|d| diagnostic_finding(d)).collect();
        let feedback = errors.iter().map(|d| render(program, d)).collect::<Vec<_>>().join("\n");
        Ok(Verdict { findings, feedback, dry_run: None })
    }

    /// `xpuctl run` on the sample, under the job's policy.
    fn run(&self, dir: &Path, deadline: Instant) -> Result<Verdict> {
        let mut args = vec!["run", "answer.ml", "--out", ".out"];
        if let Some(p) = &self.policy {
            args.extend(["--policy", p]);
        }
        let Some(done) = self.child(dir, &args, deadline)? else {
            return Ok(timed_out("running", self.limit));
        };
        if done.status.success() {
            return Ok(Verdict { dry_run: Some(done.stdout), ..Verdict::default() });
        }
        Ok(failed(done.stderr.trim().trim_start_matches("error: ").to_string(), "run_failed"))
    }
}

impl xpu_assistant::Judge for DryRun {
    fn judge(&self, program: &str, deadline: Instant) -> Verdict {
        let deadline = deadline.min(Instant::now() + self.limit);
        let verdict = (|| {
            let dir = self.sample()?;
            std::fs::write(dir.path().join("answer.ml"), program)?;
            let checked = self.check(program, dir.path(), deadline)?;
            if !checked.ok() {
                return Ok(checked);
            }
            self.run(dir.path(), deadline)
        })();
        verdict.unwrap_or_else(|e: anyhow::Error| failed(format!("{e:#}"), "dry_run"))
    }
}

fn diagnostic_finding(d: &serde_json::Value) -> Finding {
    let code = d["code"].as_str().unwrap_or("");
    Finding {
        stage: stage_of(code),
        code: code.to_string(),
        message: d["message"].as_str().unwrap_or("").to_string(),
        line: d["line"].as_u64().map(|v| v as usize),
        col: d["col"].as_u64().map(|v| v as usize),
        help: d["help"].as_str().map(str::to_string),
    }
}

/// A diagnostic as the model reads it: `line:col: error[CODE]: message`, the source line
/// with a caret under the column, and the help.
fn render(program: &str, d: &serde_json::Value) -> String {
    let line = d["line"].as_u64().unwrap_or(0) as usize;
    let col = d["col"].as_u64().unwrap_or(1) as usize;
    let mut out = format!(
        "answer.ml:{line}:{col}: error[{}]: {}",
        d["code"].as_str().unwrap_or(""),
        d["message"].as_str().unwrap_or("")
    );
    if let Some(src) = program.lines().nth(line.saturating_sub(1)) {
        let label = d["label"].as_str().unwrap_or("");
        out.push_str(&format!("\n  | {src}\n  | {}^ {label}", " ".repeat(col.saturating_sub(1))));
    }
    if let Some(help) = d["help"].as_str() {
        out.push_str(&format!("\n  = help: {help}"));
    }
    out
}

fn timed_out(what: &str, limit: Duration) -> Verdict {
    let message = format!("{what} the program did not finish in {:.1} s", limit.as_secs_f64());
    failed(message, "timeout")
}

fn failed(message: String, code: &str) -> Verdict {
    let feedback = format!("The dry run on the first rows of the data failed:\n{message}");
    Verdict { findings: vec![Finding::new(Stage::DryRun, code, message)], feedback, dry_run: None }
}

/// A policy named by path is relative to where `ask` runs, not to the scratch directory.
pub(super) fn policy_path(cwd: &Path, p: &str) -> String {
    let candidate = cwd.join(p);
    if candidate.exists() { candidate.to_string_lossy().into_owned() } else { p.to_string() }
}

/// Waits for the child until `deadline`; past it, kills it and answers `None`.
fn wait_until(child: &mut std::process::Child, deadline: Instant) -> Result<Option<ExitStatus>> {
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

fn read_capped(path: &Path, cap: usize) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    String::from_utf8_lossy(&bytes[..bytes.len().min(cap)]).into_owned()
}
