//! The replies a connection owes, in request order, and the state of the
//! request behind each.

use super::Request;
use super::precedence::{
    Entry, EntryRef, Index, Mode, Sending, TouchRef, holds_back, waits_by_scan,
};
use crate::reply::{Protocol, Reply};
use crate::stock::{StockCall, Touches};
use bytes::{Bytes, BytesMut};
use std::cell::Cell;
use std::collections::{BTreeSet, VecDeque};

/// The replies a connection owes, in request order. Each request gets the
/// next ticket; a reply is written once every reply before it is.
///
/// It also keeps the order in which requests take effect: a stock request
/// is sent only when no unfinished request before it touches what it
/// touches ([`Touches`]), unless both are script calls on one SKU's node
/// pipe, which keeps them in order itself. Requests on different SKUs go
/// at once, so a pipeline over many SKUs loses nothing; and while every
/// unfinished request is a plain script call with its pipe (a pipeline of
/// DEDUCTs), a new script call goes without a look at any of them.
#[derive(Default)]
pub(super) struct Replies {
    pub(super) slots: VecDeque<Slot>,
    /// The ticket of `slots[0]`.
    first: u64,
    /// Slots whose call is with a node pipe.
    pub(super) sent: usize,
    /// Stock slots not answered yet...
    open: usize,
    /// ...of which the ones that touch everything (orders)...
    open_all: usize,
    /// ...and the ones not in a node pipe's order: all but a plain script
    /// call with its pipe (held back, running as a future or a fallback,
    /// reading first). While none is, a script call never waits.
    irregular: usize,
    /// Slots held back (a request not sent yet, or a fallback not run yet).
    pub(super) held: usize,
    /// What the unfinished requests touch, while a request may have to
    /// wait: built when one first might, dropped when nothing is
    /// unfinished ([`super::precedence`]).
    index: Option<Index>,
    /// Held requests that a change may have let go, to look at.
    candidates: BTreeSet<u64>,
}

/// Up to this many requests in flight, whether one must wait, and which
/// held one may go, is a look at each earlier one; past it the index
/// answers ([`super::precedence`]). A short pipeline keeps no index, even
/// with orders and held requests in it: keeping one costs each change of
/// a slot more than a look at a few dozen does.
const SCAN_MOST: usize = 64;

/// What a slot's request touches ([`Touches`], without the SKU's name:
/// that is the request's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Not a stock request: answered on the spot.
    Local,
    Piped,
    Sku,
    /// An ORDER or ORDER.HOLD ([`Lines`]).
    Lines,
    All,
}

impl Kind {
    pub(super) fn of(touches: Touches<'_>) -> Kind {
        match touches {
            Touches::Piped(_) => Kind::Piped,
            Touches::Sku(_) => Kind::Sku,
            Touches::Lines { .. } => Kind::Lines,
            Touches::All => Kind::All,
        }
    }
}

/// What an ORDER or ORDER.HOLD touches ([`Touches::Lines`]): its order
/// and its lines' SKUs, kept with its slot while it is unfinished (its
/// request moves into the saga's future).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Lines {
    id: Bytes,
    skus: Vec<Bytes>,
}

impl Lines {
    pub(super) fn of(touches: Touches<'_>) -> Option<Box<Lines>> {
        let Touches::Lines { id, pairs } = touches else {
            return None;
        };
        let mut skus: Vec<Bytes> = pairs
            .iter()
            .step_by(2)
            .map(|word| word.slice(..crate::stock::order::lines::sku_of(word).len()))
            .collect();
        // Sorted, as the look at earlier requests compares them.
        skus.sort_unstable();
        Some(Box::new(Lines {
            id: Bytes::copy_from_slice(id),
            skus,
        }))
    }
}

/// One request's place in the reply order, and the protocol its reply is
/// encoded in (fixed when the request was read: a later HELLO doesn't
/// change it).
pub(super) struct Slot {
    protocol: Protocol,
    state: SlotState,
    kind: Kind,
    /// The SKU of a request running as a future (its call moved into it).
    running_sku: Option<Bytes>,
    /// An order's footprint, while it is unfinished.
    lines: Option<Box<Lines>>,
    /// Held: the earlier request that held it back when last looked at
    /// ([`Replies::first_free_held`]).
    blocker: Cell<Option<Blocker>>,
}

/// An unfinished request that holds a held one back, as it stood then:
/// while it stands so, it holds it back still (the rule reads only what
/// each touches and how it stands), and the held one needs no new look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Blocker {
    ticket: u64,
    mode: Mode,
    held: bool,
    /// Which kind of touch it had ([`TouchRef`]'s variant): a request
    /// being settled touches nothing, then its SKU again.
    touch: std::mem::Discriminant<TouchRef<'static>>,
}

pub(super) enum SlotState {
    Ready(Reply),
    /// With a node pipe; the answer comes through the mailbox.
    Sent(StockCall),
    /// Running as a future, or being settled.
    Pending,
    /// Not sent yet: an unfinished request before it touches the same.
    Held(Request),
    /// Its answer calls for the slow path, which waits for the unfinished
    /// requests before it on its SKU.
    HeldFallback(StockCall),
}

impl SlotState {
    /// A plain script call with its node pipe: in the pipe's order with
    /// the later calls of its SKU (a read-first DEDUCT may yet take the
    /// slow path: it is not).
    fn is_plain(&self) -> bool {
        matches!(self, SlotState::Sent(call) if !call.reads_first())
    }
}

/// What a slot in some state counts for ([`Replies::tally`]).
#[derive(Clone, Copy)]
struct Counted {
    sent: bool,
    open: bool,
    all: bool,
    irregular: bool,
    held: bool,
}

impl Counted {
    #[inline(always)]
    fn of(kind: Kind, state: &SlotState) -> Counted {
        let open = kind != Kind::Local && !matches!(state, SlotState::Ready(_));
        Counted {
            sent: matches!(state, SlotState::Sent(_)),
            open,
            all: open && kind == Kind::All,
            irregular: open && !state.is_plain(),
            held: matches!(state, SlotState::Held(_) | SlotState::HeldFallback(_)),
        }
    }
}

/// What [`Replies::take_releasable`] hands back to be sent.
pub(super) enum Released {
    Request(Request),
    Fallback(StockCall),
}

impl Slot {
    fn is_open(&self) -> bool {
        self.kind != Kind::Local && !matches!(self.state, SlotState::Ready(_))
    }

    /// The SKU its request is on, while it is open.
    fn sku(&self) -> Option<&[u8]> {
        match &self.state {
            SlotState::Sent(call) | SlotState::HeldFallback(call) => Some(call.sku()),
            SlotState::Held(request) => request.args.first().map(|sku| &sku[..]),
            SlotState::Pending => self.running_sku.as_deref(),
            SlotState::Ready(_) => None,
        }
    }
}

impl Replies {
    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Whether it keeps room for slots it has none in (see
    /// [`super::InFlight::give_back`]).
    pub(super) fn holds_memory(&self) -> bool {
        self.slots.is_empty() && self.slots.capacity() > 0
    }

    /// The ticket the next request pushed gets.
    pub(super) fn next_ticket(&self) -> u64 {
        self.first + self.slots.len() as u64
    }

    fn index(&self, ticket: u64) -> Option<usize> {
        let index = usize::try_from(ticket.checked_sub(self.first)?).ok()?;
        (index < self.slots.len()).then_some(index)
    }

    /// Counts a slot's state in (`+1`) or out (`-1`): every change of a
    /// slot's state goes through here, so the counts stay exact.
    #[inline(always)]
    fn tally(&mut self, counted: Counted, sign: isize) {
        let step = |count: &mut usize, on: bool| {
            if on {
                *count = count.wrapping_add_signed(sign);
            }
        };
        step(&mut self.sent, counted.sent);
        step(&mut self.open, counted.open);
        step(&mut self.open_all, counted.all);
        step(&mut self.irregular, counted.irregular);
        step(&mut self.held, counted.held);
    }

    /// What the index keeps of the slot at `index`: what it touches and
    /// how it stands, while it is unfinished.
    fn entry_of(&self, index: usize) -> Option<EntryRef<'_>> {
        let slot = &self.slots[index];
        if !slot.is_open() {
            return None;
        }
        let touch = match (&slot.kind, &slot.lines) {
            (Kind::All, _) => TouchRef::All,
            (_, Some(lines)) => TouchRef::Lines {
                id: &lines.id,
                skus: &lines.skus,
            },
            _ => slot.sku().map_or(TouchRef::Nothing, TouchRef::Sku),
        };
        let (mode, held) = match &slot.state {
            SlotState::Sent(call) if call.reads_first() => (Mode::Read, false),
            SlotState::Sent(_) => (Mode::Script, false),
            SlotState::Held(_) | SlotState::HeldFallback(_) => (Mode::Other, true),
            SlotState::Pending | SlotState::Ready(_) => (Mode::Other, false),
        };
        Some(EntryRef { touch, mode, held })
    }

    /// Brings the index up to date with the slot at `index` after any
    /// change of it, when there is an index.
    #[inline(always)]
    fn sync(&mut self, index: usize) {
        if self.index.is_some() {
            self.sync_slow(index);
        }
    }

    #[inline(never)]
    fn sync_slow(&mut self, index: usize) {
        let entry = self.entry_of(index).map(|e| Entry {
            touch: e.touch.to_owned(),
            mode: e.mode,
            held: e.held,
        });
        let ticket = self.first + index as u64;
        if let Some(precedence) = &mut self.index {
            precedence.set(ticket, entry, &mut self.candidates);
        }
        // Few requests again: a look at each is cheaper than keeping the
        // index (the held ones are then found by a look too).
        if self.slots.len() <= SCAN_MOST / 2 {
            self.index = None;
            self.candidates.clear();
        }
    }

    fn push_slot(
        &mut self,
        protocol: Protocol,
        kind: Kind,
        state: SlotState,
        lines: Option<Box<Lines>>,
    ) {
        self.tally(Counted::of(kind, &state), 1);
        self.slots.push_back(Slot {
            protocol,
            state,
            kind,
            running_sku: None,
            lines,
            blocker: Cell::new(None),
        });
        self.sync(self.slots.len() - 1);
    }

    /// Sets the state of the slot at `index`, in place: a state is large
    /// (a call in it is written once, not moved about).
    #[inline(always)]
    fn set_state(&mut self, index: usize, state: SlotState) {
        let kind = self.slots[index].kind;
        let before = Counted::of(kind, &self.slots[index].state);
        let after = Counted::of(kind, &state);
        self.slots[index].state = state;
        self.tally(before, -1);
        self.tally(after, 1);
        self.sync(index);
    }

    /// [`Replies::set_state`], handing back the state before.
    fn take_state(&mut self, index: usize, state: SlotState) -> SlotState {
        let kind = self.slots[index].kind;
        let before = Counted::of(kind, &self.slots[index].state);
        let after = Counted::of(kind, &state);
        let taken = std::mem::replace(&mut self.slots[index].state, state);
        self.tally(before, -1);
        self.tally(after, 1);
        self.sync(index);
        taken
    }

    pub(super) fn push(&mut self, reply: Reply, protocol: Protocol) {
        self.push_slot(protocol, Kind::Local, SlotState::Ready(reply), None);
    }

    /// A stock request about to be sent ([`Replies::sent`],
    /// [`Replies::running`] or [`Replies::answer`] follows).
    /// `lines`: an order's footprint, kept while it is unfinished.
    pub(super) fn push_stock(&mut self, protocol: Protocol, kind: Kind, lines: Option<Box<Lines>>) {
        self.push_slot(protocol, kind, SlotState::Pending, lines);
    }

    /// A stock request with its node pipe from the start.
    pub(super) fn push_sent(&mut self, protocol: Protocol, kind: Kind, call: StockCall) {
        self.sent += 1;
        self.open += 1;
        if call.reads_first() {
            self.irregular += 1;
        }
        self.slots.push_back(Slot {
            protocol,
            state: SlotState::Sent(call),
            kind,
            running_sku: None,
            lines: None,
            blocker: Cell::new(None),
        });
        self.sync(self.slots.len() - 1);
    }

    /// A stock request held back until what it must follow is done.
    pub(super) fn push_held(
        &mut self,
        protocol: Protocol,
        kind: Kind,
        request: Request,
        lines: Option<Box<Lines>>,
    ) {
        self.push_slot(protocol, kind, SlotState::Held(request), lines);
        self.index_when_long();
    }

    /// Past [`SCAN_MOST`] requests, the index, so that a held request is
    /// let go by the changes it names; below, a look at each held one.
    fn index_when_long(&mut self) {
        if self.slots.len() > SCAN_MOST {
            self.precedence();
        }
    }

    /// Whether a request at `index` of `kind` on `sku` (an order's
    /// `lines`), sent `how` (asked only when an earlier request may touch
    /// the same), must wait for an unfinished request before it.
    pub(super) fn must_wait(
        &mut self,
        index: usize,
        kind: Kind,
        sku: &[u8],
        lines: Option<&Lines>,
        how: impl FnOnce() -> Sending,
    ) -> bool {
        if self.open == 0 {
            return false;
        }
        // Every unfinished request a plain script call with its pipe: a
        // script call (or a read) behind them keeps the pipe's order.
        if kind == Kind::Piped && self.open_all == 0 && self.irregular == 0 {
            return false;
        }
        let how = how();
        let touch = match (kind, lines) {
            (Kind::All, _) => TouchRef::All,
            (_, Some(lines)) => TouchRef::Lines {
                id: &lines.id,
                skus: &lines.skus,
            },
            (Kind::Local, None) => TouchRef::Nothing,
            (_, None) => TouchRef::Sku(sku),
        };
        let by_scan = || waits_by_scan((0..index).filter_map(|i| self.entry_of(i)), touch, how);
        // A few requests: a look at each, no index to keep.
        if self.index.is_none() && self.slots.len() <= SCAN_MOST {
            return by_scan();
        }
        let touch = touch.to_owned();
        let ticket = self.first + index as u64;
        let waits = self.precedence().waits(ticket, &touch, how);
        debug_assert_eq!(
            waits,
            waits_by_scan(
                (0..index).filter_map(|i| self.entry_of(i)),
                touch.as_ref(),
                how
            ),
            "the index and a look at every earlier request disagree"
        );
        waits
    }

    /// The index, built from the slots when there is none yet.
    fn precedence(&mut self) -> &Index {
        if self.index.is_none() {
            let mut index = Index::default();
            let mut none = BTreeSet::new();
            for i in 0..self.slots.len() {
                // Held without an index, they were let go by a look at
                // each: any of them may go now, as far as the index knows.
                if matches!(
                    self.slots[i].state,
                    SlotState::Held(_) | SlotState::HeldFallback(_)
                ) {
                    self.candidates.insert(self.first + i as u64);
                }
                if let Some(entry) = self.entry_of(i) {
                    let entry = Entry {
                        touch: entry.touch.to_owned(),
                        mode: entry.mode,
                        held: entry.held,
                    };
                    index.set(self.first + i as u64, Some(entry), &mut none);
                }
            }
            self.index = Some(index);
        }
        self.index
            .as_ref()
            .unwrap_or_else(|| unreachable!("built just above"))
    }

    /// Whether the fallback of `ticket`, on `sku`, must wait for an
    /// unfinished request before it on its SKU.
    pub(super) fn fallback_must_wait(&mut self, ticket: u64, sku: &[u8]) -> bool {
        let Some(index) = self.index(ticket) else {
            return false;
        };
        let slot = &self.slots[index];
        let (kind, lines) = (slot.kind, slot.lines.clone());
        self.must_wait(index, kind, sku, lines.as_deref(), || Sending::Alone)
    }

    pub(super) fn hold_fallback(&mut self, ticket: u64, call: StockCall) {
        if let Some(index) = self.index(ticket) {
            self.set_state(index, SlotState::HeldFallback(call));
            self.index_when_long();
        }
    }

    /// The request of `ticket` runs as a future now, on `sku`.
    pub(super) fn running(&mut self, ticket: u64, sku: Option<Bytes>) {
        if let Some(index) = self.index(ticket) {
            self.slots[index].running_sku = sku;
            self.sync(index);
        }
    }

    /// A held slot nothing holds back any more, taken out to be sent (its
    /// slot pending meanwhile): the first that may go of the held ones a
    /// change may have let go (with an index), or of them all (without).
    pub(super) fn take_releasable(&mut self) -> Option<(u64, Released)> {
        if self.index.is_none() {
            let index = self.first_free_held()?;
            let released = self.take_held(index);
            return Some((self.first + index as u64, released));
        }
        while let Some(ticket) = self.candidates.pop_first() {
            let Some(index) = self.index(ticket) else {
                continue;
            };
            if let Some(released) = self.release_if_free(index) {
                return Some((ticket, released));
            }
        }
        None
    }

    /// Without an index: the first held request that nothing unfinished
    /// before it holds back, by a look at each earlier one. A held request
    /// that touches everything and must wait holds back every one after it.
    ///
    /// A held request remembers what held it back ([`Blocker`]): while that
    /// one stands as it did, the held one is not looked at again. Each
    /// change then costs a look only at the held requests whose blocker
    /// changed, not at every one of them.
    fn first_free_held(&self) -> Option<usize> {
        for index in 0..self.slots.len() {
            let Some(how) = self.held_sending(index) else {
                continue;
            };
            let touch = self.entry_of(index).map_or(TouchRef::Nothing, |e| e.touch);
            let blocker = &self.slots[index].blocker;
            let remembered = blocker.get().is_some_and(|b| self.stands(b));
            debug_assert!(
                !remembered
                    || waits_by_scan((0..index).filter_map(|i| self.entry_of(i)), touch, how),
                "a held request's blocker stands, so it waits"
            );
            let waits = remembered || {
                let found = (0..index).find_map(|i| {
                    let e = self.entry_of(i)?;
                    holds_back(&e, touch, how).then(|| Blocker {
                        ticket: self.first + i as u64,
                        mode: e.mode,
                        held: e.held,
                        touch: std::mem::discriminant(&e.touch.kindless()),
                    })
                });
                blocker.set(found);
                found.is_some()
            };
            if !waits {
                return Some(index);
            }
            if touch == TouchRef::All {
                return None;
            }
        }
        None
    }

    /// Whether `blocker` is still unfinished and stands as it did.
    fn stands(&self, blocker: Blocker) -> bool {
        self.index(blocker.ticket)
            .and_then(|i| self.entry_of(i))
            .is_some_and(|e| {
                e.mode == blocker.mode
                    && e.held == blocker.held
                    && std::mem::discriminant(&e.touch.kindless()) == blocker.touch
            })
    }

    /// How a held request would be let go: as a script call at most.
    /// Whether it reads first is known once it is checked, and a read let
    /// go behind an unfinished read is answered by the script anyway.
    /// `None` when the slot is not held.
    fn held_sending(&self, index: usize) -> Option<Sending> {
        let slot = &self.slots[index];
        match (&slot.state, slot.kind) {
            (SlotState::Held(_), Kind::Piped) => Some(Sending::Script),
            (SlotState::Held(_) | SlotState::HeldFallback(_), _) => Some(Sending::Alone),
            _ => None,
        }
    }

    /// The held request at `index`, taken out to be sent, unless an
    /// unfinished one before it still holds it back (by the index).
    fn release_if_free(&mut self, index: usize) -> Option<Released> {
        let how = self.held_sending(index)?;
        let slot = &self.slots[index];
        let (kind, lines) = (slot.kind, slot.lines.clone());
        let sku = Bytes::copy_from_slice(slot.sku().unwrap_or_default());
        if self.must_wait(index, kind, &sku, lines.as_deref(), || how) {
            return None;
        }
        Some(self.take_held(index))
    }

    /// The held request at `index`, its slot pending meanwhile.
    fn take_held(&mut self, index: usize) -> Released {
        match self.take_state(index, SlotState::Pending) {
            SlotState::Held(request) => Released::Request(request),
            SlotState::HeldFallback(call) => Released::Fallback(call),
            _ => unreachable!("a held slot"),
        }
    }

    /// The call of `ticket` is with its node pipe now (its slot was
    /// pending). Written in place, counted by hand: this and the two below
    /// run for every request.
    pub(super) fn sent(&mut self, ticket: u64, call: StockCall) {
        let Some(index) = self.index(ticket) else {
            return;
        };
        self.sent += 1;
        if self.slots[index].kind != Kind::Local && !call.reads_first() {
            // Pending was irregular; a plain call with its pipe is not.
            self.irregular -= 1;
        }
        self.slots[index].state = SlotState::Sent(call);
        self.sync(index);
    }

    /// The call of `ticket`, if it is still with a pipe (not answered by
    /// the connection's own overdue check meanwhile); its slot pending.
    pub(super) fn take_sent(&mut self, ticket: u64) -> Option<StockCall> {
        let index = self.index(ticket)?;
        let slot = &mut self.slots[index];
        if !matches!(slot.state, SlotState::Sent(_)) {
            return None;
        }
        let SlotState::Sent(call) = std::mem::replace(&mut slot.state, SlotState::Pending) else {
            unreachable!("checked just above")
        };
        self.sent -= 1;
        if slot.kind != Kind::Local && !call.reads_first() {
            self.irregular += 1;
        }
        self.sync(index);
        Some(call)
    }

    /// The first call still with a pipe whose deadline was before
    /// `overdue`. Calls are sent in order with one `--timeout`, so that is
    /// the first sent one or none.
    pub(super) fn take_overdue(
        &mut self,
        overdue: tokio::time::Instant,
    ) -> Option<(u64, StockCall)> {
        if self.sent == 0 {
            return None;
        }
        let (index, _) = self.slots.iter().enumerate().find(
            |(_, s)| matches!(&s.state, SlotState::Sent(call) if call.deadline() < overdue),
        )?;
        let ticket = self.first + index as u64;
        self.take_sent(ticket).map(|call| (ticket, call))
    }

    pub(super) fn answer(&mut self, ticket: u64, reply: Reply) {
        let Some(index) = self.index(ticket) else {
            return;
        };
        let slot = &mut self.slots[index];
        let before = Counted::of(slot.kind, &slot.state);
        slot.state = SlotState::Ready(reply);
        slot.running_sku = None;
        slot.lines = None;
        // A ready slot counts for nothing.
        self.tally(before, -1);
        self.sync(index);
    }

    /// Encodes every reply that is next in order.
    pub(super) fn write_ready(&mut self, output: &mut BytesMut) {
        while let Some(Slot {
            state: SlotState::Ready(_),
            ..
        }) = self.slots.front()
        {
            let Some(Slot {
                protocol,
                state: SlotState::Ready(reply),
                ..
            }) = self.slots.pop_front()
            else {
                unreachable!("the front slot is ready")
            };
            self.first += 1;
            reply.encode(protocol, output);
        }
    }
}
