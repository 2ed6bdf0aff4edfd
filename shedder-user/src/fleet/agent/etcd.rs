//! The protocol's requests ([`ops`](super::ops)) as etcd client calls, and etcd's answers
//! as the protocol reads them: the only place where both meet.

use etcd_client::{
    Client, CompareOp, Error, KeyValue, PutOptions, TxnOp, TxnOpResponse, TxnResponse,
};

use super::ops::{Compare, Kv, Op, Txn, TxnAnswer};

/// Perform one request alone.
pub(super) async fn perform(client: &mut Client, op: Op) -> Result<(), Error> {
    match op {
        Op::Put { key, value, lease } => client.put(key, value, put_options(lease)).await.map(drop),
        Op::Delete { key } => client.delete(key, None).await.map(drop),
        Op::Get { key } => client.get(key, None).await.map(drop),
    }
}

/// The transaction as etcd's client spells it.
pub(super) fn txn(t: Txn) -> etcd_client::Txn {
    etcd_client::Txn::new()
        .when(t.when.into_iter().map(compare).collect::<Vec<_>>())
        .and_then(t.then.into_iter().map(txn_op).collect::<Vec<_>>())
        .or_else(t.otherwise.into_iter().map(txn_op).collect::<Vec<_>>())
}

/// Whether the transaction succeeded, and the lease of the first key a read in it found.
pub(super) fn answer(r: &TxnResponse) -> TxnAnswer {
    TxnAnswer {
        succeeded: r.succeeded(),
        holder: r.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.lease()),
            _ => None,
        }),
    }
}

/// A key as the protocol reads it.
pub(super) fn kv(kv: &KeyValue) -> Kv<'_> {
    Kv {
        key: kv.key(),
        value: kv.value(),
        lease: kv.lease(),
    }
}

fn put_options(lease: Option<i64>) -> Option<PutOptions> {
    lease.map(|l| PutOptions::new().with_lease(l))
}

fn txn_op(op: Op) -> TxnOp {
    match op {
        Op::Put { key, value, lease } => TxnOp::put(key, value, put_options(lease)),
        Op::Delete { key } => TxnOp::delete(key, None),
        Op::Get { key } => TxnOp::get(key, None),
    }
}

fn compare(c: Compare) -> etcd_client::Compare {
    match c {
        Compare::Absent(key) => etcd_client::Compare::create_revision(key, CompareOp::Equal, 0),
        Compare::Unchanged { prefix, revision } => {
            etcd_client::Compare::mod_revision(prefix, CompareOp::Less, revision + 1).with_prefix()
        }
    }
}
