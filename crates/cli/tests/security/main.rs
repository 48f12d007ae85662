//! Only the cluster's own members get in: every connection proves the cluster key before a
//! request of it is read, strangers are refused with a line in the server's log, and running
//! without a key must be asked for.

#[path = "../common/mod.rs"]
mod common;

use common::{binary, client_key, cluster, keyed_client, once_settled, set_rule};
use std::fs;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;
use weft_net::MetaCalls;
use weft_net::MgmtCalls;
use weft_proto::codec::{self, FrameHeader, FrameKind};
use weft_proto::messages::{MgmtRequest, Request, StorageRequest};
use weft_proto::{InodeId, TargetId};
use weft_testkit::{wait_until, ClusterSpec};

/// The header of a request frame with a body of `body_len` bytes and no payload.
fn request_header(body_len: u32, flags: u8) -> [u8; codec::FRAME_HEADER_BYTES] {
    FrameHeader {
        version: codec::PROTOCOL_VERSION,
        flags,
        kind: FrameKind::Request,
        request_id: 1,
        body_len,
        payload_len: 0,
        payload_crc: 0,
        origin: 0,
    }
    .encode()
}

/// Sends `request` as a frame at once, as a peer that skips the handshake would (every Weft
/// before authentication did); returns every byte the server sent back before it closed.
fn unauthenticated_request(address: &str, request: &Request) -> Vec<u8> {
    let mut stream = std::net::TcpStream::connect(address).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let body = codec::encode_body(request);
    let header = request_header(body.len() as u32, 0);
    let mut frame = header.to_vec();
    frame.extend_from_slice(&body);
    // The server may hang up before all of it is read.
    let _ = stream.write_all(&frame);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    answer
}

/// Runs the CLI as on a host of its own, with `key_file` as its key (`None`: no key anywhere
/// it looks; the links of this host's mounts are out of its sight).
fn weft_with_key(key_file: Option<&Path>, args: &[&str]) -> Output {
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let mut command = Command::new(binary());
    command
        .args(args)
        .env("WEFT_LOG", "warn")
        .env("XDG_RUNTIME_DIR", elsewhere.path());
    match key_file {
        Some(file) => command.env("WEFT_KEY_FILE", file),
        None => command.env("WEFT_KEY_FILE", ""),
    };
    command.output().expect("weft runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Reads 5 bytes of, or writes to, the first object of `inode` (at `slot`) on its storage
/// server, showing `capability`.
async fn object_io(
    view: &weft_net::ClusterView,
    (inode, slot): (InodeId, weft_proto::layout::Slot),
    capability: Option<weft_proto::access::Capability>,
    write: bool,
) -> Result<Vec<u8>, weft_net::RpcError> {
    let route = view.route(slot).await?;
    let storage = view.storage_for_target(route.target).await?;
    if write {
        let data = bytes::Bytes::from_static(b"overwritten");
        storage
            .write(
                route,
                weft_net::ObjectWrite {
                    file: (inode, 0),
                    offset: 0,
                    data,
                    tag: None,
                    capability,
                    owner: None,
                },
            )
            .await
            .map(|_| Vec::new())
    } else {
        storage
            .read(route, (inode, 0), 0, 5, capability)
            .await
            .map(|data| data.to_vec())
    }
}

/// Whether `result` is the error `errno`.
fn fails_with<T>(result: std::io::Result<T>, errno: i32) -> bool {
    result.is_err_and(|error| error.raw_os_error() == Some(errno))
}

fn code<T: std::fmt::Debug>(result: Result<T, weft_client::ClientError>) -> weft_proto::ErrorCode {
    result.expect_err("refused").code()
}

mod clients;
mod handshake;
