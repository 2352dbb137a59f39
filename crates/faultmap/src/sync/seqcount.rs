//! A sequence count (the speculative page fault series' `vm_sequence`): lets a reader that takes no
//! lock find out whether a writer changed what it read.
//!
//! A writer (serialised by a lock of its own) makes the count odd before it
//! changes anything and even again after; a region that is unmapped keeps
//! it odd for good. A reader loads the count ([`SeqCount::begin`]; odd:
//! a writer is at work, give up), reads, and checks the count is unchanged
//! ([`SeqCount::still`]) before it acts on what it read. The data itself
//! must be atomics (relaxed is enough): a reader may read it mid-change,
//! and only the check tells it to throw the values away.
//!
//! Orderings (the classic seqlock's): the writer's first increment is
//! followed by a Release fence, so a reader that sees any store of the
//! change and then fences (Acquire) sees the odd count on its re-load; the
//! second increment is a Release after the stores. The reader's first load
//! is Acquire; an Acquire fence orders its data loads before the re-load.

use crate::sync::{fence, AtomicU64, Ordering};

/// A sequence count.
#[derive(Debug, Default)]
#[repr(transparent)]
pub(crate) struct SeqCount(AtomicU64);

impl SeqCount {
    /// The count if no writer is at work (even), else `None`.
    pub(crate) fn begin(&self) -> Option<u64> {
        let s = self.0.load(Ordering::Acquire);
        (s % 2 == 0).then_some(s)
    }

    /// The count as it is (odd while a writer is at work).
    pub(crate) fn raw(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Whether no writer began or ended a change since `begin` returned
    /// `seen`.
    pub(crate) fn still(&self, seen: u64) -> bool {
        fence(Ordering::Acquire);
        self.0.load(Ordering::Relaxed) == seen
    }

    /// Starts a change (the caller holds the writers' lock).
    pub(crate) fn write_begin(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
        // A reader that reads any of the change's stores and then fences
        // (acquire) synchronises with this fence, so its re-load sees the
        // odd count. (An AcqRel increment alone does not give this: its
        // release half orders what came before it. The loom model below
        // finds that bug.)
        fence(Ordering::Release);
    }

    /// Ends a change.
    pub(crate) fn write_end(&self) {
        self.0.fetch_add(1, Ordering::Release);
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// A change of two fields bracketed by the count, against a reader: a
    /// reader whose check passes saw both fields from the same side of the
    /// change, never one old and one new.
    #[test]
    fn loom_models_seqcount_change_vs_reader() {
        loom::model(|| {
            let seq = Arc::new(SeqCount::default());
            let a = Arc::new(AtomicU64::new(0));
            let b = Arc::new(AtomicU64::new(0));
            let reader = {
                let (seq, a, b) = (seq.clone(), a.clone(), b.clone());
                thread::spawn(move || {
                    if let Some(s) = seq.begin() {
                        let x = a.load(Ordering::Relaxed);
                        let y = b.load(Ordering::Relaxed);
                        if seq.still(s) {
                            assert_eq!(x, y, "a validated read mixed old and new");
                        }
                    }
                })
            };
            seq.write_begin();
            a.store(1, Ordering::Relaxed);
            b.store(1, Ordering::Relaxed);
            seq.write_end();
            reader.join().unwrap();
        });
    }
}
