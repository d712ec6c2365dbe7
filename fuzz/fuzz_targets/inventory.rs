//! Inventory TOML (declared engines, kernels and devices): read or refused with a location.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let _ = xpu_engine::Inventory::from_toml(text);
});
