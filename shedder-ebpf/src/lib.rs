//! Empty host-side library so `shedder-user` can name this crate as a build dependency
//! (aya-build rebuilds the eBPF object when it changes). The programs live in `main.rs`.
#![no_std]
