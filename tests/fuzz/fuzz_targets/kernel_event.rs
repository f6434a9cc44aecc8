//! A ring-buffer record's bytes, as the agent reads them from the kernel
//! (`swiftlet::kernel::event::decode`), then what the agent does with a decoded event before it
//! reaches the PLEG: `swiftlet events --json`'s serialisation, the exit code, and the mapping of a
//! cgroup path to its pod and container (`pleg::index`). The programs are the agent's own, but a
//! record is still bytes of a layout shared across a build boundary (`swiftlet-common`), and the
//! strings in it (comm, filename, cgroup path) come from what containers name things. A record
//! that does not decode is counted as malformed; a panic or an out-of-bounds read (ASan) is a
//! finding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use swiftlet::{
    cgroup::PodCgroupLayout,
    kernel::{
        EventBody,
        event::{DecodeError, decode},
    },
    pleg::index::{ContainerIndex, is_runtime_bootstrap},
};
use swiftlet_common::{EventKind, PressureSource};

fuzz_target!(|data: &[u8]| {
    let (event, _meta) = match decode(data, 0) {
        Ok(decoded) => decoded,
        Err(error) => {
            if let DecodeError::UnknownKind { kind } = error {
                assert_eq!(EventKind::from_raw(kind), None);
            }
            let _ = error.to_string();
            return;
        }
    };
    let kind = event.body.kind();
    assert_eq!(EventKind::from_raw(kind as u32), Some(kind));
    assert!(
        data.len() >= kind.record_size(),
        "decoded from fewer bytes than its layout"
    );
    let json = serde_json::to_string(&event).expect("an event serialises");
    assert!(
        json.contains(&format!("\"kind\":\"{}\"", kind.as_str())),
        "{json}"
    );
    match &event.body {
        EventBody::Exit(exit) => {
            let _ = exit.container_exit_code();
        }
        EventBody::Exec(exec) => {
            let _ = is_runtime_bootstrap(&exec.comm, &exec.filename);
        }
        EventBody::CgroupMkdir(change) | EventBody::CgroupRmdir(change) => {
            // The PLEG's index, as it learns of a cgroup from this event.
            let path = change.path.to_string_lossy();
            let layout = PodCgroupLayout::new(std::path::Path::new("/"), true);
            let mut index = ContainerIndex::under(layout.clone());
            let inserted = index.insert_path(change.cgroup_id, &path).cloned();
            match (layout.parse_container(&path), inserted) {
                (Some((pod, id)), Some(entry)) => {
                    assert!(!pod.0.is_empty() && !pod.0.contains('/'), "pod uid {pod:?}");
                    assert!(!id.is_empty() && !id.contains('/'), "container id {id:?}");
                    assert_eq!((entry.pod, entry.container_id), (pod, id));
                    assert!(index.remove(change.cgroup_id).is_some());
                }
                (None, None) => assert!(index.is_empty()),
                (parsed, inserted) => panic!("parsed {parsed:?}, indexed {inserted:?}"),
            }
        }
        EventBody::Pressure(pressure) => {
            assert_eq!(
                PressureSource::from_raw(pressure.source as u32),
                Some(pressure.source)
            );
            assert!(pressure.order.is_none_or(|o| o >= 0));
        }
        EventBody::Oom(_) | EventBody::MemcgLevel(_) => {}
    }
});
