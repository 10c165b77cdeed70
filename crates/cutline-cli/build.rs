//! `CUTLINE_SKIP_NETNS=1` at build time marks the network partition test (tests/partition.rs) as
//! ignored, so that a machine without root or iproute2 reports it as ignored, never as passed.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(cutline_skip_netns)");
    println!("cargo::rerun-if-env-changed=CUTLINE_SKIP_NETNS");
    if std::env::var("CUTLINE_SKIP_NETNS").as_deref() == Ok("1") {
        println!("cargo::rustc-cfg=cutline_skip_netns");
    }
}
