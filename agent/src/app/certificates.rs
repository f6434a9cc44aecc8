//! The node's certificates at start (upstream `cmd/kubelet/app/server.go` `run`: the TLS
//! bootstrap before anything talks to the API server, then `buildKubeletClientConfig` with a
//! client certificate manager when `rotateCertificates`, and the serving certificate manager
//! when `serverTLSBootstrap`): the API clients to use, and the kubelet server's certificate
//! handle when the cluster issues it.
//!
//! Rotation needs a kubeconfig this agent's bootstrap wrote (its client certificate and key in
//! `<certDir>/kubelet-client-current.pem`); another kubeconfig keeps its credentials, with a
//! warning when rotation was asked for. The serving certificate is requested with the agent's
//! client, so it needs `--kubeconfig`; until the first one is issued the kubelet server has no
//! certificate and refuses handshakes, as upstream's does (no self-signed stand-in: a client
//! that trusts the cluster CA would refuse it anyway).

use std::{sync::Arc, time::Duration};

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{Error, node::NodeFacts};
use crate::{
    certificate::{
        bootstrap,
        csr::{Kind, Subject},
        manager::{ApiRequester, Manager},
        metrics::CertificateMetrics,
        store::{CLIENT_PEM, SERVER_PEM, Store},
        transport::Identity,
    },
    clock,
    config::Config,
    metrics::Metrics,
    server::serving_cert::ServingCertificate,
    sources::{ApiClients, ClientSettings},
};

/// The first and last pause between bootstrap tries.
const FIRST_RETRY: Duration = Duration::from_secs(2);
const LAST_RETRY: Duration = Duration::from_secs(60);

/// The API clients (with `--kubeconfig`) and the serving certificate handle (with
/// `serverTLSBootstrap`).
pub struct Certificates {
    pub api: Option<ApiClients>,
    pub serving: Option<ServingCertificate>,
}

pub async fn start(
    config: &Config,
    node: &NodeFacts,
    metrics: &Metrics,
    tasks: &mut JoinSet<Result<(), Error>>,
    shutdown: &CancellationToken,
) -> Result<Certificates, Error> {
    let Some(kubeconfig) = &config.kubeconfig else {
        if config.bootstrap_kubeconfig.is_some() {
            return Err(Error::Certificate(
                crate::certificate::Error::KubeconfigPath(
                    "(not given; --bootstrap-kubeconfig writes it)".into(),
                ),
            ));
        }
        if config.rotate_certificates || config.server_tls_bootstrap {
            tracing::warn!(
                "rotateCertificates and serverTLSBootstrap need --kubeconfig: not in effect"
            );
        }
        return Ok(Certificates {
            api: None,
            serving: None,
        });
    };
    let cert_dir = &config.server.cert_directory;
    let clock = clock::system();
    // Upstream makes the serving certificate manager only with the gate on (beta, on by default).
    let server_tls_bootstrap = config.server_tls_bootstrap
        && config
            .feature_gates
            .enabled("RotateKubeletServerCertificate");
    if config.server_tls_bootstrap && !server_tls_bootstrap {
        tracing::warn!(
            "serverTLSBootstrap is not in effect: featureGates.RotateKubeletServerCertificate is false"
        );
    }
    let needs_store =
        config.bootstrap_kubeconfig.is_some() || config.rotate_certificates || server_tls_bootstrap;
    let store = if needs_store {
        Some(Arc::new(Store::open(cert_dir).map_err(Error::Certificate)?))
    } else {
        None
    };

    if let (Some(bootstrap_kubeconfig), Some(store)) = (&config.bootstrap_kubeconfig, &store) {
        let mut retry = FIRST_RETRY;
        loop {
            match bootstrap::load_client_cert(
                kubeconfig,
                bootstrap_kubeconfig,
                store,
                &config.node_name,
                clock(),
            )
            .await
            {
                Ok(_) => break,
                Err(error) => {
                    tracing::warn!(%error, retry_in_s = retry.as_secs(), "TLS bootstrap failed");
                }
            }
            tokio::select! {
                () = tokio::time::sleep(retry) => {}
                () = shutdown.cancelled() => {
                    return Err(Error::Stopped { component: "TLS bootstrap", reason: "shut down".into() });
                }
            }
            retry = (retry * 2).min(LAST_RETRY);
        }
    }

    let lease = Duration::from_secs(u64::from(config.node_lease_duration_seconds));
    let settings = ClientSettings {
        qps: config.kube_api_qps,
        burst: config.kube_api_burst,
        heartbeat_timeout: config.node_status_update_frequency.min(lease),
    };
    let rotating = match &store {
        Some(store) if config.rotate_certificates => {
            let pem_path = store.file_path(CLIENT_PEM);
            if bootstrap::written_by_bootstrap(kubeconfig, &pem_path)
                .await
                .map_err(Error::Certificate)?
            {
                store.load(CLIENT_PEM).map_err(Error::Certificate)?
            } else {
                tracing::warn!(
                    kubeconfig = %kubeconfig.display(),
                    "rotateCertificates: the kubeconfig's credentials are not the client certificate in {}; they are not rotated",
                    pem_path.display()
                );
                None
            }
        }
        _ => None,
    };
    let api = match (rotating, &store) {
        (Some(pair), Some(store)) => {
            let identity = Identity::new(pair.certified.clone());
            let clients = ApiClients::connect_rotating(kubeconfig, &settings, &identity)
                .await
                .map_err(Error::ApiServer)?;
            let metrics = certificate_metrics(Kind::Client, metrics)?;
            let manager = Manager::new(
                Kind::Client,
                Subject::node(&config.node_name),
                store.clone(),
                CLIENT_PEM,
                ApiRequester {
                    client: clients.main.clone(),
                },
                clock.clone(),
                metrics,
                Some(pair),
            )
            .on_rotate(Box::new(move |pair| identity.set(pair.certified.clone())));
            let shutdown = shutdown.clone();
            tasks.spawn(async move {
                manager.run(shutdown).await;
                Ok(())
            });
            clients
        }
        _ => ApiClients::connect(kubeconfig, &settings)
            .await
            .map_err(Error::ApiServer)?,
    };

    let serving = match &store {
        Some(store) if server_tls_bootstrap => {
            let handle = ServingCertificate::empty();
            let current = match store.load(SERVER_PEM) {
                Ok(Some(pair)) if pair.valid_at(clock()) => Some(pair),
                Ok(_) => None,
                Err(error) => {
                    tracing::warn!(%error, "the stored serving certificate is not usable; requesting one");
                    None
                }
            };
            if let Some(pair) = &current
                && let Err(error) = handle.set(pair.certified.clone())
            {
                tracing::warn!(%error, "the stored serving certificate is not usable");
            }
            let subject = Subject {
                dns_names: vec![config.node_name.clone()],
                ips: node.node_ips.clone(),
                ..Subject::node(&config.node_name)
            };
            let metrics = certificate_metrics(Kind::Serving, metrics)?;
            let publish = handle.clone();
            let manager = Manager::new(
                Kind::Serving,
                subject,
                store.clone(),
                SERVER_PEM,
                ApiRequester {
                    client: api.main.clone(),
                },
                clock,
                metrics,
                current,
            )
            .on_rotate(Box::new(move |pair| {
                if let Err(error) = publish.set(pair.certified.clone()) {
                    tracing::warn!(%error, "the issued serving certificate is not usable");
                }
            }));
            let shutdown = shutdown.clone();
            tasks.spawn(async move {
                manager.run(shutdown).await;
                Ok(())
            });
            Some(handle)
        }
        _ => None,
    };
    Ok(Certificates {
        api: Some(api),
        serving,
    })
}

fn certificate_metrics(kind: Kind, metrics: &Metrics) -> Result<CertificateMetrics, Error> {
    let certificate = CertificateMetrics::new(kind, clock::system())?;
    certificate.register(&metrics.registry)?;
    Ok(certificate)
}
