//! Policy TOML: loaded (with `extends` confined to no directory, as a sender's inline
//! policy is confined to the policy directories) or refused with located diagnostics; a
//! loaded policy is validated on its own and against a declared inventory.
#![no_main]
use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;

static INVENTORY: LazyLock<xpu_engine::Inventory> = LazyLock::new(|| {
    xpu_engine::Inventory::from_toml(include_str!("../../policies/inventories/h100.toml"))
        .expect("the h100 inventory loads")
});

fuzz_target!(|text: &str| {
    let loader = xpu_policy::Loader::new().confined_to(Vec::new());
    match loader.load_text("fuzz.toml", None, text) {
        Ok(policy) => {
            let _ = xpu_policy::validate::structural(&policy);
            let _ = xpu_policy::validate::contextual(&policy, &INVENTORY, "h100");
        }
        Err(diags) => {
            let _ = diags.to_string();
        }
    }
});
