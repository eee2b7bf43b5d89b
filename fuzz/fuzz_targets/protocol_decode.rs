//! Fuzzes the decoder of messages the daemon receives from agents (untrusted client input).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    uffd_daemon::fuzz_protocol_decode(data);
});
