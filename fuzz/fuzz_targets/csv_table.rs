//! CSV tables (job inputs): a table that reads writes back to CSV that reads to a table
//! with the same columns and rows.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let Ok(table) = xpu_tensorfile::table_from_csv(bytes) else { return };
    let Ok(written) = xpu_tensorfile::csv_bytes(&table) else { return };
    let again = xpu_tensorfile::table_from_csv(&written)
        .unwrap_or_else(|e| panic!("written CSV does not read back: {e}"));
    assert_eq!(table.columns.len(), again.columns.len(), "columns differ after a round trip");
    assert_eq!(table.rows(), again.rows(), "rows differ after a round trip");
});
