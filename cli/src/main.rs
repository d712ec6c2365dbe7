//! `xpuctl`: the xpu command line. Runs SGR-ML or ONNX programs locally on the CPU engine,
//! prints, optimises, imports and exports IR, and lists engines. Exit codes: 0 ok,
//! 1 program/run/check error, 2 usage error.

mod ask_cmd;
mod client;
mod lir_cmd;
mod policy_cmd;
mod program;
mod repl;
mod tune_cmd;

use xpu_runtime::tensors;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use xpu_ir::Tensor;
use xpu_plan::GraphExec;

#[derive(Parser)]
#[command(name = "xpuctl", version, about = "xpu: run, inspect and explain ML and data jobs")]
struct Cli {
    /// The xpud to talk to (client commands); default: $XPU_SERVER. The token comes from
    /// $XPU_TOKEN.
    #[arg(long, global = true)]
    server: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    Text,
    Json,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum InventoryFormat {
    Text,
    Json,
    Toml,
}

/// The engines this build registers; the table engine may touch files only in the working
/// directory.
pub(crate) fn registry() -> xpu_engine::Registry {
    xpu_runtime::registry_for(&[std::env::current_dir().unwrap_or_else(|_| ".".into())])
}

/// Plans a graph under the built-in default policy on this build's engines and runs it.
pub(crate) fn run_default(g: xpu_ir::Graph, roots: &[PathBuf]) -> Result<Vec<xpu_ir::Tensor>> {
    let registry = xpu_runtime::registry_for(roots);
    let policy = policy_cmd::load_policy(None, &[])?;
    let g = std::sync::Arc::new(g);
    let eval = xpu_runtime::fold_evaluator();
    let (plan, _) = xpu_plan::plan_shared(
        &g,
        &g.content_hash(),
        &policy,
        &registry.inventory(),
        &Default::default(),
        Some(eval.as_ref()),
    )
    .map_err(|f| anyhow::anyhow!("no plan: {f}"))?;
    let mut exec = GraphExec::new(std::sync::Arc::new(plan), &registry)?;
    Ok(exec.run(&[])?.outputs)
}

#[derive(Subcommand)]
enum Command {
    /// Plan a program under a policy, run the plan on this machine's engines and write its
    /// outputs as .npy.
    Run {
        program: PathBuf,
        /// Policy file or name (looked up in $XPU_POLICY_PATH, then policies/examples);
        /// default: the built-in defaults.
        #[arg(long)]
        policy: Option<String>,
        /// Job-level override of a key the policy marks overridable: KEY=VALUE.
        #[arg(long = "set")]
        set: Vec<String>,
        /// Job label KEY=VALUE; without --policy, the policy whose `match.labels` fit best
        /// (most specific, then priority) among $XPU_POLICY_PATH and policies/examples.
        #[arg(long = "label", conflicts_with = "policy")]
        labels: Vec<String>,
        /// Print the explanation: every node's engine, kernel, precision and the rule that chose it.
        #[arg(long)]
        explain: bool,
        /// Replay a frozen plan (`policy resolve --plan-out`) instead of planning; the program
        /// must be the one it was made for.
        #[arg(long, conflicts_with_all = ["policy", "set", "labels"])]
        plan: Option<PathBuf>,
        /// An input: NAME=PATH (.npy, .pb, or .csv for a table), or PATH.pb (the name comes
        /// from the proto).
        #[arg(long = "input", short = 'i')]
        inputs: Vec<String>,
        /// Directory for the outputs (created if missing).
        #[arg(long, default_value = "out")]
        out: PathBuf,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Run the engines that load native code (ort, openvino, llvm, cuda) in worker
        /// processes, as xpud does: a crash in one fails the run with its cause instead of
        /// killing xpuctl.
        #[arg(long)]
        isolate: bool,
    },
    /// Parse and verify a program; report every problem.
    Check {
        program: PathBuf,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// SGR-ML tools.
    #[command(subcommand)]
    Ir(IrCommand),
    /// Compile a whole program ahead of time: for riscv64 a static executable with its
    /// manifest and a `run` script (`DIR/run --input NAME=FILE.npy ... --out OUTDIR`); for
    /// cuda each generated kernel's CUDA C++ and PTX (NVRTC, for --arch) and a manifest.
    Build {
        program: PathBuf,
        /// The board's target (riscv64: rv64gc, lp64d).
        #[arg(long, value_enum)]
        target: lir_cmd::BuildTarget,
        #[arg(long)]
        policy: Option<String>,
        /// Bind a symbolic dim: N=64 (a build is compiled for concrete shapes).
        #[arg(long = "bind")]
        bind: Vec<String>,
        /// The riscv64 ISA: rv64gc (scalar), or rv64gcv (RVV 1.0: loops vectorised with
        /// scalable vectors; the program refuses to start on a CPU without V).
        #[arg(long, default_value = "rv64gc")]
        cpu: xpu_engine::RiscvCpu,
        /// The same as `--cpu rv64gcv`.
        #[arg(long, hide = true)]
        vector: bool,
        /// The GPU architecture of a cuda build (sm_80, sm_90, ...).
        #[arg(long, default_value = "sm_90")]
        arch: String,
        #[arg(short, long)]
        output: PathBuf,
    },
    /// List the engines of this build and what they can run (`--format toml` writes the live
    /// inventory, the form `--inventory` files take).
    Engines {
        #[arg(long, value_enum, default_value_t = InventoryFormat::Text)]
        format: InventoryFormat,
        /// Ask the daemon (--server / $XPU_SERVER) for its engines instead.
        #[arg(long)]
        remote: bool,
    },
    /// Policies in CI: check, test, resolve, diff.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Measure every candidate the policy allows per node on this machine and write the
    /// winners to a lock file beside the policy (P.lock.toml), for `choose = "measured"`.
    Tune {
        program: PathBuf,
        /// The policy file (the lock is written beside it).
        #[arg(long)]
        policy: String,
        /// An input: NAME=PATH; float inputs of known shape not given are generated.
        #[arg(long = "input", short = 'i')]
        inputs: Vec<String>,
        /// Timed runs per plan in each measurement (after --warmup runs; rounded up to whole
        /// rounds of up to five): the candidates, all plans side by side, then the finals.
        #[arg(long, default_value_t = 10)]
        runs: u32,
        #[arg(long, default_value_t = 3)]
        warmup: u32,
        /// Where to write the lock (default: beside the policy, P.lock.toml).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Run every engine in this process instead of in worker processes as xpud does.
        #[arg(long)]
        in_process: bool,
        /// Measure and report, write nothing.
        #[arg(long)]
        dry_run: bool,
        /// How much faster (percent, round by round) than the policy's static plan another
        /// plan must run to be locked instead: below it the lock confirms the static choices.
        #[arg(long, default_value_t = 3.0, value_parser = parse_gain)]
        min_gain: f64,
    },
    /// Per node of a program: its candidates under the policy and the figures the policy's
    /// evidence ([measured] lock, or with --from-server xpud's store) has for them.
    Evidence {
        program: PathBuf,
        #[arg(long)]
        policy: String,
        /// Read the figures xpud's store holds (every run it stored on its machine: samples,
        /// median, p90, last run) instead of the policy's lock; --server or XPU_SERVER.
        #[arg(long)]
        from_server: bool,
        /// Symbol bindings NAME=SIZE for shapes the program leaves open.
        #[arg(long = "bind")]
        bind: Vec<String>,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// MiniLang interactively: statements accumulate, bare expressions print their value.
    Repl,
    /// Submit a job to xpud (a progress spinner while --wait waits).
    Submit {
        program: PathBuf,
        /// PROGRAM is a path under one of the server's model_roots, read there (for models
        /// larger than the server's request limit); nothing is uploaded.
        #[arg(long)]
        on_server: bool,
        /// An input: NAME=PATH.npy, NAME=PATH.pb, NAME=PATH.csv (a table), or PATH.pb (named
        /// by its proto).
        #[arg(long = "input", short = 'i')]
        inputs: Vec<String>,
        /// A policy name known to the daemon, or a local FILE.toml sent inline.
        #[arg(long)]
        policy: Option<String>,
        /// Job label KEY=VALUE.
        #[arg(long = "label")]
        labels: Vec<String>,
        /// Wait until the run is stored and explainable.
        #[arg(long)]
        wait: bool,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// A run's status and outputs.
    Status {
        run: String,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Runs, newest first.
    List {
        #[arg(long)]
        status: Option<String>,
        #[arg(long)]
        policy: Option<String>,
        #[arg(long = "label")]
        labels: Vec<String>,
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// The `more: --cursor N` of the previous page.
        #[arg(long)]
        cursor: Option<String>,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Cancel a queued or running job.
    Cancel {
        run: String,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Why every node of a run ran where it did (from xpud, or offline from --store DIR).
    Explain {
        run: String,
        /// Only this node (id `n3` or name).
        #[arg(long)]
        node: Option<String>,
        /// Compare with another run: the nodes whose engine, kernel or precision differ.
        #[arg(long)]
        diff: Option<String>,
        /// Read a store directory directly (the daemon must not hold it).
        #[arg(long)]
        store: Option<PathBuf>,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Full-text search over stored runs (words, "phrases", field:value).
    Search {
        query: String,
        #[arg(long, default_value_t = 20)]
        limit: usize,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Read-only SQL over the store (admin token).
    Sql {
        query: String,
        #[arg(long, default_value_t = 100)]
        limit: usize,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Run a stored run again with its program, inputs and policy.
    Replay {
        run: String,
        /// Check that every output is byte-identical to the original's (exit 1 if not).
        #[arg(long)]
        verify: bool,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// The daemon's policies.
    Policies {
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Store maintenance.
    #[command(subcommand)]
    Admin(AdminCommand),
    /// Print a shell completion script.
    Completions { shell: clap_complete::Shell },
    /// Ask for a MiniLang program in plain language: an OpenAI-compatible LLM writes it,
    /// xpu parses, checks and dry-runs it on a sample of the data and feeds every problem
    /// back until it passes (docs/ask.md). Exit 0 with a program, 1 without, 2 when no
    /// endpoint is configured.
    Ask(ask_cmd::AskArgs),
    /// MiniLang's grammar and language reference, as tools and models get them.
    #[command(subcommand)]
    Minilang(ask_cmd::MinilangCommand),
}

#[derive(Subcommand)]
enum AdminCommand {
    /// Rebuild the search index of a store directory from its database (xpud stopped).
    Reindex {
        #[arg(long, default_value = "var")]
        data_dir: PathBuf,
    },
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Validate policy files (directories expand to their *.toml): structure always, and
    /// against an inventory with --inventory FILE|live.
    Check {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        #[arg(long)]
        inventory: Option<PathBuf>,
        #[arg(long, value_enum, default_value_t = policy_cmd::ReportFormat::Text)]
        format: policy_cmd::ReportFormat,
    },
    /// Run every [[test]] placement assertion of the policies.
    Test {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        #[arg(long, value_enum, default_value_t = policy_cmd::ReportFormat::Text)]
        format: policy_cmd::ReportFormat,
    },
    /// Print the plan a policy gives a program: node, op, engine, kernel, precision, rule.
    Resolve {
        #[arg(long)]
        policy: String,
        program: PathBuf,
        /// Declared inventory file (default: this machine's live inventory).
        #[arg(long)]
        inventory: Option<PathBuf>,
        /// Bind a symbolic dim: N=64.
        #[arg(long = "bind")]
        bind: Vec<String>,
        /// Job-level override: KEY=VALUE (only keys the policy marks overridable).
        #[arg(long = "set")]
        set: Vec<String>,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Also list every rejected candidate with its reason code.
        #[arg(long)]
        why: bool,
        /// Write the plan and its explanation to FILE, to replay with `xpuctl run --plan`.
        #[arg(long)]
        plan_out: Option<PathBuf>,
    },
    /// Show which node decisions change between two versions of a policy.
    Diff {
        old: PathBuf,
        new: PathBuf,
        #[arg(required = true)]
        programs: Vec<PathBuf>,
        #[arg(long)]
        inventory: Option<PathBuf>,
        /// Exit 1 when any decision changes.
        #[arg(long)]
        fail_on_change: bool,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
}

#[derive(Subcommand)]
enum IrCommand {
    /// Print a program as SGR-ML text (or JSON).
    Print {
        program: PathBuf,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Run passes over a program and print the result (and optionally the memory plan).
    Opt {
        program: PathBuf,
        /// Comma-separated passes (fold, dce, cse, canon, fuse); default: canon,fold,cse,dce,fuse.
        #[arg(long, value_delimiter = ',')]
        passes: Option<Vec<String>>,
        /// Also print the memory plan (liveness, buffer reuse, peak bytes).
        #[arg(long)]
        memory: bool,
        /// Bind a symbolic dim for the memory plan: N=64.
        #[arg(long = "bind")]
        bind: Vec<String>,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Import an ONNX model into SGR-ML (.sgr text or .json by the output's extension).
    Import {
        model: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Export a program to ONNX.
    Export {
        program: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
    },
    /// The LIR-ML of each partition the llvm engine would run (planned under --policy, by
    /// default llvm first), or with --emit what LLVM makes of it for this machine.
    Lir {
        program: PathBuf,
        #[arg(long)]
        policy: Option<String>,
        /// Bind a symbolic dim: N=64 (kernels are compiled for concrete shapes).
        #[arg(long = "bind")]
        bind: Vec<String>,
        #[arg(long, value_enum, default_value_t = lir_cmd::LirEmit::Lir)]
        emit: lir_cmd::LirEmit,
    },
}

/// A failure already reported on stdout (failed checks, tests, plans): exit 1, no more text.
#[derive(Debug)]
pub(crate) struct Reported;

impl std::fmt::Display for Reported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("failed")
    }
}

impl std::error::Error for Reported {}

/// An error in how xpuctl was invoked (exit code 2).
#[derive(Debug)]
pub(crate) struct UsageError(pub(crate) String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

pub(crate) fn usage(msg: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(UsageError(msg.into()))
}

fn main() -> ExitCode {
    // Like cat or grep, end quietly when the reader of our output goes away
    // (`xpuctl run job.ml | head`); Rust's default turns that into a panic on the next print.
    #[cfg(unix)]
    // SAFETY: done first, before any thread exists; SIG_DFL is a valid disposition.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // SAFETY: still before any thread exists.
    unsafe { xpu_engine_cpu::quiet_blas_threads() };
    // Panics are caught below and reported as one-line errors; keep the raw panic text (and
    // backtrace) off the terminal.
    std::panic::set_hook(Box::new(|_| {}));
    let cli = Cli::parse();
    // Engines turn their own panics into errors; anything else that panics ends here.
    let result =
        std::panic::catch_unwind(|| dispatch(cli.command, cli.server)).unwrap_or_else(|p| {
            let what = xpu_engine::panic_message(&*p);
            Err(anyhow::anyhow!("internal error (please report): {what}"))
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<Reported>().is_some() => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            if e.downcast_ref::<UsageError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}

fn dispatch(cmd: Command, server: Option<String>) -> Result<()> {
    let connect = || -> Result<client::Client> {
        Ok(client::Client::new(client::server_url(server.as_deref())?))
    };
    match cmd {
        Command::Run {
            program,
            policy,
            set,
            labels,
            explain,
            plan,
            inputs,
            out,
            format,
            isolate,
        } => run(
            &program,
            policy.as_deref(),
            &labels,
            &set,
            explain,
            plan.as_deref(),
            &inputs,
            &out,
            format,
            isolate,
        ),
        Command::Tune {
            program,
            policy,
            inputs,
            runs,
            warmup,
            out,
            in_process,
            dry_run,
            min_gain,
        } => tune_cmd::tune(&tune_cmd::TuneArgs {
            program: &program,
            policy: &policy,
            inputs: &inputs,
            runs,
            warmup,
            out: out.as_deref(),
            in_process,
            dry_run,
            min_gain: min_gain / 100.0,
        }),
        Command::Evidence { program, policy, from_server, bind, format } => {
            let client = if from_server { Some(connect()?) } else { None };
            tune_cmd::evidence(&program, &policy, &bind, client.as_ref(), format == Format::Json)
        }
        Command::Policy(cmd) => {
            let ok = match cmd {
                PolicyCommand::Check { paths, inventory, format } => {
                    policy_cmd::check(&paths, inventory.as_deref(), format)?
                }
                PolicyCommand::Test { paths, format } => policy_cmd::test(&paths, format)?,
                PolicyCommand::Resolve {
                    policy,
                    program,
                    inventory,
                    bind,
                    set,
                    format,
                    why,
                    plan_out,
                } => policy_cmd::resolve(
                    &policy,
                    &program,
                    inventory.as_deref(),
                    &bind,
                    &set,
                    format == Format::Json,
                    why,
                    plan_out.as_deref(),
                )?,
                PolicyCommand::Diff { old, new, programs, inventory, fail_on_change, format } => {
                    policy_cmd::diff(
                        &old,
                        &new,
                        &programs,
                        inventory.as_deref(),
                        fail_on_change,
                        format == Format::Json,
                    )?
                }
            };
            if ok { Ok(()) } else { Err(Reported.into()) }
        }
        Command::Check { program, format } if program::is_minilang(&program) => {
            let ok = program::check_minilang(&program, format == Format::Json)?;
            if ok { Ok(()) } else { Err(Reported.into()) }
        }
        Command::Check { program, format } => {
            let g = program::load(&program)?;
            match format {
                Format::Text => println!(
                    "{}: ok ({} inputs, {} nodes, {} outputs)",
                    program.display(),
                    g.inputs.len(),
                    g.nodes.len(),
                    g.outputs.len()
                ),
                Format::Json => println!(
                    "{}",
                    serde_json::json!({"program": program, "ok": true, "inputs": g.inputs.len(), "nodes": g.nodes.len(), "outputs": g.outputs.len()})
                ),
            }
            Ok(())
        }
        Command::Engines { format, remote } if remote => {
            let f = if format == InventoryFormat::Json { Format::Json } else { Format::Text };
            client::engines(&connect()?, f)
        }
        Command::Engines { format, .. } => {
            let inv = registry().inventory();
            match format {
                InventoryFormat::Json => println!("{}", serde_json::to_string_pretty(&inv)?),
                InventoryFormat::Toml => print!("{}", inv.to_toml()),
                InventoryFormat::Text => {
                    for e in &inv.engines {
                        let devices: Vec<String> = e
                            .devices
                            .iter()
                            .map(|d| match d.name.as_str() {
                                "" => d.id.to_string(),
                                vendor => format!("{} ({vendor})", d.id),
                            })
                            .collect();
                        let on = if devices.is_empty() {
                            String::new()
                        } else {
                            format!(" — devices: {}", devices.join(", "))
                        };
                        println!("{} {} — {}{on}", e.engine, e.version, e.availability);
                        for k in &e.kernels {
                            let mut runs = Vec::new();
                            if !k.ops.is_empty() {
                                runs.push(format!("{} ops", k.ops.len()));
                            }
                            if !k.classes.is_empty() {
                                runs.push(format!("{} op classes", k.classes.len()));
                            }
                            let kind = k
                                .device_kind()
                                .map(|kind| format!(", on {kind}"))
                                .unwrap_or_default();
                            let narrower: usize = k.op_dtypes.iter().map(|e| e.ops.len()).sum();
                            let narrower = if narrower > 0 {
                                format!(" ({narrower} ops take fewer)")
                            } else {
                                String::new()
                            };
                            println!(
                                "  {:<18} {}, dtypes {}{narrower}{kind}",
                                k.name,
                                runs.join(" + "),
                                k.dtypes.iter().map(|d| d.name()).collect::<Vec<_>>().join(" ")
                            );
                            if k.name == "cpu.blas" {
                                println!("    {}", k.description);
                            }
                            if let Some(why) = &k.degraded {
                                println!(
                                    "    degraded (the planner prefers another kernel): {why}"
                                );
                            }
                        }
                    }
                }
            }
            Ok(())
        }
        Command::Ir(ir) => ir_command(ir),
        Command::Build { program, target, policy, bind, cpu, vector, arch, output } => match target
        {
            lir_cmd::BuildTarget::Riscv64 => {
                let cpu = if vector { xpu_engine::RiscvCpu::Rv64gcv } else { cpu };
                lir_cmd::build(&program, policy.as_deref(), &bind, cpu, &output)
            }
            lir_cmd::BuildTarget::Cuda => {
                lir_cmd::build_cuda(&program, policy.as_deref(), &bind, &arch, &output)
            }
        },
        Command::Repl => repl::repl(),
        Command::Ask(args) => ask_cmd::ask(args, server.as_deref()),
        Command::Minilang(cmd) => ask_cmd::minilang(cmd),
        Command::Submit { program, on_server, inputs, policy, labels, wait, format } => {
            client::submit(
                &connect()?,
                &program,
                on_server,
                &inputs,
                policy.as_deref(),
                &labels,
                wait,
                format,
            )
        }
        Command::Status { run, format } => client::status(&connect()?, &run, format),
        Command::List { status, policy, labels, limit, cursor, format } => client::list(
            &connect()?,
            status.as_deref(),
            policy.as_deref(),
            &labels,
            limit,
            cursor.as_deref(),
            format,
        ),
        Command::Cancel { run, format } => client::cancel(&connect()?, &run, format),
        Command::Explain { run, node, diff, store, format } => {
            let c = if store.is_some() { None } else { Some(connect()?) };
            client::explain(
                c.as_ref(),
                store.as_ref(),
                &run,
                node.as_deref(),
                diff.as_deref(),
                format,
            )
        }
        Command::Search { query, limit, format } => {
            client::search(&connect()?, &query, limit, format)
        }
        Command::Sql { query, limit, format } => client::sql(&connect()?, &query, limit, format),
        Command::Replay { run, verify, format } => {
            client::replay(&connect()?, &run, verify, format)
        }
        Command::Policies { format } => client::policies(&connect()?, format),
        Command::Admin(AdminCommand::Reindex { data_dir }) => client::reindex(&data_dir),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "xpuctl", &mut std::io::stdout());
            Ok(())
        }
    }
}

fn print_graph(g: &xpu_ir::Graph, format: Format) {
    match format {
        Format::Text => print!("{}", xpu_ir::text::print(g)),
        Format::Json => println!("{}", xpu_ir::to_json(g)),
    }
}

fn ir_command(cmd: IrCommand) -> Result<()> {
    match cmd {
        IrCommand::Print { program, format } => {
            print_graph(&program::load(&program)?, format);
            Ok(())
        }
        IrCommand::Opt { program, passes, memory, bind, format } => {
            let mut g = program::load(&program)?;
            let passes = passes.unwrap_or_else(|| {
                xpu_ir::passes::DEFAULT_PIPELINE.iter().map(|s| s.to_string()).collect()
            });
            let eval = xpu_engine_cpu::CpuEvaluator;
            for p in &passes {
                g = xpu_ir::passes::run_pass(p, &g, Some(&eval))
                    .map_err(|e| usage(e.to_string()))?;
                if let Err(errs) = xpu_ir::verify(&g) {
                    bail!("internal error: pass `{p}` produced an invalid graph: {}", errs[0]);
                }
            }
            print_graph(&g, format);
            if memory {
                let mut bindings = BTreeMap::new();
                for b in &bind {
                    let (k, v) = b
                        .split_once('=')
                        .ok_or_else(|| usage(format!("--bind {b:?}: expected NAME=SIZE")))?;
                    let v: u64 = v.parse().map_err(|_| {
                        usage(format!("--bind {b:?}: SIZE must be a non-negative integer"))
                    })?;
                    bindings.insert(k.to_string(), v);
                }
                print!("{}", xpu_ir::passes::plan_memory(&g, &bindings));
            }
            Ok(())
        }
        IrCommand::Lir { program, policy, bind, emit } => {
            lir_cmd::run(&program, policy.as_deref(), &bind, emit)
        }
        IrCommand::Import { model, output } => {
            let g = program::load(&model)?;
            let text = match output.extension().and_then(|e| e.to_str()) {
                Some("json") => xpu_ir::to_json(&g),
                _ => xpu_ir::text::print(&g),
            };
            std::fs::write(&output, text)
                .with_context(|| format!("cannot write {}", output.display()))?;
            eprintln!("wrote {} ({} nodes)", output.display(), g.nodes.len());
            Ok(())
        }
        IrCommand::Export { program, output } => {
            let g = program::load(&program)?;
            if let Some(n) = g.nodes.iter().find(|n| n.op.class() == xpu_ir::OpClass::Table) {
                bail!(
                    "{}: table ops have no ONNX form ({} `{}`); export a tensor program",
                    program.display(),
                    n.op,
                    n.name.as_deref().unwrap_or("")
                );
            }
            std::fs::write(&output, xpu_onnx::export_model(&g))
                .with_context(|| format!("cannot write {}", output.display()))?;
            eprintln!("wrote {} (ONNX opset {})", output.display(), xpu_onnx::EXPORT_OPSET);
            Ok(())
        }
    }
}

/// Reads every `--input` file once: name → (the argument as given, the tensor).
pub(crate) fn read_inputs(args: &[String]) -> Result<BTreeMap<String, (String, Tensor)>> {
    let mut read: BTreeMap<String, (String, Tensor)> = BTreeMap::new();
    for arg in args {
        let (name, path) = match arg.split_once('=') {
            Some((n, p)) => (Some(n.to_string()), PathBuf::from(p)),
            None => (None, PathBuf::from(arg)),
        };
        if name.is_none() && path.extension().and_then(|e| e.to_str()) != Some("pb") {
            return Err(usage(format!(
                "--input {arg:?}: give NAME=PATH (only .pb files carry their own name)"
            )));
        }
        let (proto_name, t) = tensors::read(&path)?;
        let name = match name.or(proto_name) {
            Some(n) => n,
            None => {
                return Err(usage(format!(
                    "--input {arg:?}: the TensorProto has no name; give NAME={arg}"
                )));
            }
        };
        if read.insert(name.clone(), (arg.clone(), t)).is_some() {
            return Err(usage(format!("input {name:?} is given twice")));
        }
    }
    Ok(read)
}

/// Binds the read inputs to the graph's inputs by name, in the graph's order.
pub(crate) fn bind_inputs(
    g: &xpu_ir::Graph,
    mut read: BTreeMap<String, (String, Tensor)>,
) -> Result<Vec<Tensor>> {
    let names: Vec<String> =
        g.inputs.iter().map(|&v| g.value(v).name.clone().unwrap_or_default()).collect();
    if let Some((name, (arg, _))) = read.iter().find(|(n, _)| !names.contains(n)) {
        bail!(
            "--input {arg:?}: the program has no input named {name:?} (its inputs: {})",
            names.iter().map(|n| format!("{n:?}")).collect::<Vec<_>>().join(", ")
        );
    }
    let missing: Vec<&String> = names.iter().filter(|n| !read.contains_key(*n)).collect();
    if !missing.is_empty() {
        bail!(
            "missing input(s): {} (pass them with --input NAME=PATH)",
            missing.iter().map(|n| format!("{n:?}")).collect::<Vec<_>>().join(", ")
        );
    }
    Ok(names.iter().map(|n| read.remove(n).expect("checked above").1).collect())
}

fn run(
    program: &Path,
    policy: Option<&str>,
    labels: &[String],
    overrides: &[String],
    explain: bool,
    frozen: Option<&Path>,
    input_args: &[String],
    out_dir: &Path,
    format: Format,
    isolate: bool,
) -> Result<()> {
    let read = read_inputs(input_args)?;
    let (g, prints, writes) = if program::is_minilang(program) {
        let bytes =
            std::fs::read(program).with_context(|| format!("cannot read {}", program.display()))?;
        // Their dtypes and shapes (a table's columns) type the program's input(…)s.
        let inputs =
            xpu_minilang::lower::Inputs::given(read.iter().map(|(n, (_, t))| (n.as_str(), t)));
        let ml = program::load_minilang_with(program, bytes, &inputs)?;
        (ml.graph, Some(ml.prints), ml.writes)
    } else {
        (program::load(program)?, None, Vec::new())
    };
    let g = std::sync::Arc::new(g);
    let inputs = bind_inputs(&g, read)?;
    let roots = xpu_runtime::program::data_roots_of(program);
    let registry = if isolate {
        xpu_runtime::isolated_registry_for(roots.roots())
    } else {
        xpu_runtime::registry_for(roots.roots())
    };
    let (plan, mut explanation, policy_name) = match frozen {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let f = xpu_plan::FrozenPlan::from_json(&text)
                .map_err(|e| anyhow::anyhow!("{}:{e}", path.display()))?;
            let eval = xpu_runtime::fold_evaluator();
            f.validate(&g, &g.content_hash(), Some(eval.as_ref())).map_err(|e| {
                anyhow::anyhow!("{}: {e} (program {})", path.display(), program.display())
            })?;
            let live = registry.inventory().fingerprint();
            if f.plan.inventory.fingerprint != live {
                eprintln!(
                    "note: the plan was made for inventory {:?} ({}); this machine's is {live}",
                    f.plan.inventory.name, f.plan.inventory.fingerprint
                );
            }
            let name = format!("{} (frozen plan {})", f.plan.policy.name, path.display());
            (f.plan, f.explanation, name)
        }
        None => {
            let policy = if labels.is_empty() {
                policy_cmd::load_policy(policy, overrides)?
            } else {
                policy_cmd::select_policy(labels, overrides)?
            };
            // Engines the policy cannot place a node on are not loaded (a policy of llvm and
            // cpu does not start ONNX Runtime and OpenVINO for a local run).
            let inventory =
                registry.inventory_for_engines(&g, policy.engines_it_may_place_on().as_ref());
            let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
            let bindings = xpu_plan::bind_symbols(&g, &shapes);
            // Shared with the plan (no copy of the weights) and hashed once.
            let eval = xpu_runtime::fold_evaluator();
            let hash = g.content_hash();
            match xpu_plan::plan_shared(&g, &hash, &policy, &inventory, &bindings, Some(&*eval)) {
                Ok((p, e)) => (p, e, policy.name().to_string()),
                Err(f) => {
                    if explain {
                        print!("{}", xpu_plan::render::explanation_text(&f.explanation, true));
                    }
                    bail!("{}: no plan under policy {}:\n{f}", program.display(), policy.name());
                }
            }
        }
    };
    let mut exec = GraphExec::new(std::sync::Arc::new(plan), &registry)
        .with_context(|| format!("{}: cannot prepare the plan", program.display()))?;
    let start = std::time::Instant::now();
    let result = exec.run(&inputs).with_context(|| format!("{}: run failed", program.display()))?;
    let wall = start.elapsed();
    explanation.record_run(&result);
    std::fs::create_dir_all(out_dir)
        .with_context(|| format!("cannot create {}", out_dir.display()))?;
    let mut written = Vec::new();
    for (o, t) in g.outputs.iter().zip(&result.outputs) {
        // Tables are written as CSV, tensors as .npy.
        let path = match t.data().as_table() {
            Some(table) => {
                let path = out_dir.join(format!("{}.csv", tensors::output_file_name(&o.name)));
                tensors::write_csv(&path, table)?;
                path
            }
            None => {
                let path = out_dir.join(format!("{}.npy", tensors::output_file_name(&o.name)));
                tensors::write_npy(&path, t)?;
                path
            }
        };
        written.push((o.name.clone(), path, t));
    }
    // `write_npy` targets were resolved inside the data roots when the program was lowered.
    for (name, path) in &writes {
        if let Some((_, _, t)) = written.iter().find(|(n, _, _)| n == name) {
            tensors::write_npy(path, t)?;
        }
    }
    let engines: std::collections::BTreeSet<&str> =
        exec.plan().partitions.iter().map(|p| p.engine.as_str()).collect();
    let engines = engines.into_iter().collect::<Vec<_>>().join("+");
    match format {
        Format::Text => {
            if let Some(prints) = &prints {
                // A MiniLang program prints what its `print` statements say, in order.
                for item in prints {
                    match item {
                        xpu_minilang::lower::PrintItem::Text(t) => println!("{t}"),
                        xpu_minilang::lower::PrintItem::Output(name) => {
                            if let Some((_, _, t)) = written.iter().find(|(n, _, _)| n == name) {
                                println!("{}", tensors::pretty(t));
                            }
                        }
                    }
                }
            } else {
                for (name, path, t) in &written {
                    println!("{name}: {}  -> {}", tensors::summary(t), path.display());
                }
            }
            // A program computed at compile time has no node and so no engine to name.
            let on = if engines.is_empty() { String::new() } else { format!(" on {engines}") };
            println!(
                "ran {} nodes{on} in {:.3} ms (policy {policy_name})",
                g.nodes.len(),
                wall.as_secs_f64() * 1e3,
            );
            if explain {
                print!("{}", xpu_plan::render::explanation_text(&explanation, false));
            }
        }
        Format::Json => {
            let outputs: Vec<_> = written
                .iter()
                .map(|(name, path, t)| serde_json::json!({"name": name, "file": path, "dtype": t.dtype().name(), "shape": t.shape()}))
                .collect();
            let plan = exec.plan();
            let timings: Vec<_> = result
                .timings
                .iter()
                .map(|t| serde_json::json!({"node": t.node.0, "op": plan.graph.node(t.node).op.name(), "engine": t.engine, "kernel": t.kernel, "nanos": t.nanos}))
                .collect();
            let mut doc = serde_json::json!({"program": program, "engine": engines, "policy": policy_name, "outputs": outputs, "wall_ms": wall.as_secs_f64() * 1e3, "timings": timings});
            // MiniLang: what each `print` shows, in order — an output by name, or the text
            // of a value computed at compile time (which has no output).
            if let Some(prints) = &prints {
                let items: Vec<_> = prints
                    .iter()
                    .map(|item| match item {
                        xpu_minilang::lower::PrintItem::Text(t) => serde_json::json!({"text": t}),
                        xpu_minilang::lower::PrintItem::Output(name) => {
                            serde_json::json!({"output": name})
                        }
                    })
                    .collect();
                doc["prints"] = serde_json::json!(items);
            }
            if explain {
                doc["explanation"] = serde_json::to_value(&explanation)?;
            }
            println!("{}", serde_json::to_string_pretty(&doc)?);
        }
    }
    Ok(())
}

/// `--min-gain`: a percentage in [0, 100).
fn parse_gain(text: &str) -> Result<f64, String> {
    let v: f64 = text.parse().map_err(|_| format!("{text:?} is not a number"))?;
    if !(0.0..100.0).contains(&v) {
        return Err(format!("{v} is not a percentage in [0, 100)"));
    }
    Ok(v)
}
