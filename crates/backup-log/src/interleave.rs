//! Interleaving points: where a deterministic simulator may run other work in the middle
//! of a production call.
//!
//! Job: production code marks the few places whose interleaving with other operations
//! matters for correctness (for example [`crate::LogEngine::recover_zone`] between its
//! flush and its snapshot of the versions) with [`point`]. Normally nothing is installed
//! and [`point`] costs one thread-local read. The simulator of `myriad-testing`
//! (`myriad_testing::sim`) installs a hook for the duration of one call with
//! [`with_hook`]; the hook runs on the calling thread, in the simulator's seeded order,
//! whatever other operations the simulator decides happen "meanwhile" at that point.
//!
//! Invariants:
//! - A hook is per thread and only for the extent of [`with_hook`]; production threads
//!   never see one.
//! - A hook is not re-entered: a point reached from inside the hook does nothing.
//!
//! Callers: the log engine's recovery read, the backup service and the peer's restart
//! step (`myriad-node`) mark points; the simulator installs hooks.

use std::cell::RefCell;

/// An installed hook: called at every [`point`] with the point's name.
type BoxedHook = Box<dyn FnMut(&'static str)>;

thread_local! {
    static HOOK: RefCell<Option<BoxedHook>> = const { RefCell::new(None) };
}

/// Marks an interleaving point named `name` (a stable dotted name such as
/// `"log.recover_zone.flushed"`): runs the hook of this thread if one is installed.
pub fn point(name: &'static str) {
    // Take the hook out while it runs, so a point reached inside it does nothing.
    let hook = HOOK.with(|slot| slot.borrow_mut().take());
    if let Some(mut hook) = hook {
        hook(name);
        HOOK.with(|slot| *slot.borrow_mut() = Some(hook));
    }
}

/// Runs `body` with `hook` installed on this thread (replacing none: hooks do not nest;
/// an outer hook is put back afterwards), and returns what `body` returned.
pub fn with_hook<R>(hook: impl FnMut(&'static str) + 'static, body: impl FnOnce() -> R) -> R {
    struct Restore(Option<BoxedHook>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0.take();
            HOOK.with(|slot| *slot.borrow_mut() = outer);
        }
    }
    let outer = HOOK.with(|slot| slot.borrow_mut().replace(Box::new(hook)));
    let _restore = Restore(outer);
    body()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn a_hook_sees_the_points_of_its_body_only() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        point("before");
        let log = Arc::clone(&seen);
        let answer = with_hook(
            move |name| {
                log.lock().unwrap().push(name);
                point("inside the hook");
            },
            || {
                point("a");
                point("b");
                7
            },
        );
        point("after");
        assert_eq!(answer, 7);
        assert_eq!(*seen.lock().unwrap(), vec!["a", "b"]);
    }
}
