//! Sizes in human units: parsing `4KiB`, `8k`, `32MiB`, `1.5G` and printing `1.5 GiB`.

use crate::{Error, Result};

/// Parses a byte size: a number of bytes, or a number followed by a unit (case-insensitive).
/// Binary units are powers of 1024: `KiB`, `MiB`, `GiB`, `TiB`, `PiB` and the single letters
/// `K`, `M`, `G`, `T`, `P`. Decimal units are powers of 1000, as the SI and disk vendors use
/// them: `kB`, `MB`, `GB`, `TB`, `PB`. Fractions are allowed when the result is a whole
/// number of bytes (`1.5G`). The arithmetic is exact: no size is rounded.
pub fn parse_size(text: &str) -> Result<u64> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let (base, exponent): (u128, u32) = match unit.as_str() {
        "" | "b" => (1, 0),
        "k" | "kib" => (1024, 1),
        "m" | "mib" => (1024, 2),
        "g" | "gib" => (1024, 3),
        "t" | "tib" => (1024, 4),
        "p" | "pib" => (1024, 5),
        "kb" => (1000, 1),
        "mb" => (1000, 2),
        "gb" => (1000, 3),
        "tb" => (1000, 4),
        "pb" => (1000, 5),
        _ => {
            return Err(Error::InvalidArgument(format!(
                "size {text:?} has an unknown unit {unit:?}; use B, KiB, MiB, GiB, TiB \
                 (powers of 1024) or kB, MB, GB, TB (powers of 1000)"
            )))
        }
    };
    let not_a_number =
        || Error::InvalidArgument(format!("size {text:?} is not a number with a unit"));
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits_only = |part: &str| part.bytes().all(|byte| byte.is_ascii_digit());
    if (whole.is_empty() && fraction.is_empty()) || !digits_only(whole) || !digits_only(fraction) {
        return Err(not_a_number());
    }
    // Bytes times 10^(decimal places), computed exactly; u128 holds any u64 size times the
    // largest unit (2^50) times the 10^(decimal places) accepted.
    const DECIMAL_PLACES_MAX: usize = 18;
    if fraction.len() > DECIMAL_PLACES_MAX {
        return Err(Error::InvalidArgument(format!(
            "size {text:?} has more than {DECIMAL_PLACES_MAX} decimal places"
        )));
    }
    let too_large = || {
        Error::InvalidArgument(format!(
            "size {text:?} is too large: at most {} bytes (16 EiB)",
            u64::MAX
        ))
    };
    let scaled = whole
        .bytes()
        .chain(fraction.bytes())
        .try_fold(0u128, |value, digit| {
            value.checked_mul(10)?.checked_add(u128::from(digit - b'0'))
        })
        .and_then(|value| value.checked_mul(base.pow(exponent)))
        .ok_or_else(too_large)?;
    let denominator = 10u128.pow(fraction.len() as u32);
    if scaled % denominator != 0 {
        return Err(Error::InvalidArgument(format!(
            "size {text:?} is not a whole number of bytes"
        )));
    }
    u64::try_from(scaled / denominator).map_err(|_| too_large())
}

/// Formats a byte count with a binary unit and three significant digits: `512 B`, `4.00 KiB`,
/// `1.50 GiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    let digits = if value >= 100.0 {
        0
    } else if value >= 10.0 {
        1
    } else {
        2
    };
    format!("{value:.digits$} {}", UNITS[unit])
}

/// Formats a rate in bytes per second, in decimal units as disk and network rates usually are:
/// `1.52 GB/s`.
pub fn format_rate(bytes_per_second: f64) -> String {
    const UNITS: [&str; 5] = ["B/s", "kB/s", "MB/s", "GB/s", "TB/s"];
    let mut value = bytes_per_second;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

/// A unix time in nanoseconds as `YYYY-MM-DD HH:MM:SS` in UTC (civil date from days since
/// 1970-01-01, proleptic Gregorian calendar; Howard Hinnant's algorithm).
pub fn format_time(unix_ns: u64) -> String {
    let seconds = (unix_ns / 1_000_000_000) as i64;
    let (days, rest) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// Parses a duration into nanoseconds: `0`, `250ns`, `10us` (or `10µs`), `1.5ms`, `2s`.
pub fn parse_duration_ns(text: &str) -> Result<u64> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let multiplier = match unit.trim() {
        "" if number.parse::<f64>().ok() == Some(0.0) => 1.0,
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        _ => {
            return Err(Error::InvalidArgument(format!(
                "duration {text:?} needs a unit: ns, us, ms or s (for example 100us)"
            )))
        }
    };
    let value: f64 = number.parse().map_err(|_| {
        Error::InvalidArgument(format!("duration {text:?} is not a number with a unit"))
    })?;
    let nanoseconds = value * multiplier;
    if !(0.0..=(u64::MAX as f64)).contains(&nanoseconds) {
        return Err(Error::InvalidArgument(format!(
            "duration {text:?} is out of range"
        )));
    }
    Ok(nanoseconds.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: every accepted spelling parses to the right byte count; bad input is an error.
    /// Method: parse each spelling.
    #[test]
    fn parse_accepts_units_and_rejects_garbage() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("4KiB").unwrap(), 4096);
        assert_eq!(parse_size("8k").unwrap(), 8192);
        assert_eq!(parse_size("32 MiB").unwrap(), 32 << 20);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("0.5").is_err());
    }

    /// Goal: decimal units are powers of 1000 and binary units powers of 1024, exactly.
    /// Method: parse both spellings of each unit, and sizes whose floating-point product
    /// would round.
    #[test]
    fn decimal_and_binary_units_differ() {
        assert_eq!(parse_size("10GB").unwrap(), 10_000_000_000);
        assert_eq!(parse_size("10GiB").unwrap(), 10 << 30);
        assert_eq!(parse_size("10G").unwrap(), 10 << 30);
        assert_eq!(parse_size("4kB").unwrap(), 4000);
        assert_eq!(parse_size("1.5MB").unwrap(), 1_500_000);
        assert_eq!(parse_size("2TB").unwrap(), 2_000_000_000_000);
        assert_eq!(parse_size("18446744073709551615").unwrap(), u64::MAX);
        assert!(parse_size("1.0000001KB").is_err());
    }

    /// Goal: a size beyond 2^64 - 1 bytes says it is too large, not that it is a fraction;
    /// malformed numbers say they are not numbers. Method: parse each kind.
    #[test]
    fn overflowing_sizes_are_too_large() {
        for text in [
            "18446744073709551616",
            "99999999999999999999999GiB",
            "17000PiB",
        ] {
            let message = parse_size(text).unwrap_err().to_string();
            assert!(message.contains("too large"), "{text}: {message}");
        }
        assert!(parse_size("1.2.3G")
            .unwrap_err()
            .to_string()
            .contains("not a number"));
        assert!(parse_size(".").is_err());
        assert_eq!(parse_size(".5K").unwrap(), 512);
    }

    /// Goal: durations parse with every unit and refuse bare numbers other than zero.
    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration_ns("0").unwrap(), 0);
        assert_eq!(parse_duration_ns("10us").unwrap(), 10_000);
        assert_eq!(parse_duration_ns("1.5ms").unwrap(), 1_500_000);
        assert_eq!(parse_duration_ns("2s").unwrap(), 2_000_000_000);
        assert!(parse_duration_ns("10").is_err());
        assert!(parse_duration_ns("fast").is_err());
    }

    /// Goal: formatted sizes round-trip through the parser to within the printed precision.
    #[test]
    fn format_is_human() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(4096), "4.00 KiB");
        assert_eq!(format_size(3 << 29), "1.50 GiB");
        assert_eq!(format_rate(1.52e9), "1.52 GB/s");
    }
}
