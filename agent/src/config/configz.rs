//! The effective configuration as `/configz` serves it: upstream answers
//! `{"kubeletconfig": <KubeletConfiguration>}` (`pkg/kubelet/server/server.go`,
//! `InstallDebuggingHandlers` with `configz.InstallHandler`; the kubelet registers its
//! configuration in `cmd/kubelet/app/server.go`, `initConfigz`). Every resolved setting of the
//! table (`settings.rs`) is written under its file key, flags and defaults applied, nested keys
//! (`authentication.webhook.cacheTTL`) as nested objects. The table holds paths to key and
//! credential files, never their contents, so nothing here is a secret.
//!
//! Not here: routing and authorization (`server/full.rs`, the `configz` subresource).

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

use k8s_openapi::api::core::v1::Taint;
use serde_json::{Map, Value, json};

use super::types::CgroupDriver;
use super::{
    duration::GoDuration,
    input::{Given, MapField},
    shutdown::FileShutdownGrace,
    types::{ChangeDetectionStrategy, Cidr, CpuApply, CpuManagerPolicy, PlegMode, TlsVersion},
};
use crate::cm::cpumanager::CpuSet;

/// A resolved setting as KubeletConfiguration writes it; `None` leaves the field out (unset).
pub(super) trait ConfigzValue {
    fn configz(&self) -> Option<Value>;
}

/// Puts `value` at the dotted `key`, making the objects on the way; an earlier value stays (the
/// table lists a flag's own setting before the file fields it stands for).
pub(super) fn insert(document: &mut Map<String, Value>, key: &str, value: Option<Value>) {
    let Some(value) = value else { return };
    let mut at = document;
    let mut parts = key.split('.').peekable();
    while let Some(part) = parts.next() {
        if parts.peek().is_none() {
            at.entry(part.to_owned()).or_insert(value);
            return;
        }
        let next = at
            .entry(part.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        let Value::Object(next) = next else { return };
        at = next;
    }
}

/// The `/configz` document for the settings' map.
pub fn document(kubelet_config: Map<String, Value>) -> Value {
    let mut config = kubelet_config;
    config.insert("kind".to_owned(), json!("KubeletConfiguration"));
    config.insert(
        "apiVersion".to_owned(),
        json!("kubelet.config.k8s.io/v1beta1"),
    );
    json!({ "kubeletconfig": config })
}

macro_rules! as_json {
    ($($ty:ty),*) => {$(
        impl ConfigzValue for $ty {
            fn configz(&self) -> Option<Value> {
                Some(json!(self))
            }
        }
    )*};
}
as_json!(bool, u16, u32, i32, i64, usize, String, Taint);

macro_rules! as_text {
    ($($ty:ty => $text:expr),* $(,)?) => {$(
        impl ConfigzValue for $ty {
            fn configz(&self) -> Option<Value> {
                let text: fn(&$ty) -> String = $text;
                Some(Value::String(text(self)))
            }
        }
    )*};
}
as_text!(
    Duration => |d| GoDuration::from(*d).to_string(),
    PathBuf => |p| p.display().to_string(),
    IpAddr => |ip| ip.to_string(),
    // The healthz flag's address: its IP is `healthzBindAddress` (its port is `healthzPort`).
    SocketAddr => |addr| addr.ip().to_string(),
    Cidr => |c| c.to_string(),
    CpuSet => |c| c.to_string(),
    PlegMode => |m| m.to_string(),
    CgroupDriver => |d| d.as_str().to_owned(),
    CpuManagerPolicy => |p| p.as_str().to_owned(),
    CpuApply => |a| a.as_str().to_owned(),
    TlsVersion => |v| match v {
        TlsVersion::Tls12 => "VersionTLS12".to_owned(),
        TlsVersion::Tls13 => "VersionTLS13".to_owned(),
    },
    ChangeDetectionStrategy => |s| format!("{s:?}"),
);

impl<T: ConfigzValue> ConfigzValue for Option<T> {
    fn configz(&self) -> Option<Value> {
        self.as_ref().and_then(ConfigzValue::configz)
    }
}

impl<T: ConfigzValue> ConfigzValue for Given<T> {
    fn configz(&self) -> Option<Value> {
        self.value.configz()
    }
}

impl<T: ConfigzValue> ConfigzValue for Vec<T> {
    fn configz(&self) -> Option<Value> {
        Some(Value::Array(
            self.iter().filter_map(ConfigzValue::configz).collect(),
        ))
    }
}

impl ConfigzValue for BTreeMap<String, String> {
    fn configz(&self) -> Option<Value> {
        Some(json!(self))
    }
}

impl ConfigzValue for MapField {
    fn configz(&self) -> Option<Value> {
        let entries: Map<String, Value> = self
            .entries
            .iter()
            .map(|e| (e.key.clone(), Value::String(e.value.clone())))
            .collect();
        Some(Value::Object(entries))
    }
}

impl ConfigzValue for FileShutdownGrace {
    fn configz(&self) -> Option<Value> {
        Some(json!({
            "priority": self.priority,
            "shutdownGracePeriodSeconds": self.shutdown_grace_period_seconds,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotted_keys_nest_and_the_first_value_stays() {
        let mut map = Map::new();
        insert(
            &mut map,
            "authentication.webhook.cacheTTL",
            Duration::from_secs(120).configz(),
        );
        insert(&mut map, "authentication.webhook.enabled", true.configz());
        insert(
            &mut map,
            "healthzBindAddress",
            "127.0.0.1:10248".parse::<SocketAddr>().ok().configz(),
        );
        insert(
            &mut map,
            "healthzBindAddress",
            "0.0.0.0".to_owned().configz(),
        );
        insert(&mut map, "staticPodPath", None::<PathBuf>.configz());
        assert_eq!(
            Value::Object(map),
            json!({
                "authentication": {"webhook": {"cacheTTL": "2m0s", "enabled": true}},
                "healthzBindAddress": "127.0.0.1",
            })
        );
    }
}
