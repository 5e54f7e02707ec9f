//! The modules of the crate form the layers stated in the crate doc (`src/lib.rs`, "Module
//! order"): every `crate::` path in a module's code names a module of a lower layer, so the
//! module dependency graph has no cycle.

use std::fs;
use std::path::Path;

/// Each module and its layer; a module may use only modules of strictly lower layers.
const LAYERS: &[(&str, u32)] = &[
    ("limits", 0),
    ("types", 0),
    ("files", 0),
    ("codec", 1),
    ("log_store", 2),
    ("state_machine", 2),
    ("network", 2),
    ("meta_raft", 3),
    ("group", 4),
];

fn layer(module: &str) -> Option<u32> {
    LAYERS
        .iter()
        .find(|(name, _)| *name == module)
        .map(|(_, layer)| *layer)
}

/// The modules named by `crate::` paths in the code (comments and doc comments skipped).
fn crate_dependencies(source: &str) -> Vec<String> {
    let mut modules = Vec::new();
    for line in source.lines() {
        let code = match line.find("//") {
            Some(comment) => &line[..comment],
            None => line,
        };
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            assert!(
                !name.is_empty(),
                "grouped `crate::{{..}}` paths are not checked; name each module: {line}"
            );
            modules.push(name);
        }
    }
    modules
}

#[test]
fn every_module_uses_only_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut checked = 0;
    for file in fs::read_dir(&src).unwrap() {
        let path = file.unwrap().path();
        let module = path.file_stem().unwrap().to_str().unwrap().to_owned();
        if module == "lib" {
            continue;
        }
        let own = layer(&module).unwrap_or_else(|| {
            panic!("module {module} has no layer in this test and the crate doc")
        });
        for dependency in crate_dependencies(&fs::read_to_string(&path).unwrap()) {
            let other = layer(&dependency).unwrap_or_else(|| {
                panic!("{module} uses crate::{dependency}: name the module, not a re-export")
            });
            assert!(
                other < own,
                "{module} (layer {own}) uses {dependency} (layer {other}): a cycle or a layer violation"
            );
        }
        checked += 1;
    }
    assert_eq!(checked, LAYERS.len());
}
