//! The one rule for the short critical sections behind `std::sync::Mutex` in this crate.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking over a poisoned lock: a panic while holding one of these short critical
/// sections leaves plain maps behind, which are still consistent; keep serving rather than
/// cascading the panic.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
