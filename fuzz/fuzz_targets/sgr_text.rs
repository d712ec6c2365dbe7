//! SGR-ML text: a graph that parses prints to text that parses to the same graph (the text
//! form round-trips), and the verifier answers on whatever parsed.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|src: &str| {
    let Ok(graph) = xpu_ir::text::parse(src) else { return };
    let _ = xpu_ir::verify(&graph);
    let printed = xpu_ir::text::print(&graph);
    let again = xpu_ir::text::parse(&printed)
        .unwrap_or_else(|e| panic!("printed graph does not parse: {e}\n{printed}"));
    assert_eq!(printed, xpu_ir::text::print(&again), "the text form does not round-trip");
});
