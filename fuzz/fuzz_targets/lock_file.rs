//! Lock files (`xpuctl tune`'s measured choices): read, or refused with a location; a lock
//! that reads is written back and reads again the same.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Ok(lock) = xpu_policy::LockFile::parse("fuzz.lock.toml", text) {
        let again = xpu_policy::LockFile::parse("again.lock.toml", &lock.to_toml())
            .expect("a lock written back reads");
        assert_eq!(again, lock);
    }
});
