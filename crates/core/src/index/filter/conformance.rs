//! The conformance suite of [`MembershipFilter`]: every [`FilterKind`] runs it (a new kind
//! joins by being listed in [`FilterKind::ALL`]).

use super::*;
use crate::index::cache::conformance::fingerprint;

/// Keys used by the measurements: stored keys are 0..n, absent keys start here.
const ABSENT_KEYS_START: u64 = 1 << 40;

fn filled(kind: FilterKind, capacity: u64, rate: f64) -> Filter {
    let mut filter = Filter::new(kind, capacity, rate).unwrap();
    for n in 0..capacity {
        assert!(
            filter.insert(&fingerprint(n)),
            "{kind}: insert {n} below capacity"
        );
    }
    filter
}

fn measured_rate(filter: &Filter, probes: u64) -> f64 {
    let positives = (ABSENT_KEYS_START..ABSENT_KEYS_START + probes)
        .filter(|&n| filter.may_contain(&fingerprint(n)))
        .count();
    positives as f64 / probes as f64
}

/// Goal: no false negatives, and the measured false-positive rate at capacity meets the
/// target and the filter's own estimate. Method: fill to capacity, probe 200,000 absent keys
/// (the measured rate at 1% has a standard deviation of about 0.02%).
#[test]
fn rates_are_met_without_false_negatives() {
    for kind in FilterKind::ALL {
        for rate in [0.05, 0.01, 0.002] {
            let filter = filled(kind, 50_000, rate);
            assert!((0..50_000).all(|n| filter.may_contain(&fingerprint(n))));
            let measured = measured_rate(&filter, 200_000);
            let expected = filter.expected_false_positive_rate();
            assert!(
                measured <= rate * 1.15,
                "{kind} at {rate}: measured {measured}"
            );
            assert!(expected <= rate, "{kind} at {rate}: expected {expected}");
            assert!(
                (measured - expected).abs() <= expected * 0.25 + 2e-4,
                "{kind} at {rate}: measured {measured}, expected {expected}"
            );
            assert!(filter.needs_growth());
        }
    }
}

/// Goal: at the default 1% rate a full filter costs at most 2 bytes of memory per entry.
#[test]
fn memory_per_entry_is_within_two_bytes() {
    for kind in FilterKind::ALL {
        let filter = filled(kind, 100_000, 0.01);
        let bytes_per_entry = filter.memory_bytes() as f64 / filter.len() as f64;
        assert!(
            bytes_per_entry <= 2.0,
            "{kind}: {bytes_per_entry} bytes per entry"
        );
        assert!(
            bytes_per_entry >= 1.0,
            "{kind}: {bytes_per_entry} is implausibly small"
        );
    }
}

/// Goal: a filter restored from its shape and words answers exactly as the original.
#[test]
fn restore_round_trips() {
    for kind in FilterKind::ALL {
        let filter = filled(kind, 5_000, 0.01);
        let restored = Filter::restore(filter.shape(), filter.words().as_slice().to_vec()).unwrap();
        assert_eq!(restored.shape(), filter.shape());
        for n in (0..5_000).chain(ABSENT_KEYS_START..ABSENT_KEYS_START + 20_000) {
            let fp = fingerprint(n);
            assert_eq!(restored.may_contain(&fp), filter.may_contain(&fp));
        }
        let mut wrong = filter.shape();
        wrong.units *= 2;
        assert!(Filter::restore(wrong, filter.words().as_slice().to_vec()).is_none());
    }
}

/// Goal: removal (where supported) forgets removed keys and keeps the others. Method: remove
/// every other key; removed keys must then test absent at about the false-positive rate.
#[test]
fn remove_forgets_only_removed_keys() {
    for kind in FilterKind::ALL {
        let mut filter = filled(kind, 20_000, 0.01);
        if !filter.supports_remove() {
            assert!(!filter.remove(&fingerprint(0)));
            assert_eq!(filter.len(), 20_000);
            continue;
        }
        for n in (0..20_000).step_by(2) {
            assert!(filter.remove(&fingerprint(n)), "{kind}: remove {n}");
        }
        assert_eq!(filter.len(), 10_000);
        assert!((1..20_000)
            .step_by(2)
            .all(|n| filter.may_contain(&fingerprint(n))));
        let still_positive = (0..20_000)
            .step_by(2)
            .filter(|&n| filter.may_contain(&fingerprint(n)))
            .count();
        assert!(
            still_positive < 200,
            "{kind}: {still_positive} removed keys remain"
        );
        assert!(!filter.needs_growth());
    }
}

/// Goal: filled past capacity, a filter still has no false negatives and says it must grow;
/// a cuckoo filter refuses inserts once it cannot place a tag, and those refusals are the
/// only keys it does not represent.
#[test]
fn overfilled_filters_keep_every_accepted_key() {
    for kind in FilterKind::ALL {
        let mut filter = Filter::new(kind, 1_000, 0.01).unwrap();
        let mut accepted = Vec::new();
        for n in 0..3_000 {
            if filter.insert(&fingerprint(n)) {
                accepted.push(n);
            }
        }
        assert!(filter.needs_growth());
        assert!(
            accepted.len() >= 1_000,
            "{kind}: {} accepted",
            accepted.len()
        );
        assert_eq!(filter.len(), accepted.len() as u64);
        assert!(accepted
            .iter()
            .all(|&n| filter.may_contain(&fingerprint(n))));
    }
}

/// Goal: bad parameters are refused with an error, and kinds parse by name.
#[test]
fn parameters_are_checked() {
    assert!(Filter::new(FilterKind::Bloom, 0, 0.01).is_err());
    assert!(Filter::new(FilterKind::Cuckoo, 10, 0.9).is_err());
    assert!(Filter::new(FilterKind::Cuckoo, 10, 0.0).is_err());
    assert_eq!("Cuckoo".parse::<FilterKind>().unwrap(), FilterKind::Cuckoo);
    assert!("quotient".parse::<FilterKind>().is_err());
}

/// Goal: a filter's answers depend only on the first 16 bytes of a fingerprint, the key the
/// on-disk index stores, so a filter rebuilt from the index's keys ([`crate::index::IndexKey`])
/// answers as the one built from whole fingerprints. Method: fill with fingerprints, then ask
/// for their key probes and for copies with other trailing bytes; remove through a probe.
#[test]
fn answers_depend_on_the_key_only() {
    for kind in FilterKind::ALL {
        let mut filter = filled(kind, 10_000, 0.01);
        let probe = |n: u64| crate::index::IndexKey::of(&fingerprint(n)).probe();
        let other_tail = |n: u64| {
            let mut changed = fingerprint(n);
            changed.0[16..].copy_from_slice(&fingerprint(n + (1 << 50)).0[16..]);
            changed
        };
        for n in 0..10_000 {
            assert!(filter.may_contain(&probe(n)), "{kind}: probe of {n}");
            assert!(
                filter.may_contain(&other_tail(n)),
                "{kind}: other tail of {n}"
            );
        }
        let absent = ABSENT_KEYS_START..ABSENT_KEYS_START + 10_000;
        let whole = absent
            .clone()
            .filter(|&n| filter.may_contain(&fingerprint(n)));
        let probed = absent.filter(|&n| filter.may_contain(&probe(n)));
        assert!(whole.eq(probed), "{kind}: absent keys answered alike");
        if filter.supports_remove() {
            assert!(
                filter.remove(&probe(7)),
                "{kind}: removed through the probe"
            );
            assert!(!filter.may_contain(&fingerprint(7)) || filter.may_contain(&probe(7)));
        }
    }
}
