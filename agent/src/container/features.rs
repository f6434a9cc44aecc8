//! What the container runtime says it can do (upstream `kubecontainer.RuntimeStatus`'s handlers
//! and features, from CRI `Status`): whether it honours `supplementalGroupsPolicy: Strict`, and
//! which runtime handlers support user namespaces. Admission and the user-namespace manager
//! decide from it; `cri::convert::runtime_features` fills it in.

/// The runtime's features, as its last `Status` answer gave them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeFeatures {
    /// CRI `features.supplemental_groups_policy`: `Strict` is honoured (containerd 2.0+).
    pub supplemental_groups_policy: bool,
    /// CRI `runtime_handlers`; empty from runtimes before CRI v1.30 (containerd 1.6, 1.7).
    pub handlers: Vec<RuntimeHandler>,
}

/// One runtime handler (RuntimeClass handler; `""` is the default).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeHandler {
    pub name: String,
    pub user_namespaces: bool,
    pub recursive_read_only_mounts: bool,
}

impl RuntimeFeatures {
    /// Whether `handler` supports user namespaces (upstream `HandlerSupportsUserNamespaces`); a
    /// runtime that lists no handlers supports them on none.
    pub fn handler_supports_user_namespaces(&self, handler: &str) -> bool {
        self.handlers
            .iter()
            .any(|h| h.name == handler && h.user_namespaces)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_namespaces_only_where_the_named_handler_says_so() {
        let none = RuntimeFeatures::default();
        assert!(!none.handler_supports_user_namespaces(""));
        let features = RuntimeFeatures {
            supplemental_groups_policy: true,
            handlers: vec![
                RuntimeHandler {
                    name: String::new(),
                    user_namespaces: true,
                    recursive_read_only_mounts: false,
                },
                RuntimeHandler {
                    name: "kata".into(),
                    user_namespaces: false,
                    recursive_read_only_mounts: false,
                },
            ],
        };
        assert!(features.handler_supports_user_namespaces(""));
        assert!(!features.handler_supports_user_namespaces("kata"));
        assert!(!features.handler_supports_user_namespaces("gvisor"));
    }
}
