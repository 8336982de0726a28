//! Waiting inside a call. A driver waits on its backend (a task, a guest
//! shutdown) by sleeping between polls; the host does not count the time a
//! guest sleeps against its CPU budget.

use crate::Result;

/// Sleep for `ms` milliseconds.
pub fn sleep_ms(ms: u64) {
    std::thread::sleep(std::time::Duration::from_millis(ms));
}

/// Poll `done` every `interval_ms` until it returns true or `timeout_ms` has passed;
/// returns whether it became true. `done` is always called at least once.
pub fn wait_until(timeout_ms: u64, interval_ms: u64, mut done: impl FnMut() -> Result<bool>) -> Result<bool> {
    let start = std::time::Instant::now();
    loop {
        if done()? {
            return Ok(true);
        }
        let elapsed = start.elapsed().as_millis() as u64;
        if elapsed >= timeout_ms {
            return Ok(false);
        }
        sleep_ms(interval_ms.min(timeout_ms - elapsed).max(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_until_stops_when_done_or_late() {
        let mut n = 0;
        assert!(wait_until(1_000, 1, || {
            n += 1;
            Ok(n == 3)
        })
        .unwrap());
        assert_eq!(n, 3);
        let mut calls = 0;
        assert!(!wait_until(5, 1, || {
            calls += 1;
            Ok(false)
        })
        .unwrap());
        assert!(calls >= 2);
    }
}
