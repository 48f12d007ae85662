//! `weft fsck` on one metadata target: checks that the namespace is whole — every dentry names
//! an inode that exists and sits in its name's hash bucket, every link count matches the dentries, no inode is
//! unreachable unless a client holds it open, work queues name live inodes — and that every
//! storage object belongs to a file (or awaits disposal) and holds no bytes past the end its
//! file's size and layout give it, that every slot a file's data was written to still has its
//! object, and that the members of a mirror group hold the same copy of each object (the last
//! two are [`Suspect`]s, looked at again afterwards). With `repair`, it fixes what is safe:
//! it drops dangling entries, recounts links, disposes of unreachable inodes and returns the
//! objects without a file for removal. It reports what it cannot fix (a directory with two
//! names) and leaves it.
//!
//! The check reads what it needs of the store at its start ([`Snapshot`]): a check alone reads
//! a read snapshot and no change waits for it; a repair reads and fixes in one write
//! transaction, so what it fixes is what it saw.

use super::remove::dispose;
use super::setattr::queue_truncate;
use super::xattr::remove_all;
use crate::schema::{
    cookie_fits_name, kind_code, load_dentry, replace_dentry, store_inode, Dentry, InodeRecord,
    OpError, Transaction, DISPOSALS, ENTRIES, INODES, ORPHANS, TRUNCATES, UNREPORTED, WRITTEN,
    XATTRS,
};
use crate::store::{ReadTransaction, ReadableTable, TableDefinition, WriteTransaction};
use std::collections::{BTreeMap, HashMap, HashSet};
use weft_proto::ids::GroupId;
use weft_proto::ids::{InodeId, NodeId, TargetId};
use weft_proto::layout::SlotSet;
use weft_proto::layout::{object_length_for_file_size, PatternKind, Slot};
use weft_proto::messages::{CheckReport, MetaResponse, CHECK_FINDINGS_MAX};

/// Collects findings, keeping the detailed list bounded; `fix` is the transaction repairs
/// go in, if the check repairs.
struct Findings<'a> {
    report: CheckReport,
    fix: Option<&'a WriteTransaction>,
}

/// Adds a problem to `report`, keeping the detailed list bounded.
pub(crate) fn report_problem(report: &mut CheckReport, text: String) {
    report.problem_count += 1;
    if report.problems.len() < CHECK_FINDINGS_MAX {
        report.problems.push(text);
    }
}

impl Findings<'_> {
    fn problem(&mut self, text: String) {
        report_problem(&mut self.report, text);
    }

    fn repaired(&mut self, text: String) {
        if self.report.repairs.len() < CHECK_FINDINGS_MAX {
            self.report.repairs.push(text);
        }
    }
}

/// A dentry as the check sees it.
struct Entry {
    parent: u64,
    name: String,
    child: u64,
    cookie: u64,
    kind: u8,
}

/// An object found on a target: a plain one as (inode, target, `None`, length), a mirrored
/// one as (inode, member target, `Some(group)`, length).
pub(crate) type FoundObject = (InodeId, TargetId, Option<GroupId>, u64);

/// The objects found on the targets, and where they were looked for: the targets that were
/// listed, and of each storage mirror group the members that hold every acknowledged change
/// (good) and were listed.
pub(crate) struct Listed {
    pub objects: Vec<FoundObject>,
    pub targets: HashSet<TargetId>,
    pub good_members: HashMap<GroupId, Vec<TargetId>>,
}

/// A copy of a file's data the check did not find, or must compare with its other copies.
/// The objects were listed before the check's transaction, so a suspect is looked at again
/// after it (`Meta::verify_suspects`) before it is reported.
#[derive(Debug)]
pub(crate) struct Suspect {
    pub inode: InodeId,
    /// The file's truncate generation when it was suspected: a truncate since may have
    /// removed the object.
    pub generation: u64,
    /// The slot's index in the file's layout.
    pub index: usize,
    pub slot: Slot,
    pub kind: SuspectKind,
}

#[derive(Debug)]
pub(crate) enum SuspectKind {
    /// A slot the file's data was written to has no object on `lacking` (for a mirrored slot,
    /// good members), while `holding` have one.
    Missing {
        lacking: Vec<TargetId>,
        holding: Vec<TargetId>,
    },
    /// Good members that each hold a copy of a mirrored object: they must hold the same bytes.
    Compare(Vec<TargetId>),
}

/// What the check found that the caller acts on after the commit.
pub(crate) struct Checked {
    pub report: CheckReport,
    /// Objects that belong to no file, each with the slot to remove it through.
    pub garbage: Vec<(InodeId, Slot)>,
    pub suspects: Vec<Suspect>,
}

/// What the check reads of the store, all at its start.
struct Snapshot {
    inodes: HashMap<u64, InodeRecord>,
    entries: Vec<Entry>,
    orphans: HashSet<u64>,
    truncates: HashSet<u64>,
    unreported: HashSet<u64>,
    disposals: HashSet<u64>,
    /// Inodes that have extended attributes.
    xattrs: HashSet<u64>,
    written: HashMap<u64, SlotSet>,
    /// Per file, the slots its moves use besides its layout's: the copies of a move in
    /// flight, and its tombstones (whose data a crash may have left).
    moved: HashMap<u64, Vec<Slot>>,
    /// Files with a move in flight: their objects are in transit (a sealing move's old
    /// objects may have given up their data already), so their copies are not judged.
    moving: HashSet<u64>,
}

impl Snapshot {
    fn read(source: &impl Transaction) -> Result<Snapshot, OpError> {
        let mut inodes = HashMap::new();
        for item in source.table(INODES)?.iter()? {
            let (key, value) = item?;
            inodes.insert(
                key.value(),
                InodeRecord::decode(key.value(), value.value())?,
            );
        }
        let mut entries = Vec::new();
        for item in source.table(ENTRIES)?.iter()? {
            let (key, value) = item?;
            let (parent, cookie) = key.value();
            let (child, kind, name) = value.value();
            entries.push(Entry {
                parent,
                name: name.to_string(),
                child,
                cookie,
                kind,
            });
        }
        let mut xattrs = HashSet::new();
        for item in source.table(XATTRS)?.iter()? {
            xattrs.insert(item?.0.value().0);
        }
        let mut written = HashMap::new();
        for (id, slots) in WRITTEN.open(source)?.all()? {
            written.insert(id, slots);
        }
        // The slots a file's objects moved onto or off are of its layout's kind.
        let kind = |id: u64| {
            inodes
                .get(&id)
                .and_then(|record: &InodeRecord| record.layout.as_ref())
                .map_or(PatternKind::Raid0, |layout| layout.pattern.kind)
        };
        let mut moved: HashMap<u64, Vec<Slot>> = HashMap::new();
        let mut moving = HashSet::new();
        for (id, work) in crate::schema::MOVES.open(source)?.all()? {
            moving.insert(id);
            moved.entry(id).or_default().extend(work.copies(kind(id)));
        }
        for (id, held) in crate::schema::TOMBSTONES.open(source)?.all()? {
            moved
                .entry(id)
                .or_default()
                .extend(held.into_iter().map(|slot| slot.slot(kind(id))));
        }
        Ok(Snapshot {
            inodes,
            entries,
            moved,
            moving,
            orphans: keys(source, ORPHANS)?,
            truncates: keys(source, TRUNCATES.definition())?,
            unreported: keys(source, UNREPORTED)?,
            disposals: keys(source, DISPOSALS.definition())?,
            xattrs,
            written,
        })
    }
}

impl Snapshot {
    /// Forgets what the repair's disposal of inode `id` removed, and notes its disposal.
    fn disposed(&mut self, id: u64) {
        self.inodes.remove(&id);
        self.orphans.remove(&id);
        self.truncates.remove(&id);
        self.unreported.remove(&id);
        self.xattrs.remove(&id);
        self.written.remove(&id);
        self.disposals.insert(id);
    }
}

/// The keys of a table keyed by inode.
fn keys<V: crate::store::Value + 'static>(
    source: &impl Transaction,
    table: TableDefinition<'static, u64, V>,
) -> Result<HashSet<u64>, OpError> {
    let mut keys = HashSet::new();
    for item in source.table(table)?.iter()? {
        keys.insert(item?.0.value());
    }
    Ok(keys)
}

/// Runs the check on what `source` holds; repairs in `fix`, if given (the same transaction
/// as `source` then). `objects` are the objects found on the targets `listed`.
pub(crate) fn check(
    source: &impl Transaction,
    fix: Option<&WriteTransaction>,
    home: NodeId,
    listed: &Listed,
    open: &HashSet<InodeId>,
    referenced: &HashMap<InodeId, usize>,
) -> Result<Checked, OpError> {
    let mut findings = Findings {
        report: CheckReport {
            node: home,
            inodes: 0,
            dentries: 0,
            objects: listed.objects.len() as u64,
            problems: Vec::new(),
            problem_count: 0,
            repairs: Vec::new(),
            unreachable_targets: Vec::new(),
        },
        fix,
    };
    let mut snapshot = Snapshot::read(source)?;
    findings.report.inodes = snapshot.inodes.len() as u64;
    findings.report.dentries = snapshot.entries.len() as u64;
    let entries = std::mem::take(&mut snapshot.entries);

    let removed = check_dentries(&mut findings, &snapshot.inodes, &entries, home)?;
    // Link counts are counted on what the repair leaves, so one run ends clean.
    let entries: Vec<Entry> = entries
        .into_iter()
        .filter(|e| !removed.contains(&(e.parent, e.cookie)))
        .collect();
    check_inodes(
        &mut findings,
        &mut snapshot,
        &entries,
        home,
        open,
        referenced,
    )?;
    check_queues(&mut findings, &mut snapshot)?;
    check_usage(&mut findings, source)?;
    let unsettled: HashSet<InodeId> = open
        .iter()
        .copied()
        .chain(snapshot.unreported.iter().map(|id| InodeId(*id)))
        .chain(snapshot.truncates.iter().map(|id| InodeId(*id)))
        .collect();
    let garbage = check_objects(&mut findings, &snapshot, &listed.objects, &unsettled)?;
    let suspects = check_copies(&snapshot, listed, &unsettled);
    Ok(Checked {
        report: findings.report,
        garbage,
        suspects,
    })
}

/// Checks every dentry; returns the keys (directory, cookie) of those the repair removed.
fn check_dentries(
    findings: &mut Findings,
    inodes: &HashMap<u64, InodeRecord>,
    entries: &[Entry],
    home: NodeId,
) -> Result<HashSet<(u64, u64)>, OpError> {
    let mut seen: HashSet<(u64, &str)> = HashSet::new();
    let mut removed = HashSet::new();
    // Entries filed under their name's hash first: of two entries of one name, the one lookups
    // find is the one kept.
    let mut ordered: Vec<&Entry> = entries.iter().collect();
    ordered.sort_by_key(|e| !cookie_fits_name(e.cookie, &e.name));
    for entry in ordered {
        let path = format!("{}/{:?}", InodeId(entry.parent), entry.name);
        let parent_ok = inodes.get(&entry.parent).is_some_and(InodeRecord::is_dir);
        let child = inodes.get(&entry.child);
        let child_missing = child.is_none() && InodeId(entry.child).home() == home;
        if !parent_ok || child_missing {
            let why = if parent_ok {
                "names a missing inode"
            } else {
                "is in a missing directory"
            };
            findings.problem(format!("dentry {path} {why}"));
            if let Some(txn) = findings.fix {
                txn.open_table(ENTRIES)?
                    .remove((entry.parent, entry.cookie))?;
                removed.insert((entry.parent, entry.cookie));
                findings.repaired(format!("removed dentry {path}"));
            }
            continue;
        }
        if !seen.insert((entry.parent, entry.name.as_str())) {
            findings.problem(format!("dentry {path} is there twice"));
            if let Some(txn) = findings.fix {
                txn.open_table(ENTRIES)?
                    .remove((entry.parent, entry.cookie))?;
                removed.insert((entry.parent, entry.cookie));
                findings.repaired(format!("removed the second dentry {path}"));
            }
            continue;
        }
        let dentry = Dentry {
            child: InodeId(entry.child),
            cookie: entry.cookie,
            kind: crate::schema::kind_from_code(entry.kind),
        };
        if let Some(child) = child {
            if kind_code(child.kind) != entry.kind {
                findings.problem(format!("dentry {path} records the wrong file type"));
                if let Some(txn) = findings.fix {
                    let fixed = Dentry {
                        kind: child.kind,
                        ..dentry
                    };
                    let mut table = txn.open_table(ENTRIES)?;
                    replace_dentry(&mut table, InodeId(entry.parent), &entry.name, fixed)?;
                    findings.repaired(format!("corrected the file type of {path}"));
                }
            }
        }
        if !cookie_fits_name(entry.cookie, &entry.name) {
            // A lookup would not find it.
            findings.problem(format!("dentry {path} is not filed under its name's hash"));
            if let Some(txn) = findings.fix {
                let mut table = txn.open_table(ENTRIES)?;
                table.remove((entry.parent, entry.cookie))?;
                let parent = InodeId(entry.parent);
                let parent_record = &inodes[&entry.parent];
                let kind = child.map_or(dentry.kind, |child| child.kind);
                if load_dentry(&table, parent, &entry.name)?.is_none() {
                    crate::schema::insert_dentry(
                        &mut table,
                        parent,
                        parent_record,
                        &entry.name,
                        dentry.child,
                        kind,
                    )?;
                    findings.repaired(format!("filed {path} under its name's hash"));
                } else {
                    // The name is already filed where lookups find it: this is a second one.
                    removed.insert((entry.parent, entry.cookie));
                    findings.repaired(format!("removed the second dentry {path}"));
                }
            }
        }
    }
    Ok(removed)
}

fn check_inodes(
    findings: &mut Findings,
    snapshot: &mut Snapshot,
    entries: &[Entry],
    home: NodeId,
    open: &HashSet<InodeId>,
    referenced: &HashMap<InodeId, usize>,
) -> Result<(), OpError> {
    let inodes = &snapshot.inodes;
    // Entries whose child exists: here, or on its own home (directories placed elsewhere).
    let valid: Vec<&Entry> = entries
        .iter()
        .filter(|e| {
            inodes.get(&e.parent).is_some_and(InodeRecord::is_dir)
                && (inodes.contains_key(&e.child) || InodeId(e.child).home() != home)
        })
        .collect();
    let mut names: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut subdirectories: HashMap<u64, u32> = HashMap::new();
    for entry in &valid {
        names.entry(entry.child).or_default().push(entry.parent);
        if entry.kind == kind_code(weft_proto::messages::FileKind::Directory) {
            *subdirectories.entry(entry.parent).or_default() += 1;
        }
    }
    let ids: BTreeMap<u64, ()> = inodes.keys().map(|id| (*id, ())).collect();
    for id in ids.keys().copied() {
        let inode = InodeId(id);
        if inode.home() != home {
            continue;
        }
        let Some(mut record) = snapshot.inodes.get(&id).cloned() else {
            continue;
        };
        let mut parents = names.get(&id).cloned().unwrap_or_default();
        // Dentries on other servers that name this inode (a directory placed here, or hard
        // links); for a directory its parent pointer says which directory holds the name.
        for _ in 0..referenced.get(&inode).copied().unwrap_or(0) {
            parents.push(record.parent);
        }

        if parents.is_empty() && inode != InodeId::ROOT {
            let held = snapshot.orphans.contains(&id) && open.contains(&inode);
            if !held {
                findings.problem(format!(
                    "inode {inode} ({:?}) is not reachable from any directory",
                    record.kind
                ));
                if let Some(txn) = findings.fix.filter(|_| !open.contains(&inode)) {
                    dispose(
                        txn,
                        &mut crate::schema::usage::Inodes::open(txn)?,
                        inode,
                        &record,
                    )?;
                    snapshot.disposed(id);
                    findings.repaired(format!("disposed of unreachable inode {inode}"));
                }
            }
            continue;
        }
        let remote_names = referenced.get(&inode).copied().unwrap_or(0);
        let subdirectories = subdirectories.get(&id).copied().unwrap_or(0);
        let (expected_links, mut changed) = check_parent(
            findings,
            (inode, &mut record),
            &parents,
            (remote_names, subdirectories),
        );
        // A record that says "none" where attributes are kept would have mounts answer for
        // attributes the file has.
        if record.xattr_free && snapshot.xattrs.contains(&id) {
            findings.problem(format!(
                "inode {inode} has extended attributes but its record says it has none"
            ));
            record.xattr_free = false;
            changed = true;
        }
        if record.nlink != expected_links && !(record.nlink == 0 && parents.is_empty()) {
            findings.problem(format!(
                "inode {inode} has link count {} but {expected_links} links",
                record.nlink
            ));
            record.nlink = expected_links;
            changed = true;
        }
        if let Some(txn) = findings.fix.filter(|_| changed) {
            store_inode(
                &mut crate::schema::usage::Inodes::open(txn)?,
                inode,
                &record,
            )?;
            findings.repaired(format!("corrected inode {inode}"));
        }
        if snapshot.orphans.contains(&id) && !parents.is_empty() {
            findings.problem(format!("inode {inode} is linked but on the orphan list"));
            if let Some(txn) = findings.fix {
                txn.open_table(ORPHANS)?.remove(id)?;
                snapshot.orphans.remove(&id);
                findings.repaired(format!("took {inode} off the orphan list"));
            }
        }
    }
    check_stale_xattrs(findings, snapshot)
}

/// The parent `record` (of `inode`) keeps, against the directories that hold its names
/// (`parents`; `remote`, names on other servers); corrected in `record`. Answers the links it
/// should have (a directory's: 2 and its `subdirectories`) and whether it was corrected.
fn check_parent(
    findings: &mut Findings,
    (inode, record): (InodeId, &mut InodeRecord),
    parents: &[u64],
    (remote, subdirectories): (usize, u32),
) -> (u32, bool) {
    let mut changed = false;
    if record.is_dir() {
        if parents.len() > 1 {
            findings.problem(format!(
                "directory {inode} has {} names; fix it by hand",
                parents.len()
            ));
        }
        if let Some(parent) = parents.first() {
            if record.parent != *parent {
                findings.problem(format!("directory {inode} records the wrong parent"));
                record.parent = *parent;
                changed = true;
            }
        }
        return (2 + subdirectories, changed);
    }
    // A file's parent must hold a name of it (see `service::subtree`); with names only here
    // that can be checked. An unknown one (0: a file made before parents were kept, or one
    // whose named parent went) is filled in, not counted.
    if remote == 0 && !parents.contains(&record.parent) {
        if record.parent != 0 {
            findings.problem(format!(
                "file {inode} records a parent that holds no name of it"
            ));
        }
        record.parent = parents[0];
        changed = true;
    }
    (parents.len() as u32, changed)
}

/// Attributes of inodes that no longer exist.
fn check_stale_xattrs(findings: &mut Findings, snapshot: &Snapshot) -> Result<(), OpError> {
    let mut stale: Vec<u64> = snapshot
        .xattrs
        .iter()
        .copied()
        .filter(|id| !snapshot.inodes.contains_key(id))
        .collect();
    stale.sort_unstable();
    for id in stale {
        findings.problem(format!(
            "extended attributes of missing inode {}",
            InodeId(id)
        ));
        if let Some(txn) = findings.fix {
            remove_all(&mut txn.open_table(XATTRS)?, InodeId(id))?;
            findings.repaired(format!("removed the attributes of {}", InodeId(id)));
        }
    }
    Ok(())
}

fn check_queues(findings: &mut Findings, snapshot: &mut Snapshot) -> Result<(), OpError> {
    let inodes = &snapshot.inodes;
    drop_missing(findings, ORPHANS, &mut snapshot.orphans, inodes, |id| {
        (
            format!("the orphan list names missing inode {id}"),
            format!("removed {id} from the orphan list"),
        )
    })?;
    drop_missing(
        findings,
        TRUNCATES.definition(),
        &mut snapshot.truncates,
        inodes,
        |id| {
            (
                format!("a truncate is queued for missing inode {id}"),
                format!("dropped the truncate of {id}"),
            )
        },
    )?;
    drop_missing(
        findings,
        UNREPORTED,
        &mut snapshot.unreported,
        inodes,
        |id| {
            (
                format!("the list of files without a size report names missing inode {id}"),
                format!("removed {id} from the list of files without a size report"),
            )
        },
    )?;
    let mut written: HashSet<u64> = snapshot.written.keys().copied().collect();
    drop_missing(findings, WRITTEN.definition(), &mut written, inodes, |id| {
        (
            format!("written slots are recorded for missing inode {id}"),
            format!("dropped the written slots of {id}"),
        )
    })?;
    snapshot.written.retain(|id, _| written.contains(id));
    Ok(())
}

/// Compares what the usage table says users and groups use with a count of the inodes (after
/// the repairs above), and with `--repair` writes the count: usage is right after any crash
/// or bug once fsck ran.
fn check_usage(findings: &mut Findings, source: &impl Transaction) -> Result<(), OpError> {
    let counted = match findings.fix {
        Some(txn) => crate::schema::usage::recount(&txn.open_table(INODES)?)?,
        None => crate::schema::usage::recount(&source.table(INODES)?)?,
    };
    let stored: HashMap<(u8, u32, u16), (u64, u64)> = source
        .table(crate::schema::usage::USAGE)?
        .iter()?
        .map(|item| item.map(|(key, value)| (key.value(), value.value())))
        .collect::<Result<_, _>>()?;
    let mut differ = false;
    for (key, count) in &counted {
        if stored.get(key) != Some(count) {
            differ = true;
            let (kind, id, pool) = key;
            let was = stored.get(key).copied().unwrap_or_default();
            findings.problem(format!(
                "{} {id} in pool {pool} is recorded as using {} bytes and {} inodes; its inodes use {} bytes and {} inodes",
                kind_name(*kind),
                was.0,
                was.1,
                count.0,
                count.1
            ));
        }
    }
    for ((kind, id, pool), was) in &stored {
        if !counted.contains_key(&(*kind, *id, *pool)) {
            differ = true;
            findings.problem(format!(
                "{} {id} in pool {pool} is recorded as using {} bytes and {} inodes; it has no inode",
                kind_name(*kind),
                was.0,
                was.1
            ));
        }
    }
    if differ {
        if let Some(txn) = findings.fix {
            let rows = crate::schema::usage::rewrite(txn, &counted)?;
            findings.repaired(format!(
                "recounted usage: {rows} rows of users, groups and projects changed"
            ));
        }
    }
    Ok(())
}

/// Reports each of `keys`, the keys of `table`, that names no existing inode, and with
/// `--repair` removes it; `say` gives the problem and the repair for an inode.
fn drop_missing<V: crate::store::Value + 'static>(
    findings: &mut Findings,
    table: TableDefinition<'static, u64, V>,
    keys: &mut HashSet<u64>,
    inodes: &HashMap<u64, InodeRecord>,
    say: impl Fn(InodeId) -> (String, String),
) -> Result<(), OpError> {
    let mut missing: Vec<u64> = keys
        .iter()
        .copied()
        .filter(|id| !inodes.contains_key(id))
        .collect();
    missing.sort_unstable();
    for id in missing {
        let (problem, repair) = say(InodeId(id));
        findings.problem(problem);
        if let Some(txn) = findings.fix {
            txn.open_table(table)?.remove(id)?;
            keys.remove(&id);
            findings.repaired(repair);
        }
    }
    Ok(())
}

/// Objects that belong to no file, each as the slot to remove it through: its target for a
/// plain object, its group (every member at once) for a mirrored one. Reports an object
/// longer than its file's size allows it (bytes past the end of the file, which would show if
/// the file grew), unless the file is open, has a size to report or a truncate under way:
/// then its size may lag behind its objects.
fn check_objects(
    findings: &mut Findings,
    snapshot: &Snapshot,
    objects: &[FoundObject],
    unsettled: &HashSet<InodeId>,
) -> Result<Vec<(InodeId, Slot)>, OpError> {
    let inodes = &snapshot.inodes;
    let mut garbage = Vec::new();
    // Files whose objects hold bytes past their end: a truncate to their size cuts them.
    let mut cut = Vec::new();
    for &(inode, target, group, length) in objects {
        let record = inodes.get(&inode.0);
        let slot = record.and_then(|record| {
            let layout = record.layout.as_ref()?;
            Some((record, layout, layout.index_of_object(target, group)?))
        });
        if let Some((record, layout, index)) = slot {
            let allowed = object_length_for_file_size(layout, index, record.size);
            if length > allowed && !unsettled.contains(&inode) {
                findings.problem(format!(
                    "the object of {inode} on target {target} holds {length} bytes, but a file of \
                     {} bytes has at most {allowed} there: bytes past the end of the file",
                    record.size
                ));
                if findings.fix.is_some() && !cut.contains(&inode) {
                    cut.push(inode);
                }
            }
            continue;
        }
        if snapshot.disposals.contains(&inode.0) {
            continue;
        }
        let (what, slot) = match group {
            None => ("object", Slot::Target(target)),
            Some(group) => ("mirrored object", Slot::Group(group)),
        };
        if snapshot
            .moved
            .get(&inode.0)
            .is_some_and(|slots| slots.contains(&slot))
        {
            // A copy its move is making, or data a move left under a tombstone: the move
            // or the file's removal takes care of it.
            continue;
        }
        findings.problem(format!(
            "{what} of {inode} on target {target} belongs to no file"
        ));
        if findings.fix.is_some() && !garbage.contains(&(inode, slot)) {
            garbage.push((inode, slot));
        }
    }
    if let Some(txn) = findings.fix {
        for inode in cut {
            let mut record = inodes[&inode.0].clone();
            queue_truncate(txn, inode, &mut record)?;
            store_inode(
                &mut crate::schema::usage::Inodes::open(txn)?,
                inode,
                &record,
            )?;
            findings.repaired(format!(
                "queued a truncate of {inode} to its size ({} bytes): its objects are cut to it",
                record.size
            ));
        }
    }
    Ok(garbage)
}

/// The suspects among the copies of settled files' data: a slot recorded as written (and
/// left bytes by the file's size) without its object on a listed target or good member, and
/// the copies of a mirrored object on two or more good members, to be compared.
fn check_copies(
    snapshot: &Snapshot,
    listed: &Listed,
    unsettled: &HashSet<InodeId>,
) -> Vec<Suspect> {
    let present: HashSet<(InodeId, TargetId, Option<GroupId>)> = listed
        .objects
        .iter()
        .map(|&(inode, target, group, _)| (inode, target, group))
        .collect();
    let mut suspects = Vec::new();
    for (&id, record) in &snapshot.inodes {
        let inode = InodeId(id);
        let Some(layout) = &record.layout else {
            continue;
        };
        if unsettled.contains(&inode) || snapshot.moving.contains(&id) {
            continue;
        }
        let written = snapshot.written.get(&id).copied().unwrap_or_default();
        for index in 0..layout.width() {
            if object_length_for_file_size(layout, index, record.size) == 0 {
                continue;
            }
            let slot = layout.slot(index);
            let (copies, group) = match slot {
                Slot::Target(target) if listed.targets.contains(&target) => (vec![target], None),
                Slot::Group(group) => match listed.good_members.get(&group) {
                    Some(members) => (members.clone(), Some(group)),
                    None => continue,
                },
                Slot::Target(_) => continue,
            };
            let (holding, lacking): (Vec<TargetId>, Vec<TargetId>) = copies
                .into_iter()
                .partition(|target| present.contains(&(inode, *target, group)));
            let kind = if written.contains(index) && !lacking.is_empty() {
                SuspectKind::Missing { lacking, holding }
            } else if holding.len() >= 2 {
                SuspectKind::Compare(holding)
            } else {
                continue;
            };
            suspects.push(Suspect {
                inode,
                generation: record.truncate_generation,
                index,
                slot,
                kind,
            });
        }
    }
    suspects
}

/// Inodes of other homes that dentries here name.
pub(crate) fn remote_references(
    txn: &ReadTransaction,
    home: NodeId,
) -> Result<MetaResponse, OpError> {
    let entries = txn.open_table(ENTRIES)?;
    let mut out = Vec::new();
    for item in entries.iter()? {
        let (_, value) = item?;
        let child = InodeId(value.value().0);
        if child.home() != home {
            out.push(child);
        }
    }
    // A spread directory names its shards on other servers.
    for item in txn.open_table(INODES)?.iter()? {
        let (key, value) = item?;
        let record = InodeRecord::decode(key.value(), value.value())?;
        out.extend(record.shards.iter().skip(1).map(|shard| InodeId(*shard)));
    }
    Ok(MetaResponse::Inodes(out))
}

/// The name of a kind of quota as the usage table stores it.
fn kind_name(key: u8) -> &'static str {
    weft_proto::quota::QuotaKind::from_key(key).map_or("unknown kind of", <&str>::from)
}
