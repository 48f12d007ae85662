//! The open-file calls of a [`Client`]: opening and creating files as [`OpenFile`]s, and what
//! the files open here tell of their inodes.

use super::{Client, ClientError};
use crate::file::OpenFile;
use std::sync::Arc;
use weft_proto::ids::InodeId;
use weft_proto::messages::InodeAttr;

impl Client {
    /// Opens `inode` for `access` (bits of [`weft_proto::access`]) with its metadata server.
    ///
    /// # Errors
    /// As [`Client::open`].
    pub async fn open_file(
        self: &Arc<Self>,
        inode: InodeId,
        access: u8,
    ) -> Result<OpenFile, ClientError> {
        let handle = self.files.next_handle();
        let attr = self.open(inode, handle, access).await?;
        Ok(self.handle_of(handle, &attr))
    }

    /// Creates a regular file (or another entry, as [`Client::create_entry`]) in `parent`
    /// and opens it for reading and writing, in one request.
    ///
    /// # Errors
    /// As [`Client::create`].
    pub async fn create_file(
        self: &Arc<Self>,
        (parent, name): (InodeId, &str),
        new: weft_proto::messages::NewInode,
    ) -> Result<(OpenFile, crate::Created), ClientError> {
        let handle = self.files.next_handle();
        let created = self.create_entry(parent, name, new, Some(handle)).await?;
        Ok((self.handle_of(handle, &created.attr), created))
    }

    fn handle_of(self: &Arc<Self>, handle: u64, attr: &InodeAttr) -> OpenFile {
        OpenFile::opened(self, handle, attr)
    }

    /// Waits until every write of `inode` in flight here is done (a lock is taken or
    /// released after the writes made under the one before).
    pub async fn drain_writes(&self, inode: InodeId) {
        if let Some(shared) = self.files.get(inode) {
            shared.drain().await;
        }
    }

    /// `attr` as this client knows it: with the size this client wrote and has not reported
    /// yet (see the module's notes on size).
    pub fn known(&self, attr: InodeAttr) -> InodeAttr {
        self.files.merge(attr)
    }

    /// Attributes of `inode` kept since this client learned them, as [`Client::known`] would
    /// show them now, without learning anything from them (they may be older than what this
    /// client heard since); `None` when they no longer match the file this client has open:
    /// another truncate generation or another layout.
    pub fn known_view(&self, attr: InodeAttr) -> Option<InodeAttr> {
        self.files.view(attr)
    }
}
