//! xpud's REST request bodies, decoded as the daemon decodes them (axum's `Json`: serde with
//! the field path on errors), then the parts it reads further: inputs in each of their
//! forms (.npy or CSV as base64, or dtype + shape + numbers) and the program's base64.
#![no_main]
use base64::Engine as _;
use libfuzzer_sys::fuzz_target;
use xpu_api::{ReplayRequest, SqlRequest, SubmitJob, ValidateRequest};

fn decode<T: serde::de::DeserializeOwned>(body: &[u8]) -> Option<T> {
    let mut de = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut de).ok()
}

fn b64(s: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD.decode(s.trim()).ok()
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else { return };
    match which % 4 {
        0 => {
            let Some(job) = decode::<SubmitJob>(body) else { return };
            if let Some(b) = &job.program.source_base64 {
                let _ = b64(b);
            }
            for (name, input) in &job.inputs {
                if let Some(bytes) = input.npy_base64.as_deref().and_then(b64) {
                    let _ = xpu_tensorfile::read_bytes(name, "npy", &bytes);
                }
                if let Some(bytes) = input.csv_base64.as_deref().and_then(b64) {
                    let _ = xpu_tensorfile::read_bytes(name, "csv", &bytes);
                }
                if let (Some(shape), Some(data)) = (&input.shape, &input.data) {
                    let _ = xpu_tensorfile::from_literal(input.dtype.as_deref(), shape, data);
                }
            }
        }
        1 => drop(decode::<SqlRequest>(body)),
        2 => drop(decode::<ReplayRequest>(body)),
        _ => drop(decode::<ValidateRequest>(body)),
    }
});
