//! MiniLang source: the parser and checker never fail (they return diagnostics), the
//! lowering answers with diagnostics or a graph, and the diagnostics render against the
//! source whatever their spans.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|src: &str| {
    let (program, diags) = xpu_minilang::analyze(src);
    let _ = xpu_minilang::render("fuzz.ml", src, &diags);
    if diags.iter().any(|d| d.severity == xpu_minilang::Severity::Error) {
        return;
    }
    match xpu_minilang::lower::lower(&program, "fuzz", None) {
        Ok(lowered) => {
            let _ = xpu_ir::verify(&lowered.graph);
        }
        Err(diags) => {
            let _ = xpu_minilang::render("fuzz.ml", src, &diags);
        }
    }
});
