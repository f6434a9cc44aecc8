//! End-to-end tests of the static pod source with real inotify in temp dirs, through the merge:
//! what an operator does to the directory, and the updates the sync loop then sees. The safety-net
//! rescan is set to an hour, so every update here is driven by inotify.

use std::{
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use tokio::{sync::mpsc, task::JoinHandle};

use super::*;
use crate::sources::{Op, PodConfig, PodUpdate, Source};

const WAIT: Duration = Duration::from_secs(5);
const QUIET: Duration = Duration::from_millis(300);

fn manifest(name: &str, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: main\n    image: {image}\n"
    )
}

fn manifest_with_uid(name: &str, image: &str, uid: &str) -> String {
    manifest(name, image).replace("metadata:\n", &format!("metadata:\n  uid: {uid}\n"))
}

struct Harness {
    updates: mpsc::Receiver<PodUpdate>,
    problems: watch::Receiver<Vec<SourceProblem>>,
    cancel: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Harness {
    fn start(dir: &Path) -> Harness {
        Self::start_with_rescan(dir, Duration::from_secs(3600))
    }

    fn start_with_rescan(dir: &Path, rescan: Duration) -> Harness {
        let (mut config, updates) = PodConfig::new(Box::new(SystemTime::now));
        let sender = config.channel(Source::File);
        let options = StaticPodOptions::new(dir.to_owned(), "node-1".to_owned(), rescan);
        let source = StaticPodSource::new(options, sender);
        let problems = source.problems();
        let cancel = CancellationToken::new();
        let tasks = vec![
            tokio::spawn(config.run(cancel.clone())),
            tokio::spawn(source.run(cancel.clone())),
        ];
        Harness {
            updates,
            problems,
            cancel,
            tasks,
        }
    }

    /// The next update: its op and the (name, uid) of its pods.
    async fn next(&mut self) -> (Op, Vec<(String, String)>) {
        let update = tokio::time::timeout(WAIT, self.updates.recv())
            .await
            .expect("an update in time")
            .expect("merge running");
        assert_eq!(update.source, Source::File);
        let pods = update
            .pods
            .iter()
            .map(|p| {
                (
                    p.metadata.name.clone().unwrap_or_default(),
                    p.metadata.uid.clone().unwrap_or_default(),
                )
            })
            .collect();
        (update.op, pods)
    }

    /// The next update's op and pod names.
    async fn next_names(&mut self) -> (Op, Vec<String>) {
        let (op, pods) = self.next().await;
        (op, pods.into_iter().map(|(n, _)| n).collect())
    }

    async fn expect_quiet(&mut self) {
        if let Ok(update) = tokio::time::timeout(QUIET, self.updates.recv()).await {
            panic!("unexpected update: {update:?}");
        }
    }

    /// Waits until the problem list satisfies `check`.
    async fn problems_until(
        &mut self,
        check: impl Fn(&[SourceProblem]) -> bool,
    ) -> Vec<SourceProblem> {
        tokio::time::timeout(WAIT, self.problems.wait_for(|p| check(p)))
            .await
            .expect("problems in time")
            .expect("source running")
            .clone()
    }

    async fn stop(self) {
        self.cancel.cancel();
        for task in self.tasks {
            task.await.expect("task ends");
        }
    }
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

fn write(path: &PathBuf, text: &str) {
    std::fs::write(path, text).expect("write manifest");
}

#[tokio::test]
async fn add_modify_remove() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::start(dir.path());
    assert_eq!(
        h.next_names().await,
        (Op::Add, vec![]),
        "source ready, no pods"
    );

    let web = dir.path().join("web.yaml");
    write(&web, &manifest("web", "nginx:1.27"));
    let (op, added) = h.next().await;
    assert_eq!(op, Op::Add);
    assert_eq!(added[0].0, "web-node-1");

    // New content is a new UID (as upstream): the old pod goes, the new one comes.
    write(&web, &manifest("web", "nginx:1.28"));
    let (op, removed) = h.next().await;
    assert_eq!((op, &removed), (Op::Remove, &added));
    let (op, readded) = h.next().await;
    assert_eq!(op, Op::Add);
    assert_ne!(readded[0].1, added[0].1);

    std::fs::remove_file(&web).expect("remove");
    assert_eq!(h.next_names().await, (Op::Remove, names(&["web-node-1"])));
    h.expect_quiet().await;
    h.stop().await;
}

#[tokio::test]
async fn explicit_uid_makes_a_change_an_update() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("db.yml");
    write(&db, &manifest_with_uid("db", "postgres:16", "db-uid"));
    let mut h = Harness::start(dir.path());
    assert_eq!(
        h.next().await,
        (Op::Add, vec![("db-node-1".to_owned(), "db-uid".to_owned())])
    );
    write(&db, &manifest_with_uid("db", "postgres:17", "db-uid"));
    assert_eq!(
        h.next().await,
        (
            Op::Update,
            vec![("db-node-1".to_owned(), "db-uid".to_owned())]
        )
    );
    h.stop().await;
}

#[tokio::test]
async fn a_bad_manifest_is_reported_and_others_keep_flowing() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(&dir.path().join("a.yaml"), &manifest("a", "busybox"));
    let bad = dir.path().join("b.yaml");
    write(
        &bad,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: b}\nspec:\n  containers: [{name: main}]\n",
    );
    let mut h = Harness::start(dir.path());
    assert_eq!(h.next_names().await, (Op::Add, names(&["a-node-1"])));
    let problems = h.problems_until(|p| !p.is_empty()).await;
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].file, bad);
    assert_eq!(
        problems[0].reason,
        "invalid pod: spec.containers[0].image: Required value"
    );

    // Still reported while other files change.
    write(&dir.path().join("c.json"), &manifest("c", "busybox"));
    assert_eq!(h.next_names().await, (Op::Add, names(&["c-node-1"])));
    assert_eq!(h.problems.borrow().len(), 1);

    // Fixed: the pod appears and the problem clears.
    write(&bad, &manifest("b", "busybox"));
    assert_eq!(h.next_names().await, (Op::Add, names(&["b-node-1"])));
    h.problems_until(<[SourceProblem]>::is_empty).await;
    h.stop().await;
}

#[tokio::test]
async fn a_uid_that_would_climb_out_of_the_pods_directory_is_reported_by_file_and_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(&dir.path().join("a.yaml"), &manifest("a", "busybox"));
    let bad = dir.path().join("b.yaml");
    write(&bad, &manifest_with_uid("b", "busybox", "../../../etc"));
    let mut h = Harness::start(dir.path());
    assert_eq!(h.next_names().await, (Op::Add, names(&["a-node-1"])));
    let problems = h.problems_until(|p| !p.is_empty()).await;
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].file, bad);
    assert!(
        problems[0].reason.starts_with(
            "invalid pod: metadata.uid: Invalid value: \"../../../etc\": must consist of"
        ),
        "{}",
        problems[0].reason
    );
    h.stop().await;
}

#[tokio::test]
async fn duplicate_names_keep_the_running_pod() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = dir.path().join("b.yaml");
    write(&b, &manifest("web", "nginx:1"));
    let mut h = Harness::start(dir.path());
    let (op, first) = h.next().await;
    assert_eq!(op, Op::Add);

    // A copy sorting first does not displace the running pod; it is reported.
    let a = dir.path().join("a.yaml");
    write(&a, &manifest("web", "nginx:2"));
    let problems = h.problems_until(|p| !p.is_empty()).await;
    assert_eq!(problems[0].file, a);
    assert_eq!(
        problems[0].reason,
        format!(
            "duplicate pod name \"web-node-1_default\": already defined in {}",
            b.display()
        )
    );
    h.expect_quiet().await;

    // When the owner goes, the copy takes over.
    std::fs::remove_file(&b).expect("remove");
    assert_eq!(h.next().await, (Op::Remove, first));
    assert_eq!(h.next_names().await, (Op::Add, names(&["web-node-1"])));
    h.problems_until(<[SourceProblem]>::is_empty).await;
    h.stop().await;
}

#[tokio::test]
async fn rename_moves_the_pod_and_ignored_names_drop_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = dir.path().join("a.yaml");
    write(&a, &manifest("web", "nginx"));
    let mut h = Harness::start(dir.path());
    let (_, first) = h.next().await;

    // The path is part of the UID, as upstream.
    let b = dir.path().join("b.yaml");
    std::fs::rename(&a, &b).expect("rename");
    assert_eq!(h.next().await, (Op::Remove, first));
    let (op, moved) = h.next().await;
    assert_eq!(op, Op::Add);

    // Renamed to a name the source does not read: gone.
    std::fs::rename(&b, dir.path().join("b.yaml.disabled")).expect("rename");
    assert_eq!(h.next().await, (Op::Remove, moved));
    h.stop().await;
}

#[tokio::test]
async fn atomic_replacement_is_one_change_or_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    let web = dir.path().join("web.yaml");
    write(&web, &manifest("web", "nginx:1"));
    let mut h = Harness::start(dir.path());
    let (_, first) = h.next().await;

    // Write a temp file and rename it over the manifest, as editors and config tools do.
    let tmp = dir.path().join(".web.yaml.tmp");
    write(&tmp, &manifest("web", "nginx:1"));
    std::fs::rename(&tmp, &web).expect("rename");
    h.expect_quiet().await;

    // Vim's way: move the original away, write a new file in its place. Same content: no change.
    std::fs::rename(&web, dir.path().join("web.yaml~")).expect("backup");
    write(&web, &manifest("web", "nginx:1"));
    h.expect_quiet().await;

    // A real change through a replacement.
    write(&tmp, &manifest("web", "nginx:2"));
    std::fs::rename(&tmp, &web).expect("rename");
    assert_eq!(h.next().await, (Op::Remove, first));
    assert_eq!(h.next_names().await, (Op::Add, names(&["web-node-1"])));
    h.stop().await;
}

#[tokio::test]
async fn ignores_dotfiles_and_other_extensions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = Harness::start(dir.path());
    assert_eq!(h.next_names().await, (Op::Add, vec![]));
    for name in [".hidden.yaml", "notes.txt", "web.yaml.swp", "web.yaml~"] {
        write(&dir.path().join(name), &manifest("web", "nginx"));
    }
    std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
    h.expect_quiet().await;
    assert!(h.problems.borrow().is_empty());
    h.stop().await;
}

#[tokio::test]
async fn uid_survives_a_restart_and_follows_content() {
    let dir = tempfile::tempdir().expect("tempdir");
    let web = dir.path().join("web.yaml");
    write(&web, &manifest("web", "nginx:1"));
    let mut first = Harness::start(dir.path());
    let (_, before) = first.next().await;
    first.stop().await;

    let mut second = Harness::start(dir.path());
    let (_, after) = second.next().await;
    assert_eq!(before, after);
    second.stop().await;

    write(&web, &manifest("web", "nginx:2"));
    let mut third = Harness::start(dir.path());
    let (_, changed) = third.next().await;
    assert_ne!(before[0].1, changed[0].1);
    third.stop().await;
}

#[tokio::test]
async fn a_missing_directory_is_empty_until_it_appears() {
    let parent = tempfile::tempdir().expect("tempdir");
    let dir = parent.path().join("manifests");
    let mut h = Harness::start(&dir);
    assert_eq!(
        h.next_names().await,
        (Op::Add, vec![]),
        "ready with no pods"
    );

    std::fs::create_dir(&dir).expect("mkdir");
    write(&dir.join("web.yaml"), &manifest("web", "nginx"));
    assert_eq!(h.next_names().await, (Op::Add, names(&["web-node-1"])));

    // The directory goes: its pods go. It comes back: they come back.
    std::fs::remove_dir_all(&dir).expect("rmdir");
    assert_eq!(h.next_names().await, (Op::Remove, names(&["web-node-1"])));
    std::fs::create_dir(&dir).expect("mkdir");
    write(&dir.join("web.yaml"), &manifest("web", "nginx"));
    assert_eq!(h.next_names().await, (Op::Add, names(&["web-node-1"])));
    h.stop().await;
}

#[tokio::test]
async fn the_rescan_catches_what_inotify_cannot_see() {
    use std::io::{Seek as _, Write as _};

    let dir = tempfile::tempdir().expect("tempdir");
    let web = dir.path().join("web.yaml");
    write(&web, &manifest("web", "nginx:1"));
    let mut h = Harness::start_with_rescan(dir.path(), Duration::from_millis(300));
    let (_, first) = h.next().await;

    // Rewritten in place by a writer that keeps the file open: no close, so no event to act on.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(&web)
        .expect("open");
    file.set_len(0).expect("truncate");
    file.seek(std::io::SeekFrom::Start(0)).expect("seek");
    file.write_all(manifest("web", "nginx:2").as_bytes())
        .expect("write");
    file.flush().expect("flush");
    assert_eq!(h.next().await, (Op::Remove, first));
    assert_eq!(h.next_names().await, (Op::Add, names(&["web-node-1"])));
    drop(file);
    h.stop().await;
}

#[tokio::test]
async fn an_unlistable_path_is_a_problem_and_never_an_empty_set() {
    let parent = tempfile::tempdir().expect("tempdir");
    let path = parent.path().join("manifests");
    write(&path, "not a directory");
    let mut h = Harness::start(&path);
    let problems = h.problems_until(|p| !p.is_empty()).await;
    assert_eq!(problems[0].file, path);
    assert!(
        problems[0].reason.starts_with("cannot list the directory:"),
        "{problems:?}"
    );
    // Not ready: an empty set here could make the agent stop static pods it cannot see.
    h.expect_quiet().await;

    std::fs::remove_file(&path).expect("remove");
    std::fs::create_dir(&path).expect("mkdir");
    assert_eq!(h.next_names().await, (Op::Add, vec![]));
    h.problems_until(<[SourceProblem]>::is_empty).await;
    h.stop().await;
}
