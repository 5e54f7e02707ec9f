//! Feeds arbitrary bytes to every metadata decoder: commands, responses and snapshots must
//! decode or return an error, never panic or allocate beyond the input; whatever decodes
//! must encode back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use myriad_meta::{Command, MetaState, Response};

fuzz_target!(|data: &[u8]| {
    if let Ok(command) = Command::from_bytes(data) {
        assert_eq!(command.to_bytes(), data);
    }
    if let Ok(response) = Response::from_bytes(data) {
        assert_eq!(response.to_bytes(), data);
    }
    if let Ok(state) = MetaState::from_snapshot(data) {
        let again = MetaState::from_snapshot(&state.snapshot()).expect("own snapshot decodes");
        assert_eq!(again, state);
    }
});
