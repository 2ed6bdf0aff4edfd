fn main() -> anyhow::Result<()> {
    let mut s = shedder::ebpf::Shedder::load()?;
    let _ = s.xdp()?;
    println!("loaded");
    Ok(())
}
