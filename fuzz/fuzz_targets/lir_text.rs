//! LIR-ML text: a module that parses prints to text that parses to the same module, and the
//! verifier answers on whatever parsed.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|src: &str| {
    let Ok(module) = xpu_lir::parse(src) else { return };
    let _ = xpu_lir::verify(&module);
    let printed = module.to_string();
    let again = xpu_lir::parse(&printed)
        .unwrap_or_else(|e| panic!("printed module does not parse: {e}\n{printed}"));
    assert_eq!(printed, again.to_string(), "the text form does not round-trip");
});
