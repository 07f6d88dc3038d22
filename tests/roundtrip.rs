//! Printing is a fixed point: for every example and every lit input chunk that parses,
//! print(parse(print(parse(text)))) == print(parse(text)), and the re-parsed module verifies
//! to the same types.

use efopt::ir::print::{print_module, PrintOptions};
use efopt::parse::parse_module;
use efopt::verify::verify_module;
use std::path::{Path, PathBuf};

fn ef_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            ef_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "ef") {
            out.push(p);
        }
    }
}

#[test]
fn printing_is_a_fixed_point() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    ef_files(&root.join("examples"), &mut files);
    ef_files(&root.join("tests/lit"), &mut files);
    let mut checked = 0;
    let mut examples = 0;
    for f in &files {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        for chunk in text.split("\n// -----\n") {
            let Ok(mut m) = parse_module(chunk, 0) else {
                assert!(
                    !f.starts_with(root.join("examples")),
                    "example {} does not parse",
                    f.display()
                );
                continue;
            };
            let verified = verify_module(&mut m).is_ok();
            if f.starts_with(root.join("examples")) {
                assert!(verified, "example {} does not verify", f.display());
                examples += 1;
            }
            for types in [false, true] {
                let opts = PrintOptions { types };
                let once = print_module(&m, opts);
                let mut again = parse_module(&once, 0).unwrap_or_else(|e| {
                    panic!(
                        "{}: printed form does not parse: {e:?}\n{once}",
                        f.display()
                    )
                });
                if verified {
                    verify_module(&mut again).unwrap_or_else(|e| {
                        panic!(
                            "{}: printed form does not verify: {e:?}\n{once}",
                            f.display()
                        )
                    });
                }
                let twice = print_module(&again, opts);
                assert_eq!(
                    once,
                    twice,
                    "{}: printing is not a fixed point",
                    f.display()
                );
            }
            checked += 1;
        }
    }
    assert!(
        examples >= 5,
        "expected the bundled examples, found {examples}"
    );
    assert!(checked >= examples);
}
