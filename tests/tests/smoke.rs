use aya::programs::TestRun;
use shedder::ebpf::Shedder;
use shedder_tests::{packet::*, policy::*};

#[test]
fn smoke() {
    shedder_tests::require_root();
    let mut s = Shedder::load().unwrap();
    install_standard(&mut s);
    let syn = Packet::syn_v4(CLIENT_V4, SERVER_V4, PORT_RST);
    let bytes = syn.bytes();
    let mut out = vec![0u8; 256];
    let r = s
        .xdp()
        .unwrap()
        .test_run(aya::programs::TestRunOptions {
            data_in: Some(&bytes),
            data_out: Some(&mut out),
            ..Default::default()
        })
        .unwrap();
    println!("open: {} {}", r.return_value, r.data_size_out);
    s.set_policy(SVC_RST, &closed_policy(shedder_common::ACTION_RST, 0))
        .unwrap();
    let r = s
        .xdp()
        .unwrap()
        .test_run(aya::programs::TestRunOptions {
            data_in: Some(&bytes),
            data_out: Some(&mut out),
            ..Default::default()
        })
        .unwrap();
    println!("closed: {} {}", r.return_value, r.data_size_out);
    let got = &out[..r.data_size_out as usize];
    assert_eq!(got, &syn.expected_rst()[..]);
    verify_checksums(got).unwrap();
    let r = s
        .tc()
        .unwrap()
        .test_run(aya::programs::TestRunOptions {
            data_in: Some(&bytes),
            data_out: Some(&mut out),
            ..Default::default()
        })
        .unwrap();
    println!("tc closed: {} {}", r.return_value, r.data_size_out);
    assert_eq!(&out[..r.data_size_out as usize], &syn.expected_rst()[..]);
}
