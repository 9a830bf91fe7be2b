//! Sizes in human units: parsing `4KiB`, `8k`, `32MiB`, `1.5G` and printing `1.5 GiB`.

use crate::{Error, Result};

/// Parses a byte size. Accepts a plain number of bytes or a number followed by a binary unit
/// (`K`, `KiB`, `M`, `MiB`, `G`, `GiB`, `T`, `TiB`; case-insensitive; `KB` means KiB too,
/// because storage sizes here are always powers of two). Fractions are allowed (`1.5G`).
pub fn parse_size(text: &str) -> Result<u64> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let multiplier: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        "p" | "pb" | "pib" => 1 << 50,
        _ => {
            return Err(Error::InvalidArgument(format!(
                "size {text:?} has an unknown unit {unit:?}; use B, KiB, MiB, GiB, TiB"
            )))
        }
    };
    let value: f64 = number.parse().map_err(|_| {
        Error::InvalidArgument(format!("size {text:?} is not a number with a unit"))
    })?;
    let bytes = value * multiplier as f64;
    if !(0.0..=(u64::MAX as f64)).contains(&bytes) || bytes.fract() != 0.0 {
        return Err(Error::InvalidArgument(format!(
            "size {text:?} is not a whole number of bytes"
        )));
    }
    Ok(bytes as u64)
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
