use super::*;
use crate::testing;
use k8s_openapi::api::core::v1::{AppArmorProfile, Capabilities, SELinuxOptions, SeccompProfile};

use cri::security_profile::ProfileType;

fn pod(sc: Option<PodSecurityContext>, containers: Vec<Container>) -> Pod {
    testing::pod()
        .named("prod", "web", "u1")
        .security_context(sc)
        .containers(containers)
        .build()
}

fn container(sc: Option<SecurityContext>) -> Container {
    Container {
        name: "app".into(),
        security_context: sc,
        ..Default::default()
    }
}

fn options(seccomp_default: bool) -> SecurityOptions {
    SecurityOptions::new(Path::new("/var/lib/swiftlet"), seccomp_default)
}

fn convert(pod: &Pod, user: &ImageUser) -> cri::LinuxContainerSecurityContext {
    let c = &pod.spec.as_ref().expect("spec").containers[0];
    container_security_context(pod, c, user, namespace_options(pod, None), &options(false))
        .expect("converts")
}

fn restricted() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(1000),
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        }),
        ..Default::default()
    }
}

#[test]
fn the_restricted_profile_reaches_cri_whole() {
    let p = pod(None, vec![container(Some(restricted()))]);
    let sc = convert(&p, &ImageUser::Uid(0));
    assert_eq!(sc.run_as_user.map(|u| u.value), Some(1000));
    assert!(sc.no_new_privs);
    assert!(!sc.privileged);
    assert_eq!(
        sc.capabilities
            .map(|c| (c.add_capabilities, c.drop_capabilities)),
        Some((vec![], vec!["ALL".to_owned()]))
    );
    assert_eq!(
        sc.seccomp.map(|s| s.profile_type),
        Some(ProfileType::RuntimeDefault as i32)
    );
    assert_eq!(sc.masked_paths.len(), DEFAULT_MASKED_PATHS.len());
    assert!(sc.masked_paths.iter().any(|p| p == "/proc/kcore"));
    assert!(sc.readonly_paths.iter().any(|p| p == "/proc/sys"));
    assert_eq!(sc.run_as_username, "");
}

#[test]
fn container_fields_win_over_the_pods() {
    let pod_sc = PodSecurityContext {
        run_as_user: Some(1),
        run_as_group: Some(2),
        run_as_non_root: Some(true),
        se_linux_options: Some(SELinuxOptions {
            level: Some("s0:c1".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    /// The container's context, then the user, group and SELinux level CRI gets.
    type Case = (
        Option<SecurityContext>,
        Option<i64>,
        Option<i64>,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (None, Some(1), Some(2), "s0:c1"),
        (
            Some(SecurityContext {
                run_as_user: Some(10),
                ..Default::default()
            }),
            Some(10),
            Some(2),
            "s0:c1",
        ),
        (
            Some(SecurityContext {
                run_as_group: Some(20),
                se_linux_options: Some(SELinuxOptions {
                    level: Some("s0:c9".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            Some(1),
            Some(20),
            "s0:c9",
        ),
    ];
    for (sc, user, group, level) in cases {
        let p = pod(Some(pod_sc.clone()), vec![container(sc.clone())]);
        let got = convert(&p, &ImageUser::Uid(0));
        assert_eq!(got.run_as_user.map(|u| u.value), user, "{sc:?}");
        assert_eq!(got.run_as_group.map(|g| g.value), group, "{sc:?}");
        assert_eq!(
            got.selinux_options.map(|s| s.level).as_deref(),
            Some(level),
            "{sc:?}"
        );
    }
}

#[test]
fn the_image_user_applies_only_without_run_as_user() {
    let cases = [
        (None, ImageUser::Uid(0), Some(0), ""),
        (None, ImageUser::Uid(7), Some(7), ""),
        (None, ImageUser::Name("app".into()), None, "app"),
        (Some(5), ImageUser::Name("app".into()), Some(5), ""),
    ];
    for (run_as_user, image, uid, name) in cases {
        let p = pod(
            None,
            vec![container(Some(SecurityContext {
                run_as_user,
                ..Default::default()
            }))],
        );
        let got = convert(&p, &image);
        assert_eq!(got.run_as_user.map(|u| u.value), uid, "{image:?}");
        assert_eq!(got.run_as_username, name, "{image:?}");
    }
}

#[test]
fn image_user_from_image_status() {
    let image = |uid: Option<i64>, name: &str| cri::Image {
        uid: uid.map(|value| cri::Int64Value { value }),
        username: name.into(),
        ..Default::default()
    };
    assert_eq!(ImageUser::of(None), ImageUser::Uid(0));
    assert_eq!(ImageUser::of(Some(&image(None, ""))), ImageUser::Uid(0));
    assert_eq!(
        ImageUser::of(Some(&image(Some(1000), ""))),
        ImageUser::Uid(1000)
    );
    assert_eq!(
        ImageUser::of(Some(&image(None, "nginx"))),
        ImageUser::Name("nginx".into())
    );
}

#[test]
fn run_as_non_root_is_verified_with_upstreams_messages() {
    let with = |pod_sc: Option<PodSecurityContext>, sc: Option<SecurityContext>| {
        pod(pod_sc, vec![container(sc)])
    };
    let non_root = |user: Option<i64>| SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: user,
        ..Default::default()
    };
    let cases: Vec<(Pod, ImageUser, Option<&str>)> = vec![
        (with(None, None), ImageUser::Uid(0), None),
        (
            with(None, Some(non_root(None))),
            ImageUser::Uid(0),
            Some(
                "container has runAsNonRoot and image will run as root (pod: \"web_prod(u1)\", \
                 container: app)",
            ),
        ),
        (with(None, Some(non_root(None))), ImageUser::Uid(1000), None),
        (
            with(None, Some(non_root(Some(0)))),
            ImageUser::Uid(1000),
            Some(
                "container's runAsUser breaks non-root policy (pod: \"web_prod(u1)\", container: app)",
            ),
        ),
        (
            with(None, Some(non_root(Some(1000)))),
            ImageUser::Uid(0),
            None,
        ),
        (
            with(None, Some(non_root(None))),
            ImageUser::Name("nginx".into()),
            Some(
                "container has runAsNonRoot and image has non-numeric user (nginx), cannot verify \
                 user is non-root (pod: \"web_prod(u1)\", container: app)",
            ),
        ),
        // The pod's runAsNonRoot applies; the container may turn it off.
        (
            with(
                Some(PodSecurityContext {
                    run_as_non_root: Some(true),
                    ..Default::default()
                }),
                None,
            ),
            ImageUser::Uid(0),
            Some(
                "container has runAsNonRoot and image will run as root (pod: \"web_prod(u1)\", \
                 container: app)",
            ),
        ),
        (
            with(
                Some(PodSecurityContext {
                    run_as_non_root: Some(true),
                    ..Default::default()
                }),
                Some(SecurityContext {
                    run_as_non_root: Some(false),
                    ..Default::default()
                }),
            ),
            ImageUser::Uid(0),
            None,
        ),
        // A pod-level runAsUser satisfies a container's runAsNonRoot.
        (
            with(
                Some(PodSecurityContext {
                    run_as_user: Some(1000),
                    ..Default::default()
                }),
                Some(non_root(None)),
            ),
            ImageUser::Uid(0),
            None,
        ),
    ];
    for (p, image, want) in cases {
        let c = &p.spec.as_ref().expect("spec").containers[0];
        let got = verify_run_as_non_root(&p, c, &image)
            .err()
            .map(|e| e.to_string());
        assert_eq!(got.as_deref(), want, "{:?} {image:?}", c.security_context);
    }
}

#[test]
fn allow_privilege_escalation_sets_no_new_privs_only_when_false() {
    for (allow, want) in [(None, false), (Some(true), false), (Some(false), true)] {
        let p = pod(
            None,
            vec![container(Some(SecurityContext {
                allow_privilege_escalation: allow,
                ..Default::default()
            }))],
        );
        assert_eq!(
            convert(&p, &ImageUser::Uid(0)).no_new_privs,
            want,
            "{allow:?}"
        );
    }
}

#[test]
fn proc_mount_and_privileged_decide_the_masked_paths() {
    let cases = [
        (None, None, true),
        (Some("Default"), None, true),
        (Some("Unmasked"), None, false),
        (None, Some(true), false),
    ];
    for (proc_mount, privileged, masked) in cases {
        let p = pod(
            None,
            vec![container(Some(SecurityContext {
                proc_mount: proc_mount.map(str::to_owned),
                privileged,
                ..Default::default()
            }))],
        );
        let sc = convert(&p, &ImageUser::Uid(0));
        assert_eq!(
            !sc.masked_paths.is_empty(),
            masked,
            "{proc_mount:?} {privileged:?}"
        );
        assert_eq!(
            !sc.readonly_paths.is_empty(),
            masked,
            "{proc_mount:?} {privileged:?}"
        );
        assert_eq!(sc.privileged, privileged == Some(true));
    }
}

#[test]
fn capabilities_pass_through_as_written() {
    let p = pod(
        None,
        vec![container(Some(SecurityContext {
            capabilities: Some(Capabilities {
                add: Some(vec!["NET_BIND_SERVICE".into()]),
                drop: Some(vec!["ALL".into()]),
            }),
            ..Default::default()
        }))],
    );
    let caps = convert(&p, &ImageUser::Uid(0))
        .capabilities
        .expect("capabilities");
    assert_eq!(caps.add_capabilities, vec!["NET_BIND_SERVICE".to_owned()]);
    assert_eq!(caps.drop_capabilities, vec!["ALL".to_owned()]);
    // No capabilities field: the runtime's default set.
    let plain = pod(None, vec![container(None)]);
    assert_eq!(convert(&plain, &ImageUser::Uid(0)).capabilities, None);
}

#[test]
fn seccomp_container_over_pod_over_the_kubelet_default() {
    let seccomp = |kind: &str, local: Option<&str>| SeccompProfile {
        type_: kind.into(),
        localhost_profile: local.map(str::to_owned),
    };
    let on_pod = |s: SeccompProfile| PodSecurityContext {
        seccomp_profile: Some(s),
        ..Default::default()
    };
    let on_container = |s: SeccompProfile| SecurityContext {
        seccomp_profile: Some(s),
        ..Default::default()
    };
    /// Pod, container, `seccompDefault`, then the profile type and reference CRI gets.
    type Case = (
        Option<PodSecurityContext>,
        Option<SecurityContext>,
        bool,
        ProfileType,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (None, None, false, ProfileType::Unconfined, ""),
        (None, None, true, ProfileType::RuntimeDefault, ""),
        (
            Some(on_pod(seccomp("RuntimeDefault", None))),
            None,
            false,
            ProfileType::RuntimeDefault,
            "",
        ),
        (
            Some(on_pod(seccomp("RuntimeDefault", None))),
            Some(on_container(seccomp("Unconfined", None))),
            true,
            ProfileType::Unconfined,
            "",
        ),
        (
            None,
            Some(on_container(seccomp(
                "Localhost",
                Some("profiles/audit.json"),
            ))),
            false,
            ProfileType::Localhost,
            "/var/lib/swiftlet/seccomp/profiles/audit.json",
        ),
        (
            Some(on_pod(seccomp("Localhost", Some("p.json")))),
            None,
            true,
            ProfileType::Localhost,
            "/var/lib/swiftlet/seccomp/p.json",
        ),
    ];
    for (pod_sc, sc, default, kind, reference) in cases {
        let p = pod(pod_sc.clone(), vec![container(sc.clone())]);
        let got = seccomp_profile(
            &p,
            &p.spec.as_ref().expect("spec").containers[0],
            &options(default),
        )
        .expect("valid");
        assert_eq!(
            (got.profile_type, got.localhost_ref.as_str()),
            (kind as i32, reference),
            "{pod_sc:?} {sc:?} {default}"
        );
    }
}

#[test]
fn bad_localhost_seccomp_profiles_are_refused() {
    let cases = [
        (Some("/etc/shadow"), "must be a relative path"),
        (Some("../../etc/shadow"), "must not contain '..'"),
        (Some("a/../../b"), "must not contain '..'"),
        (None, "localhostProfile must be set"),
        (Some(""), "localhostProfile must be set"),
    ];
    for (profile, want) in cases {
        let p = pod(
            None,
            vec![container(Some(SecurityContext {
                seccomp_profile: Some(SeccompProfile {
                    type_: "Localhost".into(),
                    localhost_profile: profile.map(str::to_owned),
                }),
                ..Default::default()
            }))],
        );
        let err = seccomp_profile(
            &p,
            &p.spec.as_ref().expect("spec").containers[0],
            &options(false),
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(err.contains(want), "{profile:?}: {err}");
    }
    let typo = pod(
        None,
        vec![container(Some(SecurityContext {
            seccomp_profile: Some(SeccompProfile {
                type_: "runtime/default".into(),
                localhost_profile: None,
            }),
            ..Default::default()
        }))],
    );
    assert!(matches!(
        seccomp_profile(
            &typo,
            &typo.spec.as_ref().expect("spec").containers[0],
            &options(true)
        ),
        Err(SecurityContextError::SeccompType(_))
    ));
}

#[test]
fn apparmor_field_annotation_and_pod_level_in_upstreams_order() {
    let field = |kind: &str, local: Option<&str>| AppArmorProfile {
        type_: kind.into(),
        localhost_profile: local.map(str::to_owned),
    };
    let annotated = |value: &str| {
        let mut p = pod(
            Some(PodSecurityContext {
                app_armor_profile: Some(field("Unconfined", None)),
                ..Default::default()
            }),
            vec![container(None)],
        );
        p.metadata.annotations = Some(
            [(format!("{APPARMOR_ANNOTATION_PREFIX}app"), value.to_owned())]
                .into_iter()
                .collect(),
        );
        p
    };
    let of = |p: &Pod| {
        apparmor_profile(p, &p.spec.as_ref().expect("spec").containers[0])
            .expect("valid")
            .map(|(profile, old)| (profile.profile_type, profile.localhost_ref, old))
    };
    assert_eq!(of(&pod(None, vec![container(None)])), None);
    assert_eq!(
        of(&annotated("localhost/k8s-deny-write")),
        Some((
            ProfileType::Localhost as i32,
            "k8s-deny-write".to_owned(),
            "localhost/k8s-deny-write".to_owned()
        ))
    );
    assert_eq!(
        of(&annotated("runtime/default")),
        Some((
            ProfileType::RuntimeDefault as i32,
            String::new(),
            "runtime/default".to_owned()
        ))
    );
    // An invalid annotation is ignored: the pod's field applies.
    assert_eq!(
        of(&annotated("bogus")),
        Some((
            ProfileType::Unconfined as i32,
            String::new(),
            "unconfined".to_owned()
        ))
    );
    // The container's field beats the annotation.
    let mut both = annotated("runtime/default");
    if let Some(spec) = both.spec.as_mut() {
        spec.containers[0].security_context = Some(SecurityContext {
            app_armor_profile: Some(field("Unconfined", None)),
            ..Default::default()
        });
    }
    assert_eq!(of(&both).map(|p| p.0), Some(ProfileType::Unconfined as i32));
    let missing = pod(
        Some(PodSecurityContext {
            app_armor_profile: Some(field("Localhost", None)),
            ..Default::default()
        }),
        vec![container(None)],
    );
    assert_eq!(
        apparmor_profile(
            &missing,
            &missing.spec.as_ref().expect("spec").containers[0]
        ),
        Err(SecurityContextError::AppArmorLocalhostMissing)
    );
}

#[test]
fn supplemental_groups_fs_group_first_and_the_policy() {
    let p = pod(
        Some(PodSecurityContext {
            fs_group: Some(2000),
            supplemental_groups: Some(vec![3000, 3001]),
            supplemental_groups_policy: Some("Strict".into()),
            ..Default::default()
        }),
        vec![container(None)],
    );
    let sc = convert(&p, &ImageUser::Uid(0));
    assert_eq!(sc.supplemental_groups, vec![2000, 3000, 3001]);
    assert_eq!(
        sc.supplemental_groups_policy,
        cri::SupplementalGroupsPolicy::Strict as i32
    );
    let sandbox = sandbox_security_context(&p, namespace_options(&p, None)).expect("sandbox");
    assert_eq!(sandbox.supplemental_groups, vec![2000, 3000, 3001]);
    assert_eq!(
        sandbox.supplemental_groups_policy,
        cri::SupplementalGroupsPolicy::Strict as i32
    );
    let mut bad = p.clone();
    if let Some(sc) = bad.spec.as_mut().and_then(|s| s.security_context.as_mut()) {
        sc.supplemental_groups_policy = Some("Loose".into());
    }
    assert_eq!(
        sandbox_security_context(&bad, namespace_options(&bad, None))
            .err()
            .map(|e| e.to_string()),
        Some("unsupported supplementalGroupsPolicy: Loose".to_owned())
    );
}

#[test]
fn the_sandbox_runs_as_the_pod_user_runtime_default_and_privileged_when_a_container_is() {
    let mut privileged = container(Some(SecurityContext {
        privileged: Some(true),
        ..Default::default()
    }));
    privileged.name = "init".into();
    let mut p = pod(
        Some(PodSecurityContext {
            run_as_user: Some(1000),
            run_as_group: Some(3000),
            seccomp_profile: Some(SeccompProfile {
                type_: "Unconfined".into(),
                localhost_profile: None,
            }),
            ..Default::default()
        }),
        vec![container(None)],
    );
    let sandbox = sandbox_security_context(&p, namespace_options(&p, None)).expect("sandbox");
    assert_eq!(sandbox.run_as_user.map(|u| u.value), Some(1000));
    assert_eq!(sandbox.run_as_group.map(|g| g.value), Some(3000));
    assert_eq!(
        sandbox.seccomp.map(|s| s.profile_type),
        Some(ProfileType::RuntimeDefault as i32)
    );
    assert!(!sandbox.privileged);
    if let Some(spec) = p.spec.as_mut() {
        spec.init_containers = Some(vec![privileged]);
    }
    assert!(has_privileged_container(&p));
    assert!(
        sandbox_security_context(&p, namespace_options(&p, None))
            .expect("sandbox")
            .privileged
    );
}

#[test]
fn namespaces_follow_the_host_flags() {
    let mut p = pod(None, vec![container(None)]);
    let ns = namespace_options(&p, None);
    assert_eq!(
        (ns.network, ns.pid, ns.ipc),
        (
            cri::NamespaceMode::Pod as i32,
            cri::NamespaceMode::Container as i32,
            cri::NamespaceMode::Pod as i32
        )
    );
    if let Some(spec) = p.spec.as_mut() {
        spec.host_network = Some(true);
        spec.host_ipc = Some(true);
        spec.share_process_namespace = Some(true);
    }
    let userns = cri::UserNamespace {
        mode: cri::NamespaceMode::Node as i32,
        ..Default::default()
    };
    let ns = namespace_options(&p, Some(userns.clone()));
    assert_eq!(
        (ns.network, ns.pid, ns.ipc),
        (
            cri::NamespaceMode::Node as i32,
            cri::NamespaceMode::Pod as i32,
            cri::NamespaceMode::Node as i32
        )
    );
    assert_eq!(ns.userns_options, Some(userns));
}

#[test]
fn windows_options_are_ignored() {
    let p = pod(
        Some(PodSecurityContext {
            windows_options: Some(k8s_openapi::api::core::v1::WindowsSecurityContextOptions {
                run_as_user_name: Some("ContainerAdministrator".into()),
                host_process: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        }),
        vec![container(None)],
    );
    let sc = convert(&p, &ImageUser::Uid(0));
    let plain = convert(&pod(None, vec![container(None)]), &ImageUser::Uid(0));
    assert_eq!(sc, plain);
}
