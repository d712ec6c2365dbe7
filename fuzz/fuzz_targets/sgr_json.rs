//! SGR-ML JSON: a graph that deserializes serializes to JSON that reads back to the same
//! graph, and the verifier answers on whatever was read.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|src: &str| {
    let Ok(graph) = xpu_ir::from_json(src) else { return };
    let _ = xpu_ir::verify(&graph);
    let json = xpu_ir::to_json(&graph);
    let again = xpu_ir::from_json(&json)
        .unwrap_or_else(|e| panic!("written graph does not read back: {e}\n{json}"));
    assert_eq!(json, xpu_ir::to_json(&again), "the JSON form does not round-trip");
});
