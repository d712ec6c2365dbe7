//! Runs the ONNX node-suite conformance outside the test harness:
//! `xpu-conformance [ROUTE] [FILTER]` prints one line per case and the totals. ROUTE is
//! `cpu` (import → cpu engine, the default), `ort` / `openvino` (the model straight to ONNX
//! Runtime / OpenVINO) or `ort-roundtrip` / `openvino-roundtrip` (import → SGR-ML → export →
//! the engine).

use xpu_engine::{Assignment, Executable};
use xpu_tests::conformance::{Route, Status, cache_dir, run_all};

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let route_name = match args.first().map(String::as_str) {
        Some("cpu" | "ort" | "ort-roundtrip" | "openvino" | "openvino-roundtrip") => args.remove(0),
        _ => "cpu".to_string(),
    };
    let filter = args.first().cloned();
    let cpu = xpu_engine_cpu::CpuEngine::new();
    let ort = xpu_engine_ort::OrtEngine::load(None).without_profiling();
    let direct = |name: &str, bytes: &[u8]| {
        ort.prepare_model(name, bytes, &Assignment::new("ort"))
            .map(|e| Box::new(e) as Box<dyn Executable>)
    };
    let ov = xpu_engine_openvino::OpenVinoEngine::load(None).without_profiling();
    let ov_direct = |name: &str, bytes: &[u8]| {
        ov.prepare_model(name, bytes, &Assignment::new("openvino"))
            .map(|e| Box::new(e) as Box<dyn Executable>)
    };
    let route = match route_name.as_str() {
        "ort" => Route::Direct(&direct),
        "ort-roundtrip" => Route::Import(&ort, Assignment::new("ort")),
        "openvino" => Route::Direct(&ov_direct),
        "openvino-roundtrip" => Route::Import(&ov, Assignment::new("openvino")),
        _ => Route::Import(&cpu, Assignment::new("cpu")),
    };
    match run_all(&cache_dir(), filter.as_deref(), &route) {
        Ok((_, results)) => {
            let mut pass = 0;
            for r in &results {
                if r.status == Status::Pass {
                    pass += 1;
                }
                println!("{:<60} {:<11} {}", r.name, r.status.name(), r.detail);
            }
            println!("{pass} / {} pass ({route_name})", results.len());
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
