use super::*;
use crate::{GroupId, Version};

const PIECES: Pieces = Pieces {
    extent: 100,
    piece: 64,
};

fn start(member: u32, version: u64, full: bool) -> ResyncStart {
    ResyncStart {
        group: GroupId(7),
        version: Version(version),
        member: ServerId(member),
        full,
    }
}

// Goal: syncs finish one at a time in the order asked; one takes everything written since the
// one before; reads see every write at once, whether it is being sent or written after.
#[test]
fn syncs_take_what_was_written_and_finish_in_order() {
    let mut home = HomeSends::open(Changes::default(), 0, PIECES);
    home.set_len(300);
    home.write(10, &[1; 20]);
    let first = home.ask().expect("a sync");
    home.write(250, &[2; 10]);
    let second = home.ask().expect("a sync");
    let sync = home.take_sync().expect("nothing under way");
    assert_eq!(sync.ticket, second, "one sync takes both");
    assert_eq!(sync.changes.extents(PIECES.extent, 0), vec![0, 2]);
    home.write(40, &[3; 5]);
    let third = home.ask().expect("a sync");
    assert!(
        home.take_sync().is_none(),
        "the next waits for the one taken"
    );
    let mut view = vec![0; 300];
    home.overlay(0, &mut view);
    assert_eq!((view[10], view[40], view[250]), (1, 3, 2));
    home.send_sync().expect("sent");
    assert_eq!(home.missed(300), vec![0, 2]);
    assert_eq!(home.outcome(first), None);
    assert!(home.synced(true).is_none());
    assert_eq!(home.outcome(first), Some(Ok(())));
    assert_eq!(home.outcome(second), Some(Ok(())));
    assert_eq!(home.outcome(third), None);
    let sync = home.take_sync().expect("the third");
    assert_eq!(sync.ticket, third);
    assert_eq!(sync.changes.payload, vec![3; 5]);
}

// Goal: a sync that could not ship is handed back to be kept, still reads, and fails every
// later sync; the home's next opening ships the kept changes first, before any new write.
#[test]
fn a_sync_that_could_not_ship_is_kept_and_ships_first_at_the_next_opening() {
    let mut home = HomeSends::open(Changes::default(), 0, PIECES);
    home.write(0, &[5; 10]);
    let first = home.ask().expect("a sync");
    home.take_sync().expect("taken");
    home.send_sync().expect("sent");
    home.write(20, &[6; 10]);
    let later = home.ask().expect("asked while the first is under way");
    let kept = home.synced(false).expect("kept");
    assert_eq!(kept.payload, vec![5; 10]);
    assert_eq!(home.outcome(first), Some(Err(Failed)));
    assert_eq!(home.outcome(later), Some(Err(Failed)));
    assert_eq!(home.ask(), Err(Failed));
    let mut view = vec![0; 10];
    home.overlay(0, &mut view);
    assert_eq!(view, vec![5; 10], "the failed sync's writes still read");
    let resync = start(2, 3, true);
    home.begin_resync(resync, None, 10);
    assert_eq!(
        home.step(resync, 10),
        Err(NoStep::Stale),
        "no step after a failure"
    );
    assert!(home.next_send(10).is_none());

    let mut again = HomeSends::open((*kept).clone(), 0, PIECES);
    let Some(NextSend::Sync(sync)) = again.next_send(0) else {
        panic!("the kept changes ship first");
    };
    assert_eq!(sync.changes.payload, vec![5; 10]);
}

// Goal: a resync copies what its member missed when that was recorded and no full copy is
// asked for; otherwise the whole file, and the record is void. It ends with the length, and
// only then is an incremental one's record forgotten.
#[test]
fn a_resync_copies_the_record_or_the_whole_file() {
    let mut home = HomeSends::open(Changes::default(), 1000, PIECES);
    let missed = start(2, 3, false);
    let begun = home.begin_resync(missed, Some(vec![1, 4]), 1000);
    assert_eq!(
        (begun.incremental, begun.forget_record, begun.total),
        (true, false, 2)
    );
    let mut copied = Vec::new();
    loop {
        match home.next_send(1000) {
            Some(NextSend::Step(of, PageStep::Copy { offset, len })) => {
                assert_eq!(of, missed);
                copied.push((offset, len));
                assert_eq!(home.stepped(of, true), StepEnd::Going);
            }
            Some(NextSend::Step(of, PageStep::Finish { len })) => {
                assert_eq!(len, 1000);
                assert_eq!(
                    home.stepped(of, true),
                    StepEnd::Finished { incremental: true }
                );
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(copied, vec![(100, 100), (400, 100)]);
    assert!(home.next_send(1000).is_none(), "nothing left to send");

    let full = start(3, 3, true);
    let begun = home.begin_resync(full, Some(vec![1]), 1000);
    assert_eq!(
        (begun.incremental, begun.forget_record, begun.total),
        (false, true, 16)
    );
    let unrecorded = home.begin_resync(start(4, 3, false), None, 1000);
    assert!(!unrecorded.incremental && !unrecorded.forget_record);
}

// Goal: a resync's step is never sent while a sync is, nor a sync while a step is; a step of a
// resync replaced meanwhile is stale, and a step not taken stops its resync.
#[test]
fn sends_are_one_at_a_time() {
    let mut home = HomeSends::open(Changes::default(), 500, PIECES);
    let old = start(2, 3, true);
    home.begin_resync(old, None, 500);
    home.write(0, &[1; 4]);
    home.ask().expect("a sync");
    let Some(NextSend::Sync(_)) = home.next_send(500) else {
        panic!("a sync goes before a resync's step");
    };
    assert_eq!(home.step(old, 500), Err(NoStep::Busy));
    home.synced(true);
    let Some(NextSend::Step(of, PageStep::Copy { offset: 0, .. })) = home.next_send(500) else {
        panic!("then the resync");
    };
    home.write(8, &[2; 4]);
    home.ask().expect("a sync");
    assert!(
        home.take_sync().is_some(),
        "a sync is taken while a step is sent"
    );
    assert_eq!(home.send_sync().map(|_| ()), Err(NoStep::Busy));
    let new = start(2, 4, true);
    let begun = home.begin_resync(new, None, 500);
    assert_eq!(begun.replaced, Some(old));
    assert_eq!(home.stepped(of, true), StepEnd::Stale);
    assert_eq!(home.step(old, 500), Err(NoStep::Stale));
    home.send_sync().expect("the step ended");
    home.synced(true);
    assert!(home.step(new, 500).expect("current").is_some());
    assert_eq!(home.stepped(new, false), StepEnd::Stopped);
    assert!(home.resyncs().next().is_none(), "stopped");
}
