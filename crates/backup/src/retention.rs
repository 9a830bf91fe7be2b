//! Retention rules (`backup expire --keep-last N --keep-daily N ...`): which backups of a
//! series stay, as restic's `forget` decides.
//!
//! Backups are taken newest first. `keep_last` keeps the newest N. Each calendar rule cuts
//! time into buckets (hours, days, ISO weeks, months, years, in UTC) and keeps the newest
//! backup of each of the N newest buckets that hold a backup; a bucket without backups
//! does not count. A backup is kept when any rule keeps it, and the plan says which rules
//! did. Every rule with N > 0 keeps the newest backup, so an expiry never empties a series.
//!
//! Unlike restic, buckets are in UTC rather than local time, so a plan does not depend on the
//! time zone of the machine that makes it.

use serde::{Deserialize, Serialize};

/// How many backups each rule keeps (0: the rule keeps none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetentionPolicy {
    pub keep_last: u32,
    pub keep_hourly: u32,
    pub keep_daily: u32,
    pub keep_weekly: u32,
    pub keep_monthly: u32,
    pub keep_yearly: u32,
}

impl RetentionPolicy {
    /// Keeps the newest `count` backups.
    pub fn last(count: u32) -> RetentionPolicy {
        RetentionPolicy {
            keep_last: count,
            ..RetentionPolicy::default()
        }
    }

    /// True when no rule keeps anything (such a policy would delete every backup).
    pub fn keeps_nothing(&self) -> bool {
        *self == RetentionPolicy::default()
    }
}

/// A backup a plan keeps, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KeptBackup {
    pub version: u32,
    pub created_unix_ns: u64,
    /// The rules that keep it, each with its bucket: `last`, `hourly 2026-11-25 14h`,
    /// `daily 2026-11-25`, `weekly 2026-W48`, `monthly 2026-11`, `yearly 2026`.
    pub reasons: Vec<String>,
}

/// Days since 1970-01-01 to the civil date (year, month 1-12, day 1-31), proleptic
/// Gregorian (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_index + 2) / 5 + 1) as u32;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    } as u32;
    (year_of_era + era * 400 + i64::from(month <= 2), month, day)
}

/// The civil date to days since 1970-01-01 (the inverse of [`civil_from_days`]).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year.rem_euclid(400);
    let month = i64::from(month);
    let day_of_year =
        (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The ISO 8601 week (year, week 1-53) of a day: weeks start on Monday, and week 1 is the
/// one holding the year's first Thursday.
fn iso_week(days: i64) -> (i64, u32) {
    let weekday = (days + 3).rem_euclid(7); // 0 = Monday; 1970-01-01 was a Thursday.
    let thursday = days - weekday + 3;
    let (year, _, _) = civil_from_days(thursday);
    let week = (thursday - days_from_civil(year, 1, 1)) / 7 + 1;
    (year, week as u32)
}

/// The bucket of each calendar rule for a time, as the text shown in reasons (buckets are
/// equal exactly when their texts are).
fn buckets(created_unix_ns: u64) -> [String; 5] {
    let seconds = (created_unix_ns / 1_000_000_000) as i64;
    let days = seconds.div_euclid(86_400);
    let hour = seconds.rem_euclid(86_400) / 3600;
    let (year, month, day) = civil_from_days(days);
    let (week_year, week) = iso_week(days);
    [
        format!("hourly {year:04}-{month:02}-{day:02} {hour:02}h"),
        format!("daily {year:04}-{month:02}-{day:02}"),
        format!("weekly {week_year:04}-W{week:02}"),
        format!("monthly {year:04}-{month:02}"),
        format!("yearly {year:04}"),
    ]
}

/// Applies `policy` to `backups` (version, creation time), returning the kept backups,
/// newest first, and the versions to delete, oldest first.
pub fn plan_retention(
    backups: &[(u32, u64)],
    policy: &RetentionPolicy,
) -> (Vec<KeptBackup>, Vec<u32>) {
    let mut newest_first: Vec<(u32, u64)> = backups.to_vec();
    newest_first.sort_unstable_by(|a, b| b.cmp(a));
    let counts = [
        policy.keep_hourly,
        policy.keep_daily,
        policy.keep_weekly,
        policy.keep_monthly,
        policy.keep_yearly,
    ];
    let mut remaining = counts;
    let mut last_kept: [Option<String>; 5] = Default::default();
    let mut kept = Vec::new();
    let mut expired = Vec::new();
    for (position, &(version, created_unix_ns)) in newest_first.iter().enumerate() {
        let mut reasons = Vec::new();
        if position < policy.keep_last as usize {
            reasons.push("last".to_string());
        }
        for (rule, bucket) in buckets(created_unix_ns).into_iter().enumerate() {
            if remaining[rule] > 0 && last_kept[rule].as_ref() != Some(&bucket) {
                remaining[rule] -= 1;
                reasons.push(bucket.clone());
                last_kept[rule] = Some(bucket);
            }
        }
        if reasons.is_empty() {
            expired.push(version);
        } else {
            kept.push(KeptBackup {
                version,
                created_unix_ns,
                reasons,
            });
        }
    }
    expired.reverse();
    assert_eq!(
        kept.len() + expired.len(),
        backups.len(),
        "every backup is decided"
    );
    assert!(
        policy.keeps_nothing()
            || backups.is_empty()
            || kept.first().map(|kept| kept.version) == newest_first.first().map(|newest| newest.0),
        "a rule that keeps anything keeps the newest backup"
    );
    (kept, expired)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unix nanoseconds of a UTC time.
    fn at(year: i64, month: u32, day: u32, hour: i64) -> u64 {
        ((days_from_civil(year, month, day) * 86_400 + hour * 3600) * 1_000_000_000) as u64
    }

    /// Goal: the calendar arithmetic agrees with known dates, ISO weeks included at year
    /// edges. Method: round trips over 1900-2100 and a table of ISO weeks.
    #[test]
    fn calendar_is_right_at_the_edges() {
        for days in days_from_civil(1900, 1, 1)..days_from_civil(2100, 12, 31) {
            let (year, month, day) = civil_from_days(days);
            assert_eq!(days_from_civil(year, month, day), days);
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(days_from_civil(2024, 2, 29)), (2024, 2, 29));
        let weeks = [
            ((2020, 12, 31), (2020, 53)),
            ((2021, 1, 3), (2020, 53)),
            ((2021, 1, 4), (2021, 1)),
            ((2024, 12, 30), (2025, 1)),
            ((2026, 11, 25), (2026, 48)),
            ((2027, 1, 1), (2026, 53)),
        ];
        for ((year, month, day), expected) in weeks {
            assert_eq!(
                iso_week(days_from_civil(year, month, day)),
                expected,
                "{year}-{month}-{day}"
            );
        }
    }

    /// Goal: each calendar rule keeps the newest backup of each of its N newest buckets,
    /// across month and year edges, `keep_last` the newest N, and the reasons name the
    /// rules. Method: backups at chosen times around 2025-12-31 and 2026-01-01.
    #[test]
    fn buckets_keep_the_newest_backup_of_each() {
        let backups = [
            (1, at(2025, 11, 30, 23)),
            (2, at(2025, 12, 1, 0)),
            (3, at(2025, 12, 31, 10)),
            (4, at(2025, 12, 31, 22)),
            (5, at(2026, 1, 1, 1)),
            (6, at(2026, 1, 1, 1) + 60_000_000_000),
            (7, at(2026, 1, 2, 9)),
        ];
        let decide = |policy: RetentionPolicy| {
            let (kept, expired) = plan_retention(&backups, &policy);
            let mut versions: Vec<u32> = kept.iter().map(|kept| kept.version).collect();
            versions.sort_unstable();
            (versions, expired)
        };
        let daily = RetentionPolicy {
            keep_daily: 3,
            ..RetentionPolicy::default()
        };
        // Days 01-02, 01-01 (newest there: 6), 12-31 (newest: 4).
        assert_eq!(decide(daily), (vec![4, 6, 7], vec![1, 2, 3, 5]));
        let monthly = RetentionPolicy {
            keep_monthly: 3,
            ..RetentionPolicy::default()
        };
        // Months 2026-01 (7), 2025-12 (4), 2025-11 (1).
        assert_eq!(decide(monthly), (vec![1, 4, 7], vec![2, 3, 5, 6]));
        let yearly = RetentionPolicy {
            keep_yearly: 5,
            ..RetentionPolicy::default()
        };
        assert_eq!(decide(yearly), (vec![4, 7], vec![1, 2, 3, 5, 6]));
        let hourly = RetentionPolicy {
            keep_hourly: 2,
            ..RetentionPolicy::default()
        };
        // 7 in its hour; 5 and 6 share 01h of 2026-01-01, 6 is the newer.
        assert_eq!(decide(hourly), (vec![6, 7], vec![1, 2, 3, 4, 5]));
        let weekly = RetentionPolicy {
            keep_weekly: 2,
            ..RetentionPolicy::default()
        };
        // 2025-12-29 to 2026-01-04 is 2026-W01 (7 newest); 2025-W49 holds 12-01 (2); 11-30
        // is a Sunday of 2025-W48.
        assert_eq!(decide(weekly), (vec![2, 7], vec![1, 3, 4, 5, 6]));
        let mixed = RetentionPolicy {
            keep_last: 2,
            keep_monthly: 2,
            ..RetentionPolicy::default()
        };
        let (kept, expired) = plan_retention(&backups, &mixed);
        assert_eq!(expired, [1, 2, 3, 5]);
        let reasons: Vec<(u32, Vec<String>)> = kept
            .into_iter()
            .map(|kept| (kept.version, kept.reasons))
            .collect();
        assert_eq!(
            reasons,
            [
                (7, vec!["last".to_string(), "monthly 2026-01".to_string()]),
                (6, vec!["last".to_string()]),
                (4, vec!["monthly 2025-12".to_string()]),
            ]
        );
        assert_eq!(decide(RetentionPolicy::last(9)).1, Vec::<u32>::new());
    }
}
