#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| kn_fuzz::response_head(data));
