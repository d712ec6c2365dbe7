//! Runs the ONNX node-suite conformance outside the test harness:
//! `xpu-conformance [FILTER]` prints one line per case and the totals.

fn main() {
    let filter = std::env::args().nth(1);
    let dir = xpu_tests::conformance::cache_dir();
    match xpu_tests::conformance::run_all(&dir, filter.as_deref()) {
        Ok((_, results)) => {
            let mut pass = 0;
            for r in &results {
                if r.status == xpu_tests::conformance::Status::Pass {
                    pass += 1;
                }
                println!("{:<60} {:<11} {}", r.name, r.status.name(), r.detail);
            }
            println!("{pass} / {} pass", results.len());
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
