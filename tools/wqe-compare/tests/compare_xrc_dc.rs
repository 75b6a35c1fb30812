//! XRC and DC WQEs, libmlx5 against the `mlx5` crate (`mlx5_wqe_compare::xrc_dc`): the XRC
//! initiator through `ibv_post_send` and through `ibv_wr_*`, the DCI through `ibv_wr_*` with
//! `mlx5dv_wr_set_dc_addr`. Every WQE of the corpus must match field by field, each side's
//! object numbers and keys mapped, and only the don't-care bytes of `compare.rs` may differ.

use mlx5_wqe_compare::xrc_dc::{self, Corpus, Q, Report};

fn check(wr_api: bool) {
    let dir = std::env::temp_dir().join(format!(
        "mlx5-wqe-compare-xrc-dc-{}-{wr_api}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let exe = xrc_dc::build(&dir).expect("build the harness");
    let corpus = Corpus::standard();
    let file = dir.join("corpus.txt");
    std::fs::write(&file, corpus.text()).expect("corpus file");
    let theirs =
        xrc_dc::run_theirs(&exe, &file, &dir.join("theirs.log"), wr_api).expect("libmlx5 side");
    let ours = xrc_dc::run_ours(&corpus).expect("mlx5 crate side");
    let mut r = Report::default();
    xrc_dc::compare(&corpus, Q::Xrc, &theirs, &ours, wr_api, &mut r);
    xrc_dc::compare(&corpus, Q::Dc, &theirs, &ours, true, &mut r);
    eprintln!(
        "{} WQEs compared (XRC {}, DC {}); don't-care bytes that differed: {:?}",
        r.wqes,
        ours.xrc.len(),
        ours.dc.len(),
        r.dont_care
    );
    assert!(r.diffs.is_empty(), "{}", r.diffs.join("\n"));
    let n = |q| corpus.posts.iter().flatten().filter(|w| w.q == q).count();
    assert_eq!(r.wqes, n(Q::Xrc) + n(Q::Dc), "every WR's WQE compared");
    // The rings wrapped: WQE indices went past the ring size.
    assert!(
        ours.xrc.iter().any(|w| w.wqe_index >= 64),
        "the XRC ring did not wrap"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn xrc_and_dc_wqes_match_libmlx5_through_ibv_post_send() {
    check(false);
}

#[test]
fn xrc_and_dc_wqes_match_libmlx5_through_ibv_wr() {
    check(true);
}
