//! Data roots (CWE-22): paths resolve inside the roots; `..`, absolute paths elsewhere and
//! symlinks that lead out are refused.

use xpu_minilang::paths::DataRoots;

#[test]
fn paths_stay_inside_the_roots() {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("data")).unwrap();
    std::fs::write(root.path().join("data/a.csv"), "x\n1\n").unwrap();
    std::fs::write(outside.path().join("secret.csv"), "s\n").unwrap();
    let roots = DataRoots::new([root.path().to_path_buf()]);
    let canon = std::fs::canonicalize(root.path()).unwrap();

    assert_eq!(roots.resolve_read("data/a.csv").unwrap(), canon.join("data/a.csv"));
    assert_eq!(roots.resolve_read("./data/../data/a.csv").unwrap(), canon.join("data/a.csv"));
    let abs = canon.join("data/a.csv");
    assert_eq!(roots.resolve_read(abs.to_str().unwrap()).unwrap(), abs);
    assert!(roots.resolve_read("data/missing.csv").unwrap_err().contains("does not exist"));
    assert!(roots.resolve_read("../secret.csv").unwrap_err().contains("climbs out"));
    assert!(roots.resolve_read("data/../../x").unwrap_err().contains("climbs out"));
    let secret = outside.path().join("secret.csv");
    assert!(
        roots
            .resolve_read(secret.to_str().unwrap())
            .unwrap_err()
            .contains("outside the data roots")
    );
    assert!(roots.resolve_read("").is_err());

    // A symlink inside the root that points out is refused, for reading and for writing.
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(&secret, root.path().join("data/link.csv")).unwrap();
        assert!(roots.resolve_read("data/link.csv").unwrap_err().contains("symlink"));
        assert!(roots.resolve_write("data/link.csv").unwrap_err().contains("symlink"));
        std::os::unix::fs::symlink(outside.path(), root.path().join("out")).unwrap();
        assert!(roots.resolve_write("out/new.npy").unwrap_err().contains("outside the data roots"));
    }
    assert_eq!(roots.resolve_write("data/new.npy").unwrap(), canon.join("data/new.npy"));
    assert!(roots.resolve_write("nodir/new.npy").unwrap_err().contains("does not exist"));
    assert!(roots.resolve_write("../new.npy").unwrap_err().contains("climbs out"));

    // Lowering reports the refusal at the path's span.
    let src = "write_npy([1.0], \"../x.npy\")";
    let (program, diags) = xpu_minilang::analyze(src);
    assert!(diags.is_empty());
    let err = xpu_minilang::lower::lower(&program, "p", Some(&roots)).unwrap_err();
    assert_eq!((err[0].code, err[0].line_col(src)), ("E0301", (1, 18)));
    let err = xpu_minilang::lower::lower(&program, "p", None).unwrap_err();
    assert!(err[0].message.contains("no data roots"));
}
