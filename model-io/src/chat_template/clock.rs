//! `strftime_now(format)` for chat templates: the current time (UTC) formatted like C/Python `strftime`.
//!
//! Templates such as Llama 3.1's print today's date with it. A fixed time can be set (`ChatTemplate::with_fixed_time`)
//! so renders are reproducible. The common conversions are supported (`%Y %y %m %d %e %H %I %M %S %p %j %a %A %b %B
//! %h %Z %z %%`, and glibc's `%-d`-style "no padding" flag); an unknown one is copied through unchanged.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// Marks "no fixed time: read the system clock".
const USE_SYSTEM_CLOCK: i64 = i64::MIN;

/// The time source shared between a template and its `strftime_now` function.
#[derive(Debug, Clone)]
pub(crate) struct Clock(Arc<AtomicI64>);

impl Default for Clock {
    fn default() -> Self {
        Self(Arc::new(AtomicI64::new(USE_SYSTEM_CLOCK)))
    }
}

impl Clock {
    pub(crate) fn fix(&self, unix_seconds: i64) {
        self.0.store(unix_seconds, Ordering::Relaxed);
    }

    pub(crate) fn now(&self) -> i64 {
        match self.0.load(Ordering::Relaxed) {
            USE_SYSTEM_CLOCK => match SystemTime::now().duration_since(UNIX_EPOCH) {
                Ok(d) => i64::try_from(d.as_secs()).unwrap_or(0),
                Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(0),
            },
            fixed => fixed,
        }
    }
}

/// A UTC calendar time broken into fields.
struct Civil {
    year: i64,
    month: u32, // 1..=12
    day: u32,   // 1..=31
    hour: u32,
    minute: u32,
    second: u32,
    weekday: usize,   // 0 = Monday
    day_of_year: u32, // 1..=366
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

impl Civil {
    fn from_unix(seconds: i64) -> Self {
        let days = seconds.div_euclid(86_400);
        let secs = seconds.rem_euclid(86_400) as u32;
        // Walk from 1970-01-01 (a Thursday) by 400-year eras of 146097 days, then years, then months.
        let weekday = (days + 3).rem_euclid(7) as usize;
        let eras = days.div_euclid(146_097);
        let mut rest = days.rem_euclid(146_097);
        let mut year = 1970 + eras * 400;
        loop {
            let len = if is_leap(year) { 366 } else { 365 };
            if rest < len {
                break;
            }
            rest -= len;
            year += 1;
        }
        let day_of_year = rest as u32 + 1;
        let month_lengths = [31, if is_leap(year) { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
        let mut month = 1;
        let mut day = rest as u32;
        for len in month_lengths {
            if day < len {
                break;
            }
            day -= len;
            month += 1;
        }
        Self {
            year,
            month,
            day: day + 1,
            hour: secs / 3600,
            minute: secs / 60 % 60,
            second: secs % 60,
            weekday,
            day_of_year,
        }
    }
}

/// Formats `unix_seconds` (UTC) with a `strftime` format string.
pub(crate) fn strftime(format: &str, unix_seconds: i64) -> String {
    let t = Civil::from_unix(unix_seconds);
    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let unpadded = chars.peek() == Some(&'-');
        if unpadded {
            chars.next();
        }
        let Some(spec) = chars.next() else {
            out.push('%');
            break;
        };
        let num = |value: u32, width: usize| {
            if unpadded {
                value.to_string()
            } else {
                format!("{value:0width$}")
            }
        };
        let hour12 = match t.hour % 12 {
            0 => 12,
            h => h,
        };
        let month_name = MONTHS[(t.month - 1) as usize];
        match spec {
            'Y' => out.push_str(&t.year.to_string()),
            'y' => out.push_str(&num(t.year.rem_euclid(100) as u32, 2)),
            'm' => out.push_str(&num(t.month, 2)),
            'd' => out.push_str(&num(t.day, 2)),
            'e' => out.push_str(&if unpadded { t.day.to_string() } else { format!("{:>2}", t.day) }),
            'H' => out.push_str(&num(t.hour, 2)),
            'I' => out.push_str(&num(hour12, 2)),
            'M' => out.push_str(&num(t.minute, 2)),
            'S' => out.push_str(&num(t.second, 2)),
            'j' => out.push_str(&num(t.day_of_year, 3)),
            'p' => out.push_str(if t.hour < 12 { "AM" } else { "PM" }),
            'a' => out.push_str(&WEEKDAYS[t.weekday][..3]),
            'A' => out.push_str(WEEKDAYS[t.weekday]),
            'b' | 'h' => out.push_str(&month_name[..3]),
            'B' => out.push_str(month_name),
            'Z' => out.push_str("UTC"),
            'z' => out.push_str("+0000"),
            '%' => out.push('%'),
            other => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                out.push(other);
            }
        }
    }
    out
}
