//! Group commit. One writer thread owns redb's single write transaction: it takes every
//! operation queued while the previous commit ran, applies them in one transaction, commits
//! (one fsync for all of them), and only then answers each. A rejected operation has written
//! nothing (operations validate before they write), so it does not disturb its batch-mates; a
//! store failure abandons the whole batch and every operation in it gets the error.

use crate::store::OpError;
use redb::{Database, WriteTransaction};
use std::sync::mpsc;
use std::sync::Arc;
use tokio::sync::oneshot;
use weft_proto::messages::Response;

/// Most operations applied in one transaction.
const BATCH_OPERATIONS_MAX: usize = 512;

/// An operation run inside the batch transaction.
pub(crate) type WriteOp = Box<dyn FnOnce(&WriteTransaction) -> Result<Response, OpError> + Send>;

type Queued = (WriteOp, oneshot::Sender<Result<Response, OpError>>);

/// Handle to the writer thread.
pub(crate) struct Committer {
    queue: mpsc::Sender<Queued>,
}

impl Committer {
    pub fn start(db: Arc<Database>) -> Committer {
        let (queue, receiver) = mpsc::channel::<Queued>();
        std::thread::Builder::new()
            .name("weft-meta-commit".into())
            .spawn(move || writer_loop(&db, &receiver))
            .expect("spawning the commit thread");
        Committer { queue }
    }

    /// Runs `op` in the next batch and hands back what it computed once its batch committed.
    pub async fn run_with<T: Send + 'static>(
        &self,
        op: impl FnOnce(&WriteTransaction) -> Result<T, OpError> + Send + 'static,
    ) -> Result<T, OpError> {
        let (sender, receiver) = oneshot::channel();
        self.run(Box::new(move |txn| {
            let value = op(txn)?;
            let _ = sender.send(value);
            Ok(Response::Done)
        }))
        .await?;
        receiver
            .await
            .map_err(|_| OpError::Store("the operation produced nothing".into()))
    }

    /// Runs `op` in the next batch and waits until its batch committed.
    pub async fn run(&self, op: WriteOp) -> Result<Response, OpError> {
        let (answer, receiver) = oneshot::channel();
        self.queue
            .send((op, answer))
            .map_err(|_| OpError::Store("commit thread stopped".into()))?;
        receiver
            .await
            .map_err(|_| OpError::Store("commit thread stopped".into()))?
    }
}

fn writer_loop(db: &Database, receiver: &mpsc::Receiver<Queued>) {
    while let Ok(first) = receiver.recv() {
        let mut batch = vec![first];
        while batch.len() < BATCH_OPERATIONS_MAX {
            match receiver.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        commit_batch(db, batch);
    }
}

fn commit_batch(db: &Database, batch: Vec<Queued>) {
    let txn = match db.begin_write() {
        Ok(txn) => txn,
        Err(error) => {
            for (_, answer) in batch {
                let _ = answer.send(Err(OpError::Store(error.to_string())));
            }
            return;
        }
    };
    let mut results = Vec::with_capacity(batch.len());
    let mut failure = None;
    for (op, answer) in batch {
        if failure.is_some() {
            results.push((answer, None));
            continue;
        }
        match op(&txn) {
            Err(OpError::Store(message)) => {
                failure = Some(message);
                results.push((answer, None));
            }
            result => results.push((answer, Some(result))),
        }
    }
    let outcome = match failure {
        Some(message) => {
            let _ = txn.abort();
            Err(message)
        }
        None => txn.commit().map_err(|error| error.to_string()),
    };
    for (answer, result) in results {
        let reply = match (&outcome, result) {
            (Ok(()), Some(result)) => result,
            (Ok(()), None) => Err(OpError::Store("batch abandoned".into())),
            (Err(message), _) => Err(OpError::Store(format!("metadata commit failed: {message}"))),
        };
        let _ = answer.send(reply);
    }
}
