#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| kn_fuzz::record_decode(data));
