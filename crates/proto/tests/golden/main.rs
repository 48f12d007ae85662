//! Golden bytes: the encoding of every message, fixed in `golden/messages.txt`.
//!
//! Every variant of every enum that crosses the wire is encoded here, with its nested
//! structures filled in, and the bytes compared with the ones recorded. A change of a tag, of
//! the order or type of a field, or of a nested structure shows as a difference: that is a
//! change of the protocol, which needs a new protocol version (docs/design/protocol.md,
//! "Versions"). Messages of the older version this build still speaks are recorded too.
//! After a deliberate change, `WEFT_BLESS=1 cargo test -p weft-proto --test golden` records
//! the new bytes; review the diff of the file like code.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use weft_mirror::pages::FileChange;
use weft_proto::access::{Caller, Capability, ClientRule, Subtree};
use weft_proto::codec::{encode_body_in, PROTOCOL_VERSION, PROTOCOL_VERSION_MIN};
use weft_proto::ids::{GroupId, GroupVersion, MemberId};
use weft_proto::layout::{FileLayout, PatternKind, Slot, SlotSet, StripePattern};
use weft_proto::messages::*;
use weft_proto::{ClientId, ErrorCode, InodeId, NodeId, StoragePoolId, TargetId};

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/messages.txt");

fn requests() -> Vec<Request> {
    vec![
        Request::Mgmt(MgmtRequest::GetClusterMap),
        Request::Meta(route(), MetaRequest::GetAttr { inode: inode(5) }, caller()),
        Request::Meta(route(), MetaRequest::LockEpoch, None),
        Request::Storage(StorageRequest::Sync {
            target: TargetId(3),
            mirror: None,
            inode: inode(5),
            capability: None,
        }),
        Request::Stats,
    ]
}

/// Each response of every service, as its tag and its encoding in a reply.
fn response_encodings() -> Vec<(u32, Result<Vec<u8>, String>)> {
    fn encoded<R: serde::Serialize>(
        responses: Vec<R>,
        tag: fn(&R) -> u32,
    ) -> Vec<(u32, Result<Vec<u8>, String>)> {
        responses
            .into_iter()
            .map(|response| {
                let tag = tag(&response);
                let reply: Reply<R> = Ok(response);
                (tag, encode_body_in(PROTOCOL_VERSION, &reply))
            })
            .collect()
    }
    let mut all = encoded(meta_responses(), MetaResponse::wire_tag);
    all.extend(encoded(mgmt_responses(), MgmtResponse::wire_tag));
    all.extend(encoded(storage_responses(), StorageResponse::wire_tag));
    all.extend(encoded(stats_responses(), StatsResponse::wire_tag));
    all
}

/// Each of `responses`, in a reply, decodes back to itself.
fn round_trips<R>(responses: Vec<R>)
where
    R: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    for response in responses {
        let reply: Reply<R> = Ok(response);
        let bytes = weft_proto::codec::encode_body(&reply);
        assert_eq!(
            weft_proto::codec::decode_body::<Reply<R>>(&bytes).as_ref(),
            Ok(&reply)
        );
    }
}

/// Every tag of `all` is the tag of one of `samples`.
fn covers(what: &str, all: &[(u32, &str)], samples: impl IntoIterator<Item = u32>) {
    let seen: BTreeSet<u32> = samples.into_iter().collect();
    let missing: Vec<&str> = all
        .iter()
        .filter(|(tag, _)| !seen.contains(tag))
        .map(|(_, name)| *name)
        .collect();
    assert!(missing.is_empty(), "{what}: no sample of {missing:?}");
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// `name version hex` lines of every sample.
fn encodings() -> String {
    let mut out = String::new();
    let mut line = |name: String, version: u16, bytes: Result<Vec<u8>, String>| {
        let bytes = bytes.unwrap_or_else(|error| panic!("{name} in version {version}: {error}"));
        writeln!(out, "{name} {version} {}", hex(&bytes)).expect("write to a string");
    };
    for request in mgmt_requests() {
        let name = format!("MgmtRequest::{}", <&str>::from(&request));
        line(
            name,
            PROTOCOL_VERSION,
            encode_body_in(PROTOCOL_VERSION, &request),
        );
    }
    for request in meta_requests() {
        let name = format!("MetaRequest::{}", <&str>::from(&request));
        line(
            name,
            PROTOCOL_VERSION,
            encode_body_in(PROTOCOL_VERSION, &request),
        );
    }
    for request in storage_requests() {
        let name = format!("StorageRequest::{}", <&str>::from(&request));
        line(
            name,
            PROTOCOL_VERSION,
            encode_body_in(PROTOCOL_VERSION, &request),
        );
    }
    for (index, op) in bench_ops().into_iter().enumerate() {
        let name = format!("StorageBenchOp#{index}");
        line(
            name,
            PROTOCOL_VERSION,
            encode_body_in(PROTOCOL_VERSION, &op),
        );
    }
    // The services' responses kept the tags they had in one enum: listed by tag, a tag that
    // several services answer (`Done`) once, after checking that they encode alike.
    let mut responses: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
    for (tag, bytes) in response_encodings() {
        let bytes = bytes.unwrap_or_else(|error| panic!("response {tag}: {error}"));
        if let Some(earlier) = responses.insert(tag, bytes.clone()) {
            assert_eq!(earlier, bytes, "responses of tag {tag} encode differently");
        }
    }
    for (tag, bytes) in responses {
        line(format!("Response#{tag}"), PROTOCOL_VERSION, Ok(bytes));
    }
    let error: Reply<MetaResponse> =
        Err(weft_proto::error::WireError::new(ErrorCode::ReadOnly, "ro"));
    line(
        "Reply::Err".into(),
        PROTOCOL_VERSION,
        encode_body_in(PROTOCOL_VERSION, &error),
    );
    for request in requests() {
        let name = format!("Request::{}", request.op_name());
        line(
            name,
            PROTOCOL_VERSION,
            encode_body_in(PROTOCOL_VERSION, &request),
        );
    }
    // What a peer of the older version sends and is sent: the same messages without what
    // version 5 added.
    let older = PROTOCOL_VERSION_MIN;
    for request in requests() {
        let name = format!("Request::{}", request.op_name());
        line(name, older, encode_body_in(older, &request));
    }
    let open = &meta_requests()[11];
    line(
        "MetaRequest::open".into(),
        older,
        encode_body_in(older, open),
    );
    let map: Reply<MgmtResponse> = Ok(MgmtResponse::ClusterMap(cluster_map()));
    line(
        "Response::ClusterMap".into(),
        older,
        encode_body_in(older, &map),
    );
    out
}

// Goal: every variant of every message enum has a sample, so no message escapes the golden
// bytes.
#[test]
fn every_variant_has_a_sample() {
    covers(
        "MgmtRequest",
        MgmtRequest::WIRE_TAGS,
        mgmt_requests().iter().map(MgmtRequest::wire_tag),
    );
    covers(
        "MetaRequest",
        MetaRequest::WIRE_TAGS,
        meta_requests().iter().map(MetaRequest::wire_tag),
    );
    covers(
        "StorageRequest",
        StorageRequest::WIRE_TAGS,
        storage_requests().iter().map(StorageRequest::wire_tag),
    );
    covers(
        "StorageBenchOp",
        StorageBenchOp::WIRE_TAGS,
        bench_ops().iter().map(StorageBenchOp::wire_tag),
    );
    covers(
        "MetaResponse",
        MetaResponse::WIRE_TAGS,
        meta_responses().iter().map(MetaResponse::wire_tag),
    );
    covers(
        "MgmtResponse",
        MgmtResponse::WIRE_TAGS,
        mgmt_responses().iter().map(MgmtResponse::wire_tag),
    );
    covers(
        "StorageResponse",
        StorageResponse::WIRE_TAGS,
        storage_responses().iter().map(StorageResponse::wire_tag),
    );
    covers(
        "StatsResponse",
        StatsResponse::WIRE_TAGS,
        stats_responses().iter().map(StatsResponse::wire_tag),
    );
    covers(
        "Request",
        Request::WIRE_TAGS,
        requests().iter().map(Request::wire_tag),
    );
    let kinds = [
        FileKind::Regular,
        FileKind::Directory,
        FileKind::Symlink,
        FileKind::Fifo,
        FileKind::Socket,
        FileKind::CharDevice,
        FileKind::BlockDevice,
    ];
    covers(
        "FileKind",
        FileKind::WIRE_TAGS,
        kinds.iter().map(FileKind::wire_tag),
    );
}

// Goal: the bytes of every message are the ones recorded; a change of any of them is a
// change of the protocol and shows here. Every message also decodes back to itself.
#[test]
fn messages_keep_their_bytes() {
    for request in requests() {
        let bytes = weft_proto::codec::encode_body(&request);
        assert_eq!(
            weft_proto::codec::decode_body::<Request>(&bytes).as_ref(),
            Ok(&request)
        );
    }
    round_trips(meta_responses());
    round_trips(mgmt_responses());
    round_trips(storage_responses());
    round_trips(stats_responses());
    let now = encodings();
    if std::env::var_os("WEFT_BLESS").is_some() {
        std::fs::write(GOLDEN, &now).expect("write the golden file");
        return;
    }
    let recorded = std::fs::read_to_string(GOLDEN).expect("the golden file");
    for (now, recorded) in now.lines().zip(recorded.lines()) {
        assert_eq!(
            now, recorded,
            "an encoding changed (a protocol change: see the top of this file)"
        );
    }
    assert_eq!(
        now.lines().count(),
        recorded.lines().count(),
        "messages added or removed"
    );
}

// Goal: a message of the older version decodes into this version's type, with what version
// 5 added at its default, and what the older version cannot say is refused for it, not
// dropped: a project's quota, a setattr that gives a project.
#[test]
fn the_older_version_decodes_and_is_spoken() {
    let older = PROTOCOL_VERSION_MIN;
    fn in_older<R: serde::Serialize + serde::de::DeserializeOwned>(reply: &Reply<R>) -> Reply<R> {
        let older = PROTOCOL_VERSION_MIN;
        let bytes = encode_body_in(older, reply).expect("encodes for version 4");
        weft_proto::codec::decode_body_in::<Reply<R>>(older, &bytes).expect("decodes")
    }
    let decode_older = in_older::<MgmtResponse>;
    // The hard limits came in version 9: a peer of version 4 (or 8) goes without them, and
    // enforces the blocked list only.
    let map: Reply<MgmtResponse> = Ok(MgmtResponse::ClusterMap(ClusterMap {
        quota_hard: Vec::new(),
        ..cluster_map()
    }));
    assert_eq!(
        decode_older(&Ok(MgmtResponse::ClusterMap(cluster_map()))),
        map,
        "the map did not change in version 5 but for the hard limits of version 9"
    );
    let Ok(MetaResponse::Attr(decoded)) = in_older(&Ok(MetaResponse::Attr(attr()))) else {
        panic!("attributes")
    };
    assert_eq!(
        decoded,
        InodeAttr {
            project: 0,
            xattr_free: false,
            ..attr()
        },
        "a peer of version 4 gets attributes without the project, nor whether the inode has \
         no extended attributes (so it asks)"
    );
    let write = &storage_requests()[0];
    let bytes = encode_body_in(older, write).expect("a write encodes for version 4");
    let decoded: StorageRequest =
        weft_proto::codec::decode_body_in(older, &bytes).expect("decodes");
    let StorageRequest::Write { project, owner, .. } = decoded else {
        panic!("a write")
    };
    assert_eq!(
        (project, owner),
        (0, Some((1001, 2002))),
        "a server of version 4 checks the owner's quotas, not the project's"
    );
    // A project's rows are left out for it, and what it is sent goes on without them.
    let user_usage = weft_proto::quota::QuotaUsage {
        kind: weft_proto::quota::QuotaKind::User,
        ..quota_usage()
    };
    let usage: Reply<MetaResponse> = Ok(MetaResponse::QuotaUsage(vec![quota_usage(), user_usage]));
    assert_eq!(
        in_older(&usage),
        Ok(MetaResponse::QuotaUsage(vec![user_usage])),
        "a project's usage is not sent to a peer of version 4"
    );
    let mut blocked = cluster_map();
    blocked.quota_blocked.push(weft_proto::quota::QuotaBlock {
        kind: weft_proto::quota::QuotaKind::Project,
        ..blocked.quota_blocked[0]
    });
    assert_eq!(
        decode_older(&Ok(MgmtResponse::ClusterMap(blocked))),
        map,
        "a peer of version 4 gets the map without the blocked projects"
    );
    let project_rule = MgmtRequest::SetQuota {
        rule: weft_proto::quota::QuotaRule {
            kind: weft_proto::quota::QuotaKind::Project,
            ..quota_rule()
        },
    };
    assert!(encode_body_in(older, &project_rule)
        .is_err_and(|error| error.contains("needs protocol version 5")));
    let set_project = MetaRequest::SetAttr {
        mutation: mutation(),
        inode: inode(5),
        changes: AttrChanges {
            project: Some(42),
            ..AttrChanges::default()
        },
        granted: None,
    };
    assert!(
        encode_body_in(older, &set_project)
            .is_err_and(|error| error.contains("protocol version 5")),
        "a setattr that gives a project is refused for a server that would drop it"
    );
    let seal = storage_requests()
        .into_iter()
        .find(|request| matches!(request, StorageRequest::Seal { .. }))
        .expect("a seal");
    assert!(
        encode_body_in(5, &seal).is_err_and(|error| error.contains("protocol version 6")),
        "a seal is refused for a member of version 5, which could not seal"
    );
    let mirrored_push = storage_requests()
        .into_iter()
        .find(|request| matches!(request, StorageRequest::Push { .. }))
        .expect("a push");
    assert!(
        encode_body_in(5, &mirrored_push).is_err_and(|error| error.contains("protocol version 6")),
        "a mirrored object's push is refused for a primary of version 5, which would push nothing"
    );
    assert!(
        encode_body_in(
            6,
            &MgmtRequest::Raft {
                call: RaftCall::Vote
            }
        )
        .is_err_and(|error| error.contains("protocol version 7")),
        "replication is refused for a management server of version 6, which does not replicate"
    );
    let chmod = &meta_requests()[2];
    let bytes = encode_body_in(older, chmod).expect("a setattr without a project encodes");
    let decoded: MetaRequest = weft_proto::codec::decode_body_in(older, &bytes).expect("decodes");
    // The capability of the descriptor it went through is left out for an older server,
    // which judges the caller by the mode alone.
    let MetaRequest::SetAttr {
        mutation,
        inode,
        changes,
        granted,
    } = chmod.clone()
    else {
        panic!("the third request is a setattr");
    };
    assert!(granted.is_some());
    let without = MetaRequest::SetAttr {
        mutation,
        inode,
        changes,
        granted: None,
    };
    assert_eq!(decoded, without);
}

mod requests;
mod responses;
mod samples;

use requests::*;
use responses::*;
use samples::*;
