#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| kn_fuzz::legacy_event(data));
