//! Where the kernel puts the one socket field the eBPF object reads at a fixed offset.
//!
//! The seeding iterator reads `skc_state` from `struct sock_common` at
//! [`shedder_common::SKC_STATE_OFFSET`] (the Rust eBPF toolchain has no CO-RE field
//! relocations). The offset has been the same for as long as the iterator exists, but a
//! kernel built otherwise would make the iterator misread every connection, so the daemon
//! checks it in the kernel's own BTF (`/sys/kernel/btf/vmlinux`) before loading the
//! iterator, and `doctor` reports it. aya parses BTF but does not expose struct members,
//! hence this small reader of the format (the kernel's Documentation/bpf/btf.rst): the
//! header, the type section walked record by record, the string section.

/// The kernel's BTF, as the kernel publishes it.
pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

const MAGIC: u16 = 0xeb9f;
const HEADER_LEN: usize = 24;
/// Size of `struct btf_type`: name_off, info, size/type.
const TYPE_LEN: usize = 12;

const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_ENUM64: u32 = 19;
const KIND_MAX: u32 = 19;

/// One type record: where it starts in the type section, its kind, member count and flag.
#[derive(Clone, Copy)]
struct Record {
    at: usize,
    kind: u32,
    vlen: usize,
    kind_flag: bool,
}

/// The type and string sections of a BTF blob, each type record located.
struct Types<'a> {
    types: &'a [u8],
    strings: &'a [u8],
    /// Type ids start at 1: `records[id - 1]`.
    records: Vec<Record>,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Bytes of kind-specific data after a record's `struct btf_type`.
fn extra_len(kind: u32, vlen: usize) -> usize {
    match kind {
        KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
        KIND_ARRAY => 12,
        KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
        KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
        _ => 0,
    }
}

impl<'a> Types<'a> {
    fn parse(data: &'a [u8]) -> Result<Self, String> {
        let magic = data.get(0..2).map(|m| u16::from_le_bytes([m[0], m[1]]));
        if magic != Some(MAGIC) {
            return Err("not little-endian BTF (bad magic)".into());
        }
        let field = |i: usize| u32_at(data, 4 + 4 * i).map(|v| v as usize);
        let (Some(hdr_len), Some(type_off), Some(type_len), Some(str_off), Some(str_len)) =
            (field(0), field(1), field(2), field(3), field(4))
        else {
            return Err("truncated header".into());
        };
        if hdr_len < HEADER_LEN {
            return Err(format!("header of {hdr_len} bytes"));
        }
        let section = |off: usize, len: usize, what: &str| {
            hdr_len
                .checked_add(off)
                .and_then(|s| Some(s..s.checked_add(len)?))
                .and_then(|r| data.get(r))
                .ok_or_else(|| format!("the {what} section runs past the end"))
        };
        let types = section(type_off, type_len, "type")?;
        let strings = section(str_off, str_len, "string")?;
        let mut records = Vec::new();
        let mut at = 0;
        while at < types.len() {
            let info = u32_at(types, at + 4).ok_or("a truncated type record")?;
            let kind = (info >> 24) & 0x1f;
            if kind == 0 || kind > KIND_MAX {
                return Err(format!("unknown type kind {kind}"));
            }
            let vlen = (info & 0xffff) as usize;
            records.push(Record {
                at,
                kind,
                vlen,
                kind_flag: info >> 31 == 1,
            });
            at += TYPE_LEN + extra_len(kind, vlen);
        }
        if at != types.len() {
            return Err("a truncated type record".into());
        }
        Ok(Self {
            types,
            strings,
            records,
        })
    }

    fn name(&self, off: u32) -> &'a [u8] {
        let rest = self.strings.get(off as usize..).unwrap_or_default();
        rest.split(|&b| b == 0).next().unwrap_or_default()
    }

    fn record(&self, id: u32) -> Option<Record> {
        self.records.get((id as usize).checked_sub(1)?).copied()
    }

    /// Byte offset of `member` in the struct or union `rec`, looking into its anonymous
    /// struct and union members too.
    fn member_offset(&self, rec: Record, member: &str, depth: usize) -> Option<u32> {
        if depth > 8 || !matches!(rec.kind, KIND_STRUCT | KIND_UNION) {
            return None;
        }
        (0..rec.vlen).find_map(|i| {
            let m = rec.at + TYPE_LEN + 12 * i;
            let (name, ty, offset) = (
                u32_at(self.types, m)?,
                u32_at(self.types, m + 4)?,
                u32_at(self.types, m + 8)?,
            );
            // With kind_flag, the top byte is a bitfield's size and the rest its offset.
            let bits = if rec.kind_flag {
                offset & 0x00ff_ffff
            } else {
                offset
            };
            if name == 0 {
                let inner = self.member_offset(self.record(ty)?, member, depth + 1)?;
                return Some(bits / 8 + inner);
            }
            (self.name(name) == member.as_bytes() && bits % 8 == 0).then_some(bits / 8)
        })
    }
}

/// Byte offset of `member` in `struct strukt` as the BTF blob `data` describes it.
pub fn member_offset(data: &[u8], strukt: &str, member: &str) -> Result<u32, String> {
    let types = Types::parse(data).map_err(|e| format!("reading BTF: {e}"))?;
    let found = types.records.iter().find(|r| {
        r.kind == KIND_STRUCT
            && u32_at(types.types, r.at).is_some_and(|n| types.name(n) == strukt.as_bytes())
    });
    let rec = found.ok_or_else(|| format!("BTF has no struct {strukt}"))?;
    types
        .member_offset(*rec, member, 0)
        .ok_or_else(|| format!("struct {strukt} has no byte-aligned member {member} in BTF"))
}

/// Whether `struct sock_common` of the kernel described by `data` has `skc_state` where the
/// seeding iterator reads it; `Err` says what differs.
pub fn check_sock_layout(data: &[u8]) -> Result<(), String> {
    let want = shedder_common::SKC_STATE_OFFSET as u32;
    match member_offset(data, "sock_common", "skc_state")? {
        got if got == want => Ok(()),
        got => Err(format!(
            "this kernel's struct sock_common has skc_state at byte {got}, where the \
             seeding iterator reads byte {want}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob built record by record, as the kernel lays it out.
    #[derive(Default)]
    struct Blob {
        types: Vec<u8>,
        strings: Vec<u8>,
    }

    impl Blob {
        fn new() -> Self {
            Self {
                types: Vec::new(),
                strings: vec![0],
            }
        }

        fn string(&mut self, s: &str) -> u32 {
            if s.is_empty() {
                return 0;
            }
            let off = self.strings.len() as u32;
            self.strings.extend_from_slice(s.as_bytes());
            self.strings.push(0);
            off
        }

        fn push(&mut self, words: &[u32]) {
            for w in words {
                self.types.extend_from_slice(&w.to_le_bytes());
            }
        }

        /// An integer type of `size` bytes (type ids follow the order of the calls).
        fn int(&mut self, name: &str, size: u32) {
            let n = self.string(name);
            self.push(&[n, KIND_INT << 24, size, size * 8]);
        }

        /// A struct or union whose members are (name, type id, bit offset).
        fn aggregate(&mut self, kind: u32, name: &str, size: u32, members: &[(&str, u32, u32)]) {
            let n = self.string(name);
            self.push(&[n, kind << 24 | members.len() as u32, size]);
            for (m, ty, off) in members {
                let mn = self.string(m);
                self.push(&[mn, *ty, *off]);
            }
        }

        fn bytes(&self) -> Vec<u8> {
            let mut out = Vec::new();
            out.extend_from_slice(&MAGIC.to_le_bytes());
            out.extend_from_slice(&[1, 0]);
            for w in [
                HEADER_LEN as u32,
                0,
                self.types.len() as u32,
                self.types.len() as u32,
                self.strings.len() as u32,
            ] {
                out.extend_from_slice(&w.to_le_bytes());
            }
            out.extend_from_slice(&self.types);
            out.extend_from_slice(&self.strings);
            out
        }
    }

    /// `struct sock_common` as Linux lays out its first fields: three unions (the address
    /// pair, the hash, the port pair; the first two with anonymous members), the family,
    /// then the state.
    fn kernel_like(state_bits: u32) -> Vec<u8> {
        let mut b = Blob::new();
        b.int("unsigned char", 1); // 1
        b.int("unsigned int", 4); // 2
        b.aggregate(
            KIND_STRUCT,
            "",
            8,
            &[("skc_daddr", 2, 0), ("skc_rcv_saddr", 2, 32)],
        ); // 3
        b.aggregate(KIND_UNION, "", 8, &[("skc_addrpair", 2, 0), ("", 3, 0)]); // 4
        b.aggregate(KIND_UNION, "", 4, &[("skc_hash", 2, 0)]); // 5
        b.aggregate(
            KIND_STRUCT,
            "sock_common",
            136,
            &[
                ("", 4, 0),
                ("", 5, 64),
                ("skc_portpair", 2, 96),
                ("skc_family", 2, 128),
                ("skc_state", 1, state_bits),
            ],
        );
        b.bytes()
    }

    #[test]
    fn finds_the_state_where_linux_puts_it() {
        let blob = kernel_like(144);
        assert_eq!(member_offset(&blob, "sock_common", "skc_state"), Ok(18));
        assert_eq!(check_sock_layout(&blob), Ok(()));
        // Members of anonymous unions and structs are found at their whole offset.
        assert_eq!(member_offset(&blob, "sock_common", "skc_rcv_saddr"), Ok(4));
        assert_eq!(member_offset(&blob, "sock_common", "skc_hash"), Ok(8));
    }

    #[test]
    fn a_moved_state_is_reported() {
        let err = check_sock_layout(&kernel_like(160)).unwrap_err();
        assert!(err.contains("byte 20") && err.contains("byte 18"), "{err}");
    }

    #[test]
    fn a_missing_struct_or_member_is_an_error() {
        let blob = kernel_like(144);
        assert!(
            member_offset(&blob, "sock", "skc_state")
                .unwrap_err()
                .contains("no struct sock")
        );
        assert!(
            member_offset(&blob, "sock_common", "skc_bound_dev_if")
                .unwrap_err()
                .contains("no byte-aligned member")
        );
    }

    #[test]
    fn broken_blobs_are_errors_not_panics() {
        let blob = kernel_like(144);
        assert!(member_offset(&[], "sock_common", "skc_state").is_err());
        assert!(member_offset(&blob[..10], "sock_common", "skc_state").is_err());
        // Cut inside the type section: the header's lengths run past the end.
        assert!(member_offset(&blob[..40], "sock_common", "skc_state").is_err());
        let mut bad_magic = blob.clone();
        bad_magic[0] = 0;
        assert!(member_offset(&bad_magic, "sock_common", "skc_state").is_err());
        // An unknown kind cannot be stepped over.
        let mut unknown = blob.clone();
        unknown[HEADER_LEN + 7] = 31;
        assert!(member_offset(&unknown, "sock_common", "skc_state").is_err());
        // Every prefix fails cleanly.
        for n in 0..blob.len() {
            assert!(
                member_offset(&blob[..n], "sock_common", "skc_state").is_err(),
                "{n}"
            );
        }
    }
}
