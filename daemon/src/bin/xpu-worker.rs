//! `xpu-worker`: one engine served to the xpud or xpuctl process that started it
//! (docs/daemon.md, "Isolation"). Not run by hand.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(xpu_runtime::worker::worker_main(&args));
}
