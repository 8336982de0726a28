//! A console session's bounds: how many may be open at once (per VM, per user), how long one
//! may sit idle and how long it may last at most. A session holds its place while it is
//! open ([`Admitted`]) and gives it back when it ends, however it ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::failure::Failure;
use crate::status::reasons::Reason;

/// The bounds of every console session this server opens.
#[derive(Clone, Debug)]
pub struct SessionLimits {
    /// Closed after this long without a byte either way.
    pub idle: Duration,
    /// Closed after this long, busy or not.
    pub max_duration: Duration,
    /// Open at once on one VM (both kinds together).
    pub per_vm: usize,
    /// Open at once by one user.
    pub per_user: usize,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits { idle: Duration::from_secs(15 * 60), max_duration: Duration::from_secs(8 * 3600), per_vm: 4, per_user: 16 }
    }
}

/// The sessions open now, counted per VM and per user.
#[derive(Default)]
pub struct Sessions {
    open: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    by_vm: HashMap<String, usize>,
    by_user: HashMap<String, usize>,
    total: usize,
}

/// A session's place among the open ones, given back when dropped.
pub struct Admitted {
    sessions: Arc<Sessions>,
    vm: String,
    user: String,
}

impl Sessions {
    /// Take a place for `user`'s session on VM `vm` (`namespace/name`) within `limits`.
    pub fn admit(self: &Arc<Self>, limits: &SessionLimits, vm: &str, user: &str) -> Result<Admitted, Failure> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let on_vm = open.by_vm.get(vm).copied().unwrap_or(0);
        if on_vm >= limits.per_vm {
            return Err(Failure::transient(Reason::TooManySessions, format!("VM {vm} has {on_vm} console sessions open, the most allowed (--console-max-per-vm)")));
        }
        let by_user = open.by_user.get(user).copied().unwrap_or(0);
        if by_user >= limits.per_user {
            return Err(Failure::transient(Reason::TooManySessions, format!("{user} has {by_user} console sessions open, the most allowed (--console-max-per-user)")));
        }
        *open.by_vm.entry(vm.to_string()).or_default() += 1;
        *open.by_user.entry(user.to_string()).or_default() += 1;
        open.total += 1;
        Ok(Admitted { sessions: self.clone(), vm: vm.to_string(), user: user.to_string() })
    }

    /// Sessions open now.
    pub fn count(&self) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).total
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut guard = self.sessions.open.lock().unwrap_or_else(|e| e.into_inner());
        let open = &mut *guard;
        for (counts, key) in [(&mut open.by_vm, &self.vm), (&mut open.by_user, &self.user)] {
            if let Some(n) = counts.get_mut(key) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    counts.remove(key);
                }
            }
        }
        open.total = open.total.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_bounded_per_vm_and_per_user_and_given_back_when_dropped() {
        let sessions = Arc::new(Sessions::default());
        let limits = SessionLimits { per_vm: 2, per_user: 3, ..Default::default() };
        let a = sessions.admit(&limits, "ns/web", "alice").unwrap();
        let _b = sessions.admit(&limits, "ns/web", "bob").unwrap();
        let refused = sessions.admit(&limits, "ns/web", "carol").err().unwrap();
        assert_eq!(refused.reason, Reason::TooManySessions);
        assert!(refused.message.contains("ns/web has 2"), "{}", refused.message);
        let _c = sessions.admit(&limits, "ns/db", "alice").unwrap();
        let _d = sessions.admit(&limits, "ns/cache", "alice").unwrap();
        let refused = sessions.admit(&limits, "ns/queue", "alice").err().unwrap();
        assert!(refused.message.contains("alice has 3"), "{}", refused.message);
        assert_eq!(sessions.count(), 4);
        drop(a);
        assert_eq!(sessions.count(), 3);
        sessions.admit(&limits, "ns/web", "carol").expect("a place given back is taken again");
    }
}
