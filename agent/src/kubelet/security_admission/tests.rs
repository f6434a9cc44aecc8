use super::*;
use crate::container::RuntimeHandler;
use crate::testing;
use k8s_openapi::api::core::v1::{AppArmorProfile, Container, PodSecurityContext, SecurityContext};

fn admission(apparmor: bool, features: Option<RuntimeFeatures>) -> SecurityAdmission {
    let (tx, rx) = watch::channel(features);
    drop(tx);
    SecurityAdmission {
        sysctls: Allowlist::new(Some((6, 18)), &[]).expect("allowlist"),
        apparmor: AppArmorHost::from_enabled_file(apparmor.then_some("Y\n")),
        features: rx,
        runtime_handler: String::new(),
    }
}

fn pod(sc: Option<PodSecurityContext>, container_sc: Option<SecurityContext>) -> Pod {
    testing::pod()
        .name("p")
        .security_context(sc)
        .container(Container {
            security_context: container_sc,
            ..testing::container("app")
        })
        .build()
}

fn apparmor(kind: &str, name: Option<&str>) -> AppArmorProfile {
    AppArmorProfile {
        type_: kind.into(),
        localhost_profile: name.map(str::to_owned),
    }
}

fn annotated(value: &str) -> Pod {
    let mut p = pod(None, None);
    p.metadata.annotations = Some(
        [(format!("{APPARMOR_ANNOTATION_PREFIX}app"), value.to_owned())]
            .into_iter()
            .collect(),
    );
    p
}

fn rejection(a: &SecurityAdmission, p: &Pod) -> Option<(String, String)> {
    a.admit(p).err().map(|r| (r.reason, r.message))
}

#[test]
fn apparmor_on_a_host_without_it() {
    let without = admission(false, None);
    let with = admission(true, None);
    let on_container = |p: AppArmorProfile| {
        pod(
            None,
            Some(SecurityContext {
                app_armor_profile: Some(p),
                ..Default::default()
            }),
        )
    };
    let on_pod = |p: AppArmorProfile| {
        pod(
            Some(PodSecurityContext {
                app_armor_profile: Some(p),
                ..Default::default()
            }),
            None,
        )
    };
    let refused = Some((
        "AppArmor".to_owned(),
        "Cannot enforce AppArmor: AppArmor is not enabled on the host".to_owned(),
    ));
    let cases = [
        (pod(None, None), None),
        (on_container(apparmor("Unconfined", None)), None),
        (on_pod(apparmor("Unconfined", None)), None),
        (annotated("unconfined"), None),
        (
            on_container(apparmor("RuntimeDefault", None)),
            refused.clone(),
        ),
        (
            on_pod(apparmor("Localhost", Some("k8s-deny-write"))),
            refused.clone(),
        ),
        (annotated("runtime/default"), refused.clone()),
        (annotated("localhost/k8s-deny-write"), refused.clone()),
    ];
    for (p, want) in cases {
        assert_eq!(rejection(&without, &p), want, "{:?}", p.spec);
        // With AppArmor on the host every one of them is admitted.
        assert_eq!(rejection(&with, &p), None, "{:?}", p.spec);
    }
    let unnamed = on_container(apparmor("Localhost", Some("  ")));
    assert_eq!(
        rejection(&with, &unnamed).map(|r| r.1),
        Some("Cannot enforce AppArmor: invalid empty AppArmor profile name (container app)".into())
    );
    assert_eq!(
        AppArmorHost::from_enabled_file(Some("N\n")),
        AppArmorHost::Unavailable("AppArmor is not enabled on the host".into())
    );
}

fn features(supplemental_groups_policy: bool, user_namespaces: bool) -> RuntimeFeatures {
    RuntimeFeatures {
        supplemental_groups_policy,
        handlers: vec![RuntimeHandler {
            name: String::new(),
            user_namespaces,
            recursive_read_only_mounts: false,
        }],
    }
}

#[test]
fn strict_supplemental_groups_need_the_runtime_feature() {
    let with_policy = |policy: &str| {
        pod(
            Some(PodSecurityContext {
                supplemental_groups_policy: Some(policy.into()),
                ..Default::default()
            }),
            None,
        )
    };
    let refused = Some((
        "SupplementalGroupsPolicyNotSupported".to_owned(),
        "SupplementalGroupsPolicy=Strict is not supported in this node".to_owned(),
    ));
    // containerd 1.6: no features reported.
    let old = admission(false, Some(RuntimeFeatures::default()));
    assert_eq!(rejection(&old, &with_policy("Strict")), refused);
    assert_eq!(rejection(&old, &with_policy("Merge")), None);
    // Before the runtime's first answer nothing is known to be supported.
    assert_eq!(
        rejection(&admission(false, None), &with_policy("Strict")),
        refused
    );
    let new = admission(false, Some(features(true, false)));
    assert_eq!(rejection(&new, &with_policy("Strict")), None);
}

#[test]
fn host_users_false_needs_the_handlers_user_namespaces() {
    let with = |host_users: Option<bool>| {
        let mut p = pod(None, None);
        if let Some(spec) = p.spec.as_mut() {
            spec.host_users = host_users;
        }
        p
    };
    let old = admission(false, Some(RuntimeFeatures::default()));
    let refused = rejection(&old, &with(Some(false)));
    assert_eq!(
        refused.as_ref().map(|r| r.0.as_str()),
        Some("UserNamespacesNotSupported")
    );
    assert!(refused.is_some_and(|r| {
        r.1.contains("RuntimeClass handler \"\" does not support user namespaces")
    }),);
    assert_eq!(rejection(&old, &with(Some(true))), None);
    assert_eq!(rejection(&old, &with(None)), None);
    let new = admission(false, Some(features(false, true)));
    assert_eq!(rejection(&new, &with(Some(false))), None);
    // Support on another handler does not count.
    let other = admission(
        false,
        Some(RuntimeFeatures {
            supplemental_groups_policy: false,
            handlers: vec![RuntimeHandler {
                name: "crun".into(),
                user_namespaces: true,
                recursive_read_only_mounts: false,
            }],
        }),
    );
    assert!(rejection(&other, &with(Some(false))).is_some());
}

#[test]
fn sysctls_come_first() {
    let a = admission(false, Some(RuntimeFeatures::default()));
    let mut p = pod(
        Some(PodSecurityContext {
            sysctls: Some(vec![k8s_openapi::api::core::v1::Sysctl {
                name: "kernel.msgmax".into(),
                value: "65536".into(),
            }]),
            supplemental_groups_policy: Some("Strict".into()),
            ..Default::default()
        }),
        None,
    );
    if let Some(spec) = p.spec.as_mut() {
        spec.host_users = Some(false);
    }
    assert_eq!(
        rejection(&a, &p).map(|r| r.0),
        Some("SysctlForbidden".to_owned())
    );
}
