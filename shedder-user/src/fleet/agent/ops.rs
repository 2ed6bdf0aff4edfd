//! What the agent asks of etcd, as data: the protocol returns these and the driver performs
//! them, so that what the protocol writes is tested without an etcd.

/// A key as read from etcd: its value and the lease it lives on (0: none).
#[derive(Clone, Copy, Debug)]
pub(super) struct Kv<'a> {
    pub(super) key: &'a [u8],
    pub(super) value: &'a [u8],
    pub(super) lease: i64,
}

/// A request on one key, alone or in a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Op {
    /// `lease`: the lease the key lives on (`None`: none, the key outlives its writer).
    Put {
        key: String,
        value: Vec<u8>,
        lease: Option<i64>,
    },
    Delete {
        key: String,
    },
    /// Read the key (in a transaction: to learn who holds it).
    Get {
        key: String,
    },
}

/// A condition of a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Compare {
    /// The key does not exist (its create revision is 0).
    Absent(String),
    /// No key under `prefix` changed after `revision` (every mod revision below
    /// `revision + 1`).
    Unchanged { prefix: String, revision: i64 },
}

/// A transaction: `then` if every condition holds, else `otherwise`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Txn {
    pub(super) when: Vec<Compare>,
    pub(super) then: Vec<Op>,
    pub(super) otherwise: Vec<Op>,
}

/// What etcd answered a transaction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct TxnAnswer {
    pub(super) succeeded: bool,
    /// The lease of the first key a read in the branch taken found.
    pub(super) holder: Option<i64>,
}

/// A change the watch reports under the fleet's prefix.
#[derive(Clone, Copy, Debug)]
pub(super) enum Event<'a> {
    Put(Kv<'a>),
    /// The key deleted.
    Delete(&'a [u8]),
}

/// What a watched change asks of the driver.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Watched {
    /// A step at once rather than at the next tick: the change may leave room to raise
    /// into, and every step saved counts against the lease TTL the others' shares must
    /// rise within.
    pub(super) step: bool,
    /// A departed member's reservation to write.
    pub(super) reserve: Option<Txn>,
}
