//! A client's changes to one metadata home that the home answered before they reached its
//! disk ([`weft_proto::messages::NumberedChange`]): kept, in the order of their numbers, until
//! the home's last synced number covers them, and sent back to the home if it restarts
//! without them (docs/design/crash-consistency.md, "Durability by replay").

use crate::auth::Auth;
use ring::hmac;
use std::collections::BTreeMap;
use std::sync::Mutex;
use weft_proto::error::WireError;
use weft_proto::ids::NodeId;
use weft_proto::messages::NumberedChange;

/// What the key of change proofs is derived from the cluster key with.
const KEY_LABEL: &[u8] = b"weft numbered change key";

/// The key a metadata home proves its numbered changes with, so that a replay makes only rows
/// the home made: derived from the cluster key, which clients never hold.
#[derive(Clone)]
pub struct ChangeProofs {
    key: hmac::Key,
}

impl std::fmt::Debug for ChangeProofs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChangeProofs")
    }
}

/// What a proof signs: the home, and every field of the change but the proof.
fn signed(home: NodeId, change: &NumberedChange) -> Vec<u8> {
    let mut input = Vec::with_capacity(48 + change.rows.len());
    input.extend_from_slice(&home.0.to_le_bytes());
    input.extend_from_slice(&change.incarnation.to_le_bytes());
    input.extend_from_slice(&change.number.to_le_bytes());
    input.extend_from_slice(&change.mutation.client.0.to_le_bytes());
    input.extend_from_slice(&change.mutation.seq.to_le_bytes());
    input.extend_from_slice(&change.rows);
    input
}

impl ChangeProofs {
    /// The key of a process holding the cluster key; `None` for others.
    pub fn of(auth: &Auth) -> Option<ChangeProofs> {
        auth.derived_key(KEY_LABEL).map(|key| ChangeProofs { key })
    }

    /// The proof that `home` made `change`.
    pub fn prove(&self, home: NodeId, change: &NumberedChange) -> Vec<u8> {
        hmac::sign(&self.key, &signed(home, change))
            .as_ref()
            .to_vec()
    }

    /// Whether `change` carries `home`'s proof.
    pub fn check(&self, home: NodeId, change: &NumberedChange) -> bool {
        hmac::verify(&self.key, &signed(home, change), &change.proof).is_ok()
    }
}

/// The changes one client keeps for one home.
#[derive(Debug, Default)]
pub struct KeptChanges {
    kept: Mutex<Kept>,
}

#[derive(Debug, Default)]
struct Kept {
    /// The start of the home that numbered the changes kept and `synced`.
    incarnation: u64,
    /// By number: those above `synced`.
    changes: BTreeMap<u64, NumberedChange>,
    /// The highest number the home said it had on disk.
    synced: u64,
    /// The start of the home that last answered this client a change before its sync: a
    /// start after it waits for this client to say what it keeps.
    answered_by: Option<u64>,
    /// Why changes this client kept were dropped by a restart of the home, until a sync
    /// reports it.
    lost: Option<WireError>,
    /// Changes a start before `incarnation` numbered, kept when the new start answered before
    /// this client sent them back: the home says, when they are sent, whether they were on
    /// its disk or dropped.
    earlier: Vec<NumberedChange>,
}

impl KeptChanges {
    /// The home answered `change`, when its last synced number was `synced`: kept unless
    /// that covers it, and every change it covers dropped. A change of a start after the one
    /// that numbered the changes kept means the home serves again before this client sent
    /// them back (its recovery window closed without it, or another answer of the new start
    /// came first): they stay to be sent, and the home says whether it had them on disk.
    pub fn answered(&self, change: NumberedChange, synced: u64) {
        let mut kept = self.kept.lock().expect("kept changes poisoned");
        if change.incarnation != kept.incarnation {
            let mut earlier = std::mem::take(&mut kept.earlier);
            earlier.extend(std::mem::take(&mut kept.changes).into_values());
            *kept = Kept {
                incarnation: change.incarnation,
                answered_by: kept.answered_by,
                lost: kept.lost.take(),
                earlier,
                ..Kept::default()
            };
        }
        // The home waits for this client after a restart even if every change it answered
        // was on disk by then: it only knows it answered the session this way.
        kept.answered_by = Some(change.incarnation);
        if change.number > synced.max(kept.synced) && !change.rows.is_empty() {
            kept.changes.insert(change.number, change);
        }
        kept.covered(synced);
    }

    /// The home (still the start that numbered the changes kept) said its last synced number
    /// is `synced`: every change it covers is dropped.
    pub fn synced(&self, synced: u64) {
        self.kept
            .lock()
            .expect("kept changes poisoned")
            .covered(synced);
    }

    /// The start of the home that numbered the changes kept, and the highest number kept:
    /// what a sync of the home must reach. `None` when nothing is kept.
    pub fn highest(&self) -> Option<(u64, u64)> {
        let kept = self.kept.lock().expect("kept changes poisoned");
        let highest = kept.changes.keys().next_back().copied()?;
        Some((kept.incarnation, highest))
    }

    /// The start of the home that last answered this client a change before its sync.
    pub fn answered_by(&self) -> Option<u64> {
        self.kept.lock().expect("kept changes poisoned").answered_by
    }

    /// Changes kept were dropped by a restart of the home, for `why`.
    pub fn lose(&self, why: WireError) {
        self.kept.lock().expect("kept changes poisoned").lost = Some(why);
    }

    /// Why changes kept were dropped, once: the sync that learns it fails.
    pub fn take_lost(&self) -> Option<WireError> {
        self.kept.lock().expect("kept changes poisoned").lost.take()
    }

    /// Every change kept, in the order of their numbers: those of earlier starts first.
    pub fn waiting(&self) -> Vec<NumberedChange> {
        let kept = self.kept.lock().expect("kept changes poisoned");
        kept.earlier
            .iter()
            .chain(kept.changes.values())
            .cloned()
            .collect()
    }

    /// Whether changes of a start before the one that answered last are kept, still to be
    /// sent back.
    pub fn has_earlier(&self) -> bool {
        !self
            .kept
            .lock()
            .expect("kept changes poisoned")
            .earlier
            .is_empty()
    }

    /// The home, started again as `incarnation`, settled the changes of earlier starts among
    /// `sent` (made them again, found them on its disk, or dropped them): they are no longer
    /// kept. Every other change stays: those `incarnation` numbered, and those of a later
    /// start whose answer came while the replay was under way (a retry of the replay may
    /// reach a start after the one it was meant for).
    pub fn replayed(&self, incarnation: u64, sent: &[NumberedChange]) {
        let settled: std::collections::HashSet<(u64, u64)> = sent
            .iter()
            .filter(|change| change.incarnation != incarnation)
            .map(|change| (change.incarnation, change.number))
            .collect();
        let mut kept = self.kept.lock().expect("kept changes poisoned");
        kept.earlier
            .retain(|change| !settled.contains(&(change.incarnation, change.number)));
        kept.changes
            .retain(|_, change| !settled.contains(&(change.incarnation, change.number)));
        kept.answered_by = kept.answered_by.map(|_| incarnation);
        if kept.changes.is_empty() && kept.incarnation != incarnation {
            // Nothing of the start that numbered them is left: the numbers are the new
            // start's from now on.
            kept.incarnation = incarnation;
            kept.synced = 0;
        }
    }
}

impl Kept {
    fn covered(&mut self, synced: u64) {
        if synced > self.synced {
            self.synced = synced;
            self.changes = self.changes.split_off(&(synced + 1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_proto::ids::ClientId;
    use weft_proto::messages::MutationId;

    fn change(number: u64) -> NumberedChange {
        NumberedChange {
            incarnation: 1,
            number,
            mutation: MutationId {
                client: ClientId(1),
                seq: number,
                oldest_pending: number,
            },
            rows: vec![1],
            proof: Vec::new(),
        }
    }

    // Goal: a change is kept exactly while the home has not said it is on disk.
    #[test]
    fn a_change_is_kept_until_the_home_has_it_on_disk() {
        let kept = KeptChanges::default();
        kept.answered(change(3), 1);
        kept.answered(change(5), 2);
        assert_eq!(kept.highest(), Some((1, 5)));
        kept.answered(change(6), 3);
        let numbers: Vec<_> = kept.waiting().iter().map(|change| change.number).collect();
        assert_eq!(numbers, [5, 6], "3 is on disk");
        // A change answered on disk already is not kept; nor one an older answer covers.
        kept.answered(change(4), 4);
        kept.synced(5);
        assert_eq!(kept.highest(), Some((1, 6)));
        kept.synced(2);
        assert_eq!(
            kept.highest(),
            Some((1, 6)),
            "an older number covers nothing more"
        );
        kept.answered(change(7), 7);
        assert_eq!(kept.highest(), None);
        assert!(kept.waiting().is_empty());
        assert_eq!(kept.answered_by(), Some(1));
    }

    // Goal: a change of a new start answered before this client sent back what it kept of the
    // start before (the window closed without it, or the answer came first) neither loses
    // the old changes nor claims they are lost: they are sent back, and the home says; and
    // the new start's changes stay kept through that replay.
    #[test]
    fn an_answer_of_a_new_start_before_the_replay_keeps_both() {
        let kept = KeptChanges::default();
        kept.answered(change(8), 2);
        let mut again = change(9);
        again.incarnation = 2;
        kept.answered(again, 3);
        assert!(kept.has_earlier());
        assert_eq!(kept.take_lost().map(|lost| lost.code), None);
        let numbers: Vec<_> = kept
            .waiting()
            .iter()
            .map(|change| (change.incarnation, change.number))
            .collect();
        assert_eq!(numbers, [(1, 8), (2, 9)]);
        kept.replayed(2, &kept.waiting());
        assert!(!kept.has_earlier());
        assert_eq!(kept.highest(), Some((2, 9)), "the new start's change stays");
    }

    // Goal: a replay's answer settles only what it sent of earlier starts: a change a later
    // start answered meanwhile (the replay's retry reached a start after the one it was sent
    // to) stays kept, to be sent back if that start is lost too.
    #[test]
    fn a_replay_settles_only_what_it_sent() {
        let kept = KeptChanges::default();
        kept.answered(change(8), 2);
        let sent = kept.waiting();
        let mut later = change(12);
        later.incarnation = 3;
        kept.answered(later, 10);
        kept.replayed(2, &sent);
        assert!(!kept.has_earlier(), "change 8 was settled");
        assert_eq!(
            kept.highest(),
            Some((3, 12)),
            "the later start's change stays"
        );
    }

    // Goal: after the home started again, its new numbers are never taken for the old ones.
    #[test]
    fn a_new_start_of_the_home_numbers_anew() {
        let kept = KeptChanges::default();
        kept.answered(change(8), 2);
        kept.answered(change(9), 2);
        kept.replayed(2, &kept.waiting());
        assert_eq!(kept.highest(), None, "made again by the replay");
        assert_eq!(kept.answered_by(), Some(2));
        // The new start numbers from where the replay left it, below the old synced number.
        let mut again = change(4);
        again.incarnation = 2;
        kept.answered(again, 3);
        assert_eq!(kept.highest(), Some((2, 4)));
    }
}
