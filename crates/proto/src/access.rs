//! What a client identity may do (docs/design/security.md).
//!
//! A connection proves either the cluster key (a member: a server, an admin tool, a trusted
//! mount) or a client key issued for one name with `weft keygen --client NAME`. A client may
//! send only the file operations a mount makes ([`Request::for_clients`]); registering nodes,
//! servers' heartbeats, replication, the steps servers take with each other, checks and disk
//! benchmarks are for members. Management keeps a [`ClientRule`] per client name and hands
//! them out in the cluster map; metadata and storage servers enforce them per connection.

use crate::error::{ErrorCode, WireError};
use crate::ids::{ClientId, InodeId, NodeId};
use crate::messages::{ClusterMap, MetaRequest, Request, StorageRequest};
use serde::{Deserialize, Serialize};

/// The user and group root is squashed to: `nobody` on most systems.
pub const NOBODY: u32 = 65534;

/// Longest client name, in bytes (names are letters, digits, `.`, `_` and `-`).
pub const CLIENT_NAME_BYTES_MAX: usize = 64;

/// Whether `name` can name a client: 1 to [`CLIENT_NAME_BYTES_MAX`] letters, digits, `.`,
/// `_` or `-`.
pub fn valid_client_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= CLIENT_NAME_BYTES_MAX
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-'))
}

/// Who a metadata request acts for: the user and groups of the process that made it (a
/// mount's caller, or the process using the client library), as the client states them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Caller {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Supplementary groups (at most [`CALLER_GROUPS_MAX`] are looked at).
    pub groups: Vec<u32>,
}

/// Most supplementary groups of a caller a server considers (NFS's AUTH_SYS carries 16).
pub const CALLER_GROUPS_MAX: usize = 32;

impl Caller {
    /// The calling process's effective user and groups.
    pub fn of_process() -> Caller {
        // SAFETY: geteuid and getegid have no preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let mut groups = vec![0 as libc::gid_t; CALLER_GROUPS_MAX];
        // SAFETY: the buffer holds `CALLER_GROUPS_MAX` entries, as the call is told.
        let count =
            unsafe { libc::getgroups(CALLER_GROUPS_MAX as libc::c_int, groups.as_mut_ptr()) };
        groups.truncate(usize::try_from(count).unwrap_or(0));
        Caller { uid, gid, groups }
    }

    /// Whether this is the superuser.
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// Whether the caller is in group `gid`.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid
            || self
                .groups
                .iter()
                .take(CALLER_GROUPS_MAX)
                .any(|&g| g == gid)
    }
}

/// Read access, in an open's `access` (the bits of a mode's "other" triple).
pub const READ: u8 = 4;
/// Write access.
pub const WRITE: u8 = 2;
/// Search a directory, or execute a file.
pub const EXECUTE: u8 = 1;

/// The restrictions of one client identity, as `weft client set` makes them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientRule {
    /// The client's name, as in its key.
    pub name: String,
    /// The client may read, not change: writes, creates, removals, renames and attribute
    /// changes are refused with [`ErrorCode::ReadOnly`].
    pub read_only: bool,
    /// The client's root (uid 0, and group 0) acts as [`NOBODY`], and the servers check every
    /// caller's access to files and directories themselves, as the client's kernel would
    /// (which lets root in).
    pub root_squash: bool,
    /// Every request of the client is refused, until the rule changes.
    pub revoked: bool,
    /// The directory the client is confined to: its mounts show it as their root, and the
    /// metadata servers refuse every request that names an inode outside it.
    #[serde(default, with = "crate::wire::since_3")]
    pub subtree: Option<Subtree>,
}

/// The directory a client is confined to ([`ClientRule::subtree`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subtree {
    /// The directory: it decides, wherever it moves.
    pub inode: InodeId,
    /// Its path when the rule was set, for people to read.
    pub path: String,
}

/// What the servers check themselves for one request of a client, by the client's rule.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Checks {
    /// Who a metadata request acts as, when the server checks its access itself
    /// ([`ClientRule::checked`]).
    pub caller: Option<Caller>,
    /// The directory every inode a metadata request names must lie in.
    pub subtree: Option<InodeId>,
    /// The servers decide which files the client may use (it squashes root or is confined
    /// to a subtree), so a storage server wants a [`Capability`] with each read or change of
    /// a file's objects, and a metadata server grants one at each open.
    pub per_file: bool,
    /// The client may read but not change (its changes are refused before this is asked).
    pub read_only: bool,
}

impl Checks {
    /// Whether the client is held to a rule at all (read-only, root squash, a subtree): its
    /// locks and opens are checked and bounded.
    pub fn restricted(&self) -> bool {
        self.per_file || self.read_only
    }
}

/// A metadata server's grant of access to the objects of one file, to one client session,
/// until a time: made when a client whose access the servers check opens (or creates) the
/// file, shown to the storage servers with each read, write, fallocate and sync of its
/// objects. The proof is an HMAC-SHA256, with a key derived from the cluster key, of the
/// inode, the access, the session and the expiry, so a client can neither make one nor widen
/// or extend one; it is good while the session is the client's own and alive (a storage
/// server checks that as for every request) and until it expires, after which the client
/// opens the file again for a new one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capability {
    /// The session it was granted to.
    pub session: ClientId,
    /// [`READ`] and [`WRITE`] bits.
    pub access: u8,
    /// When it stops being good, in seconds since the Unix epoch (by the storage server's
    /// clock).
    pub expires: u64,
    /// The HMAC.
    pub proof: [u8; 32],
    /// Whose quotas the file's growth through it counts in, and how far it may grow each
    /// object (protocol version 9, signed with the rest); `None` from a server of version 8.
    #[serde(default, with = "crate::wire::since_9")]
    pub growth: Option<GrowthBound>,
}

/// What a capability binds a file's growth to: the owner, group and project a storage
/// server counts it in (whatever the request says), and the end each of the file's objects
/// may grow to, from the room the file's home reserved for the session's writers
/// (docs/design/quotas.md); `u64::MAX` when no hard byte limit counts the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrowthBound {
    /// The file's owner.
    pub uid: u32,
    /// The file's group.
    pub gid: u32,
    /// The file's project (0: none).
    pub project: u32,
    /// The end past which none of the file's objects may grow.
    pub object_end: u64,
    /// The HMAC of the capability's other fields and these. The capability's own proof
    /// signs what a peer of version 8 checks, so a client of version 8 (which never sees
    /// this) still shows a good one; a peer of version 9 must show this too.
    pub proof: [u8; 32],
}

impl ClientRule {
    /// What a metadata server checks itself for a request of this rule's client acting for
    /// `caller`.
    pub fn checks(&self, caller: Option<Caller>) -> Checks {
        Checks {
            caller: self.checked(caller),
            subtree: self.subtree.as_ref().map(|subtree| subtree.inode),
            per_file: self.per_file(),
            read_only: self.read_only,
        }
    }

    /// Whether the servers decide which files its client may use (it squashes root or is
    /// confined to a subtree), and so want capabilities for its reads and writes.
    pub fn per_file(&self) -> bool {
        self.root_squash || self.subtree.is_some()
    }

    /// Who `caller` acts as on the servers when they check its access themselves: `Some` for
    /// every caller of a client this rule squashes, root as [`NOBODY`] (uid, group and any
    /// group 0 too), so no caller of it has root's powers; `None` when the servers leave the
    /// checks to the client's kernel. A request without a caller acts as nobody.
    pub fn checked(&self, caller: Option<Caller>) -> Option<Caller> {
        if !self.root_squash {
            return None;
        }
        let mut caller = caller.unwrap_or(Caller {
            uid: NOBODY,
            gid: NOBODY,
            groups: Vec::new(),
        });
        if caller.uid == 0 {
            caller.uid = NOBODY;
        }
        if caller.gid == 0 {
            caller.gid = NOBODY;
        }
        caller.groups.truncate(CALLER_GROUPS_MAX);
        caller.groups.retain(|&group| group != 0);
        Some(caller)
    }
}

/// Whether the client named `name` may send `request` at all: only requests for clients
/// ([`Request::for_clients`]). Members are not asked.
///
/// # Errors
/// [`ErrorCode::PermissionDenied`], naming the client and the request.
pub fn for_client(name: &str, request: &Request) -> Result<(), WireError> {
    if request.for_clients() {
        return Ok(());
    }
    Err(WireError::new(
        ErrorCode::PermissionDenied,
        format!(
            "client {name} may not send {}: it is for the cluster's members (the holders of the \
             cluster key)",
            request.op_name()
        ),
    ))
}

impl ClientRule {
    /// Whether this rule lets its client send `request` (one for clients).
    ///
    /// # Errors
    /// [`ErrorCode::PermissionDenied`] when the client is revoked, [`ErrorCode::ReadOnly`] for
    /// a change by a read-only client; the message names the client.
    pub fn admit(&self, request: &Request) -> Result<(), WireError> {
        let name = &self.name;
        if self.revoked {
            return Err(WireError::new(
                ErrorCode::PermissionDenied,
                format!("client {name} is revoked (weft client set {name} --revoked)"),
            ));
        }
        if self.read_only && request.changes_files() {
            return Err(WireError::new(
                ErrorCode::ReadOnly,
                format!(
                    "client {name} is read-only (weft client set {name} --read-only): {} refused",
                    request.op_name()
                ),
            ));
        }
        Ok(())
    }
}

/// What a request is to admission: one a client may send that only reads, one a client may
/// send that changes files, directories or attributes, or one for the cluster's members.
/// Each request declares it on its variant (`#[request(...)]`, [`Declared`]), beside the
/// inodes it names, the sessions it acts in and what it answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Reads,
    Changes,
    Members,
}

pub use weft_wire_derive::Declared;

/// What a request routes by, as it declares (`#[request(route = ..)]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routing<'a> {
    /// The server that serves the home of this inode.
    Home(InodeId),
    /// The server that serves the shard of this directory that holds this name: the
    /// directory's own home unless it is spread, and the request names the shard then.
    Holder(InodeId, &'a str),
    /// The server of this storage target.
    Target(crate::ids::TargetId),
    /// The server its sender chose: a member's, a session's or the leader's business.
    Chosen,
}

impl Routing<'_> {
    /// The home whose server it goes to, when it routes by an inode.
    pub fn home(&self) -> Option<NodeId> {
        match self {
            Routing::Home(inode) | Routing::Holder(inode, _) => Some(inode.home()),
            Routing::Target(_) | Routing::Chosen => None,
        }
    }
}

/// An open for writing changes its file; one for reading only does not.
pub(crate) fn open_kind(access: u8) -> Kind {
    match access & WRITE {
        0 => Kind::Reads,
        _ => Kind::Changes,
    }
}

/// A field of a request that names the client sessions it acts in
/// (`#[request(sessions(FIELD))]`).
pub trait ActsIn {
    /// Adds the sessions it names to `sessions`.
    fn acts_in(&self, sessions: &mut Vec<ClientId>);
}

impl ActsIn for ClientId {
    fn acts_in(&self, sessions: &mut Vec<ClientId>) {
        sessions.push(*self);
    }
}

impl ActsIn for crate::messages::MutationId {
    fn acts_in(&self, sessions: &mut Vec<ClientId>) {
        sessions.push(self.client);
    }
}

impl ActsIn for Capability {
    fn acts_in(&self, sessions: &mut Vec<ClientId>) {
        sessions.push(self.session);
    }
}

impl<T: ActsIn> ActsIn for Option<T> {
    fn acts_in(&self, sessions: &mut Vec<ClientId>) {
        if let Some(named) = self {
            named.acts_in(sessions);
        }
    }
}

impl Request {
    fn kind(&self) -> Kind {
        match self {
            Request::Mgmt(request) => request.kind(),
            Request::Meta(_, request, _) => request.kind(),
            // A change a primary passes on is the members' business, whoever sends it.
            Request::Storage(request) if request.mirror().is_some_and(|route| route.forwarded) => {
                Kind::Members
            }
            Request::Storage(request) => request.kind(),
            Request::Stats => Kind::Reads,
        }
    }

    /// Whether a client identity may send it: the file operations of a mount or the client
    /// library. Every other request is for the cluster's members.
    pub fn for_clients(&self) -> bool {
        self.kind() != Kind::Members
    }

    /// Whether it changes files, directories or attributes (refused to read-only clients);
    /// every request for members counts as a change.
    pub fn changes_files(&self) -> bool {
        self.kind() != Kind::Reads
    }
}

/// Whether the sessions a client's request acts in are its own.
#[derive(Debug, PartialEq, Eq)]
pub enum Sessions {
    /// Every session it names was registered by the client (or it names none).
    Own,
    /// A session this map does not know: new since it was fetched, or made up.
    Unknown(ClientId),
    /// A session another client, or a member, registered.
    Foreign(ClientId),
}

/// Whether the client named `name` may act in the sessions `request` names, by `map`.
pub fn sessions_of(name: &str, request: &Request, map: &ClusterMap) -> Sessions {
    for session in request.sessions() {
        match map.session_owner(session) {
            Some(owner) if owner == name => {}
            Some(_) => return Sessions::Foreign(session),
            None if map.live_sessions.contains(&session) => return Sessions::Foreign(session),
            None => return Sessions::Unknown(session),
        }
    }
    Sessions::Own
}

/// The refusal of a request that acts in another's session.
pub fn foreign_session(name: &str, session: ClientId) -> WireError {
    WireError::new(
        ErrorCode::PermissionDenied,
        format!("client {name} may not act in session {session}: another client registered it"),
    )
}

impl Request {
    /// Whether it is a request a server passes on to another (a change a primary forwards to
    /// its mirror members, a metadata primary's change to its copies): such requests take a
    /// budget of their own on the receiving server (see `weft_net::server`).
    pub fn forwarded(&self) -> bool {
        match self {
            Request::Storage(request) => request.mirror().is_some_and(|route| route.forwarded),
            Request::Meta(_, MetaRequest::ReplicaApply { .. }, _) => true,
            Request::Meta(..) | Request::Mgmt(_) | Request::Stats => false,
        }
    }

    /// The client sessions the request acts in: whose replies, opens, locks or changes it
    /// touches. A client identity may name only the sessions it registered.
    pub fn sessions(&self) -> Vec<ClientId> {
        match self {
            Request::Mgmt(request) => request.sessions(),
            Request::Stats => Vec::new(),
            Request::Meta(_, request, _) => request.sessions(),
            Request::Storage(request) => {
                let capability = request
                    .file_access()
                    .and_then(|(_, _, capability)| capability)
                    .map(|capability| capability.session);
                request
                    .tag()
                    .map(|tag| tag.client)
                    .into_iter()
                    .chain(capability)
                    .collect()
            }
        }
    }
}

impl StorageRequest {
    /// The file whose objects a client's request reads or changes, the access that needs (a
    /// sync needs none: any open lets a client sync), and the capability the request shows.
    /// `None` for requests that touch no file's objects or are for members.
    pub fn file_access(&self) -> Option<(InodeId, u8, Option<&Capability>)> {
        match self {
            StorageRequest::Read {
                inode, capability, ..
            } => Some((*inode, READ, capability.as_ref())),
            StorageRequest::Write {
                inode, capability, ..
            }
            | StorageRequest::Fallocate {
                inode, capability, ..
            }
            | StorageRequest::CopyFrom {
                inode, capability, ..
            } => Some((*inode, WRITE, capability.as_ref())),
            StorageRequest::Sync {
                inode, capability, ..
            } => Some((*inode, 0, capability.as_ref())),
            StorageRequest::NetBench { .. }
            | StorageRequest::Truncate { .. }
            | StorageRequest::Remove { .. }
            | StorageRequest::RemoveObjects { .. }
            | StorageRequest::Bench { .. }
            | StorageRequest::ListObjects { .. }
            | StorageRequest::ObjectLength { .. }
            | StorageRequest::ObjectChecksum { .. }
            | StorageRequest::SyncTarget { .. }
            | StorageRequest::Push { .. }
            | StorageRequest::Seal { .. } => None,
        }
    }

    /// The file a request reads besides the one [`StorageRequest::file_access`] names (the
    /// source of a copy), with the capability it shows for reading it.
    pub fn source_access(&self) -> Option<(InodeId, u8, Option<&Capability>)> {
        match self {
            StorageRequest::CopyFrom {
                source: (inode, _),
                source_capability,
                ..
            } => Some((*inode, READ, source_capability.as_ref())),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{ClientId, GroupVersion, InodeId};
    use crate::messages::{MetaRoute, MgmtRequest, MutationId};
    use crate::NodeId;

    fn meta(request: MetaRequest) -> Request {
        let route = MetaRoute {
            home: NodeId(1),
            version: GroupVersion(0),
        };
        Request::Meta(route, request, None)
    }

    // Goal: what each request declares on its variant reaches admission: an open is a change
    // only for writing, a rename names both directories and a link its inode and new
    // directory, the sessions of a truncate through a descriptor are the mutation's and the
    // capability's, a heartbeat acts in its session, and requests between servers name no
    // inode and no session.
    #[test]
    fn declared_access_reaches_admission() {
        let inode = InodeId::new(NodeId(1), 7);
        let other = InodeId::new(NodeId(2), 9);
        let mutation = MutationId {
            client: ClientId(3),
            seq: 1,
            oldest_pending: 1,
        };
        let open = |access| MetaRequest::Open {
            client: ClientId(1),
            handle: 1,
            inode,
            access,
            granted: None,
        };
        assert_eq!(open(READ).kind(), Kind::Reads);
        assert_eq!(open(READ | WRITE).kind(), Kind::Changes);
        assert_eq!(open(READ).sessions(), vec![ClientId(1)]);
        let rename = MetaRequest::Rename {
            mutation,
            parent: inode,
            name: "a".into(),
            new_parent: other,
            new_name: "b".into(),
            flags: crate::messages::RenameFlags::default(),
        };
        assert_eq!(rename.inodes_named(), vec![inode, other]);
        assert_eq!(rename.kind(), Kind::Changes);
        let link = MetaRequest::Link {
            mutation,
            inode,
            new_parent: other,
            new_name: "l".into(),
        };
        assert_eq!(link.inodes_named(), vec![inode, other]);
        let capability = Capability {
            session: ClientId(4),
            access: WRITE,
            expires: 0,
            proof: [0; 32],
            growth: None,
        };
        let truncate = MetaRequest::SetAttr {
            mutation,
            inode,
            changes: crate::messages::AttrChanges::default(),
            granted: Some(capability),
        };
        assert_eq!(truncate.sessions(), vec![ClientId(3), ClientId(4)]);
        let heartbeat = MgmtRequest::ClientHeartbeat {
            client: ClientId(5),
            unserved: Vec::new(),
        };
        assert_eq!(heartbeat.sessions(), vec![ClientId(5)]);
        assert_eq!(heartbeat.kind(), Kind::Reads);
        let between = MetaRequest::RemoteReferences;
        assert_eq!(between.kind(), Kind::Members);
        assert!(between.inodes_named().is_empty() && between.sessions().is_empty());
    }

    // Goal: a client may make file operations and nothing servers do among themselves; a
    // read-only client may read but not change; a revoked one may do nothing.
    #[test]
    fn clients_are_admitted_by_their_rule() {
        let inode = InodeId::new(NodeId(1), 7);
        let read = meta(MetaRequest::GetAttr { inode });
        let open_write = meta(MetaRequest::Open {
            client: ClientId(1),
            handle: 1,
            inode,
            access: READ | WRITE,
            granted: None,
        });
        let unlink = meta(MetaRequest::Unlink {
            mutation: MutationId {
                client: ClientId(1),
                seq: 1,
                oldest_pending: 1,
            },
            parent: inode,
            name: "f".into(),
        });
        let register = Request::Mgmt(MgmtRequest::RegisterNode {
            node: None,
            kind: crate::messages::NodeKind::Storage,
            alias: "x".into(),
            addresses: vec!["127.0.0.1:1".into()],
        });

        let code = |rule: Option<&ClientRule>, request: &Request| {
            for_client("c1", request)
                .and_then(|()| rule.map_or(Ok(()), |rule| rule.admit(request)))
                .map_err(|error| error.code)
        };
        assert_eq!(code(None, &read), Ok(()));
        assert_eq!(code(None, &unlink), Ok(()));
        assert_eq!(code(None, &register), Err(ErrorCode::PermissionDenied));

        let read_only = ClientRule {
            name: "c1".into(),
            read_only: true,
            ..ClientRule::default()
        };
        assert_eq!(code(Some(&read_only), &read), Ok(()));
        assert_eq!(
            code(Some(&read_only), &open_write),
            Err(ErrorCode::ReadOnly)
        );
        assert_eq!(code(Some(&read_only), &unlink), Err(ErrorCode::ReadOnly));

        let revoked = ClientRule {
            name: "c1".into(),
            revoked: true,
            ..ClientRule::default()
        };
        assert_eq!(
            code(Some(&revoked), &read),
            Err(ErrorCode::PermissionDenied)
        );
    }

    // Goal: a squashing rule has every caller checked, root as nobody with no group 0; a rule
    // without squash leaves the checks to the client's kernel.
    #[test]
    fn a_squashing_rule_checks_every_caller() {
        let squash = ClientRule {
            name: "c".into(),
            root_squash: true,
            ..ClientRule::default()
        };
        let root = Caller {
            uid: 0,
            gid: 0,
            groups: vec![0, 10],
        };
        let user = Caller {
            uid: 1000,
            gid: 0,
            groups: vec![1000],
        };
        assert_eq!(
            squash.checked(Some(root.clone())),
            Some(Caller {
                uid: NOBODY,
                gid: NOBODY,
                groups: vec![10]
            })
        );
        assert_eq!(squash.checked(None).map(|caller| caller.uid), Some(NOBODY));
        assert_eq!(
            squash.checked(Some(user)),
            Some(Caller {
                uid: 1000,
                gid: NOBODY,
                groups: vec![1000]
            })
        );
        assert_eq!(ClientRule::default().checked(Some(root)), None);
    }

    #[test]
    fn client_names() {
        assert!(valid_client_name("node-17.rack_2"));
        assert!(!valid_client_name(""));
        assert!(!valid_client_name("a b"));
        assert!(!valid_client_name("a/b"));
        assert!(!valid_client_name(&"x".repeat(65)));
    }
}
