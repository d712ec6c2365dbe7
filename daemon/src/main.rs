//! `xpud`: serve the API until SIGTERM/SIGINT (then drain), reload policies on SIGHUP.
//! `xpud token` makes a token and prints the tokens-file entry for it.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use tokio::signal::unix::{SignalKind, signal};
use xpud::config::{Config, Flags};

#[derive(Parser)]
#[command(
    name = "xpud",
    version,
    about = "xpud: the xpu daemon (REST API, job queue, explanation store)"
)]
struct Cli {
    /// Address to listen on (default 127.0.0.1:8080).
    #[arg(long)]
    listen: Option<String>,
    /// Where the store and run files live (default ./var).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Settings file (default ./xpud.toml when present).
    #[arg(long)]
    config: Option<PathBuf>,
    /// No authentication; refused on a non-loopback address.
    #[arg(long)]
    dev: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Make a new token; prints it once, and the `[[token]]` entry (its digest) to add to
    /// the tokens file.
    Token {
        #[arg(long)]
        name: String,
        /// Comma-separated: submit, read, admin.
        #[arg(long, default_value = "submit,read")]
        scopes: String,
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Print the OpenAPI document.
    Openapi,
}

fn main() -> ExitCode {
    // SAFETY: the first thing main does, before any thread exists.
    unsafe { xpu_engine_cpu::quiet_blas_threads() };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("XPU_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal: a journal, a file or a pipe gets
        // plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xpud: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Some(Command::Token { name, scopes, tenant }) => {
            let token = xpud::auth::new_token().context("cannot read /dev/urandom")?;
            let scopes: Vec<String> =
                scopes.split(',').map(|s| format!("{:?}", s.trim())).collect();
            println!("token: {token}");
            println!("\n[[token]]\nname = {name:?}\nsha256 = {:?}", xpud::auth::digest(&token));
            println!("scopes = [{}]", scopes.join(", "));
            if let Some(t) = tenant {
                println!("tenant = {t:?}");
            }
            return Ok(());
        }
        Some(Command::Openapi) => {
            println!("{}", xpud::api::openapi_json());
            return Ok(());
        }
        None => {}
    }
    let flags = Flags { listen: cli.listen, data_dir: cli.data_dir, dev: cli.dev };
    let config = Config::load(cli.config.as_deref(), &flags)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .worker_threads(2)
        .thread_name("xpud-http")
        .build()?;
    runtime.block_on(serve(config))
}

async fn serve(config: Config) -> Result<()> {
    let addr = config.listen_addr()?;
    let drain = Duration::from_secs(config.limits.drain_timeout_s);
    config.prepare_dirs()?;
    let app = xpud::App::start(config)?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    tracing::info!(
        "xpud {} listening on http://{addr} (data dir {}, {} workers{})",
        env!("CARGO_PKG_VERSION"),
        app.config.data_dir.display(),
        app.config.workers(),
        if app.config.dev { ", --dev: no authentication" } else { "" }
    );
    // Once each: to the person at the terminal in --dev mode, else to the log.
    for line in app.config.describe() {
        if app.config.dev {
            println!("{line}");
        } else {
            tracing::info!("{line}");
        }
    }
    if app.config.dev {
        // The xpuctl beside this binary (the build's, or an installed pair), so the printed
        // commands work as typed even when xpuctl is not on the PATH.
        let xpuctl = std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(|d| d.join("xpuctl")))
            .filter(|p| p.exists())
            .map_or_else(|| "xpuctl".to_string(), |p| p.display().to_string());
        println!(
            "xpud is up: http://{addr}  (API console http://{addr}/docs)\n\
             submit the example job:  {xpuctl} --server http://{addr} submit examples/example.ml --wait\n\
             then explain it:         {xpuctl} --server http://{addr} explain RUN_ID"
        );
    }
    let _watch = if app.config.watch_policies {
        Some(app.watch_policies().map_err(|e| anyhow::anyhow!(e))?)
    } else {
        None
    };
    let mut hup = signal(SignalKind::hangup())?;
    let reload_app = app.clone();
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            match reload_app.reload_policies() {
                Ok(n) => tracing::info!("policies reloaded: {n} policies"),
                Err(e) => tracing::error!("policy reload rejected, the old set stays:\n{e}"),
            }
        }
    });
    let router = xpud::api::router(app.clone());
    let shutdown_app = app.clone();
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            let mut term = match signal(SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return std::future::pending().await,
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            shutdown_app.draining.store(true, Ordering::Release);
            tracing::info!("stopping: no new jobs; draining");
        })
        .await?;
    let jobs = app.jobs.clone();
    let asking = app.clone();
    let left = tokio::task::spawn_blocking(move || {
        // Asks first (one may be waiting for the run it started), within the same bound.
        let until = std::time::Instant::now() + drain;
        while asking.asks.running() > 0 && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
        }
        if asking.asks.running() > 0 {
            tracing::warn!("{} ask(s) still running are dropped", asking.asks.running());
        }
        let left = jobs.drain(until.saturating_duration_since(std::time::Instant::now()));
        // The database takes in every journaled run, so the next start replays nothing.
        jobs.store.close();
        left
    })
    .await?;
    if left > 0 {
        tracing::warn!("{left} job(s) did not finish within {}s and were dropped", drain.as_secs());
    } else {
        tracing::info!("drained");
    }
    Ok(())
}
