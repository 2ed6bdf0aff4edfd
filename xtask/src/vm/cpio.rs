//! A `newc` cpio writer, the format the kernel unpacks an initramfs from. Written here
//! rather than by `cpio` so that every entry is owned by root without the files being so,
//! and without another host program.

use std::{
    collections::BTreeSet,
    io::{self, Write},
};

const MAGIC: &str = "070701";
const DIR: u32 = 0o040000;
const FILE: u32 = 0o100000;
const SYMLINK: u32 = 0o120000;
const CHAR_DEV: u32 = 0o020000;
const TRAILER: &str = "TRAILER!!!";

/// A `newc` cpio archive being written: every entry owned by root with mtime 0, the
/// directories above each path made on the way, each once. Paths are absolute or relative
/// to the archive's root alike.
pub struct Cpio<W: Write> {
    out: W,
    written: u64,
    ino: u32,
    dirs: BTreeSet<String>,
}

impl<W: Write> Cpio<W> {
    pub fn new(out: W) -> Self {
        Self {
            out,
            written: 0,
            ino: 0,
            dirs: BTreeSet::new(),
        }
    }

    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// newc aligns each header and each body to 4 bytes.
    fn pad(&mut self) -> io::Result<()> {
        let n = (4 - self.written % 4) % 4;
        self.put(&[0; 3][..n as usize])
    }

    /// One record; `name` is relative (no leading `/`).
    fn record(&mut self, name: &str, mode: u32, rdev: (u32, u32), body: &[u8]) -> io::Result<()> {
        self.ino += 1;
        let nlink = if mode & 0o170000 == DIR { 2 } else { 1 };
        let fields = [
            self.ino,
            mode,
            0, // uid
            0, // gid
            nlink,
            0, // mtime
            body.len() as u32,
            0, // devmajor
            0, // devminor
            rdev.0,
            rdev.1,
            name.len() as u32 + 1,
            0, // check
        ];
        let mut header = String::from(MAGIC);
        for f in fields {
            header.push_str(&format!("{f:08X}"));
        }
        self.put(header.as_bytes())?;
        self.put(name.as_bytes())?;
        self.put(&[0])?;
        self.pad()?;
        self.put(body)?;
        self.pad()
    }

    /// `path` without its leading `/`, after the directories above it.
    fn start(&mut self, path: &str) -> io::Result<String> {
        let mut prefix = String::new();
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        for part in &parts[..parts.len().saturating_sub(1)] {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
            if self.dirs.insert(prefix.clone()) {
                let name = prefix.clone();
                self.record(&name, DIR | 0o755, (0, 0), &[])?;
            }
        }
        Ok(path.trim_start_matches('/').to_owned())
    }

    /// A directory, unless it is there already.
    pub fn dir(&mut self, path: &str) -> io::Result<()> {
        let name = self.start(path)?;
        if self.dirs.insert(name.clone()) {
            self.record(&name, DIR | 0o755, (0, 0), &[])?;
        }
        Ok(())
    }

    /// A regular file with permission bits `perm`.
    pub fn file(&mut self, path: &str, perm: u32, bytes: &[u8]) -> io::Result<()> {
        let name = self.start(path)?;
        self.record(&name, FILE | perm, (0, 0), bytes)
    }

    pub fn symlink(&mut self, path: &str, target: &str) -> io::Result<()> {
        let name = self.start(path)?;
        self.record(&name, SYMLINK | 0o777, (0, 0), target.as_bytes())
    }

    pub fn char_dev(&mut self, path: &str, major: u32, minor: u32) -> io::Result<()> {
        let name = self.start(path)?;
        self.record(&name, CHAR_DEV | 0o600, (major, minor), &[])
    }

    /// The trailer record, then the writer back.
    pub fn finish(mut self) -> io::Result<W> {
        self.record(TRAILER, 0, (0, 0), &[])?;
        self.out.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One record read back: name, the 13 header fields after the magic, body.
    struct Record {
        name: String,
        fields: [u32; 13],
        body: Vec<u8>,
    }

    const INO: usize = 0;
    const MODE: usize = 1;
    const UID: usize = 2;
    const GID: usize = 3;
    const NLINK: usize = 4;
    const MTIME: usize = 5;
    const FILESIZE: usize = 6;
    const RDEVMAJOR: usize = 9;
    const RDEVMINOR: usize = 10;
    const NAMESIZE: usize = 11;

    /// Parse a whole archive strictly: every header at a 4-byte boundary, names
    /// NUL-terminated, only NUL padding, nothing after the trailer.
    fn parse(archive: &[u8]) -> Vec<Record> {
        let mut at = 0;
        let mut out = Vec::new();
        let skip_padding = |at: &mut usize| {
            while !at.is_multiple_of(4) {
                assert_eq!(archive[*at], 0, "padding at {at} is not NUL");
                *at += 1;
            }
        };
        loop {
            assert_eq!(at % 4, 0, "header at {at} is not aligned");
            assert_eq!(&archive[at..at + 6], MAGIC.as_bytes(), "magic at {at}");
            let mut fields = [0; 13];
            for (i, f) in fields.iter_mut().enumerate() {
                let hex = std::str::from_utf8(&archive[at + 6 + 8 * i..at + 14 + 8 * i]).unwrap();
                assert!(
                    hex.chars()
                        .all(|c| c.is_ascii_digit() || c.is_ascii_uppercase())
                );
                *f = u32::from_str_radix(hex, 16).unwrap();
            }
            at += 110;
            let namesize = fields[NAMESIZE] as usize;
            let name = &archive[at..at + namesize];
            assert_eq!(name.last(), Some(&0), "name not NUL-terminated");
            let name = String::from_utf8(name[..namesize - 1].to_vec()).unwrap();
            at += namesize;
            skip_padding(&mut at);
            let size = fields[FILESIZE] as usize;
            let body = archive[at..at + size].to_vec();
            at += size;
            skip_padding(&mut at);
            let last = name == TRAILER;
            out.push(Record { name, fields, body });
            if last {
                assert_eq!(at, archive.len(), "bytes after the trailer");
                return out;
            }
        }
    }

    #[test]
    fn records_are_aligned_with_parents_first_and_end_in_a_trailer() {
        let mut cpio = Cpio::new(Vec::new());
        cpio.file("/a/b/c", 0o644, b"hello").unwrap();
        cpio.dir("/a/b").unwrap();
        cpio.dir("/a/d").unwrap();
        cpio.symlink("/var/run", "../run").unwrap();
        cpio.char_dev("/dev/console", 5, 1).unwrap();
        cpio.file("init", 0o755, b"#!/bin/sh\n").unwrap();
        let out = cpio.finish().unwrap();
        let records = parse(&out);
        let names: Vec<&str> = records.iter().map(|r| r.name.as_str()).collect();
        // `a/b` once (as the parent of `a/b/c`), no leading slashes.
        assert_eq!(
            names,
            [
                "a",
                "a/b",
                "a/b/c",
                "a/d",
                "var",
                "var/run",
                "dev",
                "dev/console",
                "init",
                TRAILER
            ]
        );
        for (i, r) in records.iter().enumerate() {
            assert_eq!(r.fields[INO], i as u32 + 1, "{}: inode", r.name);
            assert_eq!(
                (r.fields[UID], r.fields[GID], r.fields[MTIME]),
                (0, 0, 0),
                "{}",
                r.name
            );
            assert_eq!(r.fields[NAMESIZE] as usize, r.name.len() + 1);
            assert_eq!(r.fields[FILESIZE] as usize, r.body.len());
        }
        let by_name = |n: &str| records.iter().find(|r| r.name == n).unwrap();
        let a = by_name("a");
        assert_eq!((a.fields[MODE], a.fields[NLINK]), (0o040755, 2));
        let c = by_name("a/b/c");
        assert_eq!((c.fields[MODE], c.fields[NLINK]), (0o100644, 1));
        assert_eq!(c.body, b"hello");
        assert_eq!(by_name("init").fields[MODE], 0o100755);
        let link = by_name("var/run");
        assert_eq!(link.fields[MODE], 0o120777);
        assert_eq!(link.body, b"../run");
        let console = by_name("dev/console");
        assert_eq!(console.fields[MODE], 0o020600);
        assert_eq!(
            (console.fields[RDEVMAJOR], console.fields[RDEVMINOR]),
            (5, 1)
        );
        let trailer = by_name(TRAILER);
        assert_eq!((trailer.fields[MODE], trailer.fields[NLINK]), (0, 1));
    }

    #[test]
    fn header_bytes_of_one_file() {
        let mut cpio = Cpio::new(Vec::new());
        cpio.file("x", 0o644, b"abcde").unwrap();
        let out = cpio.finish().unwrap();
        let expect = format!(
            "070701{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}",
            1, 0o100644, 0, 0, 1, 0, 5, 0, 0, 0, 0, 2, 0
        );
        assert_eq!(&out[..110], expect.as_bytes());
        // 110 + "x\0" = 112, aligned; the body 5 bytes and 3 of padding.
        assert_eq!(&out[110..120], b"x\0abcde\0\0\0");
        // The trailer: 110 + 11 bytes of name, 3 of padding, no body.
        assert_eq!(out.len(), 120 + 124);
        assert!(out.ends_with(b"TRAILER!!!\0\0\0\0"));
    }
}
