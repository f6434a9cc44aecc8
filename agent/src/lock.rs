//! Taking a lock whatever a panicking holder left behind. The agent's locks guard caches and
//! bookkeeping that every write leaves whole (each is one insert, remove or assignment under the
//! guard), so a panic in one task must not turn every later user of the lock into another panic:
//! the state is taken as it is, as `PoisonError::into_inner` allows.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// [`Mutex::lock`] without the poison.
pub trait MutexExt<T: ?Sized> {
    fn lock_unpoisoned(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> MutexExt<T> for Mutex<T> {
    fn lock_unpoisoned(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`RwLock::read`] and [`RwLock::write`] without the poison.
pub trait RwLockExt<T: ?Sized> {
    fn read_unpoisoned(&self) -> RwLockReadGuard<'_, T>;
    fn write_unpoisoned(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> RwLockExt<T> for RwLock<T> {
    fn read_unpoisoned(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_unpoisoned(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::{
        panic,
        sync::{Arc, Mutex, RwLock},
    };

    use super::{MutexExt as _, RwLockExt as _};

    #[test]
    fn a_lock_a_panic_poisoned_still_gives_its_state() {
        let mutex = Arc::new(Mutex::new(1));
        let rwlock = Arc::new(RwLock::new(1));
        let (m, r) = (mutex.clone(), rwlock.clone());
        let poisoner = std::thread::spawn(move || {
            let _m = m.lock_unpoisoned();
            let _r = r.write_unpoisoned();
            panic::resume_unwind(Box::new("poison both locks"));
        });
        assert!(poisoner.join().is_err());
        assert!(mutex.is_poisoned() && rwlock.is_poisoned());
        *mutex.lock_unpoisoned() += 1;
        *rwlock.write_unpoisoned() += 1;
        assert_eq!(*mutex.lock_unpoisoned(), 2);
        assert_eq!(*rwlock.read_unpoisoned(), 2);
    }
}
