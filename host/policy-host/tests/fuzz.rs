//! The policy loader on hostile component bytes (docs/reliability.md, "Hostile input"): a
//! policy file is whatever someone wrote into the policy directory, so any bytes must load or
//! fail with a `PolicyError`, never panic or hang the loader. 64 cases per CI run (each may
//! compile); `PROPTEST_CASES=10000 cargo test -p switchyard-policy-host --test main fuzz` for
//! more.

use super::engine;
use proptest::prelude::*;
use switchyard_policy_host::test_util::Router;

fn cases() -> u32 {
    if std::env::var_os("PROPTEST_CASES").is_some() {
        ProptestConfig::default().cases
    } else {
        64
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// A valid component with bytes flipped, inserted or cut off anywhere.
    #[test]
    fn a_mutated_component_loads_or_is_refused(
        flips in prop::collection::vec((any::<prop::sample::Index>(), 1..=255u8), 0..6),
        inserts in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
        cut in prop::option::of(any::<prop::sample::Index>()),
    ) {
        let mut bytes = Router::default().bytes();
        for (at, mask) in flips {
            let at = at.index(bytes.len());
            bytes[at] ^= mask;
        }
        for (at, byte) in inserts {
            let at = at.index(bytes.len() + 1);
            bytes.insert(at, byte);
        }
        if let Some(cut) = cut {
            bytes.truncate(cut.index(bytes.len() + 1));
        }
        // Any outcome but a panic: most are refused, a few still load.
        let _ = engine().load_router(&bytes);
    }

    /// Anything at all, with the Wasm magic in front half the time.
    #[test]
    fn any_bytes_are_refused(mut bytes in prop::collection::vec(any::<u8>(), 0..4096), magic: bool) {
        if magic {
            bytes.splice(0..0, *b"\0asm\x0d\0\x01\0");
        }
        prop_assert!(engine().load_router(&bytes).is_err());
    }
}
