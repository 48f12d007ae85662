//! Directory listings in progress, one per open directory (a FUSE handle): what the metadata
//! server sent that the kernel's buffer did not take yet, and whether the server said it was
//! the directory's last.
//!
//! The kernel reads a directory a buffer at a time (a page: a few dozen entries with their
//! attributes), and asks once more past the last entry to learn that it is the end. A page of
//! the server holds up to `READDIR_BATCH` entries and says whether it is the last. Without what
//! is kept here, every buffer asked the server again and dropped the rest of its page, and the
//! end cost a request of its own: `find` and `ls -lR` asked two listings of every directory.
//! A listing is kept for the attribute cache time at most: the attributes it holds are given
//! to the kernel with that trust.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use weft_proto::messages::{DirEntry, InodeAttr};

/// A directory's entries after some point, as the server listed them.
pub(super) struct Listing {
    /// The offset the kernel asks for next: the cookie of the last entry it took.
    pub next: u64,
    /// Entries the kernel did not take yet, with their attributes when listed with them.
    pub left: VecDeque<(DirEntry, Option<InodeAttr>)>,
    /// Whether the attributes were listed (READDIRPLUS): a listing without them serves only
    /// a READDIR.
    pub with_attrs: bool,
    /// The last of `left` is the directory's last entry.
    pub end: bool,
    /// When the server listed them.
    pub listed: Instant,
}

/// The listings of one mount's open directories.
pub(super) struct Listings {
    ttl: Duration,
    next_handle: AtomicU64,
    open: Mutex<HashMap<u64, Option<Listing>>>,
}

impl Listings {
    /// Keeps listings for `ttl` (zero: never).
    pub(super) fn new(ttl: Duration) -> Listings {
        Listings {
            ttl,
            next_handle: AtomicU64::new(1),
            open: Mutex::default(),
        }
    }

    /// A handle for a directory opened.
    pub(super) fn open(&self) -> u64 {
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        self.open
            .lock()
            .expect("listing table poisoned")
            .insert(handle, None);
        handle
    }

    /// Forgets the listing of a directory closed.
    pub(super) fn close(&self, handle: u64) {
        self.open
            .lock()
            .expect("listing table poisoned")
            .remove(&handle);
    }

    /// The listing kept for `handle` that goes on at `offset`, fresh, and with attributes if
    /// `with_attrs` asks for them (or with nothing left but the end); taken out, to be kept
    /// again with what the kernel does not take ([`Listings::keep`]).
    pub(super) fn take(&self, handle: u64, offset: u64, with_attrs: bool) -> Option<Listing> {
        let mut open = self.open.lock().expect("listing table poisoned");
        let listing = open.get_mut(&handle)?.take()?;
        let serves = listing.next == offset
            && listing.listed.elapsed() < self.ttl
            && (listing.with_attrs || !with_attrs || listing.left.is_empty())
            && (listing.end || !listing.left.is_empty());
        serves.then_some(listing)
    }

    /// Keeps `listing` for the next buffer of the directory open as `handle`, if it is still
    /// open and listings are kept at all.
    pub(super) fn keep(&self, handle: u64, listing: Listing) {
        if self.ttl.is_zero() {
            return;
        }
        if let Some(kept) = self
            .open
            .lock()
            .expect("listing table poisoned")
            .get_mut(&handle)
        {
            *kept = Some(listing);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_proto::ids::InodeId;
    use weft_proto::messages::FileKind;

    fn listing(next: u64, left: u64, end: bool, with_attrs: bool) -> Listing {
        Listing {
            next,
            left: (0..left)
                .map(|at| {
                    let entry = DirEntry {
                        name: format!("f{at}"),
                        inode: InodeId(100 + at),
                        kind: FileKind::Regular,
                        cookie: next + 1 + at,
                    };
                    (entry, None)
                })
                .collect(),
            with_attrs,
            end,
            listed: Instant::now(),
        }
    }

    // Goal: a kept listing answers only the buffer that goes on where the kernel stopped, with
    // what that buffer needs, and only once; a closed directory keeps nothing.
    #[test]
    fn a_listing_serves_only_where_it_goes_on() {
        let listings = Listings::new(Duration::from_secs(60));
        let handle = listings.open();
        listings.keep(handle, listing(7, 3, false, true));
        assert!(listings.take(handle, 6, true).is_none(), "another offset");
        listings.keep(handle, listing(7, 3, false, true));
        let taken = listings.take(handle, 7, true).expect("goes on at 7");
        assert_eq!(taken.left.len(), 3);
        assert!(listings.take(handle, 7, true).is_none(), "taken once");

        listings.keep(handle, listing(9, 2, false, false));
        assert!(
            listings.take(handle, 9, true).is_none(),
            "names without attributes do not serve a listing with them"
        );
        listings.keep(handle, listing(9, 0, true, false));
        assert!(
            listings.take(handle, 9, true).is_some(),
            "the end serves either"
        );
        listings.keep(handle, listing(9, 0, false, true));
        assert!(
            listings.take(handle, 9, true).is_none(),
            "nothing left and not the end: the server is asked"
        );

        listings.close(handle);
        listings.keep(handle, listing(9, 0, true, true));
        assert!(listings.take(handle, 9, true).is_none(), "closed");

        let never = Listings::new(Duration::ZERO);
        let handle = never.open();
        never.keep(handle, listing(3, 1, true, true));
        assert!(never.take(handle, 3, true).is_none(), "no attribute cache");
    }
}
