//! What every handle of one emulator shares: the world behind its lock, the device
//! thread's wake-up line, and the owner that joins the device thread when the last user
//! handle goes. Below the kernel (whose open files hold it) and above the world.

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use crate::state::World;
use crate::watch;

#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) world: Mutex<World>,
    /// The UDP sockets' descriptors (owned by the HCAs in `world`), for the idle wait.
    pub(crate) udp_fds: Vec<i32>,
    /// Threaded wake mode: the device thread's wake-up line (see [`WakeMode`](crate::config::WakeMode)).
    pub(crate) wake: Option<Arc<watch::Wake>>,
    /// The waking device thread's scheduling (`SCHED_*` above, or a real-time priority).
    pub(crate) sched: std::sync::atomic::AtomicI32,
    /// The waking device thread's kernel thread id (0 until it has started).
    pub(crate) device_tid: std::sync::atomic::AtomicI32,
}

impl Shared {
    /// The world, for a caller that may create device work (a kernel command): the device
    /// thread is woken when the guard drops.
    pub(crate) fn lock(&self) -> WorldGuard<'_> {
        WorldGuard {
            guard: self.lock_quiet(),
            wake: self.wake.as_deref(),
        }
    }

    /// The world, without waking the device (the device thread itself, read-only queries).
    pub(crate) fn lock_quiet(&self) -> MutexGuard<'_, World> {
        self.world
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The device thread may be blocked with no timeout: let it see that we are gone.
        if let Some(w) = &self.wake {
            w.poke();
        }
    }
}

/// What every user handle (an [`Emulator`] clone, an opened surface) holds besides the
/// world, and the device thread never does: when the last one goes, the device thread is
/// told and joined. (The thread looks at the world through a `Weak`, and may hold it for a
/// moment; the world's last handle can therefore drop on it, which cannot join itself. This
/// one is dropped only by users, after their handle on the world: the thread's next look
/// fails, and it returns.)
#[derive(Debug)]
pub(crate) struct Owner {
    pub(crate) wake: Option<Arc<watch::Wake>>,
    pub(crate) thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The world, to see that no handle but the device thread's momentary one is left.
    pub(crate) world: Weak<Shared>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        if let Some(w) = &self.wake {
            w.poke();
        }
        let handle = self
            .thread
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let Some(h) = handle else { return };
        if h.thread().id() == std::thread::current().id() {
            return;
        }
        // Every user handle has let the world go before its `Owner` (field order), so what
        // can still hold it is the device thread, for one step: wait for that (bounded), then
        // join. A holder that is not a user handle (none should exist) would keep the thread
        // running: it is then left to end when that holder goes, rather than waited for.
        for _ in 0..2000 {
            if self.world.strong_count() == 0 {
                let _ = h.join();
                return;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// The world locked by a kernel command; dropping it wakes the device thread, which then
/// sees whatever the command changed (a QP moved to the error state has to be flushed, a
/// new QP may have receives waiting, ...), as the old polling device would have within
/// milliseconds.
pub(crate) struct WorldGuard<'a> {
    guard: MutexGuard<'a, World>,
    wake: Option<&'a watch::Wake>,
}

impl std::ops::Deref for WorldGuard<'_> {
    type Target = World;
    fn deref(&self) -> &World {
        &self.guard
    }
}

impl std::ops::DerefMut for WorldGuard<'_> {
    fn deref_mut(&mut self) -> &mut World {
        &mut self.guard
    }
}

impl Drop for WorldGuard<'_> {
    fn drop(&mut self) {
        if let Some(w) = self.wake {
            w.poke();
        }
    }
}

/// The emulator: a set of HCAs on one fabric. Cheap to clone (an `Arc` inside).
#[derive(Clone, Debug)]
pub struct Emulator {
    pub(crate) shared: Arc<Shared>,
    /// Dropped after `shared` (fields drop in order): see [`Owner`].
    pub(crate) owner: Arc<Owner>,
}
