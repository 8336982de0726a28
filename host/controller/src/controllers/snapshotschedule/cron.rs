//! Cron schedules: the five fields of cron(8) (minute hour day-of-month month day-of-week),
//! with an optional leading seconds field (six fields, as Quartz and Spring write it), lists,
//! ranges, steps, names of months and days, and `@hourly`, `@daily`, `@weekly`, `@monthly`,
//! `@yearly`. Evaluated in an IANA time zone: a time a DST change skips is run at the first
//! instant after the gap; one it repeats, once.

use jiff::civil::{Date, DateTime};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan, Zoned};

/// A parsed schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cron {
    seconds: u64,
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    weekdays: u64,
    /// Both day fields restricted: a day matches either (cron(8)'s rule).
    either_day: bool,
}

const MONTHS: [&str; 12] = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"];
const WEEKDAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

impl Cron {
    /// Parse `expr`; the error says which field is wrong and why.
    pub fn parse(expr: &str) -> Result<Cron, String> {
        let expr = expr.trim();
        let expanded = match expr {
            "@hourly" => "0 * * * *",
            "@daily" | "@midnight" => "0 0 * * *",
            "@weekly" => "0 0 * * 0",
            "@monthly" => "0 0 1 * *",
            "@yearly" | "@annually" => "0 0 1 1 *",
            other if other.starts_with('@') => return Err(format!("unknown macro {other:?} (use @hourly, @daily, @weekly, @monthly or @yearly)")),
            other => other,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        let (seconds, rest) = match fields.len() {
            5 => ("0", &fields[..]),
            6 => (fields[0], &fields[1..]),
            n => return Err(format!("{n} fields; a schedule has 5 (minute hour day-of-month month day-of-week) or 6 (seconds first)")),
        };
        let seconds = field("seconds", seconds, 0, 59, &[])?;
        let minutes = field("minute", rest[0], 0, 59, &[])?;
        let hours = field("hour", rest[1], 0, 23, &[])?;
        let days = field("day-of-month", rest[2], 1, 31, &[])?;
        let months = field("month", rest[3], 1, 12, &MONTHS)?;
        let mut weekdays = field("day-of-week", rest[4], 0, 7, &WEEKDAYS)?;
        // 7 is Sunday too.
        if weekdays & (1 << 7) != 0 {
            weekdays = (weekdays | 1) & !(1 << 7);
        }
        let either_day = !rest[2].starts_with('*') && !rest[4].starts_with('*');
        Ok(Cron { seconds, minutes, hours, days, months, weekdays, either_day })
    }

    fn day_matches(&self, d: Date) -> bool {
        let dom = self.days & (1 << d.day()) != 0;
        let dow = self.weekdays & (1 << d.weekday().to_sunday_zero_offset()) != 0;
        if self.either_day { dom || dow } else { dom && dow }
    }

    /// The first time strictly after `after` the schedule fires, in `tz`; `None` if none
    /// within five years (a 30th of February).
    pub fn next_after(&self, after: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        let start = after.to_zoned(tz.clone()).datetime();
        // Local wall-clock times, in order; each is mapped to an instant (a skipped one moves
        // past the gap, so it can come out at or before `after`: skip those).
        let mut t = start.checked_add(1.second()).ok()?.with().subsec_nanosecond(0).build().ok()?;
        let limit = start.checked_add(5.years()).ok()?;
        while t <= limit {
            if self.months & (1 << t.month()) == 0 {
                t = first_of_next_month(t)?;
                continue;
            }
            if !self.day_matches(t.date()) {
                t = t.date().tomorrow().ok()?.to_datetime(jiff::civil::Time::midnight());
                continue;
            }
            if self.hours & (1 << t.hour()) == 0 {
                t = t.with().minute(0).second(0).build().ok()?.checked_add(1.hour()).ok()?;
                continue;
            }
            if self.minutes & (1 << t.minute()) == 0 {
                t = t.with().second(0).build().ok()?.checked_add(1.minute()).ok()?;
                continue;
            }
            if self.seconds & (1 << t.second()) == 0 {
                t = t.checked_add(1.second()).ok()?;
                continue;
            }
            let instant = tz.to_ambiguous_zoned(t).compatible().ok()?.timestamp();
            if instant > after {
                return Some(instant);
            }
            t = t.checked_add(1.second()).ok()?;
        }
        None
    }

    /// The latest time in `(after, until]` the schedule fired, if any: what a control plane
    /// that was down catches up — once, not once per missed time.
    pub fn latest_in(&self, after: Timestamp, until: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        let mut latest = None;
        let mut t = after;
        // Bounded: a per-second schedule down for a long while is walked at most this far.
        for _ in 0..100_000 {
            match self.next_after(t, tz) {
                Some(n) if n <= until => {
                    latest = Some(n);
                    t = n;
                }
                _ => return latest,
            }
        }
        // Past the bound: the schedule's latest time before `until`, from a day back.
        self.latest_in(until - jiff::SignedDuration::from_hours(24), until, tz).or(latest)
    }
}

fn first_of_next_month(t: DateTime) -> Option<DateTime> {
    let first = t.date().first_of_month().checked_add(1.month()).ok()?;
    Some(first.to_datetime(jiff::civil::Time::midnight()))
}

/// One field as a bit set of the values it allows.
fn field(name: &str, text: &str, min: u64, max: u64, names: &[&str]) -> Result<u64, String> {
    let bad = |why: String| format!("the {name} field {text:?}: {why}");
    let value = |s: &str| -> Result<u64, String> {
        if let Some(i) = names.iter().position(|n| n.eq_ignore_ascii_case(s)) {
            // Month names count from 1 (the field's minimum), day names from 0.
            return Ok(i as u64 + min);
        }
        let v: u64 = s.parse().map_err(|_| bad(format!("{s:?} is not a number")))?;
        if v < min || v > max {
            return Err(bad(format!("{v} is outside {min}-{max}")));
        }
        Ok(v)
    };
    let mut set = 0u64;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => (r, s.parse::<u64>().ok().filter(|s| *s > 0).ok_or_else(|| bad(format!("step {s:?} is not a positive number")))?),
            None => (part, 1),
        };
        let (lo, hi) = match range {
            "*" | "?" => (min, if name == "day-of-week" { 6 } else { max }),
            r => match r.split_once('-') {
                Some((a, b)) => (value(a)?, value(b)?),
                // `5/15`: from 5 to the end, every 15.
                None if step > 1 => (value(r)?, max),
                None => (value(r)?, value(r)?),
            },
        };
        if lo > hi {
            return Err(bad(format!("range {lo}-{hi} runs backwards")));
        }
        let mut v = lo;
        while v <= hi {
            set |= 1 << v;
            v += step;
        }
    }
    Ok(set)
}

/// An IANA time zone (`Europe/Paris`), or UTC when none is given.
pub fn time_zone(name: Option<&str>) -> Result<TimeZone, String> {
    match name.map(str::trim).filter(|n| !n.is_empty()) {
        None => Ok(TimeZone::UTC),
        Some(n) => TimeZone::get(n).map_err(|_| format!("{n:?} is not an IANA time zone (such as UTC or Europe/Paris)")),
    }
}

/// `t` in `tz`, for messages.
pub fn local(t: Timestamp, tz: &TimeZone) -> Zoned {
    t.to_zoned(tz.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn next(expr: &str, after: &str, tz: &str) -> String {
        let tz = time_zone(Some(tz)).unwrap();
        Cron::parse(expr).unwrap().next_after(at(after), &tz).unwrap().to_string()
    }

    #[test]
    fn fields_lists_ranges_steps_names_and_macros() {
        assert_eq!(next("*/15 * * * *", "2026-12-06T17:07:00Z", "UTC"), "2026-12-06T17:15:00Z");
        assert_eq!(next("0 2 * * *", "2026-12-06T17:07:00Z", "UTC"), "2026-12-07T02:00:00Z");
        assert_eq!(next("30 9 * * mon-fri", "2026-12-05T10:00:00Z", "UTC"), "2026-12-07T09:30:00Z", "Saturday: to Monday");
        assert_eq!(next("0 0 1 jan,jul *", "2026-02-01T00:00:00Z", "UTC"), "2026-07-01T00:00:00Z");
        assert_eq!(next("@weekly", "2026-12-06T00:00:00Z", "UTC"), "2026-12-13T00:00:00Z", "2026-12-06 is a Sunday: strictly after");
        assert_eq!(next("0 0 * * 7", "2026-12-07T00:00:00Z", "UTC"), "2026-12-13T00:00:00Z", "7 is Sunday");
        assert_eq!(next("*/10 * * * * *", "2026-12-06T17:07:03Z", "UTC"), "2026-12-06T17:07:10Z", "six fields: seconds first");
        // Both day fields: either matches (cron(8)).
        assert_eq!(next("0 0 13 * fri", "2026-12-06T00:00:00Z", "UTC"), "2026-12-11T00:00:00Z");
        assert!(Cron::parse("0 0 30 2 *").unwrap().next_after(at("2026-01-01T00:00:00Z"), &TimeZone::UTC).is_none());
    }

    #[test]
    fn time_zones_and_daylight_saving() {
        assert_eq!(next("0 2 * * *", "2026-12-06T12:00:00Z", "Europe/Paris"), "2026-12-07T01:00:00Z");
        // 2026-03-29 02:30 does not exist in Paris: run at the first instant after the gap.
        assert_eq!(next("30 2 * * *", "2026-03-28T12:00:00Z", "Europe/Paris"), "2026-03-29T01:30:00Z");
        // 2026-10-25 02:30 happens twice: once.
        let tz = time_zone(Some("Europe/Paris")).unwrap();
        let c = Cron::parse("30 2 * * *").unwrap();
        let first = c.next_after(at("2026-10-24T12:00:00Z"), &tz).unwrap();
        assert_eq!(first.to_string(), "2026-10-25T00:30:00Z");
        assert_eq!(c.next_after(first, &tz).unwrap().to_string(), "2026-10-26T01:30:00Z");
    }

    #[test]
    fn missed_times_are_caught_up_once_at_the_latest() {
        let c = Cron::parse("* * * * *").unwrap();
        let latest = c.latest_in(at("2026-12-06T17:00:00Z"), at("2026-12-06T17:05:30Z"), &TimeZone::UTC).unwrap();
        assert_eq!(latest.to_string(), "2026-12-06T17:05:00Z");
        assert_eq!(c.latest_in(at("2026-12-06T17:00:00Z"), at("2026-12-06T17:00:59Z"), &TimeZone::UTC), None);
        let every_second = Cron::parse("* * * * * *").unwrap();
        let far = every_second.latest_in(at("2026-01-01T00:00:00Z"), at("2026-12-06T17:05:30Z"), &TimeZone::UTC).unwrap();
        assert_eq!(far.to_string(), "2026-12-06T17:05:30Z", "a long outage is bounded work");
    }

    #[test]
    fn bad_expressions_and_zones_say_what_is_wrong() {
        for (expr, words) in [
            ("61 * * * *", "the minute field \"61\": 61 is outside 0-59"),
            ("* * * *", "4 fields"),
            ("*/0 * * * *", "step \"0\""),
            ("* * * foo *", "\"foo\" is not a number"),
            ("5-1 * * * *", "runs backwards"),
            ("@often", "unknown macro"),
        ] {
            let e = Cron::parse(expr).unwrap_err();
            assert!(e.contains(words), "{expr}: {e}");
        }
        assert!(time_zone(Some("Mars/Olympus")).unwrap_err().contains("not an IANA time zone"));
        assert_eq!(time_zone(None).unwrap(), TimeZone::UTC);
    }
}
