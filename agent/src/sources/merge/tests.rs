//! Tests of the merge: each of upstream's rules, one case each.

use crate::testing;
use std::{
    collections::BTreeMap,
    time::{Duration, SystemTime},
};

use k8s_openapi::{
    api::core::v1::{Container, Pod, PodStatus},
    apimachinery::pkg::apis::meta::v1::Time,
};

use super::*;
use crate::sources::CONFIG_MIRROR_ANNOTATION;

fn storage() -> PodStorage {
    PodStorage::new(Box::new(|| {
        SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_500)
    }))
}

fn pod(name: &str, uid: &str, image: &str) -> Pod {
    testing::pod()
        .named("default", name, uid)
        .container(Container {
            image: Some(image.to_owned()),
            ..testing::container("c")
        })
        .build()
}

fn set(pods: Vec<Pod>) -> PodUpdate {
    PodUpdate {
        pods,
        op: Op::Set,
        source: Source::File,
    }
}

/// (op, names) of each emitted update.
fn summary(out: &[PodUpdate]) -> Vec<(Op, Vec<String>)> {
    out.iter()
        .map(|u| {
            let names = u
                .pods
                .iter()
                .map(|p| p.metadata.name.clone().unwrap_or_default())
                .collect();
            (u.op, names)
        })
        .collect()
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

#[test]
fn first_empty_set_still_signals_the_source() {
    let mut s = storage();
    let out = s.merge(set(vec![]));
    assert_eq!(summary(&out), vec![(Op::Add, vec![])]);
    assert!(s.seen_sources().contains(&Source::File));
    // Only the first time.
    assert!(s.merge(set(vec![])).is_empty());
}

#[test]
fn new_pods_are_added_with_source_and_first_seen() {
    let mut s = storage();
    let out = s.merge(set(vec![pod("a", "1", "img:1")]));
    assert_eq!(summary(&out), vec![(Op::Add, names(&["a"]))]);
    let added = &out[0].pods[0];
    assert_eq!(annotation(added, CONFIG_SOURCE_ANNOTATION), Some("file"));
    assert_eq!(
        annotation(added, CONFIG_FIRST_SEEN_ANNOTATION),
        Some("2023-11-14T22:13:20.5Z")
    );
    assert!(s.merge(set(vec![pod("a", "1", "img:1")])).is_empty());
}

#[test]
fn spec_change_is_an_update_that_keeps_local_annotations() {
    let mut s = storage();
    s.merge(set(vec![pod("a", "1", "img:1")]));
    let out = s.merge(set(vec![pod("a", "1", "img:2")]));
    assert_eq!(summary(&out), vec![(Op::Update, names(&["a"]))]);
    let updated = &out[0].pods[0];
    assert_eq!(
        annotation(updated, CONFIG_FIRST_SEEN_ANNOTATION),
        Some("2023-11-14T22:13:20.5Z")
    );
    let image = updated
        .spec
        .as_ref()
        .and_then(|s| s.containers[0].image.clone());
    assert_eq!(image.as_deref(), Some("img:2"));
}

#[test]
fn label_and_annotation_changes_are_updates_local_ones_are_not() {
    let mut s = storage();
    s.merge(set(vec![pod("a", "1", "img")]));

    let mut local = pod("a", "1", "img");
    local.metadata.annotations = Some(BTreeMap::from([(
        CONFIG_FIRST_SEEN_ANNOTATION.to_owned(),
        "x".to_owned(),
    )]));
    assert!(s.merge(set(vec![local])).is_empty());

    let mut annotated = pod("a", "1", "img");
    annotated.metadata.annotations = Some(BTreeMap::from([("k".to_owned(), "v".to_owned())]));
    let out = s.merge(set(vec![annotated.clone()]));
    assert_eq!(summary(&out), vec![(Op::Update, names(&["a"]))]);
    assert_eq!(annotation(&out[0].pods[0], "k"), Some("v"));

    let mut labelled = annotated;
    labelled.metadata.labels = Some(BTreeMap::from([("tier".to_owned(), "db".to_owned())]));
    let out = s.merge(set(vec![labelled]));
    assert_eq!(summary(&out), vec![(Op::Update, names(&["a"]))]);
}

#[test]
fn status_only_change_is_a_reconcile() {
    let mut s = storage();
    s.merge(set(vec![pod("a", "1", "img")]));
    let mut running = pod("a", "1", "img");
    running.status = Some(PodStatus {
        phase: Some("Running".to_owned()),
        ..PodStatus::default()
    });
    let out = s.merge(set(vec![running]));
    assert_eq!(summary(&out), vec![(Op::Reconcile, names(&["a"]))]);
    let phase = out[0].pods[0].status.as_ref().and_then(|s| s.phase.clone());
    assert_eq!(phase.as_deref(), Some("Running"));
}

#[test]
fn deletion_timestamp_is_a_graceful_delete() {
    let mut s = storage();
    s.merge(set(vec![pod("a", "1", "img")]));
    let mut deleting = pod("a", "1", "img");
    deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    deleting.metadata.deletion_grace_period_seconds = Some(30);
    let out = s.merge(PodUpdate {
        pods: vec![deleting],
        op: Op::Update,
        source: Source::File,
    });
    assert_eq!(summary(&out), vec![(Op::Delete, names(&["a"]))]);
}

#[test]
fn set_diff_orders_remove_add_update() {
    let mut s = storage();
    s.merge(set(vec![pod("a", "1", "img"), pod("b", "2", "img")]));
    let out = s.merge(set(vec![pod("b", "2", "img:new"), pod("c", "3", "img")]));
    assert_eq!(
        summary(&out),
        vec![
            (Op::Remove, names(&["a"])),
            (Op::Add, names(&["c"])),
            (Op::Update, names(&["b"])),
        ]
    );
}

#[test]
fn incremental_ops_and_remove_of_unknown_is_a_no_op() {
    let mut s = storage();
    let add = |p| PodUpdate {
        pods: vec![p],
        op: Op::Add,
        source: Source::Api,
    };
    assert_eq!(
        summary(&s.merge(add(pod("a", "1", "img")))),
        vec![(Op::Add, names(&["a"]))]
    );
    // Incremental ops do not make a source ready; only a SET does.
    assert!(s.seen_sources().is_empty());
    let remove = |p| PodUpdate {
        pods: vec![p],
        op: Op::Remove,
        source: Source::Api,
    };
    assert_eq!(
        summary(&s.merge(remove(pod("a", "1", "img")))),
        vec![(Op::Remove, names(&["a"]))]
    );
    assert!(s.merge(remove(pod("a", "1", "img"))).is_empty());
}

#[test]
fn duplicate_full_names_in_one_batch_keep_the_first() {
    let mut s = storage();
    let out = s.merge(set(vec![pod("a", "1", "img:1"), pod("a", "2", "img:2")]));
    assert_eq!(summary(&out), vec![(Op::Add, names(&["a"]))]);
    assert_eq!(out[0].pods[0].metadata.uid.as_deref(), Some("1"));
}

#[test]
fn sources_are_kept_apart() {
    let mut s = storage();
    s.merge(set(vec![pod("a", "1", "img")]));
    let api = PodUpdate {
        pods: vec![],
        op: Op::Set,
        source: Source::Api,
    };
    // The API server's empty set removes nothing of the file source's.
    assert_eq!(summary(&s.merge(api)), vec![(Op::Add, vec![])]);
    assert_eq!(s.merged_state().len(), 1);
}

#[test]
fn mirror_pods_are_never_taken() {
    let mut s = storage();
    let mut mirror = pod("etcd-n1", "m-1", "img");
    mirror.metadata.annotations = Some(BTreeMap::from([(
        CONFIG_MIRROR_ANNOTATION.to_owned(),
        "h1".to_owned(),
    )]));
    let out = s.merge(set(vec![mirror, pod("web", "1", "img")]));
    assert_eq!(summary(&out), vec![(Op::Add, names(&["web"]))]);
    assert_eq!(s.merged_state().len(), 1);
}
