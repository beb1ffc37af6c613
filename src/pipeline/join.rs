//! Requests that may share one call (a hot SKU's DEDUCTs): what they
//! gather into, how a [`Join`] writes the call and splits its reply, and
//! the call still open to new members at the end of a pipe's queue.

use crate::answer;
use bytes::{Bytes, BytesMut};
use std::sync::Arc;

/// Requests gathered into one call ([`Pipelines::submit_joinable`]), as the
/// [`Join`] that writes the call gets them.
#[derive(Default)]
pub struct Gathered {
    /// What the members share, written by the first one's `shared`.
    pub shared: BytesMut,
    /// Each member's parts, one after the other.
    pub parts: BytesMut,
    /// Places in `parts` the encoders marked, in order: as many per member
    /// as its [`Join`] asks for (a member's parts end at its last mark).
    pub marks: Vec<usize>,
    /// How many members.
    pub members: usize,
}

/// Where the pieces of a call written alone lie in its bytes, as its
/// writer marked them ([`Join::gather_lone`] reads them).
pub type LoneMarks = [usize; 7];

/// How requests that may share one call are written into a batch.
pub trait Join: Send + Sync {
    /// Most members one call may have.
    fn most(&self) -> usize;
    /// Writes the call of `gathered`'s members into `out`: one member's own
    /// call when it has one member, else one call of them all.
    fn write(&self, gathered: &Gathered, out: &mut BytesMut);

    /// The reply of a call of `members` (two or more), as each member's
    /// reply, in order; `None` when it is not what the call answers (an
    /// error of the whole call), which then is each member's answer. By
    /// default the reply is an array of the members' replies.
    fn split(&self, frame: &Bytes, members: usize) -> Option<Vec<Bytes>> {
        Some(answer::elements(frame, members)?.collect())
    }

    /// Moves the first member of a call, written alone as its own call
    /// (`call`, its pieces at `marks`: [`Joinable`]'s lone writer), into
    /// `gathered`, as its shared and member writers would have written
    /// it: a second member is joining. Only a join whose requests are
    /// written alone first is asked.
    fn gather_lone(&self, call: &[u8], marks: &LoneMarks, gathered: &mut Gathered) {
        let _ = (call, marks, gathered);
        unreachable!("this join's requests are never written alone first")
    }
}

/// A waiter's share of the call its bytes are part of.
#[derive(Clone)]
pub(super) enum Part {
    /// A call of its own.
    Own,
    /// The first of the `members` of a gathered call (1: a joinable request
    /// that had no company) of join key hash `join`.
    Lead {
        members: usize,
        join: u64,
        writer: Arc<dyn Join>,
    },
    /// A later member of the call its lead heads.
    Member,
}

/// The gathered call still open to new members: the queue's last
/// `gathered.members` waiters, from `first`, whose bytes are not in
/// `output` yet.
#[derive(Default)]
pub(super) struct Open {
    pub(super) join: Option<Arc<dyn Join>>,
    pub(super) key: Vec<u8>,
    pub(super) hash: u64,
    pub(super) first: usize,
    pub(super) gathered: Gathered,
    /// Its one member, written alone into the queue's output from this
    /// offset, pieces marked: as its own call already, so that a call no
    /// other request joins (nearly every one, but in a flash sale) is
    /// written once. A second member gathers it first.
    pub(super) lone: Option<(usize, LoneMarks)>,
}

impl Open {
    pub(super) fn is_open(&self) -> bool {
        self.gathered.members > 0
    }

    pub(super) fn takes(&self, join: &Arc<dyn Join>, key: &[u8]) -> bool {
        self.is_open()
            && self.key == key
            && self.join.as_ref().is_some_and(|j| Arc::ptr_eq(j, join))
            && !self.full()
    }

    pub(super) fn full(&self) -> bool {
        self.join
            .as_ref()
            .is_some_and(|j| self.gathered.members >= j.most())
    }

    pub(super) fn clear(&mut self) {
        self.join = None;
        self.lone = None;
        self.key.clear();
        self.gathered.shared.clear();
        self.gathered.parts.clear();
        self.gathered.marks.clear();
        self.gathered.members = 0;
    }
}

/// The hash a gathered call is held by: two keys that share one only hold
/// each other's call back a little, never join (joining compares the keys).
pub(super) fn join_hash(key: &[u8]) -> u64 {
    // FNV-1a: a few instructions per byte, no setup.
    key.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A request's claim to share a call ([`Pipelines::submit_joinable`]),
/// and how it is written.
pub struct Joinable<'a, L, S, M> {
    /// Requests join only with the same key (a DEDUCT's: its stock key)...
    pub key: &'a [u8],
    /// ...and the same writer.
    pub join: &'a Arc<dyn Join>,
    /// Writes the request as its own call, its pieces marked, when it opens
    /// a call ([`Join::gather_lone`] gathers it if another joins); `None`:
    /// it is written gathered from the start.
    pub lone: Option<L>,
    /// Writes what the members of a call share.
    pub shared: S,
    /// Writes the request's own parts of a gathered call.
    pub member: M,
}
