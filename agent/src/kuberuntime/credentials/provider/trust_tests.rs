//! Each refusal of `trust.rs` on real files: links, modes, owners, kinds, ancestors.

use std::os::unix::fs::PermissionsExt as _;

use super::*;

/// A tree under a fresh directory (checked from it down): `etc/providers.yaml`, `bin/plugin`.
struct Tree {
    dir: tempfile::TempDir,
}

impl Tree {
    fn new() -> Tree {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("etc")).expect("etc");
        std::fs::create_dir(dir.path().join("bin")).expect("bin");
        let tree = Tree { dir };
        std::fs::write(tree.config(), "providers: []\n").expect("config");
        std::fs::write(tree.plugin(), "#!/bin/sh\ntouch \"$0.ran\"\n").expect("plugin");
        for (path, mode) in [
            (tree.dir.path().join("etc"), 0o755),
            (tree.bin(), 0o755),
            (tree.config(), 0o644),
            (tree.plugin(), 0o755),
        ] {
            chmod(&path, mode);
        }
        tree
    }

    fn trust(&self) -> Trust {
        Trust::beneath(self.dir.path())
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("etc/providers.yaml")
    }

    fn bin(&self) -> PathBuf {
        self.dir.path().join("bin")
    }

    fn plugin(&self) -> PathBuf {
        self.bin().join("plugin")
    }

    /// The error of opening `path` as `what`, as text, after checking its variant.
    fn refused(&self, path: &Path, what: What, is: fn(&TrustError) -> bool) -> String {
        let error = self
            .trust()
            .open(path, what)
            .err()
            .unwrap_or_else(|| panic!("{} was trusted", path.display()));
        assert!(is(&error), "{error:?}");
        error.to_string()
    }
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

#[test]
fn a_tree_owned_and_writable_by_its_owner_only_is_trusted() {
    let tree = Tree::new();
    let trust = tree.trust();
    trust.open(&tree.config(), What::Config).expect("config");
    trust
        .open(&tree.dir.path().join("etc"), What::Config)
        .expect("config dir");
    trust.open(&tree.bin(), What::BinDir).expect("bin dir");
    let plugin = trust.open(&tree.plugin(), What::Plugin).expect("plugin");
    // The descriptor is of the file checked: read through it, it is the plugin.
    let text = std::fs::read_to_string(fd_path(&plugin)).expect("read through the fd");
    assert!(text.starts_with("#!/bin/sh"), "{text}");
}

#[test]
fn a_group_or_world_writable_file_is_refused_naming_path_owner_and_mode() {
    let tree = Tree::new();
    chmod(&tree.config(), 0o664);
    let text = tree.refused(&tree.config(), What::Config, |e| {
        matches!(e, TrustError::Writable { mode: 0o664, .. })
    });
    let uid = nix::unistd::geteuid().as_raw();
    assert_eq!(
        text,
        format!(
            "credential provider config {}: mode 0664 (owner uid {uid}) is writable by its \
             group; expected writable by its owner only",
            tree.config().display()
        )
    );
    chmod(&tree.plugin(), 0o757);
    let text = tree.refused(&tree.plugin(), What::Plugin, |e| {
        matches!(e, TrustError::Writable { .. })
    });
    assert!(text.contains("writable by others"), "{text}");
}

#[test]
fn a_writable_ancestor_directory_is_refused_even_if_sticky() {
    let tree = Tree::new();
    chmod(&tree.bin(), 0o1777);
    let text = tree.refused(&tree.plugin(), What::Plugin, |e| {
        matches!(e, TrustError::Writable { mode: 0o1777, .. })
    });
    assert!(
        text.starts_with(&format!("directory {}: mode 1777", tree.bin().display())),
        "{text}"
    );
    chmod(&tree.bin(), 0o775);
    tree.refused(&tree.bin(), What::BinDir, |e| {
        matches!(e, TrustError::Writable { .. })
    });
}

/// The agent's own trust checks every directory up to `/`: a path under a sticky,
/// world-writable `/tmp` is refused at `/tmp`.
#[test]
fn the_system_trust_refuses_a_path_under_tmp() {
    let tmp = Path::new("/tmp");
    let mode = std::fs::metadata(tmp).expect("/tmp").permissions().mode();
    if mode & 0o002 == 0 {
        eprintln!("skipped: /tmp is not world-writable here");
        return;
    }
    let dir = tempfile::tempdir_in(tmp).expect("tempdir");
    let error = Trust::system()
        .open(dir.path(), What::BinDir)
        .expect_err("under /tmp");
    assert!(
        matches!(error, TrustError::Writable { ref path, .. } if path == tmp),
        "{error:?}"
    );
}

#[test]
fn a_symbolic_link_anywhere_on_the_path_is_refused() {
    let tree = Tree::new();
    // The plugin a link to a shell.
    std::fs::remove_file(tree.plugin()).expect("remove");
    std::os::unix::fs::symlink("/bin/sh", tree.plugin()).expect("link");
    let text = tree.refused(&tree.plugin(), What::Plugin, |e| {
        matches!(e, TrustError::Symlink { .. })
    });
    assert!(
        text.starts_with(&format!(
            "credential provider plugin {}: a symbolic link",
            tree.plugin().display()
        )),
        "{text}"
    );
    // A directory above a link: the config through a linked directory.
    let linked = tree.dir.path().join("linked");
    std::os::unix::fs::symlink(tree.dir.path().join("etc"), &linked).expect("link");
    let text = tree.refused(&linked.join("providers.yaml"), What::Config, |e| {
        matches!(e, TrustError::Symlink { .. })
    });
    assert!(
        text.starts_with(&format!("directory {}: a symbolic link", linked.display())),
        "{text}"
    );
    // Even above the checked directory, a link is not followed.
    let outside = tempfile::tempdir().expect("tempdir");
    let link = outside.path().join("tree");
    std::os::unix::fs::symlink(tree.dir.path(), &link).expect("link");
    let error = Trust::beneath(&link.join("bin"))
        .open(&link.join("bin"), What::BinDir)
        .expect_err("through a link");
    assert!(matches!(error, TrustError::Symlink { .. }), "{error:?}");
}

#[test]
fn a_file_of_the_wrong_kind_or_without_an_execute_bit_is_refused() {
    let tree = Tree::new();
    chmod(&tree.plugin(), 0o644);
    let text = tree.refused(&tree.plugin(), What::Plugin, |e| {
        matches!(e, TrustError::Kind { .. })
    });
    assert!(
        text.ends_with(
            "a file without an execute bit (mode 0644); expected a regular file with an execute bit"
        ),
        "{text}"
    );
    tree.refused(&tree.bin(), What::Plugin, |e| {
        matches!(
            e,
            TrustError::Kind {
                kind: "directory",
                ..
            }
        )
    });
    tree.refused(&tree.config(), What::BinDir, |e| {
        matches!(e, TrustError::Kind { .. })
    });
    tree.refused(&tree.dir.path().join("etc"), What::ConfigFile, |e| {
        matches!(e, TrustError::Kind { .. })
    });
    let fifo = tree.dir.path().join("etc/fifo.yaml");
    nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o600)).expect("mkfifo");
    tree.refused(&fifo, What::Config, |e| {
        matches!(e, TrustError::Kind { kind: "FIFO", .. })
    });
}

#[test]
fn a_missing_path_or_one_with_dot_dot_is_refused() {
    let tree = Tree::new();
    tree.refused(&tree.bin().join("nope"), What::Plugin, |e| {
        matches!(
            e,
            TrustError::NotFound {
                what: "credential provider plugin",
                ..
            }
        )
    });
    tree.refused(&tree.dir.path().join("nope/plugin"), What::Plugin, |e| {
        matches!(
            e,
            TrustError::NotFound {
                what: "directory",
                ..
            }
        )
    });
    tree.refused(&tree.bin().join("../bin/plugin"), What::Plugin, |e| {
        matches!(e, TrustError::ParentComponent { .. })
    });
}

/// Files owned by another user — the bin dir, the plugin, an ancestor — are refused (root
/// owns the tree, so that `chown` can give them away).
#[test]
fn a_file_or_directory_owned_by_another_user_is_refused() {
    if !crate::testing::privileged(
        "a_file_or_directory_owned_by_another_user_is_refused",
        "chown files to another user",
    ) {
        return;
    }
    let nobody = Some(nix::unistd::Uid::from_raw(65534));
    let tree = Tree::new();
    nix::unistd::chown(&tree.bin(), nobody, None).expect("chown");
    let text = tree.refused(&tree.bin(), What::BinDir, |e| {
        matches!(e, TrustError::Owner { uid: 65534, .. })
    });
    assert_eq!(
        text,
        format!(
            "credential provider bin dir {}: owned by uid 65534 (mode 0755); expected owned by root",
            tree.bin().display()
        )
    );
    // Above the plugin, the same directory refuses the plugin.
    let text = tree.refused(&tree.plugin(), What::Plugin, |e| {
        matches!(e, TrustError::Owner { uid: 65534, .. })
    });
    assert!(
        text.starts_with(&format!(
            "directory {}: owned by uid 65534",
            tree.bin().display()
        )),
        "{text}"
    );
    nix::unistd::chown(&tree.bin(), Some(nix::unistd::Uid::from_raw(0)), None).expect("chown");
    nix::unistd::chown(&tree.plugin(), nobody, None).expect("chown");
    tree.refused(&tree.plugin(), What::Plugin, |e| {
        matches!(e, TrustError::Owner { uid: 65534, .. })
    });
    // A file in the config directory owned by another user.
    let etc = tree.dir.path().join("etc");
    nix::unistd::chown(&tree.config(), nobody, None).expect("chown");
    let dir = tree.trust().open(&etc, What::Config).expect("the dir");
    let error = tree
        .trust()
        .open_in(&dir, &tree.config(), What::ConfigFile)
        .expect_err("another's file");
    assert!(matches!(error, TrustError::Owner { .. }), "{error:?}");
}
