//! What waits for what among one connection's unfinished requests.
//!
//! A request takes effect after every request sent before it on the same
//! connection, as Redis promises. So a request waits for an unfinished
//! earlier one whenever they touch the same thing:
//!
//! - an order command that names no SKU ([`Touch::All`]) waits for every
//!   unfinished request before it, and every request after it waits for
//!   it;
//! - otherwise two requests wait on each other's keys: a SKU's, or an
//!   order's intent (an ORDER touches its intent and every line's SKU);
//! - except that on one SKU a script call does not wait for an earlier
//!   script call or read that is with the SKU's node pipe, nor a read for
//!   an earlier read: the pipe keeps them in order itself ([`Mode`],
//!   [`Sending`]).
//!
//! [`Index`] answers "must this one wait?" and "which held request may go
//! now?" in O(log n): each key keeps the tickets of the unfinished
//! requests on it, sorted, by how they stand; a held request can only
//! be let go by a change of an earlier request on one of its keys (or of
//! an earlier `All`), and of the held requests on one key only the first
//! can (it holds back those after it), so each change names at most one
//! candidate per key it touches. A connection pays for the index only
//! while it needs it: a pipeline of plain script calls never builds one.

use bytes::Bytes;
use std::collections::{BTreeSet, HashMap};

/// The index's maps hash SKUs and order ids with foldhash (seeded per
/// process), not std's SipHash, which was a third of the index's cost.
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// What an unfinished request touches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Touch {
    /// Nothing that orders it (a request being settled right now).
    Nothing,
    /// One SKU's keys (its name as sent).
    Sku(Bytes),
    /// An order's intent and its lines' SKUs, sorted: two orders are
    /// compared by one merge of their SKUs.
    Lines { id: Bytes, skus: Vec<Bytes> },
    /// Everything.
    All,
}

/// What an unfinished request touches, borrowed from its slot: what a
/// look at every earlier request reads, with nothing copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TouchRef<'a> {
    Nothing,
    Sku(&'a [u8]),
    Lines { id: &'a [u8], skus: &'a [Bytes] },
    All,
}

impl Touch {
    pub(super) fn as_ref(&self) -> TouchRef<'_> {
        match self {
            Touch::Nothing => TouchRef::Nothing,
            Touch::Sku(sku) => TouchRef::Sku(sku),
            Touch::Lines { id, skus } => TouchRef::Lines { id, skus },
            Touch::All => TouchRef::All,
        }
    }
}

impl TouchRef<'_> {
    /// Its kind alone, with no name borrowed (to compare kinds).
    pub(super) fn kindless(self) -> TouchRef<'static> {
        match self {
            TouchRef::Nothing => TouchRef::Nothing,
            TouchRef::Sku(_) => TouchRef::Sku(&[]),
            TouchRef::Lines { .. } => TouchRef::Lines { id: &[], skus: &[] },
            TouchRef::All => TouchRef::All,
        }
    }

    /// As the index keeps it.
    pub(super) fn to_owned(self) -> Touch {
        match self {
            TouchRef::Nothing => Touch::Nothing,
            TouchRef::Sku(sku) => Touch::Sku(Bytes::copy_from_slice(sku)),
            TouchRef::Lines { id, skus } => Touch::Lines {
                id: Bytes::copy_from_slice(id),
                skus: skus.to_vec(),
            },
            TouchRef::All => Touch::All,
        }
    }
}

/// How an unfinished request stands with its node pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// A plain script call, in its pipe's order.
    Script,
    /// A read of its SKU's keys (a sold-out DEDUCT), with its pipe; its
    /// script, if the read calls for it, runs later on a path of its own.
    Read,
    /// Anything else: held back, running on a path of its own, being
    /// settled.
    Other,
}

/// How a request would go to Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sending {
    /// A script call on its SKU's node pipe.
    Script,
    /// A read on its SKU's node pipe ([`Mode::Read`]).
    ReadFirst,
    /// A path of its own (the redis crate), or a request that touches
    /// more than one SKU's keys.
    Alone,
}

/// What a look at every earlier request reads of one: [`Entry`],
/// borrowed.
#[derive(Debug, Clone, Copy)]
pub(super) struct EntryRef<'a> {
    pub(super) touch: TouchRef<'a>,
    pub(super) mode: Mode,
    pub(super) held: bool,
}

impl EntryRef<'_> {
    fn standing(&self) -> Mode {
        match self.touch {
            TouchRef::Lines { .. } => Mode::Other,
            _ if self.held => Mode::Other,
            _ => self.mode,
        }
    }
}

/// What an index keeps of one unfinished request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) touch: Touch,
    pub(super) mode: Mode,
    /// Held back: not sent yet, or its fallback not run yet.
    pub(super) held: bool,
}

impl Entry {
    #[cfg(test)]
    pub(super) fn as_ref(&self) -> EntryRef<'_> {
        EntryRef {
            touch: self.touch.as_ref(),
            mode: self.mode,
            held: self.held,
        }
    }

    /// How it stands on its keys: a held request is with no pipe, and an
    /// order's saga is a path of its own on each of its keys.
    fn standing(&self) -> Mode {
        match self.touch {
            Touch::Lines { .. } => Mode::Other,
            _ if self.held => Mode::Other,
            _ => self.mode,
        }
    }
}

/// One key a request touches.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Sku(Bytes),
    Order(Bytes),
}

impl Touch {
    fn keys(&self) -> Vec<Key> {
        match self {
            Touch::Nothing | Touch::All => Vec::new(),
            Touch::Sku(sku) => vec![Key::Sku(sku.clone())],
            Touch::Lines { id, skus } => std::iter::once(Key::Order(id.clone()))
                .chain(skus.iter().cloned().map(Key::Sku))
                .collect(),
        }
    }
}

/// The unfinished requests on one key, by ticket.
#[derive(Debug, Default)]
struct OnKey {
    open: BTreeSet<u64>,
    /// The ones a script call can't follow: all but plain script calls.
    not_script: BTreeSet<u64>,
    /// The ones a read can't follow either.
    other: BTreeSet<u64>,
    held: BTreeSet<u64>,
}

impl OnKey {
    fn is_empty(&self) -> bool {
        self.open.is_empty()
    }
}

/// A connection's unfinished requests, by what they touch.
#[derive(Debug, Default)]
pub(super) struct Index {
    entries: Map<u64, Entry>,
    open: BTreeSet<u64>,
    /// The ones that touch everything.
    all: BTreeSet<u64>,
    held: BTreeSet<u64>,
    on_key: Map<Key, OnKey>,
}

fn before(set: &BTreeSet<u64>, ticket: u64) -> bool {
    set.first().is_some_and(|&first| first < ticket)
}

impl Index {
    /// Whether a request of `ticket` touching `touch`, sent `how`, must
    /// wait for an unfinished request before it.
    pub(super) fn waits(&self, ticket: u64, touch: &Touch, how: Sending) -> bool {
        match touch {
            Touch::Nothing => false,
            Touch::All => before(&self.open, ticket),
            Touch::Sku(_) | Touch::Lines { .. } => {
                if before(&self.all, ticket) {
                    return true;
                }
                let how = match touch {
                    Touch::Lines { .. } => Sending::Alone,
                    _ => how,
                };
                touch.keys().iter().any(|key| {
                    let Some(on) = self.on_key.get(key) else {
                        return false;
                    };
                    match how {
                        Sending::Script => before(&on.not_script, ticket),
                        Sending::ReadFirst => before(&on.other, ticket),
                        Sending::Alone => before(&on.open, ticket),
                    }
                })
            }
        }
    }

    /// Sets what the unfinished request of `ticket` is now (`None`: it is
    /// finished), and adds to `candidates` the held requests this change
    /// may let go.
    pub(super) fn set(&mut self, ticket: u64, now: Option<Entry>, candidates: &mut BTreeSet<u64>) {
        let was = self.entries.get(&ticket);
        if was == now.as_ref() {
            return;
        }
        if let Some(was) = self.entries.remove(&ticket) {
            self.candidates_after(ticket, &was, candidates);
            self.take_out(ticket, &was);
        }
        if let Some(now) = now {
            self.put_in(ticket, &now);
            self.entries.insert(ticket, now);
        }
    }

    fn put_in(&mut self, ticket: u64, entry: &Entry) {
        self.open.insert(ticket);
        if entry.held {
            self.held.insert(ticket);
        }
        if entry.touch == Touch::All {
            self.all.insert(ticket);
        }
        let mode = entry.standing();
        for key in entry.touch.keys() {
            let on = self.on_key.entry(key).or_default();
            on.open.insert(ticket);
            if mode != Mode::Script {
                on.not_script.insert(ticket);
            }
            if mode == Mode::Other {
                on.other.insert(ticket);
            }
            if entry.held {
                on.held.insert(ticket);
            }
        }
    }

    fn take_out(&mut self, ticket: u64, entry: &Entry) {
        self.open.remove(&ticket);
        self.held.remove(&ticket);
        self.all.remove(&ticket);
        for key in entry.touch.keys() {
            if let Some(on) = self.on_key.get_mut(&key) {
                on.open.remove(&ticket);
                on.not_script.remove(&ticket);
                on.other.remove(&ticket);
                on.held.remove(&ticket);
                if on.is_empty() {
                    self.on_key.remove(&key);
                }
            }
        }
    }

    /// The held requests a change of the request of `ticket` (which was
    /// `was`) may let go: on each of its keys, the first held one after
    /// it (any later one waits for that one); the first held `All` after
    /// it; and, when it touched everything, every held one up to the next
    /// unfinished `All`.
    fn candidates_after(&self, ticket: u64, was: &Entry, candidates: &mut BTreeSet<u64>) {
        for key in was.touch.keys() {
            if let Some(first) = self
                .on_key
                .get(&key)
                .and_then(|on| on.held.range(ticket + 1..).next())
            {
                candidates.insert(*first);
            }
        }
        if let Some(&next_all) = self.all.range(ticket + 1..).next()
            && self.held.contains(&next_all)
        {
            candidates.insert(next_all);
        }
        if was.touch == Touch::All {
            let until = self
                .all
                .range(ticket + 1..)
                .next()
                .copied()
                .unwrap_or(u64::MAX);
            candidates.extend(self.held.range(ticket + 1..until));
        }
    }
}

/// The rule itself, by a look at every earlier request: what [`Index`]
/// answers in O(log n), kept as the test of it (debug builds check every
/// answer of the index against it).
pub(super) fn waits_by_scan<'a2>(
    earlier: impl Iterator<Item = EntryRef<'a2>>,
    touch: TouchRef<'a2>,
    how: Sending,
) -> bool {
    earlier.into_iter().any(|e| holds_back(&e, touch, how))
}

/// Whether the unfinished request `e` holds back a later one that touches
/// `touch`, sent `how`: the rule for one pair ([`waits_by_scan`]).
pub(super) fn holds_back<'a>(e: &EntryRef<'a>, touch: TouchRef<'a>, how: Sending) -> bool {
    // A request's SKUs: a single one's, or an order's lines'.
    let skus = |t: &TouchRef<'a>| -> (Option<&'a [u8]>, &'a [Bytes]) {
        match *t {
            TouchRef::Sku(sku) => (Some(sku), &[]),
            TouchRef::Lines { skus, .. } => (None, skus),
            TouchRef::Nothing | TouchRef::All => (None, &[]),
        }
    };
    // Whether two requests share a SKU (an order's SKUs are sorted).
    let share = |a: &TouchRef<'a>, b: &TouchRef<'a>| -> bool {
        match (skus(a), skus(b)) {
            ((Some(one), _), (_, many)) | ((_, many), (Some(one), _)) => {
                many.binary_search_by(|s| s[..].cmp(one)).is_ok()
            }
            ((None, a_many), (None, b_many)) => sorted_share(a_many, b_many),
        }
    };
    match (e.touch, touch) {
        (_, TouchRef::Nothing) => false,
        // Even a request whose SKU is not known at this moment (being
        // settled) is before an `All`.
        (TouchRef::All, _) | (_, TouchRef::All) => true,
        (TouchRef::Nothing, _) => false,
        (TouchRef::Lines { id: a, .. }, TouchRef::Lines { id: b, .. }) if a == b => true,
        (TouchRef::Lines { .. }, _) | (_, TouchRef::Lines { .. }) => share(&e.touch, &touch),
        (TouchRef::Sku(a), TouchRef::Sku(b)) => {
            a == b
                && !matches!(
                    (e.standing(), how),
                    (Mode::Script, Sending::Script | Sending::ReadFirst)
                        | (Mode::Read, Sending::ReadFirst)
                )
        }
    }
}

/// Whether two sorted lists of SKUs have one in common: one merge.
fn sorted_share(a: &[Bytes], b: &[Bytes]) -> bool {
    let (mut i, mut j) = (0, 0);
    while let (Some(x), Some(y)) = (a.get(i), b.get(j)) {
        match x[..].cmp(&y[..]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => return true,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sku(s: &str) -> Touch {
        Touch::Sku(Bytes::copy_from_slice(s.as_bytes()))
    }

    fn entry(touch: Touch, mode: Mode, held: bool) -> Entry {
        Entry { touch, mode, held }
    }

    #[test]
    fn a_script_call_follows_the_pipes_calls_of_its_sku_and_nothing_else() {
        let mut index = Index::default();
        let mut candidates = BTreeSet::new();
        index.set(
            1,
            Some(entry(sku("a"), Mode::Script, false)),
            &mut candidates,
        );
        index.set(2, Some(entry(sku("a"), Mode::Read, false)), &mut candidates);
        assert!(!index.waits(3, &sku("a"), Sending::ReadFirst));
        assert!(
            index.waits(3, &sku("a"), Sending::Script),
            "a script waits for a read"
        );
        assert!(index.waits(3, &sku("a"), Sending::Alone));
        assert!(!index.waits(3, &sku("b"), Sending::Alone));
        // Nothing after a request holds it back.
        assert!(!index.waits(1, &sku("a"), Sending::Alone));
        let order = Touch::Lines {
            id: Bytes::from_static(b"o1"),
            skus: vec![Bytes::from_static(b"x"), Bytes::from_static(b"a")],
        };
        assert!(
            index.waits(3, &order, Sending::Script),
            "an order waits on its lines' SKUs"
        );
        assert!(index.waits(3, &Touch::All, Sending::Alone));
    }

    #[test]
    fn a_finished_request_names_the_first_held_one_of_each_key_it_touched() {
        let mut index = Index::default();
        let mut candidates = BTreeSet::new();
        index.set(
            1,
            Some(entry(sku("a"), Mode::Other, false)),
            &mut candidates,
        );
        index.set(
            2,
            Some(entry(sku("b"), Mode::Other, false)),
            &mut candidates,
        );
        for (ticket, name) in [(3, "a"), (4, "a"), (5, "b")] {
            index.set(
                ticket,
                Some(entry(sku(name), Mode::Other, true)),
                &mut candidates,
            );
        }
        index.set(
            6,
            Some(entry(Touch::All, Mode::Other, true)),
            &mut candidates,
        );
        index.set(7, Some(entry(sku("a"), Mode::Other, true)), &mut candidates);
        assert!(candidates.is_empty());
        index.set(1, None, &mut candidates);
        assert_eq!(candidates.iter().copied().collect::<Vec<_>>(), [3, 6]);
        assert!(!index.waits(3, &sku("a"), Sending::Alone));
        assert!(
            index.waits(4, &sku("a"), Sending::Alone),
            "3 is still before it"
        );
        assert!(index.waits(6, &Touch::All, Sending::Alone));
    }

    /// One step of a connection's life, as the index sees it.
    #[derive(Debug, Clone)]
    enum Step {
        /// A new request, after every other.
        Push(Touch, Mode, bool),
        /// The request at this place among the unfinished ones changes.
        Change(usize, Mode, bool),
        Finish(usize),
    }

    fn touches() -> impl Strategy<Value = Touch> {
        let name = prop_oneof![Just("a"), Just("b"), Just("c")];
        prop_oneof![
            4 => name.clone().prop_map(sku),
            1 => (prop_oneof![Just("o1"), Just("o2")], prop::collection::vec(name, 1..3)).prop_map(
                |(id, mut skus)| {
                    skus.sort_unstable();
                    Touch::Lines {
                        id: Bytes::from_static(id.as_bytes()),
                        skus: skus.into_iter().map(|s| Bytes::from_static(s.as_bytes())).collect(),
                    }
                }
            ),
            1 => Just(Touch::All),
            1 => Just(Touch::Nothing),
        ]
    }

    fn modes() -> impl Strategy<Value = Mode> {
        prop_oneof![Just(Mode::Script), Just(Mode::Read), Just(Mode::Other)]
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        let step = prop_oneof![
            3 => (touches(), modes(), any::<bool>()).prop_map(|(t, m, h)| Step::Push(t, m, h)),
            2 => (any::<usize>(), modes(), any::<bool>()).prop_map(|(i, m, h)| Step::Change(i, m, h)),
            2 => any::<usize>().prop_map(Step::Finish),
        ];
        prop::collection::vec(step, 1..80)
    }

    proptest! {
        /// Whatever the connection does, the index answers every question
        /// as a look at every earlier request does; and when a request is
        /// changed or finishes, every held request that no longer has to
        /// wait is among the candidates the change named.
        #[test]
        fn the_index_agrees_with_a_look_at_every_earlier_request(steps in steps()) {
            let mut index = Index::default();
            let mut open: Vec<(u64, Entry)> = Vec::new();
            let mut next = 0u64;
            for step in steps {
                let mut candidates = BTreeSet::new();
                let blocked_before: Vec<u64> = open
                    .iter()
                    .filter(|(t, e)| e.held && waits_by_scan(
                        open.iter().filter(|(u, _)| u < t).map(|(_, e)| e.as_ref()), e.touch.as_ref(), Sending::Alone))
                    .map(|(t, _)| *t)
                    .collect();
                match step {
                    Step::Push(touch, mode, held) => {
                        next += 1;
                        let e = entry(touch, mode, held);
                        index.set(next, Some(e.clone()), &mut candidates);
                        open.push((next, e));
                    }
                    Step::Change(i, mode, held) if !open.is_empty() => {
                        let i = i % open.len();
                        let (ticket, e) = &mut open[i];
                        e.mode = mode;
                        e.held = held;
                        index.set(*ticket, Some(e.clone()), &mut candidates);
                    }
                    Step::Finish(i) if !open.is_empty() => {
                        let (ticket, _) = open.remove(i % open.len());
                        index.set(ticket, None, &mut candidates);
                    }
                    _ => {}
                }
                for how in [Sending::Script, Sending::ReadFirst, Sending::Alone] {
                    for touch in [sku("a"), sku("b"), Touch::All] {
                        let by_scan = waits_by_scan(open.iter().map(|(_, e)| e.as_ref()), touch.as_ref(), how);
                        prop_assert_eq!(index.waits(next + 1, &touch, how), by_scan);
                    }
                    for (ticket, e) in &open {
                        let earlier = open.iter().filter(|(t, _)| t < ticket).map(|(_, e)| e.as_ref());
                        prop_assert_eq!(index.waits(*ticket, &e.touch, how), waits_by_scan(earlier, e.touch.as_ref(), how));
                    }
                }
                // A held request that had to wait and no longer has to was
                // named by the change (unless it changed itself).
                for (ticket, e) in &open {
                    let earlier = open.iter().filter(|(t, _)| t < ticket).map(|(_, e)| e.as_ref());
                    let free = !waits_by_scan(earlier, e.touch.as_ref(), Sending::Alone);
                    let was_blocked = blocked_before.contains(ticket);
                    if e.held && free && was_blocked {
                        prop_assert!(candidates.contains(ticket), "{ticket} freed but not named: {candidates:?}");
                    }
                }
            }
        }
    }
}
